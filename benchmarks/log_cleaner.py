"""Log compaction: cleaner throughput, offsets-topic takeover, produce while cleaning.

    python -m shoal.benchmarks.log_cleaner [--parts throughput takeover produce] [options]

Three parts, one run, every figure next to the machine's limits from
``../shared/tools/limits`` (measured first, in the same invocation, on the
file system the benchmark writes to; ``SHOAL_BENCH_DIR`` picks another):

``throughput``
    In this process, one log per codec (none, lz4, zstd) is filled with
    about ``--mb`` MB of keyed records (batches of 100 records of 200 bytes,
    keys drawn from ``--keys``, so most records are superseded), rolled, and
    cleaned once from scratch by :class:`~shoal.broker.log.cleaner.cleaner.Cleaner`
    (offset map, rewrite, swap) with the broker's default map size and no
    I/O throttle. Per codec, medians of ``--runs`` fresh logs: MB of log
    cleaned per wall second and per CPU-second of the process (the cleaner's
    threads included), records per CPU-second, bytes kept, and the ratio of
    the wall-clock rate to the disk's write bandwidth.

``takeover``
    A ``__consumer_offsets`` partition log as the group coordinator writes
    it: one GroupMetadata record per group, then ``--commits`` rounds in
    which each of ``--groups`` groups commits its ``--group-partitions``
    partitions in one batch (the coordinator's own key and value encoding
    and batch shape), in a log with ``--offsets-segment-mb`` MB segments.
    All groups are in this one partition, where a broker spreads them over
    50: the worst case of one coordinator partition. The coordinator's
    replay (``GroupCoordinator._read_groups``, the loop a new leader runs
    before it answers for a group) is timed over the log, then the log is
    compacted by :class:`~shoal.broker.log.cleaner.manager.LogCleaner`
    (``clean_one`` until nothing is cleanable, Kafka's defaults for the
    offsets topic) and the replay is timed again. The groups and offsets
    loaded before and after must equal what was written last, or the run
    fails.

``produce``
    One broker process (with its own etcd) per measurement, started with
    ``log.cleaner.enable`` on or off (``SHOAL_LOG_CLEANER_ENABLE``);
    confluent-kafka (acks=1) produces ``--produce-records`` keyed records of
    ``--record-bytes`` bytes over ``--produce-keys`` keys to a fresh
    one-partition compacted topic with small segments and
    ``min.cleanable.dirty.ratio=0.01``, so the cleaner always has work.
    ``--produce-runs`` pairs, alternating which setting goes first; medians
    of produce MB/s, the broker's CPU, and what the cleaner did meanwhile
    (its counters on the broker's ``/metrics``).

The JSON lands in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import struct
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.common import (
    HERE,
    LocalCluster,
    cpu_seconds,
    flush_or_raise,
    free_port,
    measure_limits,
    produce_waiting,
)
from shoal.broker.coordinator.config import GroupConfig
from shoal.broker.coordinator.coordinator import OFFSETS_TOPIC, GroupCoordinator
from shoal.broker.coordinator.group import CommittedOffset, Group
from shoal.broker.coordinator.records import (
    GroupValue,
    MemberValue,
    OffsetValue,
    group_key,
    group_value,
    offset_key,
    offset_value,
)
from shoal.broker.log.cleaner.cleanable import log_to_clean
from shoal.broker.log.cleaner.cleaner import Cleaner
from shoal.broker.log.cleaner.faults import Faults
from shoal.broker.log.cleaner.manager import CleanerSettings, LogCleaner
from shoal.broker.log.cleaner.offset_map import max_entries
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import Log
from shoal.broker.log.segment import LogSegment
from shoal.broker.partition import Partition
from shoal.broker.replica_manager import ReplicaManager

from shoal.records import BatchOptions, Compression, NewRecord, build_batch

PARTS = ("throughput", "takeover", "produce")
RECORD_SIZE = 200
BATCH_RECORDS = 100
CODECS = (Compression.NONE, Compression.LZ4, Compression.ZSTD)
DEFAULTS = CleanerSettings()
MAP_ENTRIES = max_entries(DEFAULTS.dedupe_buffer_size, DEFAULTS.threads)
"""What one broker cleaner thread may map with Kafka's default dedupe buffer."""
PRODUCE_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": str(4 << 20),
    "segment.ms": "2000",
    "min.cleanable.dirty.ratio": "0.01",
    "file.delete.delay.ms": "1000",
}
"""Small segments rolled by size and time and a low ratio: the cleaner never runs out of work."""
CLEANER_BACKOFF_MS = 500
"""log.cleaner.backoff.ms for the produce part: Kafka's 15 s would idle through a short run."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _median_row(runs: list[dict[str, Any]], keys: Iterable[str]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in keys}


# -- part 1: cleaner throughput ------------------------------------------------------------


def _fill(directory: Path, codec: Compression, mb: int, keys: int, seed: int) -> tuple[Log, int]:
    now = _now_ms()
    config = LogConfig(segment_bytes=64 << 20, cleanup_policy=("compact",), file_delete_delay_ms=0)
    log = Log(directory, config, 0, True, _now_ms)
    rng = random.Random(seed)
    words = [f"w{i}".encode() for i in range(64)]
    written = records = 0
    while written < mb << 20:
        batch = [
            NewRecord(
                f"key-{rng.randrange(keys)}".encode(),
                b" ".join(rng.choices(words, k=RECORD_SIZE // 4))[:RECORD_SIZE],
                timestamp=now,
            )
            for _ in range(BATCH_RECORDS)
        ]
        log.append_as_leader(build_batch(batch, 0, BatchOptions(compression=codec)), 0)
        written += BATCH_RECORDS * RECORD_SIZE
        records += BATCH_RECORDS
    log.roll()
    log.high_watermark = log.log_end_offset
    return log, records


async def _clean_once(log: Log, records: int) -> dict[str, float]:
    replaced: list[LogSegment] = []

    def keep(_log: Log, old: list[LogSegment]) -> None:
        replaced.extend(old)

    target = log_to_clean(log, None, log.clock())
    size = sum(s.size for s in log.segments)
    wall, cpu = time.perf_counter(), time.process_time()
    result = await Cleaner(max_map_entries=MAP_ENTRIES, destroy_later=keep).clean(log, target)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # Unlinking the replaced files is the log manager's job, later; not the clean's cost.
    for segment in replaced:
        segment.destroy()
    return {
        "log_bytes": size,
        "records": records,
        "bytes_kept": result.stats.bytes_written,
        "records_kept": result.stats.records_kept,
        "wall_s": wall,
        "cpu_s": cpu,
        "mb_per_s": size / wall / 1e6,
        "mb_per_core_s": size / cpu / 1e6,
        "records_per_core_s": records / cpu,
    }


def throughput(root: Path, mb: int, keys: int, runs: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for codec in CODECS:
        measured = []
        for run in range(runs):
            directory = root / f"throughput-{codec.name.lower()}-{run}" / "bench-0"
            log, records = _fill(directory, codec, mb, keys, run)
            measured.append(asyncio.run(_clean_once(log, records)))
            log.close()
            shutil.rmtree(directory.parent)
        row: dict[str, Any] = {"codec": codec.name.lower()}
        row.update(_median_row(measured, measured[0]))
        row["runs"] = measured
        rows.append(row)
    return rows


# -- part 2: __consumer_offsets takeover ----------------------------------------------------


@dataclass
class _OffsetsPartition:
    """What the coordinator's replay reads of a partition: its log, and its index for logging."""

    log: Log
    index: int


