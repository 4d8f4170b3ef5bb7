"""ApiVersions (18): exactly the APIs and versions this broker implements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext

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
    def __init__(self, versions: Mapping[int, tuple[int, int]]) -> None:
        self.versions = versions

    async def handle(self, services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
        return api_versions_response(ctx.api, self.versions, E.none)
