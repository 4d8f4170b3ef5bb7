"""Transactions: transactional produce next to idempotent, read_committed next to read_uncommitted.

    python -m shoal.benchmarks.transactions [--records N] [--runs R] [--intervals-ms MS ...]
                                            [--txn-records T] [--abort-every K]
                                            [--parts produce consume] [--quick]
                                            [--skip-limits] [--keep]

Starts etcd and three brokers in a temporary directory on the disk the limits
are measured on (``../shared/tools/limits``, in the same invocation;
``SHOAL_BENCH_DIR`` picks another), topics of replication factor 3 with
``min.insync.replicas=2`` (``__consumer_offsets`` and ``__transaction_state``
too), and measures, every client a confluent-kafka (librdkafka) process of
its own, as the suite's workers are:

**Produce**: one producer, ``acks=all``, ``linger.ms=5``, N (200,000)
records of 1 KiB random bytes flat out into a fresh one-partition topic:

* ``idempotent``: ``enable.idempotence=true``, the baseline;
* ``txn <MS> ms``: a ``transactional.id``, one transaction open at a time,
  committed as soon as it has been open ``MS`` ms (``--intervals-ms``, 100
  and 1000; counted from ``begin_transaction`` after the previous commit, as
  Kafka Streams counts ``commit.interval.ms``), the last one when the
  records run out. A commit waits until every record of the transaction is
  acknowledged and the coordinator has decided (EndTxn), so each commit
  drains librdkafka's queue: flat out, a transaction holds what
  ``produce()`` queued in ``MS`` ms, far more than the cluster acknowledges
  in that time, and its commit lasts until they are acknowledged. That
  pause is what the ratio to ``idempotent`` prices.

Each producer first sends one unmeasured record (in a committed transaction
for the transactional ones): librdkafka's idempotent producer waits about
half a second for its producer id, and ``init_transactions`` more. R (3)
runs of each, in an order rotated from run to run so that a shared machine's
drift falls on all of them; medians of records/s and MB/s, and their ratio
to ``idempotent``'s.

**Consume**: one more topic is filled by a transactional producer whose
transactions hold at most ``--txn-records`` (1,000) records and 100 ms, every
K-th (10th) aborted (``--abort-every``, 0 for none) once its records are
acknowledged, so the log holds commit and abort markers and aborted records.
Once its last stable offset has reached the high watermark, a consumer
reads the partition from the start to its end, R times with
``isolation.level=read_uncommitted`` and R times with ``read_committed``
(librdkafka's default), alternating. read_uncommitted hands over every
record, aborted ones included; read_committed only the committed ones, and
drops the aborted ones using the aborted transactions the broker lists in
each fetch answer. **log records/s** counts every data record in the log
(what both read through) per second, so its ratio is the like-for-like
cost of read_committed; **records/s** and **MB/s** count what the
application got. Both readers must get exactly the records they should, or
the run fails.

MB is 10^6 bytes of record values. Produce MB/s is set beside
``pagecache_write_MBps / 3`` (three replicas share this machine's page
cache), consume MB/s beside ``loopback_MBps``. The brokers' CPU (the sum of
the three, as a share of one core) is given for each phase. Every run is in
the JSON written to ``benchmarks/results/``. ``--keep`` keeps the temporary
directory (broker logs, data); it is also kept when a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from shoal.benchmarks.common import (
    HERE,
    LocalCluster,
    cpu_seconds,
    flush_or_raise,
    measure_limits,
    produce_waiting,
)
from shoal.benchmarks.replicated import (
    BROKERS,
    REPLICATION_FACTOR,
    Topics,
    broker_env,
    wait_until,
)

RECORD_SIZE = 1024
SESSION_TIMEOUT_MS = 9000
"""The brokers' session timeout: the default; nothing is killed here."""
FILL_INTERVAL_MS = 100
"""The commit interval of the producer that fills the consume part's topic."""
WORKER_TIMEOUT_S = 900
IDLE_TIMEOUT_S = 30.0
"""A reader that gets nothing for this long gives up."""
IDEMPOTENT = "idempotent"


def producer_config(bootstrap: str, transactional_id: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.kbytes": 512 * 1024,
    }
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    return config


def mode_name(interval_ms: int | None) -> str:
    return IDEMPOTENT if interval_ms is None else f"txn {interval_ms} ms"


# -- the client processes -------------------------------------------------------------------


