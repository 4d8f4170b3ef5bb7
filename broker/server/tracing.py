"""The broker's spans: one SERVER span per request, a child of the gateway's hop when it came
through one.

The dispatcher has decoded the request, and the decoder has taken the
gateway's ``traceparent`` off the end of ``client_id`` into the header
(:mod:`shoal.wire.trace_context`): it becomes the span's remote parent. A
request without one (an internal client, a gateway that does not trace, an
unsampled request) starts a root span, which the broker's own sampler decides
on. The span is current while the handler runs, so anything it traces nests
under it. Names and attributes are :mod:`shoal.tracing`'s.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Final

from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from shoal.broker.handlers.base import Spliced

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
        with self._tracer.start_as_current_span(
            api.name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            result = await handling
            record_response(span, result.body if isinstance(result, Spliced) else result)
            return result
