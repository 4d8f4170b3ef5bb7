"""What tracing adds to one request, off (the default) and on: a micro-benchmark.

Off, the per-request additions are the broker decoder's look for a trace
suffix on ``client_id`` and the gateway's check that a client's id does not
end in one; everything else is a ``tracing is None`` test. On, each request
makes the gateway's SERVER and CLIENT spans (and the traceparent on the
forwarded client id) and the broker's SERVER span, here exported to nowhere
(a processor that drops them), so the figure is the SDK's own cost.

Run: ``.venv/bin/python -m shoal.benchmarks.tracing_overhead``; it prints
nanoseconds per request for each step.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import timeit
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from shoal.broker.server.tracing import BrokerTracing
from shoal.gateway.tracing import GatewayTracing

from shoal.records import NewRecord, build_batch
from shoal.wire import decode_request, encode_request, schema
from shoal.wire.trace_context import forwarded_client_id

ROUNDS = 200_000
TRACED_ROUNDS = 20_000


class _Drop(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        del span


def _per_call_ns(action: Callable[[], Any], rounds: int) -> float:
    best = min(timeit.repeat(action, number=rounds, repeat=7))
    return best / rounds * 1e9


def _produce_frame(client_id: str) -> bytes:
    api = schema(0, 9)
    batch = build_batch([NewRecord(b"k", b"v" * 100, [], 1_700_000_000_000)])
    partition = api.make_request("PartitionProduceData", index=0, records=batch)
    topic = api.make_request("TopicProduceData", name="orders", partition_data=(partition,))
    body = api.request(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(topic,),
    )
    return encode_request(api, 1, client_id, body)[4:]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    versions = {0: (9, 9)}
    plain = _produce_frame("rdkafka")
    provider = TracerProvider()
    provider.add_span_processor(_Drop())
    header, api, _ = decode_request(plain, versions)
    gateway = GatewayTracing(provider)
    broker = BrokerTracing(provider)

    def gateway_request() -> str:
        trace = gateway.request(header, api, "tenant")
        traceparent = trace.forwarding()
        trace.answered(None)
        trace.end(None)
        return forwarded_client_id("rdkafka", traceparent)

    suffixed = _produce_frame(gateway_request())
    traced_header, _, _ = decode_request(suffixed, versions, trace_context=True)
    loop = asyncio.new_event_loop()

    async def nothing() -> None:
        return None

    def broker_request() -> None:
        loop.run_until_complete(broker.traced(traced_header, api, nothing()))

    def loop_only() -> None:
        loop.run_until_complete(nothing())

    rows = [
        (
            "decode Produce v9 (as before)",
            _per_call_ns(lambda: decode_request(plain, versions), ROUNDS),
        ),
        (
            "decode Produce v9, broker's (looks for a suffix)",
            _per_call_ns(lambda: decode_request(plain, versions, trace_context=True), ROUNDS),
        ),
        (
            "gateway: forwarded_client_id, tracing off",
            _per_call_ns(lambda: forwarded_client_id("rdkafka", None), ROUNDS),
        ),
        (
            "broker: decode with a suffix to strip (tracing on)",
            _per_call_ns(lambda: decode_request(suffixed, versions, trace_context=True), ROUNDS),
        ),
        (
            "gateway: both spans + traceparent (tracing on)",
            _per_call_ns(gateway_request, TRACED_ROUNDS),
        ),
        (
            "broker: SERVER span around a handler (tracing on)",
            _per_call_ns(broker_request, TRACED_ROUNDS) - _per_call_ns(loop_only, TRACED_ROUNDS),
        ),
    ]
    loop.close()
    provider.shutdown()
    width = max(len(name) for name, _ in rows)
    for name, ns in rows:
        print(f"{name:<{width}}  {ns:8.0f} ns")


if __name__ == "__main__":
    main()