GroupSnapshot = dict[str, tuple[GroupValue, tuple[tuple[tuple[str, int], CommittedOffset], ...]]]


def _snapshot(groups: dict[str, Group]) -> GroupSnapshot:
    return {gid: (g.to_value(), tuple(sorted(g.offsets.items()))) for gid, g in groups.items()}


def _consumer_subscription(topic: str) -> bytes:
    """The consumer protocol's Subscription v0: version, [topics], user data."""
    name = topic.encode()
    return struct.pack(">hih", 0, 1, len(name)) + name + struct.pack(">i", -1)


def _consumer_assignment(topic: str, partitions: int) -> bytes:
    """The consumer protocol's Assignment v0: version, [topic, [partitions]], user data."""
    name = topic.encode()
    return (
        struct.pack(">hih", 0, 1, len(name))
        + name
        + struct.pack(f">i{partitions}i", partitions, *range(partitions))
        + struct.pack(">i", -1)
    )


def _offsets_log(
    directory: Path, groups: int, partitions: int, commits: int, segment_bytes: int
) -> tuple[Log, GroupSnapshot, int]:
    """The log, what a correct load of it must give, and the records written."""
    # Kafka's offsets topic: compacted, producer codec, segment.bytes its own setting.
    config = LogConfig(
        segment_bytes=segment_bytes, cleanup_policy=("compact",), compression_type="producer"
    )
    log = Log(directory, config, 0, True, _now_ms)
    started = _now_ms()
    names = [(f"group-{g:04d}", f"orders-{g:04d}") for g in range(groups)]
    expected: GroupSnapshot = {}
    values: dict[str, GroupValue] = {}
    for group, topic in names:
        member = f"consumer-{group}-1-{uuid.UUID(int=len(values)).hex}"
        values[group] = GroupValue(
            "consumer",
            1,
            "range",
            member,
            started,
            (
                MemberValue(
                    member,
                    None,
                    f"consumer-{group}-1",
                    "/127.0.0.1",
                    300_000,
                    45_000,
                    _consumer_subscription(topic),
                    _consumer_assignment(topic, partitions),
                ),
            ),
        )
        batch = build_batch([NewRecord(group_key(group), group_value(values[group]))])
        log.append_as_leader(batch, 0)
    written = groups
    last: dict[str, dict[tuple[str, int], CommittedOffset]] = {g: {} for g, _ in names}
    for round_ in range(commits):
        for group, topic in names:
            committed = {
                (topic, p): CommittedOffset(500 * (round_ + 1) + p, 0, "", started + round_)
                for p in range(partitions)
            }
            records = [
                NewRecord(
                    offset_key(group, topic, p),
                    offset_value(OffsetValue(c.offset, c.leader_epoch, "", c.commit_timestamp)),
                )
                for (_, p), c in committed.items()
            ]
            # One OffsetCommit, one batch: what GroupCoordinator._append writes.
            log.append_as_leader(build_batch(records, options=BatchOptions()), 0)
            last[group].update(committed)
            written += partitions
    for group, _ in names:
        expected[group] = (values[group], tuple(sorted(last[group].items())))
    log.high_watermark = log.log_end_offset
    return log, expected, written


