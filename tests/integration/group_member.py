"""One consumer-group member as its own process, so tests can SIGKILL it.

    python group_member.py CLIENT BOOTSTRAP GROUP TOPIC OUT_DIR [ASSIGNOR]

CLIENT is confluent-kafka, kafka-python or aiokafka. The member writes two
files in OUT_DIR, named by its pid, flushed line by line:

* ``<pid>.records``: ``partition offset value`` for every record processed;
* ``<pid>.assignment``: ``<unix time> p,p,...`` whenever its assignment changes.

It commits after processing (auto commit off), so a record is committed only
once it is in the records file: a test can check that a group skips nothing.
SIGTERM makes it close cleanly (leaving the group); SIGKILL is a crash.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000


class Stop:
    requested = False


def on_term(*_: object) -> None:
    Stop.requested = True


class Journal:
    def __init__(self, out_dir: Path) -> None:
        pid = os.getpid()
        self.records = open(out_dir / f"{pid}.records", "a", buffering=1)  # noqa: SIM115
        self.assignments = open(out_dir / f"{pid}.assignment", "a", buffering=1)  # noqa: SIM115
        self.last: tuple[int, ...] | None = None

    def record(self, partition: int, offset: int, value: bytes | None) -> None:
        self.records.write(f"{partition} {offset} {(value or b'').decode()}\n")

    def assignment(self, partitions: Any) -> None:
        current = tuple(sorted(partitions))
        if current != self.last:
            self.last = current
            self.assignments.write(f"{time.time():.3f} {','.join(map(str, current))}\n")

    def flush(self) -> None:
        self.records.flush()
        os.fsync(self.records.fileno())


def run_confluent(bootstrap: str, group: str, topic: str, journal: Journal, assignor: str) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "partition.assignment.strategy": assignor,
        }
    )
    consumer.subscribe([topic])
    while not Stop.requested:
        messages = consumer.consume(200, 0.2)
        journal.assignment(tp.partition for tp in consumer.assignment())
        good = [m for m in messages if m.error() is None]
        for m in good:
            journal.record(m.partition(), m.offset(), m.value())
        if good:
            journal.flush()
            consumer.commit(asynchronous=False)
    consumer.close()


def run_kafka_python(
    bootstrap: str, group: str, topic: str, journal: Journal, assignor: str
) -> None:
    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    strategies = {
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
        "cooperative-sticky": CooperativeStickyAssignor,
    }
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        partition_assignment_strategy=[strategies[assignor]],
    )
    while not Stop.requested:
        batch = consumer.poll(timeout_ms=200)
        journal.assignment(tp.partition for tp in consumer.assignment())
        for records in batch.values():
            for m in records:
                journal.record(m.partition, m.offset, m.value)
        if batch:
            journal.flush()
            consumer.commit()
    consumer.close()


async def run_aiokafka(
    bootstrap: str, group: str, topic: str, journal: Journal, assignor: str
) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

    # aiokafka has no cooperative protocol; its sticky assignor is the eager kind.
    strategies = {
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
        "sticky": StickyPartitionAssignor,
    }
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        partition_assignment_strategy=(strategies[assignor],),
    )
    await consumer.start()
    try:
        while not Stop.requested:
            batch = await consumer.getmany(timeout_ms=200)
            journal.assignment(tp.partition for tp in consumer.assignment())
            for records in batch.values():
                for m in records:
                    journal.record(m.partition, m.offset, m.value)
            if batch:
                journal.flush()
                await consumer.commit()
    finally:
        await consumer.stop()


def main() -> None:
    client, bootstrap, group, topic, out_dir = sys.argv[1:6]
    assignor = sys.argv[6] if len(sys.argv) > 6 else "range"
    signal.signal(signal.SIGTERM, on_term)
    journal = Journal(Path(out_dir))
    if client == "confluent-kafka":
        run_confluent(bootstrap, group, topic, journal, assignor)
    elif client == "kafka-python":
        run_kafka_python(bootstrap, group, topic, journal, assignor)
    elif client == "aiokafka":
        asyncio.run(run_aiokafka(bootstrap, group, topic, journal, assignor))
    else:
        raise SystemExit(f"unknown client {client}")


if __name__ == "__main__":
    main()