def produce_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Produce ``records`` records flat out, in transactions of ``interval_ms`` if given.

    Returns seconds from the first measured produce() to the last commit (or
    acknowledgement), the records committed and aborted, each commit's
    duration, and this process's CPU seconds over the measurement.
    """
    interval_ms: int | None = spec["interval_ms"]
    abort_every: int = spec.get("abort_every", 0)
    txn_records: int = spec.get("txn_records") or spec["records"]
    topic, records = spec["topic"], spec["records"]
    transactional = interval_ms is not None
    txn_id = f"bench-txn-{uuid.uuid4().hex[:8]}" if transactional else None
    producer = Producer(producer_config(spec["bootstrap"], txn_id))
    value = os.urandom(RECORD_SIZE)
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err.str())

    # One unmeasured record: the producer id (and, transactional, the coordinator's
    # lookup and init_transactions) comes before the measurement.
    if transactional:
        producer.init_transactions(60)
        producer.begin_transaction()
    producer.produce(topic, value, on_delivery=delivered)
    if transactional:
        producer.commit_transaction(60)
    flush_or_raise(producer, failures, time.perf_counter())

    brokers = brokers_cpu(spec["broker_pids"])
    cpu = time.process_time()
    started = time.perf_counter()
    if interval_ms is not None:
        counts = _produce_in_transactions(
            producer, topic, value, records, (interval_ms / 1000, txn_records), abort_every,
            delivered,
        )  # fmt: skip
        elapsed = time.perf_counter() - started
    else:
        for _ in range(records):
            produce_waiting(producer, topic, value, on_delivery=delivered)
        elapsed = flush_or_raise(producer, failures, started)
        counts = {"committed": records, "aborted": 0, "transactions": 0, "commits": []}
    cpu = time.process_time() - cpu
    brokers = brokers_cpu(spec["broker_pids"]) - brokers
    if failures:
        raise RuntimeError(f"{len(failures)} records failed: {failures[:3]}")
    commits = counts.pop("commits")
    return {
        "seconds": elapsed,
        **counts,
        "warm_up": 1,
        "commit_ms_p50": statistics.median(commits) * 1000 if commits else None,
        "commit_ms_max": max(commits) * 1000 if commits else None,
        "client_cpu_s": cpu,
        "broker_cpu_s": brokers,
    }


def _produce_in_transactions(
    producer: Producer,
    topic: str,
    value: bytes,
    records: int,
    limit: tuple[float, int],
    abort_every: int,
    delivered: Callable[[KafkaError | None, Any], None],
) -> dict[str, Any]:
    """Flat out, a transaction ended once it has been open ``limit[0]`` seconds or
    holds ``limit[1]`` records; every ``abort_every``-th aborted (0: none).
    Returns the records committed and aborted, the transactions, and each
    commit's seconds."""
    interval_s, txn_records = limit
    commits: list[float] = []
    committed = aborted = in_txn = transactions = 0
    producer.begin_transaction()
    opened = time.perf_counter()
    for i in range(records):
        produce_waiting(producer, topic, value, on_delivery=delivered)
        in_txn += 1
        now = time.perf_counter()
        if now - opened >= interval_s or in_txn >= txn_records or i == records - 1:
            transactions += 1
            if abort_every and transactions % abort_every == 0:
                # Written first, so that the log holds the aborted records: an abort
                # purges what is still queued.
                if producer.flush(60):
                    raise RuntimeError("records of a transaction to abort not acknowledged")
                producer.abort_transaction(60)
                aborted += in_txn
            else:
                producer.commit_transaction(60)
                committed += in_txn
                commits.append(time.perf_counter() - now)
            in_txn = 0
            if i < records - 1:
                producer.begin_transaction()
                opened = time.perf_counter()
    return {
        "committed": committed,
        "aborted": aborted,
        "transactions": transactions,
        "commits": commits,
    }


