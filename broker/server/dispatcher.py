"""From a request frame to a response frame: decode, route, handle, encode.

Refusals follow Kafka: an ApiVersions request of a version we do not serve
gets an ApiVersions v0 answer with UNSUPPORTED_VERSION and our versions, so
the client can retry with one we do; any other undecodable request (unknown
API key, unsupported version, malformed bytes) closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Mapping
from typing import Any, Final

from shoal.broker.handlers.api_versions import api_versions_response
from shoal.broker.handlers.base import (
    BrokerServices,
    E,
    Handler,
    Later,
    RequestContext,
    Spliced,
)
from shoal.broker.metrics import RequestMetrics
from shoal.broker.server.connection import CloseConnectionError, ConnectionInfo, Deferred, Frame
from shoal.broker.server.tracing import BrokerTracing

from shoal.wire import (
    Chunk,
    RequestHeader,
    UnsupportedVersionError,
    WireError,
    decode_request,
    encode_response,
    schema,
)
from shoal.wire.codec import API_VERSIONS_KEY

log = logging.getLogger(__name__)

_SLOW_REQUEST_S: Final = 1.0
_PRODUCE_KEY: Final = struct.pack(">h", 0)


class Dispatcher:
    def __init__(
        self,
        services: BrokerServices,
        handlers: Mapping[int, Handler],
        versions: Mapping[int, tuple[int, int]],
        tracing: BrokerTracing | None = None,
        metrics: RequestMetrics | None = None,
    ) -> None:
        self.services = services
        self.handlers = handlers
        self.versions = dict(versions)
        self.metrics = metrics or RequestMetrics()
        self.tracing = tracing

    async def __call__(self, frame: Frame, info: ConnectionInfo) -> list[Chunk] | Deferred | None:
        try:
            header, api, body = decode_request(frame, self.versions, trace_context=True)
        except UnsupportedVersionError as exc:
            if exc.header.api_key == API_VERSIONS_KEY:
                return self._unsupported_api_versions(exc.header)
            raise CloseConnectionError(str(exc)) from exc
        except WireError as exc:
            raise CloseConnectionError(str(exc)) from exc
        ctx = RequestContext(header, api, info)
        started = time.monotonic()
        handling = self.handlers[header.api_key](self.services, ctx, body)
        if self.tracing is not None:
            handling = self.tracing.traced(header, api, handling)
        result = await handling
        if isinstance(result, Later):
            return asyncio.ensure_future(self._answer_later(ctx, started, result.answer))
        return self._answer(ctx, started, result)

    @staticmethod
    def may_overtake(frame: Frame) -> bool:
        """Whether a request may be handled while earlier ones' answers are deferred: a
        produce, whose appends stay in order (the only deferred answers are produces')."""
        return bytes(frame[:2]) == _PRODUCE_KEY

    async def _answer_later(
        self, ctx: RequestContext, started: float, answer: Awaitable[Any]
    ) -> list[Chunk] | None:
        return self._answer(ctx, started, await answer)

    def _answer(self, ctx: RequestContext, started: float, result: Any) -> list[Chunk] | None:
        header = ctx.header
        elapsed = time.monotonic() - started
        self.metrics.observe(
            ctx.api, elapsed, result.body if isinstance(result, Spliced) else result
        )
        if elapsed > _SLOW_REQUEST_S and header.api_key != 1:
            log.info(
                "event=slow_request api_key=%d version=%d client_id=%s seconds=%.3f",
                header.api_key,
                header.api_version,
                header.client_id,
                elapsed,
            )
        return _encode(header, ctx, result)

    def _unsupported_api_versions(self, header: RequestHeader) -> list[Chunk]:
        api = schema(API_VERSIONS_KEY, 0)
        body = api_versions_response(api, self.versions, E.unsupported_version)
        return encode_response(header, api, body)


def _encode(header: RequestHeader, ctx: RequestContext, result: Any) -> list[Chunk] | None:
    if result is None:
        return None
    if isinstance(result, Spliced):
        return encode_response(header, ctx.api, result.body, result.splicer)
    return encode_response(header, ctx.api, result)
