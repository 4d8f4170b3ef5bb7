"""The five workloads, each a fixed amount of work run against one :class:`Target`.

Every client runs in a :mod:`.worker` process. Each workload returns a
dict of figures (MB is 10**6 bytes, records are :data:`RECORD_SIZE` bytes)
including ``cpu``: the cores the system's server processes used while it
ran, the cost side of the comparison.

1. ``produce``: one producer, flat out, after a warm-up; ``runs`` times,
   medians.
2. ``latency``: one producer at half of (1)'s median records/s for
   :attr:`Sizes.latency_s` seconds after a :attr:`Sizes.latency_warmup_s`
   (one-second) warm-up, and a reader
   in another process from the topic's end; produce-to-consume latency
   percentiles (the stamps are CLOCK_MONOTONIC, one clock for the machine).
   Then the same at :data:`COMMON_RATE` for :attr:`Sizes.common_latency_s`,
   and at :data:`UNBATCHED_RATE` with ``linger.ms=0`` for
   :attr:`Sizes.unbatched_latency_s` (the Kafka clients then send each record
   as it comes, as the peers' clients do at every rate).
3. ``backlog``: fill a topic with :attr:`Sizes.backlog_bytes` flat out
   (two producers), then one consumer reads it all from the start.
4. ``fanout``: three consumer groups (one consumer each, own processes)
   join first, then one producer writes; from the producer's start until
   the last group has every record.
5. ``partitions``: ten producers at once, each spreading its records over a
   100-partition topic, so that every request carries many small batches.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.common import cpu_seconds
from shoal.benchmarks.suite import nats_client, redis_client
from shoal.benchmarks.suite.systems import MIN_INSYNC_REPLICAS, Target, wait_for_topic

RECORD_SIZE = 1024
GROUP_JOIN_S = 6.0
"""Time the fan-out's groups get to join before the producer starts: a new Kafka group
waits group.initial.rebalance.delay.ms (3 s) for more members before it assigns."""
START_DELAY_S = 3.0
"""Time for worker processes to start and connect before they begin together."""
COMMON_RATE = 5000.0
"""Records/s of (2)'s second measure, the same for every system: each system's half
maximum differs (Shoal RF=1's is ten times NATS's), and so does the load on the
machine its latency is measured under."""
UNBATCHED_RATE = 1000.0
"""Records/s of (2)'s third measure, with ``linger.ms=0``: a modest rate at which every
record is a request of its own, so latency is compared without client batching."""
UNBATCHED_LINGER_MS = 0
WORKER_TIMEOUT_S = 600.0
FILL_PRODUCERS = 2
"""Producers that fill the backlog together: one Python client is the bound for some peers."""
WORKER_WARMUP = 2000
"""Warm-up records of each producer in the multi-process workloads (4 and 5), unscaled."""


@dataclass(frozen=True)
class Sizes:
    """How much work each workload does; ``scaled`` shrinks them all for a quick run."""

    produce_records: int = 200_000
    warmup_records: int = 20_000
    runs: int = 3
    latency_s: float = 8.0
    common_latency_s: float = 6.0
    unbatched_latency_s: float = 10.0
    backlog_bytes: int = 2 * 1024**3
    fanout_records: int = 200_000
    partitions: int = 100
    producers: int = 10
    partitions_records: int = 200_000
    http_records: int = 60_000
    http_warmup_records: int = 6_000
    warm_up_s: float = 30.0
    """Untimed load a Kafka-protocol system gets before its first target is measured
    (:func:`~shoal.benchmarks.suite.systems.warm_up`)."""
    latency_warmup_s: float = 1.0
    """Seconds of unmeasured records the latency producer sends first, at its rate."""
    worker_warmup: int = WORKER_WARMUP
    limits_mb: int = 1024
    """MiB of each disk test of the machine's limits (``shared/tools/limits --mb``)."""

    def scaled(self, factor: float) -> Sizes:
        """Every size times ``factor``, above a floor each.

        The floors are what a quick run (0.05) still needs to be a run: a
        thousand records, a second of latency samples (5,000 records at
        :data:`COMMON_RATE`), half a second of the latency producer's
        warm-up, 64 MiB per disk test. Waits for processes (worker start,
        group joins) are no sizes: they stay as they are.
        """

        def n(value: int) -> int:
            return max(1000, int(value * factor))

        return Sizes(
            produce_records=n(self.produce_records),
            warmup_records=n(self.warmup_records),
            runs=self.runs,
            latency_s=max(1.0, self.latency_s * factor),
            common_latency_s=max(1.0, self.common_latency_s * factor),
            unbatched_latency_s=max(1.0, self.unbatched_latency_s * factor),
            backlog_bytes=max(RECORD_SIZE * 1000, int(self.backlog_bytes * factor)),
            fanout_records=n(self.fanout_records),
            partitions=self.partitions,
            producers=self.producers,
            partitions_records=n(self.partitions_records),
            http_records=n(self.http_records),
            http_warmup_records=n(self.http_warmup_records),
            warm_up_s=max(2.0, self.warm_up_s * factor),
            latency_warmup_s=max(0.5, self.latency_warmup_s * factor),
            worker_warmup=n(self.worker_warmup),
            limits_mb=max(64, int(self.limits_mb * factor)),
        )


