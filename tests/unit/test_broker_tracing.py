"""The broker's request spans: one per request, ended with its answer, a deferred one too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, get_current_span
from produce_responses import PRODUCE, produce_response
from shoal.broker.handlers.base import Later
from shoal.broker.server.tracing import BrokerTracing

from shoal.tracing import ERROR_TYPE
from shoal.wire import ErrorCode, RequestHeader

HEADER = RequestHeader(api_key=0, api_version=9, correlation_id=7, client_id="app")


def traced() -> tuple[BrokerTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return BrokerTracing(provider), exporter


async def test_a_later_answers_span_ends_when_the_answer_comes() -> None:
    tracing, exporter = traced()
    committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    current_while_waiting = []

    async def wait_for_followers() -> Any:
        await committed
        current_while_waiting.append(get_current_span().get_span_context().span_id)
        return produce_response(("t", [ErrorCode.not_enough_replicas_after_append]))

    async def handle() -> Later:
        return Later(wait_for_followers())

    result = await tracing.traced(HEADER, PRODUCE, handle())
    assert isinstance(result, Later)
    assert exporter.get_finished_spans() == (), "the span lasts until the answer"
    answering = asyncio.ensure_future(result.answer)
    await asyncio.sleep(0)
    committed.set_result(None)
    await answering
    (span,) = exporter.get_finished_spans()
    assert span.name == "Produce"
    assert current_while_waiting == [span.context.span_id], "the wait runs inside the span"
    assert span.attributes is not None
    assert span.attributes[ERROR_TYPE] == "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    assert span.status.status_code is StatusCode.ERROR


async def test_a_failed_later_answer_still_ends_its_span() -> None:
    tracing, exporter = traced()

    async def broken() -> Any:
        raise RuntimeError("lost")

    async def handle() -> Later:
        return Later(broken())

    result = await tracing.traced(HEADER, PRODUCE, handle())
    assert isinstance(result, Later)
    with pytest.raises(RuntimeError):
        await result.answer
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