def _segments(log: Log) -> dict[str, Any]:
    return {
        "log_bytes": log.size,
        "segments": len(log.segments),
        "active_segment_bytes": log.active.size,
    }


def _time_loads(
    coordinator: GroupCoordinator, log: Log, runs: int
) -> tuple[dict[str, float], GroupSnapshot]:
    partition = cast(Partition, _OffsetsPartition(log, 0))
    walls, cpus = [], []
    loaded: dict[str, Group] = {}
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        loaded = coordinator._read_groups(partition)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {
        "load_s": statistics.median(walls),
        "load_cpu_s": statistics.median(cpus),
    }, _snapshot(loaded)


async def _compact(data_dir: Path, log: Log) -> dict[str, Any]:
    """Clean as the broker's cleaner worker would, until no log is worth cleaning."""
    replaced: list[LogSegment] = []

    def keep(_log: Log, old: list[LogSegment]) -> None:
        replaced.extend(old)

    cleaner = LogCleaner(
        data_dir, {(OFFSETS_TOPIC, 0): log}, _now_ms, destroy_later=keep, faults=Faults()
    )
    cleans = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while await cleaner.clean_one():
        cleans += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    for segment in replaced:
        segment.destroy()
    return {
        "cleans": cleans,
        "clean_s": wall,
        "clean_cpu_s": cpu,
        "cleaner_bytes_read": cleaner.metrics.bytes_read,
        "cleaner_bytes_recopied": cleaner.metrics.bytes_recopied,
    }