class WorkerError(RuntimeError):
    pass


def _spec(target: Target, role: str, topic: str, records: int, **extra: Any) -> dict[str, Any]:
    return {
        "target": {"kind": target.kind, "connection": target.connection},
        "role": role,
        "topic": topic,
        "records": records,
        "size": RECORD_SIZE,
        **extra,
    }


def _start(spec: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "shoal.benchmarks.suite.worker", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise WorkerError(f"a worker ran over {WORKER_TIMEOUT_S:.0f} s:\n{err[-3000:]}") from None
    if process.returncode != 0 or not out.strip():
        raise WorkerError(f"a worker failed ({process.returncode}):\n{err[-3000:]}")
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result = report["result"]
    if result.get("failed") or result.get("missing") or result.get("timed_out"):
        raise WorkerError(f"a worker lost records: {json.dumps(result)[:2000]}")
    return report


def _workers(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    processes = [_start(spec) for spec in specs]
    try:
        return [_finish(p) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()


class ServerCpu:
    """Cores the target's server processes used while the ``with`` block ran (``cores``)."""

    def __init__(self, target: Target) -> None:
        self.pids = target.pids

    def __enter__(self) -> ServerCpu:
        self.begin = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.began = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.monotonic() - self.began
        used = sum(cpu_seconds(pid) - self.begin[name] for name, pid in self.pids.items())
        self.cores = used / elapsed if elapsed > 0 else 0.0


_live: dict[str, tuple[str, int]] = {}
"""Each target's benchmark topic that still exists: (name, partitions)."""


def create_topic(target: Target, name: str, partitions: int) -> str:
    """A fresh topic (streams, for NATS; keys, for Redis); returns the client's name for it.

    The target's previous topic is deleted first, so every measurement runs
    on a system holding one benchmark topic. Otherwise the later targets of
    one Shoal cluster would run next to the hundreds of partitions the
    earlier ones made, and pay for them: with 300 idle RF=3 partitions,
    acks=all latency at 5,000 records/s goes from 6.6 to 26.5 ms p50, since
    a replica fetch names every partition it follows.
    """
    drop_topic(target)
    topic = f"{name}-{uuid.uuid4().hex[:6]}"
    if target.kind == "kafka":
        admin = AdminClient(target.connection["admin"])
        config = {"min.insync.replicas": str(min(MIN_INSYNC_REPLICAS, target.replicas))}
        new = NewTopic(target.topic_prefix + topic, partitions, target.replicas, config=config)
        for future in admin.create_topics([new], operation_timeout=30).values():
            future.result()
        # Kafka's brokers learn a new topic a moment after its controller: a producer
        # asking one of them first would be told it does not exist.
        wait_for_topic(target.connection["admin"], new.topic)
    elif target.kind == "nats":
        asyncio.run(nats_client.create_topic(target.connection, topic, partitions))
    _live[target.name] = (topic, partitions)
    return topic


def drop_topic(target: Target) -> None:
    """Delete the target's benchmark topic, if it has one."""
    live = _live.pop(target.name, None)
    if live is None:
        return
    topic, partitions = live
    if target.kind == "kafka":
        admin = AdminClient(target.connection["admin"])
        for future in admin.delete_topics([target.topic_prefix + topic]).values():
            future.result(60)
    elif target.kind == "nats":
        asyncio.run(nats_client.delete_topic(target.connection, topic, partitions))
    else:
        asyncio.run(redis_client.delete_topic(target.connection, topic, partitions))


def _mb_per_s(records: int, seconds: float) -> float:
    return records * RECORD_SIZE / 1e6 / seconds if seconds > 0 else 0.0


def produce(target: Target, sizes: Sizes, progress: Callable[[str], None]) -> dict[str, Any]:
    return _one_producer(
        target, sizes, "produce", sizes.produce_records, sizes.warmup_records, progress
    )


def _one_producer(
    target: Target,
    sizes: Sizes,
    role: str,
    records: int,
    warmup: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """One producer process flat out on a fresh one-partition topic, ``sizes.runs``
    times; medians, and every run."""
    runs = []
    for run in range(sizes.runs):
        topic = create_topic(target, role, 1)
        progress(f"{role} run {run + 1}/{sizes.runs}")
        spec = _spec(target, role, topic, records, warmup=warmup)
        with ServerCpu(target) as cpu:
            report = _workers([spec])[0]
        result = report["result"]
        runs.append(
            {
                "records_per_s": result["records_per_s"],
                "mb_per_s": result["mb_per_s"],
                "latency_p50_ms": result["latency"]["p50_ms"],
                "latency_p99_ms": result["latency"]["p99_ms"],
                "cpu": cpu.cores,
                "mb_per_core_s": _per_core(result["mb_per_s"], cpu.cores),
                "client_cpu": report["cpu_seconds"] / result["seconds"],
            }
        )
    return {**_medians(runs), "runs": runs}


def latency(
    target: Target, sizes: Sizes, max_records_per_s: float, progress: Callable[[str], None]
) -> dict[str, Any]:
    """(2) at half of this system's maximum, at :data:`COMMON_RATE` for every system, and
    at :data:`UNBATCHED_RATE` without lingering."""
    half = _latency_at(target, max_records_per_s / 2, sizes.latency_s, sizes, progress)
    common = _latency_at(target, COMMON_RATE, sizes.common_latency_s, sizes, progress)
    unbatched = _latency_at(
        target, UNBATCHED_RATE, sizes.unbatched_latency_s, sizes, progress,
        linger_ms=UNBATCHED_LINGER_MS,
    )  # fmt: skip
    return {
        **half,
        **{f"common_{key}": value for key, value in common.items()},
        **{f"unbatched_{key}": value for key, value in unbatched.items()},
    }


def _latency_at(
    target: Target,
    rate: float,
    seconds: float,
    sizes: Sizes,
    progress: Callable[[str], None],
    linger_ms: int | None = None,
) -> dict[str, Any]:
    """Produce-to-consume latency at ``rate``; ``linger_ms`` replaces the Kafka clients'
    :data:`~shoal.benchmarks.suite.worker.LINGER_MS` (the peers' clients never linger)."""
    topic = create_topic(target, "latency", 1)
    lingering = "" if linger_ms is None else f", linger.ms={linger_ms}"
    progress(f"latency at {rate:,.0f} records/s{lingering}")
    records = int(rate * seconds)
    run_id = uuid.uuid4().bytes[:8].hex()
    reader = _spec(target, "read-latencies", topic, records, run_id=run_id)
    lingers = {} if linger_ms is None else {"linger_ms": linger_ms}
    producer = _spec(
        target, "produce", topic, records, rate=rate, run_id=run_id,
        warmup=int(rate * sizes.latency_warmup_s), start_at=time.time() + START_DELAY_S,
        **lingers,
    )  # fmt: skip
    with ServerCpu(target) as cpu:
        read, wrote = _workers([reader, producer])
    result = wrote["result"]
    latencies = read["result"]["latency"]
    return {
        "target_records_per_s": rate,
        "achieved_records_per_s": result["records_per_s"],
        "rate_kept": result["records_per_s"] / rate,
        "records": read["result"]["records"],
        "p50_ms": latencies["p50_ms"],
        "p99_ms": latencies["p99_ms"],
        "p99_9_ms": latencies["p99_9_ms"],
        "max_ms": latencies["max_ms"],
        "cdf_ms": latencies["cdf_ms"],
        "reader_ready_late": read.get("ready_at", 0) > wrote["wall_start"],
        "cpu": cpu.cores,
    }


def backlog(target: Target, sizes: Sizes, progress: Callable[[str], None]) -> dict[str, Any]:
    records = sizes.backlog_bytes // RECORD_SIZE
    topic = create_topic(target, "backlog", 1)
    progress(f"backlog: filling {sizes.backlog_bytes / 2**30:.2f} GiB")
    share = records // FILL_PRODUCERS
    fillers = [
        _spec(target, "produce", topic, share + (records % FILL_PRODUCERS if n == 0 else 0))
        for n in range(FILL_PRODUCERS)
    ]
    with ServerCpu(target) as fill_cpu:
        filled = _workers(fillers)
    fill_seconds = max(r["wall_end"] for r in filled) - min(_measured_start(r) for r in filled)
    progress("backlog: reading it back")
    with ServerCpu(target) as cpu:
        read = _workers([_spec(target, "consume", topic, records)])[0]["result"]
    return {
        "records": read["records"],
        "mb_per_s": read["mb_per_s"],
        "records_per_s": read["records_per_s"],
        "fill_mb_per_s": _mb_per_s(records, fill_seconds),
        "cpu": cpu.cores,
        "mb_per_core_s": _per_core(read["mb_per_s"], cpu.cores),
        "fill_cpu": fill_cpu.cores,
    }


def fanout(target: Target, sizes: Sizes, progress: Callable[[str], None]) -> dict[str, Any]:
    topic = create_topic(target, "fanout", 1)
    records = sizes.fanout_records
    progress("fan-out: 3 groups join, 1 producer writes")
    now = time.time()
    warmup = sizes.worker_warmup
    groups = [
        _spec(target, "consume", topic, warmup + records, group=f"g{g}-{topic}", start_at=now)
        for g in range(3)
    ]
    producer = _spec(target, "produce", topic, records, warmup=warmup, start_at=now + GROUP_JOIN_S)
    with ServerCpu(target) as cpu:
        *readers, writer = _workers([*groups, producer])
    begin = _measured_start(writer)
    end = max(r["wall_end"] for r in readers)
    joined_late = any(r["wall_start"] + r["result"]["join_seconds"] > begin for r in readers)
    return {
        "records": records,
        "produce_mb_per_s": writer["result"]["mb_per_s"],
        "mb_per_s": _mb_per_s(3 * records, end - begin),
        "last_group_s": end - begin,
        "joined_late": joined_late,
        "cpu": cpu.cores,
    }


def partitions(target: Target, sizes: Sizes, progress: Callable[[str], None]) -> dict[str, Any]:
    runs = []
    each = sizes.partitions_records // sizes.producers
    for run in range(sizes.runs):
        topic = create_topic(target, "partitions", sizes.partitions)
        progress(f"{sizes.partitions} partitions, {sizes.producers} producers, run {run + 1}")
        start_at = time.time() + START_DELAY_S
        spec = _spec(
            target, "produce", topic, each, partitions=sizes.partitions, spread=True,
            start_at=start_at, warmup=sizes.worker_warmup,
        )  # fmt: skip
        with ServerCpu(target) as cpu:
            reports = _workers([spec] * sizes.producers)
        begin = min(_measured_start(r) for r in reports)
        end = max(r["wall_end"] for r in reports)
        total = sum(r["result"]["records"] for r in reports)
        runs.append(
            {
                "records_per_s": total / (end - begin),
                "mb_per_s": _mb_per_s(total, end - begin),
                "latency_p99_ms": max(r["result"]["latency"]["p99_ms"] for r in reports),
                "cpu": cpu.cores,
                "mb_per_core_s": _per_core(_mb_per_s(total, end - begin), cpu.cores),
            }
        )
    return {**_medians(runs), "runs": runs}


def http_produce(target: Target, sizes: Sizes, progress: Callable[[str], None]) -> dict[str, Any]:
    """(6) Produce through the gateway's HTTP door in batched requests; only targets
    that have one (the gateway's)."""
    if "http" not in target.connection:
        return {"skipped": "no HTTP door"}
    return _one_producer(
        target, sizes, "http-produce", sizes.http_records, sizes.http_warmup_records, progress
    )


def _measured_start(report: dict[str, Any]) -> float:
    """When a producer's measured run began (after its warm-up), on the wall clock."""
    return float(report["wall_end"] - report["result"]["seconds"])


def _per_core(mb_per_s: float, cores: float) -> float:
    """MB moved per second of server CPU: what the throughput costs."""
    return mb_per_s / cores if cores > 0 else 0.0


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}
