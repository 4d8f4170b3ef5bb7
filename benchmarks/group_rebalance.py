"""What a rebalance costs a consumer group, by protocol: classic (eager, cooperative) and KIP-848.

    python -m shoal.benchmarks.group_rebalance [--rounds R] [--rate N]

Starts its own etcd and broker and a 12-partition topic that a producer
feeds at a steady rate, then for each protocol a group of three
confluent-kafka consumers (threads of this process). Each round a fourth
member joins and, once the group has settled, leaves again. Measured:

* **joiner's first record**: from the new member's ``subscribe`` to the first
  record it reads (what a scaled-out instance waits);
* **pause of partitions that stayed**: for every partition owned by the same
  member before and after a rebalance, the longest gap between two records
  read from it around the rebalance, against the same figure in a quiet
  window before it (the producer's own spacing). Kafka's classic protocol
  with an eager assignor stops every member while it rebalances; cooperative
  rebalancing and KIP-848 (``group.protocol=consumer``) move only the
  partitions that change owner, so the others should not pause at all;
* **settled after**: from the join (or the leave) until every partition has
  its new owner.

Protocols: ``classic`` with ``range`` (eager), ``classic`` with
``cooperative-sticky``, and ``consumer`` (KIP-848, the server's ``uniform``
assignor; members learn of a new target at their next heartbeat,
``group.consumer.heartbeat.interval.ms``, 5 s by default as in Kafka).
Medians over the rounds are printed next to the machine's limits, and the
JSON lands in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.common import LocalCluster, measure_limits, write_results

PARTITIONS = 12
MEMBERS = 3
QUIET_S = 3.0
"""The window before a change whose gaps are the baseline."""
SETTLE_TIMEOUT_S = 60.0
AFTER_SETTLED_S = 2.0

PROTOCOLS: dict[str, dict[str, str]] = {
    "classic-eager": {"group.protocol": "classic", "partition.assignment.strategy": "range"},
    "classic-cooperative": {
        "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
    },
    "consumer": {"group.protocol": "consumer"},
}


@dataclass
class Change:
    protocol: str
    kind: str
    """join or leave"""
    joiner_first_record_s: float | None
    settled_after_s: float
    stayed_pause_s: float
    """The longest gap of a partition that kept its owner, around the change."""
    quiet_gap_s: float
    """The same figure in the quiet window before the change."""


class Member:
    """A group member in a thread, noting when it read each partition's records."""

    def __init__(self, bootstrap: str, group: str, topic: str, settings: dict[str, str]) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "latest",
                "enable.auto.commit": True,
                **settings,
            }
        )
        self.reads: dict[int, list[float]] = defaultdict(list)
        self.lock = threading.Lock()
        self.subscribed_at = time.monotonic()
        self.first_record_at: float | None = None
        self.stop = threading.Event()
        self.assignment: frozenset[int] = frozenset()
        self.consumer.subscribe([topic])
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            messages = self.consumer.consume(1000, 0.05)
            now = time.monotonic()
            with self.lock:
                for message in messages:
                    if message.error() is None:
                        self.reads[message.partition()].append(now)
                        if self.first_record_at is None:
                            self.first_record_at = now
                self.assignment = frozenset(tp.partition for tp in self.consumer.assignment())
        self.consumer.close()

    def leave(self) -> None:
        self.stop.set()
        self.thread.join(30)

    def gaps(self, partition: int, since: float, until: float) -> float:
        """The longest gap between two reads of the partition that ends after ``since``
        (so a gap the window opens in counts whole) and begins before ``until``."""
        with self.lock:
            times = sorted(self.reads.get(partition, ()))
        return max((b - a for a, b in pairwise(times) if b > since and a < until), default=0.0)


def feed(bootstrap: str, topic: str, rate: int, stop: threading.Event) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "1"})
    interval = 1.0 / rate
    due = time.monotonic()
    n = 0
    while not stop.is_set():
        producer.produce(topic, b"x" * 100, partition=n % PARTITIONS)
        n += 1
        due += interval
        producer.poll(max(0.0, due - time.monotonic()))
    producer.flush(10)


def owners(members: list[Member]) -> dict[int, Member]:
    found = {}
    for m in members:
        for p in m.assignment:
            found[p] = m
    return found


