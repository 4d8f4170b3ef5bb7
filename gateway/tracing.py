"""The gateway's spans: a SERVER span per client request, a CLIENT span for its hop to a broker.

A Kafka client sends no trace context, so each request's SERVER span is a root
(an HTTP request's span follows the caller's ``traceparent`` header, as the
ASGI instrumentation does). When the request is forwarded, a CLIENT child span
covers the hop until the broker's answer is back, and, when it is sampled, its
W3C ``traceparent`` travels on the forwarded request's ``client_id``
(:mod:`shoal.wire.trace_context`): the broker's span becomes its child. Both
spans end when the client's answer is ready; a request that never gets one
(the connection broke) ends them with an error.

Spans are started and ended by hand, not as the "current" span: a request's
life spans two tasks (the session reads requests, another task reads the
broker's answers), so there is no one block of code to hold it in. Names and
attributes are :mod:`shoal.tracing`'s, plus ``shoal.tenant``.
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import FastAPI
from opentelemetry.context import Context
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import (
    Span,
    SpanKind,
    StatusCode,
    Tracer,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shoal.tracing import RPC_METHOD, RPC_SYSTEM_NAME, record_response, request_attributes
from shoal.wire import ApiSchema, RequestHeader

SHOAL_TENANT: Final = "shoal.tenant"
_UNTRACED_PATHS: Final = "/healthz,/readyz"
"""Probes: a span every few seconds that tells nobody anything. (Scrapes are not
the HTTP app's: ``/metrics`` has a listener of its own.)"""
_PROPAGATOR: Final = TraceContextTextMapPropagator()


def current_traceparent() -> str | None:
    """The ``traceparent`` of the running task's current span, if it is sampled.

    The HTTP door's requests run inside the ASGI instrumentation's SERVER span
    (the current one); what they ask the brokers becomes its children. With
    tracing off there is no current span, and this costs one lookup.
    """
    context = get_current_span().get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


class GatewayTracing:
    """The gateway's tracer; one per gateway, shared by its sessions and its HTTP app."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("shoal.gateway")

    def request(self, header: RequestHeader, api: ApiSchema, tenant: str) -> RequestTrace:
        """Start the SERVER span of one client request."""
        attributes = request_attributes(
            api.name, header.api_key, header.api_version, header.correlation_id, header.client_id
        )
        attributes[SHOAL_TENANT] = tenant
        span = self._tracer.start_span(
            api.name, context=Context(), kind=SpanKind.SERVER, attributes=attributes
        )
        return RequestTrace(self._tracer, api.name, span)

    def instrument(self, app: FastAPI) -> None:
        """A SERVER span per HTTP request (OpenTelemetry's FastAPI instrumentation)."""
        FastAPIInstrumentor.instrument_app(
            app,
            tracer_provider=self.provider,
            excluded_urls=_UNTRACED_PATHS,
            # One span per request: not one more per body chunk sent or received.
            exclude_spans=["receive", "send"],
        )


class RequestTrace:
    """The spans of one client request in flight."""

    __slots__ = ("_client", "_method", "_server", "_tracer")

    def __init__(self, tracer: Tracer, method: str, server: Span) -> None:
        self._tracer = tracer
        self._method = method
        self._server = server
        self._client: Span | None = None

    def forwarding(self) -> str | None:
        """Start the hop's CLIENT span; its ``traceparent`` for the broker if it is sampled."""
        self._client = self._tracer.start_span(
            self._method,
            context=set_span_in_context(self._server),
            kind=SpanKind.CLIENT,
            attributes={RPC_SYSTEM_NAME: "kafka", RPC_METHOD: self._method},
        )
        if not self._client.get_span_context().trace_flags.sampled:
            return None
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=set_span_in_context(self._client))
        return carrier.get("traceparent")

    def answered(self, broker_response: Any) -> None:
        """The broker's answer is back: the hop's span ends."""
        if self._client is not None:
            record_response(self._client, broker_response)
            self._client.end()
            self._client = None

    def end(self, response: Any) -> None:
        """The client's answer is ready (``None``: none is owed, as for acks=0)."""
        if self._client is not None:
            self._client.end()
            self._client = None
        record_response(self._server, response)
        self._server.end()

    def abandon(self, reason: str) -> None:
        """The connection ended before an answer."""
        for span in (self._client, self._server):
            if span is not None:
                span.set_status(StatusCode.ERROR, reason)
                span.end()
        self._client = None
