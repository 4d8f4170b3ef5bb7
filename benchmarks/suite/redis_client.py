"""Load for Redis Streams with redis-py, measured as :mod:`shoal.cli.loadgen` measures Kafka.

A topic of P partitions is P stream keys, ``<topic>:<p>``; records go
round-robin over them. Values are one field, ``v``.

* **Produce** sends what is due in pipelines of up to :data:`PIPELINE`
  XADDs, :data:`IN_FLIGHT` pipelines at a time on their own connections
  (librdkafka likewise keeps several requests in flight); a record's
  latency runs from its pipeline's start to the pipeline's answer.
* **Consume** is XREAD of :data:`FETCH` entries from the stream's start.
  A consumer group is a Redis consumer group read with XREADGROUP NOACK:
  it keeps a position and no per-entry pending list, as a Kafka group
  keeps a committed offset.
* **Latency** is read with blocking XREADs from the stream's end, in its own
  process, from the same stamps as Kafka's.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

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

PIPELINE = 500
IN_FLIGHT = 4
FETCH = 1000
BLOCK_MS = 100
IDLE_TIMEOUT_S = 10.0
FIELD = b"v"


def key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def _entries(answer: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of an XREAD or XREADGROUP answer for one stream (redis-py types it loosely)."""
    return list(answer[0][1]) if answer else []


def _client(connection: dict[str, Any]) -> aioredis.Redis:
    return aioredis.Redis(
        host=connection["host"], port=connection["port"], max_connections=IN_FLIGHT + 2
    )


async def delete_topic(connection: dict[str, Any], topic: str, partitions: int) -> None:
    client = _client(connection)
    try:
        await client.delete(*(key(topic, p) for p in range(partitions)))
    finally:
        await client.aclose()


class _Pipelines:
    """Sends due records in pipelines, at most IN_FLIGHT at once, and counts answers."""

    def __init__(self, client: aioredis.Redis, topic: str, partitions: int, expected: int) -> None:
        self.client = client
        self.topic = topic
        self.partitions = partitions
        self.latencies = LatencyRecorder(expected)
        self.slots = asyncio.Semaphore(IN_FLIGHT)
        self.tasks: set[asyncio.Task[None]] = set()
        self.acked = 0
        self.failed = 0
        self.errors: dict[str, int] = {}

    async def send(self, first: int, values: list[bytes]) -> None:
        await self.slots.acquire()
        task = asyncio.create_task(self._send(first, values))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send(self, first: int, values: list[bytes]) -> None:
        try:
            sent = time.perf_counter()
            pipeline = self.client.pipeline(transaction=False)
            for offset, value in enumerate(values):
                pipeline.xadd(key(self.topic, (first + offset) % self.partitions), {FIELD: value})
            answers = await pipeline.execute(raise_on_error=False)
            now = time.perf_counter()
            for answer in answers:
                if isinstance(answer, Exception):
                    self.failed += 1
                    self.errors[str(answer)] = self.errors.get(str(answer), 0) + 1
                else:
                    self.acked += 1
                    self.latencies.add(now - sent)
        finally:
            self.slots.release()

    async def drain(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks))


async def _produce_loop(
    pipelines: _Pipelines,
    records: int,
    payload: bytes,
    pacer: Pacer,
    value: Callable[[bytes], bytes] | None,
) -> None:
    index = 0
    while index < records:
        now = time.perf_counter()
        wait = pacer.delay(index, now)
        if wait > 0:
            await asyncio.sleep(wait)
            continue
        due = index + 1
        while due < records and due - index < PIPELINE and pacer.due(due) <= now:
            due += 1
        values = [payload if value is None else value(payload) for _ in range(index, due)]
        await pipelines.send(index, values)
        index = due
    await pipelines.drain()


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
    """XADD flat out or at ``throughput``; ``run_id`` stamps for :func:`read_latencies`;
    ``warmup_records`` go first on the same connections, unstamped and unmeasured."""
    client = _client(connection)
    try:
        payload = make_payload(record_size)
        if warmup_records:
            warm = _Pipelines(client, topic, partitions, warmup_records)
            pacer = Pacer(throughput, time.perf_counter())
            await _produce_loop(warm, warmup_records, payload, pacer, None)
        pipelines = _Pipelines(client, topic, partitions, records)
        start = time.perf_counter()
        value = None if run_id is None else lambda p: stamp(run_id, time.perf_counter_ns(), p)
        await _produce_loop(pipelines, records, payload, Pacer(throughput, start), value)
        return ProduceResult(
            records=pipelines.acked,
            bytes=pipelines.acked * record_size,
            seconds=time.perf_counter() - start,
            latency=pipelines.latencies.summary(),
            failed=pipelines.failed,
            errors=pipelines.errors,
        )
    finally:
        await client.aclose()


async def consume(
    connection: dict[str, Any], topic: str, records: int, group: str | None = None
) -> ConsumeResult:
    """Read ``records`` records of a one-partition topic from its first."""
    client = _client(connection)
    stream = key(topic, 0)
    consumer = f"c-{uuid.uuid4().hex[:8]}"
    try:
        start = time.perf_counter()
        if group is not None:
            try:
                await client.xgroup_create(stream, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        began = last = time.perf_counter()
        position: bytes = b"0-0"
        count = size = 0
        timed_out = False
        while count < records:
            wanted = min(FETCH, records - count)
            answer: Any
            if group is None:
                answer = await client.xread({stream: position}, count=wanted, block=BLOCK_MS)
            else:
                answer = await client.xreadgroup(
                    group, consumer, {stream: ">"}, count=wanted, block=BLOCK_MS, noack=True
                )
            now = time.perf_counter()
            entries = _entries(answer)
            for entry_id, fields in entries:
                count += 1
                size += len(fields[FIELD])
                position = entry_id
            if entries:
                last = now
            elif now - last > IDLE_TIMEOUT_S:
                timed_out = True
                break
        return ConsumeResult(
            records=count, bytes=size, seconds=last - began, join_seconds=began - start,
            timed_out=timed_out,
        )  # fmt: skip
    finally:
        await client.aclose()


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
    client = _client(connection)
    stream = key(topic, 0)
    latencies = LatencyRecorder(records)
    try:
        newest: Any = await client.xrevrange(stream, count=1)
        position: bytes = newest[0][0] if newest else b"0-0"
        start = last_read = time.perf_counter()
        on_ready()
        received = 0
        while received < records and time.perf_counter() - last_read < IDLE_TIMEOUT_S:
            answer = await client.xread({stream: position}, count=FETCH, block=BLOCK_MS)
            now_ns = time.perf_counter_ns()
            entries = _entries(answer)
            for entry_id, fields in entries:
                position = entry_id
                found = read_stamp(fields[FIELD])
                if found is not None and found[0] == run_id:
                    latencies.add((now_ns - found[1]) / 1e9)
                    received += 1
            if entries:
                last_read = time.perf_counter()
        return LatencyResult(
            records=received,
            bytes=received * record_size,
            seconds=last_read - start,
            latency=latencies.summary(),
            missing=records - received,
        )
    finally:
        await client.aclose()