def settled(members: list[Member]) -> bool:
    sizes = [len(m.assignment) for m in members]
    return (
        len(owners(members)) == PARTITIONS
        and sum(sizes) == PARTITIONS
        and max(sizes) - min(sizes) <= 1
    )


def wait_settled(members: list[Member]) -> float:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not settled(members):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the group did not settle: {[sorted(m.assignment) for m in members]}"
            )
        time.sleep(0.02)
    return time.monotonic()


def measure(
    protocol: str, kind: str, before: list[Member], after: list[Member], joiner: Member | None
) -> Change:
    """Called just before the change: waits for the group to settle after it."""
    owned_before = owners(before)
    changed_at = time.monotonic()
    if kind == "leave":
        before[-1].leave()
    settled_at = wait_settled(after)
    time.sleep(AFTER_SETTLED_S)
    owned_after = owners(after)
    stayed = [(p, m) for p, m in owned_after.items() if owned_before.get(p) is m]
    pause = max(
        (m.gaps(p, changed_at, settled_at + AFTER_SETTLED_S) for p, m in stayed), default=0.0
    )
    quiet = max((m.gaps(p, changed_at - QUIET_S, changed_at) for p, m in stayed), default=0.0)
    first = None
    if joiner is not None and joiner.first_record_at is not None:
        first = joiner.first_record_at - joiner.subscribed_at
    return Change(protocol, kind, first, settled_at - changed_at, pause, quiet)


def rounds_of(bootstrap: str, topic: str, protocol: str, rounds: int) -> list[Change]:
    settings = PROTOCOLS[protocol]
    group = f"rebalance-{protocol}-{uuid.uuid4().hex[:6]}"
    members = [Member(bootstrap, group, topic, settings) for _ in range(MEMBERS)]
    changes = []
    try:
        wait_settled(members)
        for _ in range(rounds):
            time.sleep(QUIET_S)
            joiner = Member(bootstrap, group, topic, settings)
            changes.append(measure(protocol, "join", members, [*members, joiner], joiner))
            time.sleep(QUIET_S)
            changes.append(measure(protocol, "leave", [*members, joiner], members, None))
    finally:
        for m in members:
            m.leave()
    return changes


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=1200, help="records per second, all partitions")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(
        prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")
    ) as tmp:
        root = Path(tmp)
        limits = measure_limits(root, mb=256)
        env = {"SHOAL_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}
        with LocalCluster(root, env=env) as cluster:
            topic = f"rebalance-{uuid.uuid4().hex[:8]}"
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
            stop = threading.Event()
            feeder = threading.Thread(target=feed, args=(cluster.bootstrap, topic, args.rate, stop))
            feeder.start()
            try:
                changes = [
                    c
                    for protocol in PROTOCOLS
                    for c in rounds_of(cluster.bootstrap, topic, protocol, args.rounds)
                ]
            finally:
                stop.set()
                feeder.join()
    print(
        f"\nmedians of {args.rounds} rounds, {MEMBERS} members + 1, {PARTITIONS} partitions,"
        f" {args.rate} records/s\n"
    )
    print(
        f"{'protocol':<22}{'change':<8}{'joiner 1st record s':>20}{'settled s':>11}"
        f"{'stayed pause s':>16}{'quiet gap s':>13}"
    )
    summary: dict[str, Any] = {}
    for protocol in PROTOCOLS:
        for kind in ("join", "leave"):
            picked = [c for c in changes if c.protocol == protocol and c.kind == kind]
            row = {
                "joiner_first_record_s": median([c.joiner_first_record_s for c in picked]),
                "settled_after_s": median([c.settled_after_s for c in picked]),
                "stayed_pause_s": median([c.stayed_pause_s for c in picked]),
                "quiet_gap_s": median([c.quiet_gap_s for c in picked]),
            }
            summary[f"{protocol}/{kind}"] = row
            first = row["joiner_first_record_s"]
            print(
                f"{protocol:<22}{kind:<8}{'' if first is None else f'{first:.2f}':>20}"
                f"{row['settled_after_s']:>11.2f}{row['stayed_pause_s']:>16.2f}"
                f"{row['quiet_gap_s']:>13.3f}"
            )
    print("\nmachine limits:", json.dumps(limits))
    write_results(
        "group_rebalance",
        {"median": summary, "changes": [asdict(c) for c in changes], "limits": limits},
    )


if __name__ == "__main__":
    main()
