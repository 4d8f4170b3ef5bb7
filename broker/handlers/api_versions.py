"""ApiVersions (18): exactly the APIs and versions this broker implements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.broker.handlers.base import (
    NO_THROTTLE,
    BrokerServices,
    E,
    Encoded,
    RequestContext,
)

from shoal.wire import ApiSchema, ErrorCode


def api_versions_response(
    api: ApiSchema, versions: Mapping[int, tuple[int, int]], code: ErrorCode
) -> Any:
    keys = tuple(
        api.make("ApiVersion", api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(versions.items())
    )
    return api.response(error_code=code, api_keys=keys, throttle_time=NO_THROTTLE)


class ApiVersionsResponder:
    """Answers from one encoding per version: every connection asks once, and the
    answer (sixty-odd APIs) took 100 us of the broker's CPU to build and encode."""

    def __init__(self, versions: Mapping[int, tuple[int, int]]) -> None:
        self.versions = versions
        self._encoded: dict[int, Encoded] = {}

    async def handle(self, services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
        encoded = self._encoded.get(ctx.version)
        if encoded is None:
            body = api_versions_response(ctx.api, self.versions, E.none)
            encoded = self._encoded[ctx.version] = Encoded(ctx.api.encode_body(body))
        return encoded
