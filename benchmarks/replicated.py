"""Three brokers, replication factor 3: acks=all throughput and latency, leader failover time.

    python -m shoal.benchmarks.replicated [--records N] [--runs R] [--partitions P ...]
                                          [--rounds K] [--session-timeout-ms MS] [--keep]

Starts etcd and three brokers in a temporary directory on the disk the limits
are measured on, with topics of replication factor 3 and
``min.insync.replicas=2`` (``__consumer_offsets`` too), and measures:

* **acks=all throughput**: one confluent-kafka producer, ``acks=all``,
  ``enable.idempotence=true``, ``linger.ms=5``, N (100000) records of 1 KiB
  flat out into a fresh topic, R (5) times with one partition and R times
  with three. Records/s, MB/s, delivery latency from ``produce()`` to the
  delivery report (flat out, so mostly time queued in the client), and the
  CPU share of each broker, of etcd and of this process. On one machine every
  byte is written three times, once per replica, so the ceiling is a third of
  the disk's (and of the page cache's) write bandwidth, measured by
  ``../shared/tools/limits`` in the same run.
* **leader failover**: K (5) rounds, each on a fresh single-partition topic:
  an idempotent acks=all producer at a steady 500 records/s (its latency
  before the kill is the unloaded latency), SIGKILL of the partition's leader
  after 3 s, the pause in acknowledgements the producer sees, then a consumer
  that checks every acknowledged record is readable at its offset exactly
  once, in order. The killed broker is started again with the same id and
  data, and the next round waits until it is back in the ISR.

A SIGKILLed broker tells nobody, but its port is closed: a peer that
knocks on it (every ``SHOAL_BROKER_PEER_PROBE_INTERVAL_MS``, 500 ms) and is
refused revokes its lease at once, and the controller moves its leaderships.
Before that knock existed the pause was the broker's lease,
``SHOAL_BROKER_SESSION_TIMEOUT_MS`` (then 9000 ms, Kafka's
``broker.session.timeout.ms``), which still bounds it for a frozen broker.
librdkafka adds up to two seconds: it asks for metadata once a second while
the leader is unreachable, and an answer that names the new leader and drops
the dead broker at once parks the partition until the next answer (see
README.md).

Throughput figures are medians over the runs, failover figures medians over
the rounds; every run and round is in the JSON written to
``benchmarks/results/``. ``--keep`` keeps the temporary directory (broker
logs, data); it is also kept, and its path printed, when a check fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from shoal.benchmarks.common import (
    LocalCluster,
    cpu_seconds,
    measure_limits,
    produce_flat_out,
    write_results,
)

RECORD_SIZE = 1024
BROKERS = 3
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
FAILOVER_RATE = 500
"""Records per second of the producer that watches a failover."""
STEADY_S = 3.0
"""How long that producer runs before the leader is killed, and after acks resume."""
WARM_UP_S = 1.0
"""Its first second is left out of its latency: librdkafka's idempotent producer waits
about 500 ms for a producer id when it starts."""


def broker_env(session_timeout_ms: int) -> dict[str, str]:
    return {
        "SHOAL_DEFAULT_REPLICATION_FACTOR": str(REPLICATION_FACTOR),
        "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": str(REPLICATION_FACTOR),
        "SHOAL_TOPIC_DEFAULTS": json.dumps({"min.insync.replicas": str(MIN_INSYNC_REPLICAS)}),
        "SHOAL_BROKER_SESSION_TIMEOUT_MS": str(session_timeout_ms),
    }


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


class Topics:
    """Topic creation and partition state, through one AdminClient.

    The client is kept for the benchmark's whole run: dropping an AdminClient
    while its futures are pending fails them with ``_DESTROY``.
    """

    def __init__(self, cluster: LocalCluster) -> None:
        self.admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    def create(self, prefix: str, partitions: int) -> str:
        topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
        futures = self.admin.create_topics([NewTopic(topic, partitions, REPLICATION_FACTOR)])
        futures[topic].result(30)
        wait_until(lambda: self.fully_in_sync(topic, partitions), 60, f"{topic} in sync")
        return topic

    def partitions(self, topic: str) -> dict[int, tuple[int, tuple[int, ...]]]:
        """(leader, ISR) by partition; empty while the broker asked cannot say."""
        try:
            metadata = self.admin.list_topics(topic, timeout=5)
        except KafkaException:
            return {}
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return {}
        return {p.id: (p.leader, tuple(sorted(p.isrs))) for p in found.partitions.values()}

    def leader(self, topic: str) -> int:
        """Leader of partition 0, -1 if none or unknown."""
        return self.partitions(topic).get(0, (-1, ()))[0]

    def fully_in_sync(self, topic: str, partitions: int) -> bool:
        views = self.partitions(topic)
        return len(views) == partitions and all(
            leader >= 0 and len(isr) == REPLICATION_FACTOR for leader, isr in views.values()
        )

    def min_insync_replicas(self, topic: str) -> str:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        configs = self.admin.describe_configs([resource])[resource].result(30)
        return str(configs["min.insync.replicas"].value)


def producer_config(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.kbytes": 512 * 1024,
    }


@dataclass
class ThroughputRun:
    partitions: int
    records: int
    seconds: float
    records_per_s: float
    mb_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    leaders: list[int]
    """Leader of each partition."""
    broker_cpu: list[float]
    """Share of one core each broker (by node id) used while producing."""
    etcd_cpu: float
    client_cpu: float
    """Share of one core this process (the producer, librdkafka's threads) used."""


def throughput_run(
    cluster: LocalCluster, topics: Topics, partitions: int, records: int
) -> ThroughputRun:
    topic = topics.create(f"acks-all-{partitions}p", partitions)
    leaders = [leader for _, (leader, _) in sorted(topics.partitions(topic).items())]
    producer = Producer(producer_config(cluster.bootstrap))
    value = os.urandom(RECORD_SIZE)
    # One record first: librdkafka's idempotent producer waits about 500 ms for a
    # producer id when it starts, which would count against the first records.
    producer.produce(topic, value)
    if producer.flush(30):
        raise RuntimeError("the warm-up record was not acknowledged")
    pids = [cluster.pid(node) for node in range(BROKERS)]
    assert cluster.etcd is not None
    cpu_before = [cpu_seconds(pid) for pid in pids]
    etcd_before, client_before = cpu_seconds(cluster.etcd.pid), time.process_time()
    elapsed, latencies = produce_flat_out(producer, topic, value, records)
    cpu_after = [cpu_seconds(pid) for pid in pids]
    etcd_cpu = (cpu_seconds(cluster.etcd.pid) - etcd_before) / elapsed
    client_cpu = (time.process_time() - client_before) / elapsed
    stored = high_watermarks(cluster.bootstrap, topic, partitions)
    if sum(stored) != records + 1:
        raise RuntimeError(f"produced {records} + 1 records, the topic holds {stored}")
    quantiles = statistics.quantiles(latencies, n=100)
    return ThroughputRun(
        partitions,
        records,
        elapsed,
        records / elapsed,
        records * RECORD_SIZE / 1e6 / elapsed,
        quantiles[49] * 1000,
        quantiles[98] * 1000,
        leaders,
        [(after - before) / elapsed for before, after in zip(cpu_before, cpu_after, strict=True)],
        etcd_cpu,
        client_cpu,
    )


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        ]
    finally:
        consumer.close()


