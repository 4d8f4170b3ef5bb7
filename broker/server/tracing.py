"""The broker's spans: one SERVER span per request, a child of the gateway's hop when it came
through one.

The dispatcher has decoded the request, and the decoder has taken the
gateway's ``traceparent`` off the end of ``client_id`` into the header
(:mod:`shoal.wire.trace_context`): it becomes the span's remote parent. A
request without one (an internal client, a gateway that does not trace, an
unsampled request) starts a root span, which the broker's own sampler decides
on. The span is current while the handler runs, so anything it traces nests
under it, and ends with the answer (a :class:`Later` one's, when it comes).
Names and attributes are :mod:`shoal.tracing`'s.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Final

from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, use_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from shoal.broker.handlers.base import Later, Spliced

from shoal.tracing import record_response, request_attributes
from shoal.wire import ApiSchema, RequestHeader

_PROPAGATOR: Final = TraceContextTextMapPropagator()


class BrokerTracing:
    def __init__(self, provider: TracerProvider) -> None:
        self._tracer = provider.get_tracer("shoal.broker")

    async def traced(self, header: RequestHeader, api: ApiSchema, handling: Awaitable[Any]) -> Any:
        """Await a handler's answer inside the request's span."""
        parent = (
            Context()
            if header.traceparent is None
            else _PROPAGATOR.extract({"traceparent": header.traceparent}, context=Context())
        )
        attributes = request_attributes(
            api.name, header.api_key, header.api_version, header.correlation_id, header.client_id
        )
        span = self._tracer.start_span(
            api.name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        result = await _awaited_in(span, handling)
        if isinstance(result, Later):
            return Later(_ended_with(span, result.answer))
        _end(span, result)
        return result


async def _awaited_in(span: Span, awaitable: Awaitable[Any]) -> Any:
    """``awaitable``'s result, awaited with ``span`` current; the span ends if it raises
    (after ``use_span`` has recorded the exception on it)."""
    try:
        with use_span(span, end_on_exit=False):
            return await awaitable
    except BaseException:
        span.end()
        raise


async def _ended_with(span: Span, answer: Awaitable[Any]) -> Any:
    result = await _awaited_in(span, answer)
    _end(span, result)
    return result


def _end(span: Span, result: Any) -> None:
    record_response(span, result.body if isinstance(result, Spliced) else result)
    span.end()
