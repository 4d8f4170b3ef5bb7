"""Load for NATS JetStream with nats-py, measured as :mod:`shoal.cli.loadgen` measures Kafka.

A topic of P partitions is P streams, ``<topic>-<p>`` on subject
``<topic>.<p>``, each with file storage and three replicas: a stream is
JetStream's unit of order and replication, as a partition is Kafka's.
Records go round-robin over the partitions.

* **Produce** uses ``publish_async``: up to :data:`MAX_PENDING` publishes
  wait for their acknowledgements at once (librdkafka keeps a similar
  window), and latency runs from the call to the acknowledgement.
* **Consume** is a pull consumer fetching :data:`FETCH` messages per
  request with ``AckPolicy.NONE``: a Kafka consumer acknowledges nothing
  per record either. A consumer group is a durable consumer of that name;
  without one, the durable is this run's own and deleted afterwards.
* **Latency** is read by an ordered push consumer from the stream's end, in
  its own process, from the same stamps as Kafka's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.js import api
from nats.js.client import JetStreamContext

from shoal.cli.loadgen import (
    ConsumeResult,
    LatencyRecorder,
    LatencyResult,
    Pacer,
    ProduceResult,
    make_payload,
    read_stamp,
    stamp,
)

MAX_PENDING = 4000
FETCH = 1000
ACK_TIMEOUT_S = 60.0
"""How long the last acknowledgements may take after the last publish."""
IDLE_TIMEOUT_S = 10.0
CREATE_AT_ONCE = 10
CREATE_TIMEOUT_S = 30.0


def stream_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def subject(topic: str, partition: int) -> str:
    return f"{topic}.{partition}"


async def _connect(connection: dict[str, Any]) -> NatsClient:
    return await nats.connect(connection["servers"], connect_timeout=5, max_reconnect_attempts=3)


async def create_topic(connection: dict[str, Any], topic: str, partitions: int) -> None:
    client = await _connect(connection)
    try:
        # Each R3 stream is a Raft group the cluster elects a leader for: a
        # hundred at once outrun the API's default 5 s timeout on two cores.
        js = client.jetstream(timeout=CREATE_TIMEOUT_S)
        for first in range(0, partitions, CREATE_AT_ONCE):
            await asyncio.gather(
                *(
                    js.add_stream(
                        name=stream_name(topic, p),
                        subjects=[subject(topic, p)],
                        storage=api.StorageType.FILE,
                        num_replicas=3,
                    )
                    for p in range(first, min(partitions, first + CREATE_AT_ONCE))
                )
            )
    finally:
        await client.close()


async def delete_topic(connection: dict[str, Any], topic: str, partitions: int) -> None:
    client = await _connect(connection)
    try:
        js = client.jetstream(timeout=CREATE_TIMEOUT_S)
        for p in range(partitions):
            await js.delete_stream(stream_name(topic, p))
    finally:
        await client.close()


class _Acks:
    """Acknowledgement bookkeeping for publish_async futures."""

    def __init__(self, expected: int) -> None:
        self.latencies = LatencyRecorder(expected)
        self.acked = 0
        self.failed = 0
        self.errors: dict[str, int] = {}

    def watch(self, future: asyncio.Future[Any], sent: float) -> None:
        def done(f: asyncio.Future[Any]) -> None:
            if f.cancelled() or f.exception() is not None:
                self.failed += 1
                reason = "cancelled" if f.cancelled() else repr(f.exception())
                self.errors[reason] = self.errors.get(reason, 0) + 1
            else:
                self.acked += 1
                self.latencies.add(time.perf_counter() - sent)

        future.add_done_callback(done)


async def _publish(
    js: JetStreamContext,
    topic: str,
    partitions: int,
    records: int,
    payload: bytes,
    pacer: Pacer,
    acks: _Acks,
    value: Callable[[bytes], bytes] | None,
) -> None:
    index = 0
    while index < records:
        wait = pacer.delay(index, time.perf_counter())
        if wait > 0:
            await asyncio.sleep(wait)
            continue
        sent = time.perf_counter()
        data = payload if value is None else value(payload)
        future = await js.publish_async(subject(topic, index % partitions), data)
        acks.watch(future, sent)
        index += 1
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(js.publish_async_completed(), ACK_TIMEOUT_S)


async def produce(
    connection: dict[str, Any],
    topic: str,
    partitions: int,
    records: int,
    record_size: int,
    throughput: float | None = None,
    run_id: bytes | None = None,
    warmup_records: int = 0,
) -> ProduceResult:
    """Publish flat out or at ``throughput``; ``run_id`` stamps for :func:`read_latencies`;
    ``warmup_records`` go first on the same connection, unstamped and unmeasured."""
    client = await _connect(connection)
    try:
        js = client.jetstream(publish_async_max_pending=MAX_PENDING)
        payload = make_payload(record_size)
        if warmup_records:
            warm = _Acks(warmup_records)
            pacer = Pacer(throughput, time.perf_counter())
            await _publish(js, topic, partitions, warmup_records, payload, pacer, warm, None)
        acks = _Acks(records)
        start = time.perf_counter()
        value = None if run_id is None else lambda p: stamp(run_id, time.perf_counter_ns(), p)
        await _publish(
            js, topic, partitions, records, payload, Pacer(throughput, start), acks, value
        )
        seconds = time.perf_counter() - start
        unacked = records - acks.acked - acks.failed
        errors = {**acks.errors, **({"no acknowledgement": unacked} if unacked else {})}
        return ProduceResult(
            records=acks.acked,
            bytes=acks.acked * record_size,
            seconds=seconds,
            latency=acks.latencies.summary(),
            failed=acks.failed + unacked,
            errors=errors,
        )
    finally:
        await client.close()


async def consume(
    connection: dict[str, Any], topic: str, records: int, group: str | None = None
) -> ConsumeResult:
    """Read ``records`` records of a one-partition topic from its first."""
    client = await _connect(connection)
    durable = group or f"read-{uuid.uuid4().hex[:8]}"
    stream = stream_name(topic, 0)
    try:
        js = client.jetstream()
        config = api.ConsumerConfig(
            ack_policy=api.AckPolicy.NONE,
            deliver_policy=api.DeliverPolicy.ALL,
        )
        start = time.perf_counter()
        pull = await js.pull_subscribe(subject(topic, 0), durable, stream, config)
        began = time.perf_counter()
        count = size = 0
        last = began
        timed_out = False
        while count < records:
            try:
                messages = await pull.fetch(min(FETCH, records - count), timeout=1)
            except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either
                messages = []
            now = time.perf_counter()
            for message in messages:
                count += 1
                size += len(message.data)
            if messages:
                last = now
            elif now - last > IDLE_TIMEOUT_S:
                timed_out = True
                break
        await pull.unsubscribe()
        if group is None:
            await js.delete_consumer(stream, durable)
        return ConsumeResult(
            records=count, bytes=size, seconds=last - began, join_seconds=began - start,
            timed_out=timed_out,
        )  # fmt: skip
    finally:
        await client.close()


async def read_latencies(
    connection: dict[str, Any],
    topic: str,
    run_id: bytes,
    records: int,
    record_size: int,
    on_ready: Callable[[], None],
) -> LatencyResult:
    """Read ``run_id``'s stamped records of a one-partition topic from its end, as
    :func:`shoal.cli.loadgen.read_latencies` does for Kafka."""
    client = await _connect(connection)
    latencies = LatencyRecorder(records)
    received = 0
    last_read = time.perf_counter()
    all_read = asyncio.Event()

    async def on_message(message: Any) -> None:
        nonlocal received, last_read
        now_ns = time.perf_counter_ns()
        found = read_stamp(message.data)
        if found is None or found[0] != run_id:
            return
        latencies.add((now_ns - found[1]) / 1e9)
        received += 1
        last_read = time.perf_counter()
        if received >= records:
            all_read.set()

    try:
        js = client.jetstream()
        subscription = await js.subscribe(
            subject(topic, 0), cb=on_message, ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.NEW,
        )  # fmt: skip
        start = time.perf_counter()
        on_ready()
        while not all_read.is_set() and time.perf_counter() - last_read < IDLE_TIMEOUT_S:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_read.wait(), 1.0)
        await subscription.unsubscribe()
        return LatencyResult(
            records=received,
            bytes=received * record_size,
            seconds=last_read - start,
            latency=latencies.summary(),
            missing=records - received,
        )
    finally:
        await client.close()