@dataclass
class SteadyProducer:
    """An idempotent acks=all producer at a steady rate, in a thread.

    Each 1 KiB value starts with its sequence number in ten digits; every
    acknowledgement is kept with its offset, the monotonic time its delivery
    report ran, and how long after ``produce()`` that was.
    """

    bootstrap: str
    topic: str
    rate: int = FAILOVER_RATE
    acked: list[tuple[int, int, float, float]] = field(default_factory=list)
    """(sequence, offset, time acknowledged, seconds since produce())"""
    errors: list[str] = field(default_factory=list)
    unflushed: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> SteadyProducer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        producer = Producer(producer_config(self.bootstrap))
        padding = bytes(RECORD_SIZE - 10)
        sent_at: list[float] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            now = time.monotonic()
            if err is not None:
                self.errors.append(err.str())
            else:
                seq = int(msg.value()[:10])
                self.acked.append((seq, msg.offset(), now, now - sent_at[seq]))

        next_at = time.monotonic()
        while not self._stop.is_set():
            value = b"%010d" % len(sent_at) + padding
            sent_at.append(time.monotonic())
            producer.produce(self.topic, value, on_delivery=delivered)
            next_at += 1 / self.rate
            producer.poll(max(0.0, next_at - time.monotonic()))
        self.unflushed = producer.flush(60)

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(90)

    def acked_after(self, moment: float) -> int:
        return sum(1 for _, _, t, _ in self.acked if t > moment)


