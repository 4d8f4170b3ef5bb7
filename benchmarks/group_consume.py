"""A consumer group of three reading a 1 GiB topic: MB/s and rebalance times, beside the limits.

    python -m shoal.benchmarks.group_consume [--gib G] [--runs R]

Starts its own etcd and broker, produces G GiB of 1 KiB records into a
6-partition topic, then starts three confluent-kafka consumers in one group,
each its own process, and measures:

* the time until the group is stable (every member assigned; this includes
  ``group.initial.rebalance.delay.ms``, 3 s as in Kafka);
* group read throughput from then until every record is consumed, against
  loopback bandwidth from ``../shared/tools/limits``;
* the rebalance after one member leaves (SIGTERM, LeaveGroup): until the two
  left own all six partitions;
* the broker's CPU use while the group reads.

Medians over the runs are printed, and the JSON lands in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.common import LocalCluster, cpu_seconds, measure_limits, write_results

RECORD_SIZE = 1024
PARTITIONS = 6
MEMBERS = 3


@dataclass
class Run:
    bytes: int
    stable_after_s: float
    read_seconds: float
    group_mb_per_s: float
    rebalance_after_leave_s: float
    broker_cpu_reading: float


def member(bootstrap: str, group: str, topic: str) -> None:
    """One group member: prints its assignment when it changes and its progress."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "fetch.max.bytes": 52428800,
            "max.partition.fetch.bytes": 10485760,
            "session.timeout.ms": 10000,
        }
    )
    consumer.subscribe([topic])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    count = 0
    last: tuple[int, ...] = ()
    last_report = 0.0
    while not stop.is_set():
        for message in consumer.consume(10000, 0.2):
            if message.error() is None:
                count += 1
        assignment = tuple(sorted(tp.partition for tp in consumer.assignment()))
        now = time.time()
        if assignment != last or now - last_report > 0.2:
            print(f"{now:.3f} {count} {','.join(map(str, assignment))}", flush=True)
            last, last_report = assignment, now
    consumer.close()


class Member:
    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal.benchmarks.group_consume",
                "--member",
                bootstrap,
                group,
                topic,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.count = 0
        self.assignment: tuple[int, ...] = ()
        self.assigned_at = 0.0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            stamp, count, partitions = line.split(" ")
            assignment = tuple(int(p) for p in partitions.strip().split(",") if p)
            if assignment != self.assignment:
                self.assigned_at = float(stamp)
            self.count, self.assignment = int(count), assignment

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)


def wait(predicate: Any, timeout: float) -> float:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise TimeoutError("the group did not get there in time")
        time.sleep(0.02)
    return time.time()


def fill(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1_000_000, "acks": "1"}
    )
    value = os.urandom(RECORD_SIZE)
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(300) == 0


def one_run(cluster: LocalCluster, gib: float) -> Run:
    records = int(gib * 2**30 / RECORD_SIZE)
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    fill(cluster.bootstrap, topic, records)
    group = f"bench-{uuid.uuid4().hex[:6]}"
    started = time.time()
    members = [Member(cluster.bootstrap, group, topic) for _ in range(MEMBERS)]
    try:

        def owned(ms: list[Member]) -> set[int]:
            return {p for m in ms for p in m.assignment}

        stable = wait(
            lambda: all(m.assignment for m in members) and owned(members) == set(range(PARTITIONS)),
            120,
        )
        cpu_before = cpu_seconds(cluster.broker_pid)
        done = wait(lambda: sum(m.count for m in members) >= records, 600)
        cpu_after = cpu_seconds(cluster.broker_pid)
        leaving = time.time()
        members[0].stop()
        survivors = members[1:]
        rebalanced = wait(
            lambda: (
                owned(survivors) == set(range(PARTITIONS))
                and all(len(m.assignment) == PARTITIONS // 2 for m in survivors)
            ),
            120,
        )
        read_s = done - stable
        return Run(
            records * RECORD_SIZE,
            stable - started,
            read_s,
            records * RECORD_SIZE / 1e6 / read_s,
            rebalanced - leaving,
            (cpu_after - cpu_before) / read_s,
        )
    finally:
        for m in members:
            if m.process.poll() is None:
                m.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--member":
        member(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(
        prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")
    ) as tmp:
        root = Path(tmp)
        limits = measure_limits(root)
        with LocalCluster(root) as cluster:
            runs = [one_run(cluster, args.gib) for _ in range(args.runs)]
    median = {k: statistics.median(getattr(r, k) for r in runs) for k in asdict(runs[0])}
    loopback = limits.get("loopback_MBps")
    shape = f"{args.gib} GiB, {MEMBERS} consumers, {PARTITIONS} partitions"
    print(f"\nmedian of {len(runs)} runs, {shape}\n")
    rows = [
        ("group stable after s", median["stable_after_s"], None),
        ("group read MB/s", median["group_mb_per_s"], loopback),
        ("rebalance after a leave s", median["rebalance_after_leave_s"], None),
        ("broker CPU while reading", median["broker_cpu_reading"], None),
    ]
    for name, value, ceiling in rows:
        ratio = f"  {value / ceiling:.2f} of loopback_MBps={ceiling}" if ceiling else ""
        print(f"{name:<28}{value:>10.2f}{ratio}")
    print("\nmachine limits:", json.dumps(limits))
    write_results(
        "group_consume", {"median": median, "runs": [asdict(r) for r in runs], "limits": limits}
    )


if __name__ == "__main__":
    main()
