"""Produce/consume throughput and produce latency of one broker, beside the machine's limits.

    python -m shoal.benchmarks.produce_consume [--records N] [--runs R] [--bootstrap HOST:PORT]

Without ``--bootstrap`` it starts its own etcd and broker in a temporary
directory on the same disk the limits are measured on. The load is
confluent-kafka (librdkafka) in this process: 1 KiB records, acks=1, one
producer, then one consumer reading everything back. Each run uses a fresh
single-partition topic; the figures quoted are medians over the runs.

Every figure is printed next to the ceiling that bounds it, from
``../shared/tools/limits`` run in the same invocation: produce MB/s against
page-cache and disk write bandwidth (the broker does not fsync per write, as
Kafka does not), consume MB/s against loopback sendfile bandwidth. The
broker's CPU use (share of one core) says how much of the time the broker,
rather than the single Python client, was the bottleneck. The JSON lands in
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.common import (
    LocalCluster,
    cpu_seconds,
    measure_limits,
    produce_flat_out,
    write_results,
)

RECORD_SIZE = 1024


@dataclass
class Run:
    records: int
    produce_seconds: float
    produce_records_per_s: float
    produce_mb_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    consume_seconds: float
    consume_mb_per_s: float
    kcat_consume_mb_per_s: float
    """The same records read by kcat (C, librdkafka), which costs far less per record."""
    broker_cpu_produce: float
    """Share of one core the broker used while producing (NaN for --bootstrap)."""
    broker_cpu_consume: float


def produce(bootstrap: str, topic: str, records: int) -> tuple[float, list[float]]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 512 * 1024,
        }
    )
    return produce_flat_out(producer, topic, os.urandom(RECORD_SIZE), records)


def consume(bootstrap: str, topic: str, records: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52428800,
            "max.partition.fetch.bytes": 10485760,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got = 0
    started = time.perf_counter()
    while got < records:
        for message in consumer.consume(10000, 1.0):
            if message.error() is None:
                got += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def kcat_consume(bootstrap: str, topic: str, records: int) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["kcat", "-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning",
         "-c", str(records), "-e", "-q", "-f", "%o\n",
         "-X", "fetch.max.bytes=52428800", "-X", "max.partition.fetch.bytes=10485760"],
        stdout=subprocess.DEVNULL,
        check=True,
    )  # fmt: skip
    return time.perf_counter() - started


def one_run(bootstrap: str, records: int, broker_pid: int | None) -> Run:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    cpu_start = cpu_seconds(broker_pid)
    produce_s, latencies = produce(bootstrap, topic, records)
    cpu_produced = cpu_seconds(broker_pid)
    consume_s = consume(bootstrap, topic, records)
    cpu_consumed = cpu_seconds(broker_pid)
    kcat_s = kcat_consume(bootstrap, topic, records)
    quantiles = statistics.quantiles(latencies, n=100)
    megabytes = records * RECORD_SIZE / 1e6
    return Run(
        records,
        produce_s,
        records / produce_s,
        megabytes / produce_s,
        quantiles[49] * 1000,
        quantiles[98] * 1000,
        consume_s,
        megabytes / consume_s,
        megabytes / kcat_s,
        (cpu_produced - cpu_start) / produce_s,
        (cpu_consumed - cpu_produced) / consume_s,
    )


def report(runs: list[Run], limits: dict[str, float]) -> dict[str, Any]:
    median = {k: statistics.median(getattr(r, k) for r in runs) for k in asdict(runs[0])}
    rows = [
        ("produce records/s", median["produce_records_per_s"], None),
        ("produce MB/s", median["produce_mb_per_s"], "pagecache_write_MBps"),
        ("produce MB/s (vs disk)", median["produce_mb_per_s"], "disk_write_MBps"),
        ("produce latency p50 ms", median["latency_p50_ms"], None),
        ("produce latency p99 ms", median["latency_p99_ms"], None),
        ("consume MB/s", median["consume_mb_per_s"], "loopback_MBps"),
        ("consume MB/s (kcat)", median["kcat_consume_mb_per_s"], "loopback_MBps"),
        ("broker CPU, producing", median["broker_cpu_produce"], None),
        ("broker CPU, consuming", median["broker_cpu_consume"], None),
    ]
    print(f"\nmedian of {len(runs)} runs, {runs[0].records} x {RECORD_SIZE} B records, acks=1\n")
    print(f"{'figure':<26}{'value':>12}  {'ceiling':<24}{'ceiling value':>14}{'ratio':>8}")
    for name, value, ceiling in rows:
        limit = limits.get(ceiling or "")
        ratio = f"{value / limit:.2f}" if limit else ""
        print(f"{name:<26}{value:>12.1f}  {ceiling or '':<24}{limit or '':>14}{ratio:>8}")
    print("\nmachine limits:", json.dumps(limits))
    return {"median": median, "runs": [asdict(r) for r in runs], "limits": limits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bootstrap", help="benchmark an existing cluster instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(
        prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")
    ) as tmp:
        root = Path(tmp)
        limits = measure_limits(root)
        if args.bootstrap:
            runs = [one_run(args.bootstrap, args.records, None) for _ in range(args.runs)]
        else:
            with LocalCluster(root) as cluster:
                runs = [
                    one_run(cluster.bootstrap, args.records, cluster.broker_pid)
                    for _ in range(args.runs)
                ]
    result = report(runs, limits)
    write_results("produce_consume", result)


if __name__ == "__main__":
    main()