@dataclass
class FailoverRound:
    victim: int
    """The partition's leader, killed with SIGKILL."""
    new_leader: int
    gap_s: float
    """The longest pause between acknowledgements that ends after the kill: from the
    last acknowledgement before it to the first after it."""
    kill_to_new_leader_s: float
    """From the kill until metadata names another leader (polled every 50 ms)."""
    kill_to_ack_s: float
    """From the kill until the first acknowledgement after the pause."""
    steady_latency_p50_ms: float
    """Delivery latency at the steady rate, before the kill, after the first second."""
    steady_latency_p99_ms: float
    acked: int
    read: int
    lost: int
    """Acknowledged records not read back at their acknowledged offset."""
    duplicates: int
    problems: list[str]
    restart_to_ready_s: float
    restart_to_isr_s: float
    """From starting the killed broker again until it is back in the partition's ISR."""


def failover_gap(ack_times: list[float], killed_at: float) -> tuple[float, float]:
    """(longest pause between acknowledgements ending after the kill, that pause's end).

    A delivery report that runs a moment after the kill for a request the
    broker answered before it would otherwise count as the first "after".
    """
    times = sorted(ack_times)
    pauses = [(b - a, b) for a, b in itertools.pairwise(times) if b > killed_at]
    return max(pauses)