def consume_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Read every partition of ``topic`` from the start to its end (the last stable
    offset for read_committed): records and value bytes handed over, and seconds
    from assign() to the end of the last partition."""
    topic, partitions = spec["topic"], spec["partitions"]
    consumer = Consumer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "group.id": f"bench-read-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": spec["isolation"],
        }
    )
    try:
        brokers = brokers_cpu(spec["broker_pids"])
        cpu = time.process_time()
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        count = size = 0
        at_end: set[int] = set()
        last = started
        while len(at_end) < partitions:
            messages = consumer.consume(10_000, 0.5)
            now = time.perf_counter()
            if not messages and now - last > IDLE_TIMEOUT_S:
                raise RuntimeError(f"nothing read for {IDLE_TIMEOUT_S:.0f} s after {count}")
            for message in messages:
                error = message.error()
                if error is None:
                    count += 1
                    size += len(message.value() or b"")
                    at_end.discard(message.partition())
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                else:
                    raise RuntimeError(f"read failed: {error.str()}")
            if messages:
                last = now
        elapsed = time.perf_counter() - started
        return {
            "records": count,
            "bytes": size,
            "seconds": elapsed,
            "client_cpu_s": time.process_time() - cpu,
            "broker_cpu_s": brokers_cpu(spec["broker_pids"]) - brokers,
        }
    finally:
        consumer.close()


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one client role in a process of its own; its one JSON line back.

    Started by this file's path, so that it runs however this script was started
    (the imports are ``shoal.benchmarks``'s, not the folder's)."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        timeout=WORKER_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{spec['role']} worker failed (exit {done.returncode}): {spec}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the measurements -----------------------------------------------------------------------


def brokers_cpu(pids: list[int]) -> float:
    """The brokers' CPU seconds, summed: read by the clients around their measurement."""
    return sum(cpu_seconds(pid) for pid in pids)


def broker_pids(cluster: LocalCluster) -> list[int]:
    return [cluster.pid(node) for node in range(BROKERS)]


def produce_run(
    cluster: LocalCluster, topics: Topics, interval_ms: int | None, records: int
) -> dict[str, Any]:
    topic = topics.create("txn-produce" if interval_ms else "idempotent", 1)
    result = run_worker(
        {
            "role": "produce",
            "bootstrap": cluster.bootstrap,
            "topic": topic,
            "records": records,
            "interval_ms": interval_ms,
            "broker_pids": broker_pids(cluster),
        }
    )
    seconds = result["seconds"]
    return {
        "mode": mode_name(interval_ms),
        "interval_ms": interval_ms,
        "topic": topic,
        "records": records,
        "records_per_s": records / seconds,
        "mb_per_s": records * RECORD_SIZE / 1e6 / seconds,
        "records_per_txn": records / result["transactions"] if result["transactions"] else None,
        **result,
    }