def takeover(
    root: Path, groups: int, partitions: int, commits: int, segment_mb: int, load_runs: int
) -> dict[str, Any]:
    data_dir = root / "takeover"
    started = time.perf_counter()
    log, expected, records = _offsets_log(
        data_dir / f"{OFFSETS_TOPIC}-0", groups, partitions, commits, segment_mb << 20
    )
    print(f"  offsets log written: {records:,} records in {time.perf_counter() - started:.0f} s")
    coordinator = GroupCoordinator(
        cast(ReplicaManager, None), GroupConfig(), _now_ms, lambda _topic, _partition: True
    )
    try:
        before = _segments(log)
        timing, loaded_before = _time_loads(coordinator, log, load_runs)
        before.update(timing)
        cleaning = asyncio.run(_compact(data_dir, log))
        after = _segments(log)
        timing, loaded_after = _time_loads(coordinator, log, load_runs)
        after.update(timing)
    finally:
        log.close()
        shutil.rmtree(data_dir)
    if loaded_before != expected or loaded_after != expected:
        raise RuntimeError(
            f"groups loaded differ from those written: before {loaded_before == expected},"
            f" after cleaning {loaded_after == expected}"
        )
    return {
        "groups": groups,
        "partitions_per_group": partitions,
        "commits_per_partition": commits,
        "records": records,
        "segment_bytes": segment_mb << 20,
        "load_runs": load_runs,
        "before": before,
        "after": after,
        "cleaning": cleaning,
        "loaded_groups": len(loaded_after),
        "loaded_offsets": sum(len(v[1]) for v in loaded_after.values()),
        "identical": True,
    }


# -- part 3: produce on a compacted topic, cleaner on and off -------------------------------


