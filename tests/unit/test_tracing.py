"""shoal.tracing: a provider only when the OpenTelemetry variables ask for one, and what a
request span records of the response."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import StatusCode
from produce_responses import produce_response

from shoal.tracing import (
    ERROR_TYPE,
    GATEWAY_SERVICE,
    RPC_RESPONSE_STATUS_CODE,
    record_response,
    response_error,
    tracer_provider,
)
from shoal.wire import ErrorCode

_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
)


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


@pytest.fixture
def providers() -> Iterator[list[TracerProvider]]:
    made: list[TracerProvider] = []
    yield made
    for provider in made:
        provider.shutdown()


def test_no_endpoint_means_no_provider(environ: pytest.MonkeyPatch) -> None:
    environ.setenv("OTEL_SERVICE_NAME", "ignored")
    assert tracer_provider(GATEWAY_SERVICE, "gw-1") is None


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
)
def test_an_endpoint_gives_a_provider_with_the_components_resource(
    environ: pytest.MonkeyPatch, providers: list[TracerProvider], variable: str
) -> None:
    environ.setenv(variable, "http://127.0.0.1:4318")
    provider = tracer_provider(GATEWAY_SERVICE, "gw-1")
    assert provider is not None
    providers.append(provider)
    assert provider.resource.attributes[SERVICE_NAME] == "shoal-gateway"
    assert provider.resource.attributes[SERVICE_INSTANCE_ID] == "gw-1"


def test_the_sdks_variables_win(
    environ: pytest.MonkeyPatch, providers: list[TracerProvider]
) -> None:
    environ.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    environ.setenv("OTEL_SERVICE_NAME", "edge")
    environ.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod")
    environ.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    environ.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    provider = tracer_provider(GATEWAY_SERVICE, "gw-1")
    assert provider is not None
    providers.append(provider)
    assert provider.resource.attributes[SERVICE_NAME] == "edge"
    assert provider.resource.attributes["deployment.environment"] == "prod"
    assert isinstance(provider.sampler, ParentBased)
    assert isinstance(provider.sampler._root, TraceIdRatioBased)
    assert provider.sampler._root.rate == 0.25


def test_the_sdk_disabled_means_no_provider(environ: pytest.MonkeyPatch) -> None:
    environ.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    environ.setenv("OTEL_SDK_DISABLED", "true")
    assert tracer_provider(GATEWAY_SERVICE, "gw-1") is None


def test_a_partitions_error_is_the_responses_error() -> None:
    failed = produce_response(("t", [ErrorCode.none, ErrorCode.not_leader_or_follower]))
    assert response_error(failed) == ErrorCode.not_leader_or_follower
    assert response_error(produce_response(("t", [ErrorCode.none]))) is None


def test_the_span_records_the_error_by_kafkas_name() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("ok") as span:
        record_response(span, produce_response(("t", [ErrorCode.none])))
    with tracer.start_as_current_span("failed") as span:
        record_response(span, produce_response(("t", [ErrorCode.topic_authorization_failed])))
    ok, failed = exporter.get_finished_spans()
    assert ok.attributes is not None and failed.attributes is not None
    assert ok.attributes[RPC_RESPONSE_STATUS_CODE] == "NONE"
    assert ERROR_TYPE not in ok.attributes
    assert failed.attributes[ERROR_TYPE] == "TOPIC_AUTHORIZATION_FAILED"
    assert failed.status.status_code is StatusCode.ERROR