def read_back(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """(offset, sequence) of every record of partition 0, up to the high watermark."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-verify-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        records: list[tuple[int, int]] = []
        deadline = time.monotonic() + 60
        while end and (not records or records[-1][0] < end - 1) and time.monotonic() < deadline:
            records.extend(
                (message.offset(), int(message.value()[:10]))
                for message in consumer.consume(1000, 0.5)
                if message.error() is None
            )
        return records
    finally:
        consumer.close()


def check(
    acked: list[tuple[int, int, float, float]], stored: list[tuple[int, int]]
) -> dict[str, Any]:
    problems = []
    offsets = [o for o, _ in stored]
    if offsets != list(range(len(offsets))):
        problems.append("offsets read back are not 0, 1, 2, ...")
    sequences = [s for _, s in stored]
    duplicates = len(sequences) - len(set(sequences))
    if duplicates:
        problems.append(f"{duplicates} records stored twice")
    if sequences != sorted(sequences):
        problems.append("records stored out of the order they were produced")
    at = dict(stored)
    lost = [seq for seq, offset, _, _ in acked if at.get(offset) != seq]
    if lost:
        problems.append(f"{len(lost)} acknowledged records missing or moved, first {lost[:5]}")
    return {"read": len(stored), "lost": len(lost), "duplicates": duplicates, "problems": problems}


def failover_round(cluster: LocalCluster, topics: Topics) -> FailoverRound:
    topic = topics.create("failover", 1)
    victim = topics.leader(topic)
    producer = SteadyProducer(cluster.bootstrap, topic).start()
    try:
        time.sleep(STEADY_S)
        if not producer.acked:
            raise RuntimeError(f"no acknowledgements in {STEADY_S} s before the kill")
        killed_at = time.monotonic()
        cluster.kill(victim)

        wait_until(lambda: topics.leader(topic) not in (-1, victim), 120, "a new leader")
        elected_at = time.monotonic()
        new_leader = topics.leader(topic)
        wait_until(lambda: producer.acked_after(elected_at), 120, "acknowledgements again")
        time.sleep(STEADY_S)
    finally:
        producer.stop()
    gap, resumed_at = failover_gap([t for _, _, t, _ in producer.acked], killed_at)
    first_sent = min(t - latency for _, _, t, latency in producer.acked)
    steady = statistics.quantiles(
        [
            latency
            for _, _, t, latency in producer.acked
            if first_sent + WARM_UP_S <= t - latency and t <= killed_at
        ],
        n=100,
    )
    outcome = check(producer.acked, read_back(cluster.live_bootstrap(), topic))
    if producer.errors or producer.unflushed:
        outcome["problems"].append(
            f"{len(producer.errors)} delivery errors, {producer.unflushed} never reported:"
            f" {producer.errors[:3]}"
        )
    restarted = time.monotonic()
    cluster.start(victim)
    ready = time.monotonic()
    wait_until(lambda: topics.fully_in_sync(topic, 1), 120, f"broker {victim} back in the ISR")
    return FailoverRound(
        victim=victim,
        new_leader=new_leader,
        gap_s=gap,
        kill_to_new_leader_s=elected_at - killed_at,
        kill_to_ack_s=resumed_at - killed_at,
        steady_latency_p50_ms=steady[49] * 1000,
        steady_latency_p99_ms=steady[98] * 1000,
        acked=len(producer.acked),
        restart_to_ready_s=ready - restarted,
        restart_to_isr_s=time.monotonic() - restarted,
        **outcome,
    )


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(
    runs: list[ThroughputRun],
    rounds: list[FailoverRound],
    limits: dict[str, float],
    settings: dict[str, Any],
) -> dict[str, Any]:
    print(
        f"\n{BROKERS} brokers, replication factor {REPLICATION_FACTOR},"
        f" min.insync.replicas={settings['min_insync_replicas']},"
        f" broker session timeout {settings['session_timeout_ms']} ms"
    )
    print(f"{'figure':<34}{'value':>10}  {'ceiling':<24}{'ceiling value':>14}{'ratio':>8}")

    def row(name: str, value: float, ceiling: tuple[str, float | None] = ("", None)) -> None:
        label, limit = ceiling
        shown, ratio = (f"{limit:.1f}", f"{value / limit:.2f}") if limit else ("", "")
        print(f"{name:<34}{value:>10.2f}  {label if limit else '':<24}{shown:>14}{ratio:>8}")

    def per_replica(key: str) -> tuple[str, float | None]:
        """A write ceiling shared by the replicas: each byte is written once per replica."""
        limit = limits.get(key)
        return f"{key} / {REPLICATION_FACTOR}", limit and limit / REPLICATION_FACTOR

    summary: dict[str, Any] = {}
    for partitions in sorted({r.partitions for r in runs}):
        mine = [r for r in runs if r.partitions == partitions]
        fields = ("records_per_s", "mb_per_s", "latency_p50_ms", "latency_p99_ms")
        med = {k: median([getattr(r, k) for r in mine]) for k in fields}
        broker_cpu = [median([r.broker_cpu[n] for r in mine]) for n in range(BROKERS)]
        med["etcd_cpu"] = median([r.etcd_cpu for r in mine])
        med["client_cpu"] = median([r.client_cpu for r in mine])
        summary[f"{partitions}_partitions"] = {**med, "broker_cpu": broker_cpu}
        print(
            f"\nacks=all, idempotent, linger.ms=5, {partitions} partition(s):"
            f" median of {len(mine)} runs of {mine[0].records} x {RECORD_SIZE} B records"
        )
        row("records/s", med["records_per_s"])
        row("MB/s", med["mb_per_s"], per_replica("disk_write_MBps"))
        row("MB/s (vs page cache)", med["mb_per_s"], per_replica("pagecache_write_MBps"))
        print(f"{'  MB/s of each run':<34}{', '.join(f'{r.mb_per_s:.1f}' for r in mine)}")
        row("delivery latency p50 ms", med["latency_p50_ms"])
        row("delivery latency p99 ms", med["latency_p99_ms"])
        for node in range(BROKERS):
            leads = sum(r.leaders.count(node) for r in mine)
            role = f" (led {leads}/{len(mine) * partitions} partitions)" if leads else ""
            row(f"CPU broker {node}{role}", broker_cpu[node])
        row("CPU etcd", med["etcd_cpu"])
        row("CPU producer (this process)", med["client_cpu"])
        row(
            "CPU total, of all cores",
            sum(broker_cpu) + med["etcd_cpu"] + med["client_cpu"],
            ("cpus", limits.get("cpus")),
        )

    if rounds:
        gaps = [r.gap_s for r in rounds]
        session_s = settings["session_timeout_ms"] / 1000
        failover = {
            "gap_s": median(gaps),
            "kill_to_new_leader_s": median([r.kill_to_new_leader_s for r in rounds]),
            "kill_to_ack_s": median([r.kill_to_ack_s for r in rounds]),
            "new_leader_to_ack_s": median(
                [r.kill_to_ack_s - r.kill_to_new_leader_s for r in rounds]
            ),
            "steady_latency_p50_ms": median([r.steady_latency_p50_ms for r in rounds]),
            "steady_latency_p99_ms": median([r.steady_latency_p99_ms for r in rounds]),
            "restart_to_isr_s": median([r.restart_to_isr_s for r in rounds]),
        }
        summary["failover"] = failover
        print(
            f"\nleader failover: {len(rounds)} rounds, idempotent acks=all producer at"
            f" {FAILOVER_RATE} records/s, leader killed with SIGKILL (medians)"
        )
        row("acknowledgement gap s", failover["gap_s"], ("session timeout s", session_s))
        row("kill -> new leader in metadata s", failover["kill_to_new_leader_s"])
        row("kill -> first acknowledgement s", failover["kill_to_ack_s"])
        row("new leader -> first ack s", failover["new_leader_to_ack_s"])
        row("latency p50 ms, steady, no failure", failover["steady_latency_p50_ms"])
        row("latency p99 ms, steady, no failure", failover["steady_latency_p99_ms"])
        row("restart -> back in the ISR s", failover["restart_to_isr_s"])
        print(
            f"\n{'round':>5}{'killed':>7}{'new':>5}{'gap s':>8}{'leader s':>10}{'ack s':>8}"
            f"{'acked':>7}{'read':>7}{'lost':>6}{'dups':>6}{'ready s':>9}{'ISR s':>7}  problems"
        )
        for i, r in enumerate(rounds):
            print(
                f"{i:>5}{r.victim:>7}{r.new_leader:>5}{r.gap_s:>8.2f}{r.kill_to_new_leader_s:>10.2f}"
                f"{r.kill_to_ack_s:>8.2f}{r.acked:>7}{r.read:>7}{r.lost:>6}{r.duplicates:>6}"
                f"{r.restart_to_ready_s:>9.2f}{r.restart_to_isr_s:>7.2f}  {'; '.join(r.problems)}"
            )
    print("\nmachine limits:", json.dumps(limits))
    return {
        "settings": settings,
        "median": summary,
        "throughput_runs": [asdict(r) for r in runs],
        "failover_rounds": [asdict(r) for r in rounds],
        "limits": limits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000, help="per throughput run")
    parser.add_argument("--runs", type=int, default=5, help="throughput runs per partition count")
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--rounds", type=int, default=5, help="leader failover rounds")
    parser.add_argument("--session-timeout-ms", type=int, default=3000)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")))
    keep = args.keep
    try:
        limits = measure_limits(root)
        env = broker_env(args.session_timeout_ms)
        with LocalCluster(root, brokers=BROKERS, env=env) as cluster:
            topics = Topics(cluster)
            runs = [
                throughput_run(cluster, topics, partitions, args.records)
                for partitions in args.partitions
                for _ in range(args.runs)
            ]
            checked = topics.create("min-insync", 1)
            settings = {
                "records": args.records,
                "record_bytes": RECORD_SIZE,
                "runs": args.runs,
                "partitions": args.partitions,
                "rounds": args.rounds,
                "session_timeout_ms": args.session_timeout_ms,
                "min_insync_replicas": topics.min_insync_replicas(checked),
                "failover_rate": FAILOVER_RATE,
            }
            rounds = []
            for i in range(args.rounds):
                rounds.append(failover_round(cluster, topics))
                print(f"failover round {i}: {asdict(rounds[-1])}", flush=True)
        keep = keep or any(r.problems for r in rounds)
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"kept {root} (broker-N.log, etcd.log, data)")
        else:
            shutil.rmtree(root, ignore_errors=True)
    result = report(runs, rounds, limits, settings)
    write_results("replicated", result)
    failed = [i for i, r in enumerate(rounds) if r.problems]
    if failed:
        raise SystemExit(f"failover rounds {failed} found problems; broker logs kept in {root}")


if __name__ == "__main__":
    main()
