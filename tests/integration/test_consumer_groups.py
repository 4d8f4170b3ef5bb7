"""Consumer groups with three Kafka clients we did not write, each member its own process.

Members share a 6-partition topic two partitions each; a member killed with
SIGKILL loses its partitions to the others once its session times out;
commits after processing mean nothing is skipped; two groups on one topic
each see every record.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness import BrokerProcess, wait_until
from kafka_clients import create_topic

MEMBER = Path(__file__).with_name("group_member.py")
PARTITIONS = 6
SESSION_TIMEOUT_S = 6.0


class Member:
    def __init__(
        self, client: str, bootstrap: str, group: str, topic: str, out: Path, assignor: str
    ) -> None:
        self.client = client
        self.out = out
        self.process = subprocess.Popen(
            [sys.executable, str(MEMBER), client, bootstrap, group, topic, str(out), assignor],
            stdout=subprocess.DEVNULL,
            stderr=open(out / f"{client}-{uuid.uuid4().hex[:6]}.stderr", "wb"),  # noqa: SIM115
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def assignment(self) -> tuple[float, frozenset[int]]:
        path = self.out / f"{self.pid}.assignment"
        if not path.exists():
            return 0.0, frozenset()
        lines = path.read_text().splitlines()
        if not lines:
            return 0.0, frozenset()
        stamp, _, partitions = lines[-1].partition(" ")
        return float(stamp), frozenset(int(p) for p in partitions.split(",") if p)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def consumed(out: Path) -> dict[tuple[int, int], str]:
    seen: dict[tuple[int, int], str] = {}
    for path in out.glob("*.records"):
        for line in path.read_text().splitlines():
            partition, offset, value = line.split(" ", 2)
            seen[(int(partition), int(offset))] = value
    return seen


def produce(bootstrap: str, topic: str, start: int, count: int) -> dict[str, int]:
    """Produce ``count`` records, returns value -> partition."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    where: dict[str, int] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        where[msg.value().decode()] = msg.partition()  # type: ignore[attr-defined]

    for i in range(start, start + count):
        producer.produce(topic, key=str(i).encode(), value=f"r-{i}".encode(), on_delivery=delivered)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return where


def balanced(members: list[Member], per_member: int) -> bool:
    assignments = [m.assignment()[1] for m in members]
    every = frozenset().union(*assignments)
    return every == frozenset(range(PARTITIONS)) and all(len(a) == per_member for a in assignments)


def run_group(
    broker: BrokerProcess, tmp_path: Path, clients: list[str], assignor: str = "range"
) -> None:
    topic = create_topic(broker.bootstrap, PARTITIONS)
    group = f"group-{uuid.uuid4().hex[:8]}"
    out = tmp_path / group
    out.mkdir()
    produced = produce(broker.bootstrap, topic, 0, 1500)
    members = [Member(c, broker.bootstrap, group, topic, out, assignor) for c in clients]
    try:
        wait_until(lambda: balanced(members, 2), 60, "2 partitions per member")

        writer = threading.Thread(
            target=lambda: produced.update(produce(broker.bootstrap, topic, 1500, 1500))
        )
        writer.start()
        victim = members[0]
        killed_at = time.time()
        victim.kill()
        survivors = members[1:]
        wait_until(lambda: balanced(survivors, 3), 40, "the victim's partitions to move")
        moved_after = max(m.assignment()[0] for m in survivors) - killed_at
        print(f"partitions reassigned {moved_after:.1f}s after SIGKILL ({clients})")
        assert moved_after < SESSION_TIMEOUT_S + 4, f"took {moved_after:.1f}s"
        writer.join(60)

        wait_until(lambda: set(produced) <= set(consumed(out).values()), 60, "every record")
        seen = consumed(out)
        for (partition, _), value in seen.items():
            assert produced[value] == partition
        by_partition: dict[int, set[int]] = {}
        for partition, offset in seen:
            by_partition.setdefault(partition, set()).add(offset)
        for partition, offsets in by_partition.items():
            assert offsets == set(range(max(offsets) + 1)), f"partition {partition} skipped offsets"
    finally:
        for member in members:
            member.stop()


@pytest.mark.parametrize("client", ["confluent-kafka", "aiokafka", "kafka-python"])
def test_three_members_of_one_client_share_and_survive_a_sigkill(
    broker: BrokerProcess, tmp_path: Path, client: str
) -> None:
    run_group(broker, tmp_path, [client] * 3)


def test_three_different_clients_in_one_group(broker: BrokerProcess, tmp_path: Path) -> None:
    run_group(broker, tmp_path, ["kafka-python", "confluent-kafka", "aiokafka"])


@pytest.mark.parametrize(
    ("client", "assignor"),
    [
        ("confluent-kafka", "roundrobin"),
        ("confluent-kafka", "cooperative-sticky"),
        ("kafka-python", "cooperative-sticky"),
    ],
)
def test_other_assignors(broker: BrokerProcess, tmp_path: Path, client: str, assignor: str) -> None:
    run_group(broker, tmp_path, [client] * 3, assignor)


def test_two_groups_on_one_topic_each_get_every_record(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = create_topic(broker.bootstrap, PARTITIONS)
    produced = produce(broker.bootstrap, topic, 0, 1000)
    groups = []
    for client in ("confluent-kafka", "aiokafka"):
        out = tmp_path / client
        out.mkdir()
        groups.append(
            (
                out,
                Member(client, broker.bootstrap, f"g-{uuid.uuid4().hex[:6]}", topic, out, "range"),
            )
        )
    try:
        for out, _ in groups:
            wait_until(
                lambda out=out: set(consumed(out).values()) == set(produced), 60, "all records"
            )
    finally:
        for _, member in groups:
            member.stop()
