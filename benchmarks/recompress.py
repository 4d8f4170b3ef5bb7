"""What a topic's compression.type costs: produce throughput with and without recompression.

    python -m shoal.benchmarks.recompress [--records N] [--runs R] [--skip-broker]

Two parts. First, in this process on one core, :func:`recompress_batch` on
one batch as librdkafka sends it (lz4 or none, about 100 records of 1 KiB)
into each codec: MB/s of records re-encoded, beside the fast path's cost
(patching a header). Then one broker (its own etcd, in a temporary directory
on the disk the limits are measured on): confluent-kafka produces lz4 batches
(acks=1) to a fresh topic per ``compression.type``; ``producer`` and ``lz4``
store the batches as sent, the others make the leader rebuild every batch.
Produce MB/s (of record bytes) and the broker's CPU share are printed with
the ratio to the no-recompression baseline and next to the page-cache
write bandwidth from ``../shared/tools/limits``, run in the same invocation.

Values are words drawn from a small vocabulary, so every codec has
something to compress (librdkafka sends a batch uncompressed when its codec
does not pay, which would leave nothing to measure). The JSON lands in
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import timeit
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.common import (
    LocalCluster,
    cpu_seconds,
    flush_or_raise,
    measure_limits,
    produce_waiting,
    write_results,
)

from shoal.records import (
    BatchHeader,
    BatchOptions,
    Compression,
    NewRecord,
    RecompressTarget,
    build_batch,
    recompress_batch,
    validate_batch,
)

RECORD_SIZE = 1024
BATCH_RECORDS = 100
TOPIC_TYPES = ("producer", "lz4", "uncompressed", "snappy", "zstd", "gzip")
"""The first two store librdkafka's lz4 batches as sent: the baseline."""
LEVELS = {Compression.GZIP: None, Compression.LZ4: 9, Compression.ZSTD: 3}
"""Kafka's default levels (KIP-390), which the broker uses unless a topic sets others."""


def _values(count: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    words = [bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randrange(3, 10)))
             for _ in range(2000)]  # fmt: skip
    out = []
    for _ in range(count):
        value = b" ".join(rng.choices(words, k=RECORD_SIZE // 5))
        out.append(value[:RECORD_SIZE].ljust(RECORD_SIZE, b"."))
    return out


def micro(seconds: float) -> list[dict[str, Any]]:
    """recompress_batch MB/s (records' bytes) per source -> target pair, one core."""
    values = _values(BATCH_RECORDS)
    records = [NewRecord(b"key-%d" % i, v, (("h", b"1"),), 1_700_000_000_000 + i)
               for i, v in enumerate(values)]  # fmt: skip
    rows = []
    for source in (Compression.LZ4, Compression.NONE):
        batch = build_batch(records, options=BatchOptions(compression=source))
        header = validate_batch(batch)
        for target in Compression:
            if target is source:
                continue
            spec = RecompressTarget(target, LEVELS.get(target), 0, 0)

            def run(
                batch: bytes = batch, header: BatchHeader = header, spec: RecompressTarget = spec
            ) -> bytes:
                return recompress_batch(batch, header, spec, 1 << 28)

            number = max(1, int(seconds / max(timeit.timeit(run, number=1), 1e-6)))
            best = min(timeit.repeat(run, number=number, repeat=3)) / number
            out = run()
            rows.append(
                {
                    "source": source.name.lower(),
                    "target": target.name.lower(),
                    "batch_bytes_in": len(batch),
                    "batch_bytes_out": len(out),
                    "ms_per_batch": best * 1000,
                    "records_mb_per_s": BATCH_RECORDS * RECORD_SIZE / best / 1e6,
                }
            )
    fast = bytearray(build_batch(records, options=BatchOptions(compression=Compression.LZ4)))

    def patch() -> None:  # what the fast path does per batch: parse, patch two fields
        validate_batch(fast)
        fast[0:8] = (5).to_bytes(8, "big")
        fast[12:16] = (1).to_bytes(4, "big")

    number = 20_000
    best = min(timeit.repeat(patch, number=number, repeat=3)) / number
    rows.append(
        {
            "source": "lz4",
            "target": "(as sent)",
            "batch_bytes_in": len(fast),
            "batch_bytes_out": len(fast),
            "ms_per_batch": best * 1000,
            "records_mb_per_s": BATCH_RECORDS * RECORD_SIZE / best / 1e6,
        }
    )
    return rows


def one_topic(
    bootstrap: str, compression_type: str, records: int, broker_pid: int
) -> dict[str, Any]:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"compression.type": compression_type})])[
        topic
    ].result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.kbytes": 512 * 1024,
        }
    )
    values = _values(256)
    cpu_start = cpu_seconds(broker_pid)
    elapsed = _produce(producer, topic, values, records)
    cpu_used = cpu_seconds(broker_pid) - cpu_start
    return {
        "compression_type": compression_type,
        "produce_mb_per_s": records * RECORD_SIZE / elapsed / 1e6,
        "broker_cpu": cpu_used / elapsed,
        "broker_cpu_s_per_gb": cpu_used / (records * RECORD_SIZE / 1e9),
    }


