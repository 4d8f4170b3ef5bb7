"""OpenTelemetry tracing for the gateway and the broker: setup, and what a request span says.

**Setup.** :func:`tracer_provider` follows the OpenTelemetry SDK's environment
variables, so operators configure Shoal as they configure anything else:

* nothing happens unless ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, or when ``OTEL_SDK_DISABLED=true``.
  Then no provider exists, components hold ``None`` instead of a tracer, and a
  request costs one ``is None`` test: no span objects, no context variables.
* otherwise spans go out over OTLP/HTTP (protobuf) through a
  ``BatchSpanProcessor``; the exporter reads its own variables (headers,
  timeout, compression, certificates), and the sampler is the SDK's from
  ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (parent-based
  always-on by default).
* the resource says ``service.name`` (``shoal-gateway`` / ``shoal-broker``) and
  ``service.instance.id`` (gateway id / broker node id); ``OTEL_SERVICE_NAME``
  and ``OTEL_RESOURCE_ATTRIBUTES`` override both, as they do in the SDK.

The provider is handed to the component (``Gateway(config, tracing=...)``,
``Broker(config, tracing=...)``) rather than installed globally, so one process
can host both with their own resources (the tests do).

**Request spans** follow OpenTelemetry's RPC semantic conventions (a Kafka
request is a call of one method on the broker): the span is named after the
method, Kafka's own API name (``Produce``, ``Fetch``, ``JoinGroup``, as in
Kafka's protocol guide and its ``RequestMetrics`` names), with
``rpc.system.name=kafka``, ``rpc.method``, and ``rpc.response.status_code``
(Kafka's error name, ``NONE`` on success). A non-zero error code also sets
``error.type`` and the span's status to ERROR. Kafka's own header fields are
``kafka.api_key``, ``kafka.api_version`` and ``kafka.correlation_id``; the
client id is the messaging conventions' ``messaging.client.id``.
"""

from __future__ import annotations

import dataclasses
import os
from enum import IntEnum
from typing import Any, Final

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import (
    SERVICE_INSTANCE_ID,
    SERVICE_NAME,
    OTELResourceDetector,
    Resource,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, StatusCode
from opentelemetry.util.types import AttributeValue

GATEWAY_SERVICE: Final = "shoal-gateway"
BROKER_SERVICE: Final = "shoal-broker"

# The attribute names, as the semantic conventions spell them (RPC, messaging, error).
RPC_SYSTEM_NAME: Final = "rpc.system.name"
RPC_METHOD: Final = "rpc.method"
RPC_RESPONSE_STATUS_CODE: Final = "rpc.response.status_code"
MESSAGING_CLIENT_ID: Final = "messaging.client.id"
ERROR_TYPE: Final = "error.type"
KAFKA_API_KEY: Final = "kafka.api_key"
KAFKA_API_VERSION: Final = "kafka.api_version"
KAFKA_CORRELATION_ID: Final = "kafka.correlation_id"

_ENDPOINT_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_NESTED_DEPTH: Final = 3
"""Responses keep per-resource error codes at most this deep (topics -> partitions)."""


def tracer_provider(service_name: str, instance_id: str) -> TracerProvider | None:
    """A provider exporting over OTLP/HTTP, or None when tracing is not configured."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if not any(os.environ.get(name, "").strip() for name in _ENDPOINT_VARIABLES):
        return None
    ours = Resource.create({SERVICE_NAME: service_name, SERVICE_INSTANCE_ID: instance_id})
    provider = TracerProvider(resource=ours.merge(OTELResourceDetector().detect()))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def request_attributes(
    method: str, api_key: int, api_version: int, correlation_id: int, client_id: str | None
) -> dict[str, AttributeValue]:
    """A Kafka request span's attributes, from the request header."""
    return {
        RPC_SYSTEM_NAME: "kafka",
        RPC_METHOD: method,
        KAFKA_API_KEY: api_key,
        KAFKA_API_VERSION: api_version,
        KAFKA_CORRELATION_ID: correlation_id,
        MESSAGING_CLIENT_ID: client_id or "",
    }


def record_response(span: Span, response: Any) -> None:
    """Put the response's error code on the span (nothing for a response that is bytes)."""
    if response is None or not dataclasses.is_dataclass(response):
        return
    code = response_error(response)
    name = "NONE" if code is None else _error_name(code)
    span.set_attribute(RPC_RESPONSE_STATUS_CODE, name)
    if code is not None:
        span.set_attribute(ERROR_TYPE, name)
        span.set_status(StatusCode.ERROR)


def response_error(response: Any, depth: int = _NESTED_DEPTH) -> int | None:
    """The first non-zero Kafka error code of a response: its own, else its parts'.

    Kafka answers most requests per resource (Produce per partition, CreateTopics
    per topic), so a request that "failed" usually failed for one partition.
    """
    own = getattr(response, "error_code", None)
    if isinstance(own, int) and own != 0:
        return own
    if depth == 0:
        return None
    for field in dataclasses.fields(response):
        value = getattr(response, field.name)
        if isinstance(value, tuple):
            for item in value:
                if not dataclasses.is_dataclass(item):
                    break
                code = response_error(item, depth - 1)
                if code is not None:
                    return code
    return None


def _error_name(code: int) -> str:
    return code.name.upper() if isinstance(code, IntEnum) else str(code)