def _scrape(port: int) -> dict[str, float]:
    """The broker's /metrics as name{labels} -> value (comments dropped)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _cleaner_counter(metrics: dict[str, float], name: str) -> float:
    return metrics.get(f"shoal_log_cleaner_{name}_total", 0.0)


def _produce_keyed(
    producer: Producer, topic: str, keys: list[bytes], values: list[bytes], records: int, seed: int
) -> float:
    """Seconds to produce ``records`` keyed records, all acknowledged."""
    rng = random.Random(seed)
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err.str())

    picks = [rng.randrange(len(keys)) for _ in range(records)]
    started = time.perf_counter()
    for i, k in enumerate(picks):
        produce_waiting(
            producer, topic, values[i % len(values)], key=keys[k], on_delivery=delivered
        )
    return flush_or_raise(producer, failures, started)


def _produce_once(
    root: Path, cleaner_on: bool, records: int, record_bytes: int, key_count: int, seed: int
) -> dict[str, Any]:
    metrics_port = free_port()
    env = {
        "SHOAL_LOG_CLEANER_ENABLE": "true" if cleaner_on else "false",
        "SHOAL_LOG_CLEANER_BACKOFF_MS": str(CLEANER_BACKOFF_MS),
        "SHOAL_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
    }
    root.mkdir(parents=True)
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    rng = random.Random(seed)
    keys = [f"key-{k:06d}".encode() for k in range(key_count)]
    values = [rng.randbytes(record_bytes) for _ in range(256)]
    try:
        with LocalCluster(root, env=env) as cluster:
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            new = NewTopic(topic, 1, 1, config=PRODUCE_TOPIC_CONFIG)
            admin.create_topics([new])[topic].result(30)
            producer = Producer(
                {
                    "bootstrap.servers": cluster.bootstrap,
                    "acks": "1",
                    "linger.ms": 5,
                    "batch.size": 1_000_000,
                    "queue.buffering.max.kbytes": 512 * 1024,
                }
            )
            # Metadata and the first request outside the measurement.
            producer.produce(topic, values[0], keys[0])
            producer.flush(30)
            metrics_before = _scrape(metrics_port)
            cpu_before = cpu_seconds(cluster.broker_pid)
            elapsed = _produce_keyed(producer, topic, keys, values, records, seed)
            cpu = cpu_seconds(cluster.broker_pid) - cpu_before
            metrics_after = _scrape(metrics_port)
            # Clients outlive no broker: they would log a reconnect per second to stderr.
            del producer, admin
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mb = records * record_bytes / 1e6
    read, recopied, cleans = (
        _cleaner_counter(metrics_after, n) - _cleaner_counter(metrics_before, n)
        for n in ("bytes_read", "bytes_recopied", "cleans")
    )
    return {
        "cleaner": "on" if cleaner_on else "off",
        "produce_mb_per_s": mb / elapsed,
        "elapsed_s": elapsed,
        "broker_cpu": cpu / elapsed,
        "broker_cpu_s_per_gb": cpu / (mb / 1000),
        "cleaner_bytes_read": read,
        "cleaner_bytes_recopied": recopied,
        "cleaner_mb_per_s": read / elapsed / 1e6,
        "cleans": cleans,
        "log_bytes_at_end": metrics_after.get(f'shoal_broker_log_size_bytes{{topic="{topic}"}}'),
    }


def produce(
    root: Path, runs: int, records: int, record_bytes: int, key_count: int
) -> list[dict[str, Any]]:
    measured: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for run in range(runs):
        # Alternating the order spreads the drift of a shared machine over both settings.
        order = (False, True) if run % 2 == 0 else (True, False)
        for cleaner_on in order:
            result = _produce_once(
                root / f"produce-{run}-{int(cleaner_on)}",
                cleaner_on,
                records,
                record_bytes,
                key_count,
                run,
            )
            print(
                f"  run {run + 1}, cleaner {result['cleaner']}: "
                f"{result['produce_mb_per_s']:.1f} MB/s, broker CPU {result['broker_cpu']:.2f},"
                f" cleaner read {result['cleaner_bytes_read'] / 1e6:.0f} MB"
            )
            measured[cleaner_on].append(result)
    rows = []
    for cleaner_on in (False, True):
        runs_of = measured[cleaner_on]
        numeric = [k for k in runs_of[0] if all(isinstance(r[k], int | float) for r in runs_of)]
        row: dict[str, Any] = {"cleaner": "on" if cleaner_on else "off"}
        row.update(_median_row(runs_of, numeric))
        row["runs"] = runs_of
        rows.append(row)
    return rows


# -- report -------------------------------------------------------------------------------


def _ratio(value: float, limit: float | None) -> str:
    return f"{value / limit:.3f}" if limit else "-"


def report(results: dict[str, Any], limits: dict[str, float]) -> None:
    disk = limits.get("disk_write_MBps")
    page_cache = limits.get("pagecache_write_MBps")
    print("\nmachine limits:", json.dumps(limits))
    if rows := results.get("throughput"):
        print(
            f"\n1. cleaner throughput, one clean of a fresh log, {MAP_ENTRIES:,}-key map,"
            " no throttle (medians)\n"
        )
        print(
            f"{'codec':<7}{'log MB':>8}{'kept MB':>9}{'MB/s':>8}{'vs disk write':>15}"
            f"{'MB/core-s':>11}{'records/core-s':>16}"
        )
        for r in rows:
            print(
                f"{r['codec']:<7}{r['log_bytes'] / 1e6:>8.1f}{r['bytes_kept'] / 1e6:>9.2f}"
                f"{r['mb_per_s']:>8.1f}{_ratio(r['mb_per_s'], disk):>15}"
                f"{r['mb_per_core_s']:>11.1f}{r['records_per_core_s']:>16,.0f}"
            )
    if t := results.get("takeover"):
        print(
            f"\n2. {OFFSETS_TOPIC} takeover: {t['records']:,} records ({t['groups']} groups x"
            f" {t['partitions_per_group']} partitions x {t['commits_per_partition']} commits,"
            f" one partition), {t['segment_bytes'] >> 20} MiB segments;"
            f" replay median of {t['load_runs']}\n"
        )
        print(
            f"{'':<16}{'log MB':>8}{'segments':>10}{'active MB':>11}{'load s':>8}"
            f"{'load CPU s':>12}{'log MB/s':>10}{'vs disk write':>15}"
        )
        for name in ("before", "after"):
            s = t[name]
            rate = s["log_bytes"] / s["load_s"] / 1e6
            print(
                f"{name + ' cleaning':<16}{s['log_bytes'] / 1e6:>8.1f}{s['segments']:>10}"
                f"{s['active_segment_bytes'] / 1e6:>11.1f}{s['load_s']:>8.2f}"
                f"{s['load_cpu_s']:>12.2f}{rate:>10.1f}{_ratio(rate, disk):>15}"
            )
        c = t["cleaning"]
        print(
            f"\ncleaning: {c['cleans']} clean(s), {c['clean_s']:.1f} s"
            f" ({c['clean_cpu_s']:.1f} CPU s), read {c['cleaner_bytes_read'] / 1e6:.1f} MB,"
            f" wrote {c['cleaner_bytes_recopied'] / 1e6:.2f} MB; takeover"
            f" {t['before']['load_s'] / t['after']['load_s']:.1f}x faster after;"
            f" {t['loaded_groups']} groups, {t['loaded_offsets']:,} offsets loaded,"
            " identical before and after"
        )
    if rows := results.get("produce"):
        print(
            "\n3. produce to a compacted topic, one broker, confluent-kafka acks=1,"
            f" cleaner on vs off (medians of {len(rows[0]['runs'])})\n"
        )
        print(
            f"{'cleaner':<9}{'MB/s':>8}{'vs off':>8}{'vs page cache':>15}{'broker CPU':>12}"
            f"{'CPU s/GB':>10}{'cleaner read MB':>17}{'cleans':>8}{'log MB at end':>15}"
        )
        off = rows[0]["produce_mb_per_s"]
        for r in rows:
            size = r.get("log_bytes_at_end")
            print(
                f"{r['cleaner']:<9}{r['produce_mb_per_s']:>8.1f}"
                f"{r['produce_mb_per_s'] / off:>8.2f}"
                f"{_ratio(r['produce_mb_per_s'], page_cache):>15}{r['broker_cpu']:>12.2f}"
                f"{r['broker_cpu_s_per_gb']:>10.1f}{r['cleaner_bytes_read'] / 1e6:>17.0f}"
                f"{r['cleans']:>8.0f}{(size or 0) / 1e6:>15.0f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--runs", type=int, default=3, help="throughput: fresh logs per codec")
    parser.add_argument("--mb", type=int, default=64, help="throughput: MB of records per log")
    parser.add_argument("--keys", type=int, default=10_000, help="throughput: distinct keys")
    parser.add_argument("--groups", type=int, default=1000, help="takeover: consumer groups")
    parser.add_argument("--group-partitions", type=int, default=10, help="takeover")
    parser.add_argument(
        "--commits", type=int, default=100, help="takeover: commits per group partition"
    )
    parser.add_argument("--offsets-segment-mb", type=int, default=16, help="takeover")
    parser.add_argument("--load-runs", type=int, default=3, help="takeover: replays timed")
    parser.add_argument("--produce-runs", type=int, default=3, help="produce: on/off pairs")
    parser.add_argument("--produce-records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--produce-keys", type=int, default=10_000)
    parser.add_argument("--skip-limits", action="store_true", help="no limits measurement")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(
        prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")
    ) as tmp:
        root = Path(tmp)
        limits = {} if args.skip_limits else measure_limits(root)
        parts: dict[str, Callable[[], Any]] = {
            "throughput": lambda: throughput(root, args.mb, args.keys, args.runs),
            "takeover": lambda: takeover(
                root,
                args.groups,
                args.group_partitions,
                args.commits,
                args.offsets_segment_mb,
                args.load_runs,
            ),
            "produce": lambda: produce(
                root, args.produce_runs, args.produce_records, args.record_bytes, args.produce_keys
            ),
        }
        for part in PARTS:
            if part in args.parts:
                print(f"{part}...", flush=True)
                results[part] = parts[part]()
    report(results, limits)
    out = HERE / "results" / f"log-cleaner-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({**results, "limits": limits, "args": vars(args)}, indent=2))
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