def stable_offsets(bootstrap: str, topic: str) -> tuple[int, int]:
    """(last stable offset, high watermark) of partition 0."""
    ends = []
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "bench-watermarks",
                "isolation.level": isolation,
            }
        )
        try:
            ends.append(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
        finally:
            consumer.close()
    return ends[0], ends[1]


def fill(
    cluster: LocalCluster, topics: Topics, records: int, txn_records: int, abort_every: int
) -> dict[str, Any]:
    """A topic of transactions of at most ``txn_records`` records and 100 ms, every
    ``abort_every``-th aborted."""
    topic = topics.create("txn-read", 1)
    result = run_worker(
        {
            "role": "produce",
            "bootstrap": cluster.bootstrap,
            "topic": topic,
            "records": records,
            "interval_ms": FILL_INTERVAL_MS,
            "txn_records": txn_records,
            "abort_every": abort_every,
            "broker_pids": broker_pids(cluster),
        }
    )
    # The markers of the last transaction may land a moment after its commit returned.
    wait_until(
        lambda: len(set(stable_offsets(cluster.bootstrap, topic))) == 1,
        60,
        f"the last stable offset of {topic} to reach its high watermark",
    )
    _, end = stable_offsets(cluster.bootstrap, topic)
    return {"topic": topic, "log_end_offset": end, **result}


def consume_run(cluster: LocalCluster, filled: dict[str, Any], isolation: str) -> dict[str, Any]:
    everything = filled["warm_up"] + filled["committed"] + filled["aborted"]
    expected = everything if isolation == "read_uncommitted" else everything - filled["aborted"]
    result = run_worker(
        {
            "role": "consume",
            "bootstrap": cluster.bootstrap,
            "topic": filled["topic"],
            "partitions": 1,
            "isolation": isolation,
            "broker_pids": broker_pids(cluster),
        }
    )
    if result["records"] != expected:
        raise RuntimeError(
            f"{isolation} read {result['records']} records, expected {expected}"
            f" ({filled['committed']} committed, {filled['aborted']} aborted, 1 warm-up)"
        )
    seconds = result["seconds"]
    return {
        "isolation": isolation,
        "records_per_s": result["records"] / seconds,
        "mb_per_s": result["bytes"] / 1e6 / seconds,
        "log_records_per_s": everything / seconds,
        **result,
    }


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


# -- report ---------------------------------------------------------------------------------


def _ratio(value: float, limit: float | None) -> str:
    return f"{value / limit:.3f}" if limit else "-"


def report(
    produce: dict[str, list[dict[str, Any]]],
    consume: dict[str, list[dict[str, Any]]],
    filled: dict[str, Any] | None,
    limits: dict[str, float],
    settings: dict[str, Any],
) -> dict[str, Any]:
    page_cache = limits.get("pagecache_write_MBps")
    per_replica = page_cache / REPLICATION_FACTOR if page_cache else None
    loopback = limits.get("loopback_MBps")
    summary: dict[str, Any] = {"produce": {}, "consume": {}}
    print(
        f"\n{BROKERS} brokers, replication factor {REPLICATION_FACTOR}, min.insync.replicas=2,"
        f" acks=all, linger.ms=5, one partition, {settings['records']:,} records of"
        f" {RECORD_SIZE} B per run"
    )
    if produce:
        base = produce.get(IDEMPOTENT)
        print(f"\nproduce, medians of {settings['runs']} run(s)\n")
        print(
            f"{'producer':<14}{'records/s':>11}{'MB/s':>8}{'/ idempotent':>14}"
            f"{'/ page cache/3':>16}{'txns':>6}{'records/txn':>13}{'commit ms p50':>15}"
            f"{'broker CPU':>12}{'client CPU':>12}"
        )
        for mode, runs in produce.items():
            rps, mbps = median_of(runs, "records_per_s"), median_of(runs, "mb_per_s")
            seconds = median_of(runs, "seconds")
            row: dict[str, Any] = {
                "records_per_s": rps,
                "mb_per_s": mbps,
                "ratio_to_idempotent": rps / median_of(base, "records_per_s") if base else None,
                "transactions": median_of(runs, "transactions"),
                "commit_ms_p50": (
                    statistics.median(r["commit_ms_p50"] for r in runs)
                    if runs[0]["commit_ms_p50"] is not None
                    else None
                ),
                "broker_cpu": median_of(runs, "broker_cpu_s") / seconds,
                "client_cpu": median_of(runs, "client_cpu_s") / seconds,
                "mb_per_s_each_run": [r["mb_per_s"] for r in runs],
            }
            summary["produce"][mode] = row
            ratio = row["ratio_to_idempotent"]
            per_txn = settings["records"] / row["transactions"] if row["transactions"] else None
            commit = row["commit_ms_p50"]
            print(
                f"{mode:<14}{rps:>11,.0f}{mbps:>8.1f}{(f'{ratio:.2f}' if ratio else '-'):>14}"
                f"{_ratio(mbps, per_replica):>16}{row['transactions']:>6.0f}"
                f"{(f'{per_txn:,.0f}' if per_txn else '-'):>13}"
                f"{(f'{commit:.1f}' if commit is not None else '-'):>15}"
                f"{row['broker_cpu']:>12.2f}{row['client_cpu']:>12.2f}"
            )
    if consume and filled:
        k = settings["abort_every"]
        aborts = f"every {k}th aborted" if k else "none aborted"
        print(
            f"\nconsume from the start, {filled['log_end_offset']:,} offsets:"
            f" {filled['committed'] + 1:,} records committed, {filled['aborted']:,} aborted"
            f" ({filled['transactions']} transactions of at most {settings['txn_records']:,}"
            f" records and {FILL_INTERVAL_MS} ms, {aborts}); medians of"
            f" {settings['runs']} run(s)\n"
        )
        print(
            f"{'isolation':<18}{'records':>9}{'records/s':>11}{'MB/s':>8}{'log records/s':>15}"
            f"{'/ uncommitted':>15}{'/ loopback':>12}{'broker CPU':>12}{'client CPU':>12}"
        )
        base_rate = median_of(consume["read_uncommitted"], "log_records_per_s")
        for isolation, runs in consume.items():
            seconds = median_of(runs, "seconds")
            row = {
                "records": runs[0]["records"],
                "records_per_s": median_of(runs, "records_per_s"),
                "mb_per_s": median_of(runs, "mb_per_s"),
                "log_records_per_s": median_of(runs, "log_records_per_s"),
                "broker_cpu": median_of(runs, "broker_cpu_s") / seconds,
                "client_cpu": median_of(runs, "client_cpu_s") / seconds,
            }
            row["ratio_to_read_uncommitted"] = row["log_records_per_s"] / base_rate
            summary["consume"][isolation] = row
            print(
                f"{isolation:<18}{row['records']:>9,}{row['records_per_s']:>11,.0f}"
                f"{row['mb_per_s']:>8.1f}{row['log_records_per_s']:>15,.0f}"
                f"{row['ratio_to_read_uncommitted']:>15.2f}"
                f"{_ratio(row['mb_per_s'], loopback):>12}{row['broker_cpu']:>12.2f}"
                f"{row['client_cpu']:>12.2f}"
            )
    print(
        "\nCPU is a share of one core over the measurement: the three brokers summed, and"
        " the client's process (librdkafka's threads included)."
    )
    print("\nmachine limits:", json.dumps(limits))
    return {
        "settings": settings,
        "median": summary,
        "produce_runs": produce,
        "consume_runs": consume,
        "filled": filled,
        "limits": limits,
    }


def measure(
    cluster: LocalCluster, args: argparse.Namespace
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]], dict[str, Any] | None]:
    """Every produce run, then the consume part's topic and its reads."""
    topics = Topics(cluster)
    modes: list[int | None] = [None, *args.intervals_ms]
    produce: dict[str, list[dict[str, Any]]] = {mode_name(m): [] for m in modes}
    consume: dict[str, list[dict[str, Any]]] = {"read_uncommitted": [], "read_committed": []}
    filled = None
    if "produce" in args.parts:
        for run in range(args.runs):
            # Rotating the order spreads a shared machine's drift over every mode.
            for mode in modes[run % len(modes) :] + modes[: run % len(modes)]:
                result = produce_run(cluster, topics, mode, args.records)
                produce[result["mode"]].append(result)
                print(
                    f"  run {run + 1}, {result['mode']}: {result['records_per_s']:,.0f}"
                    f" records/s, {result['mb_per_s']:.1f} MB/s,"
                    f" {result['transactions']} transactions",
                    flush=True,
                )
    if "consume" in args.parts:
        filled = fill(cluster, topics, args.records, args.txn_records, args.abort_every)
        for run in range(args.runs):
            order = list(consume) if run % 2 == 0 else list(consume)[::-1]
            for isolation in order:
                result = consume_run(cluster, filled, isolation)
                consume[isolation].append(result)
                print(
                    f"  run {run + 1}, {isolation}: {result['records']:,} records,"
                    f" {result['records_per_s']:,.0f} records/s",
                    flush=True,
                )
    return produce, consume, filled


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="per produce run")
    parser.add_argument("--runs", type=int, default=3, help="runs of each producer and reader")
    parser.add_argument(
        "--intervals-ms", type=int, nargs="+", default=[100, 1000], help="commit intervals"
    )
    parser.add_argument(
        "--txn-records",
        type=int,
        default=1000,
        help="consume topic: records per transaction (at most; and at most 100 ms)",
    )
    parser.add_argument(
        "--abort-every", type=int, default=10, help="consume topic: abort every K-th transaction"
    )
    parser.add_argument(
        "--parts", nargs="+", choices=("produce", "consume"), default=["produce", "consume"]
    )
    parser.add_argument("--quick", action="store_true", help="20,000 records, one run")
    parser.add_argument("--skip-limits", action="store_true", help="no limits measurement")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        worker = produce_worker if spec["role"] == "produce" else consume_worker
        print(json.dumps(worker(spec)), flush=True)
        return
    if args.quick:
        args.records, args.runs = 20_000, 1
    settings = {
        "records": args.records,
        "record_bytes": RECORD_SIZE,
        "runs": args.runs,
        "intervals_ms": args.intervals_ms,
        "txn_records": args.txn_records,
        "abort_every": args.abort_every,
        "brokers": BROKERS,
        "replication_factor": REPLICATION_FACTOR,
        "min_insync_replicas": 2,
    }
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")))
    keep = args.keep
    try:
        limits = {} if args.skip_limits else measure_limits(root)
        with LocalCluster(root, brokers=BROKERS, env=broker_env(SESSION_TIMEOUT_MS)) as cluster:
            produce, consume, filled = measure(cluster, args)
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"kept {root} (broker-N.log, etcd.log, data)")
        else:
            shutil.rmtree(root, ignore_errors=True)
    result = report(
        {k: v for k, v in produce.items() if v},
        {k: v for k, v in consume.items() if v},
        filled,
        limits,
        settings,
    )
    out = HERE / "results" / f"transactions-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