def _produce(producer: Producer, topic: str, values: list[bytes], records: int) -> float:
    """Seconds to produce ``records`` records cycling through ``values``, all acknowledged.

    Not :func:`produce_flat_out`, which repeats one value: identical records
    compress far better than any real batch, which would flatter every codec.
    """
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err.str())

    started = time.perf_counter()
    for i in range(records):
        produce_waiting(producer, topic, values[i % len(values)], on_delivery=delivered)
    return flush_or_raise(producer, failures, started)


def end_to_end(records: int, runs: int, root: Path) -> list[dict[str, Any]]:
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in TOPIC_TYPES}
    with LocalCluster(root) as cluster:
        for _ in range(runs):
            for compression_type in TOPIC_TYPES:
                results[compression_type].append(
                    one_topic(cluster.bootstrap, compression_type, records, cluster.broker_pid)
                )
    rows = []
    for compression_type, measured in results.items():
        row = {"compression_type": compression_type}
        for key in measured[0]:
            if key != "compression_type":
                row[key] = statistics.median(m[key] for m in measured)
        rows.append(row)
    return rows


def report(
    micro_rows: list[dict[str, Any]], e2e: list[dict[str, Any]], limits: dict[str, float]
) -> None:
    print(f"\nrecompress_batch, one core, {BATCH_RECORDS} x {RECORD_SIZE} B records per batch\n")
    print(
        f"{'source':<8}{'target':<11}{'bytes in':>10}{'bytes out':>11}{'ms/batch':>10}{'MB/s':>9}"
    )
    for r in micro_rows:
        print(
            f"{r['source']:<8}{r['target']:<11}{r['batch_bytes_in']:>10}{r['batch_bytes_out']:>11}"
            f"{r['ms_per_batch']:>10.3f}{r['records_mb_per_s']:>9.0f}"
        )
    if not e2e:
        return
    base = next(r for r in e2e if r["compression_type"] == "producer")
    page_cache = limits.get("pagecache_write_MBps")
    print("\none broker, confluent-kafka lz4 batches, acks=1 (medians)\n")
    print(
        f"{'compression.type':<18}{'MB/s':>8}{'vs producer':>12}{'vs page cache':>15}"
        f"{'broker CPU':>12}{'CPU s/GB':>10}"
    )
    for r in e2e:
        vs_limit = f"{r['produce_mb_per_s'] / page_cache:.3f}" if page_cache else ""
        print(
            f"{r['compression_type']:<18}{r['produce_mb_per_s']:>8.1f}"
            f"{r['produce_mb_per_s'] / base['produce_mb_per_s']:>12.2f}{vs_limit:>15}"
            f"{r['broker_cpu']:>12.2f}{r['broker_cpu_s_per_gb']:>10.1f}"
        )
    print("\nmachine limits:", json.dumps(limits))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--micro-seconds", type=float, default=0.3)
    parser.add_argument("--skip-broker", action="store_true", help="only the in-process part")
    args = parser.parse_args()
    micro_rows = micro(args.micro_seconds)
    e2e: list[dict[str, Any]] = []
    limits: dict[str, float] = {}
    if not args.skip_broker:
        with tempfile.TemporaryDirectory(
            prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")
        ) as tmp:
            root = Path(tmp)
            limits = measure_limits(root)
            e2e = end_to_end(args.records, args.runs, root)
    report(micro_rows, e2e, limits)
    write_results("recompress", {"micro": micro_rows, "produce": e2e, "limits": limits})


if __name__ == "__main__":
    main()
