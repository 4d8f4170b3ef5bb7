"""A three-broker cluster for replication tests, and what its tests ask of it.

Settings are Kafka's except for time: a broker's lease lasts 3 s (not 9 s)
and a lagging follower leaves the ISR after 4 s (not 30 s), so failures are
noticed within a test's patience. Topics default to replication factor 3
and min.insync.replicas=2, as in ``shoal dev``.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from harness import BrokerProcess, wait_until

REPLICATED_ENV = {
    "SHOAL_BROKER_SESSION_TIMEOUT_MS": "3000",
    "SHOAL_REPLICA_LAG_TIME_MAX_MS": "4000",
    "SHOAL_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS": "2",
    "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": "3",
    "SHOAL_OFFSETS_TOPIC_NUM_PARTITIONS": "6",
    "SHOAL_DEFAULT_REPLICATION_FACTOR": "3",
    "SHOAL_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    "SHOAL_TOPIC_DEFAULTS": json.dumps({"min.insync.replicas": "2"}),
}


@dataclass(frozen=True)
class PartitionView:
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


class Cluster:
    def __init__(self, brokers: list[BrokerProcess]) -> None:
        self.brokers = {b.node_id: b for b in brokers}

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def live_bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.running)

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.live_bootstrap()})

    def create_topic(self, name: str, partitions: int = 1, **config: str) -> str:
        admin = self.admin()  # kept alive until the futures resolve
        futures = admin.create_topics([NewTopic(name, partitions, config=config)])
        for future in futures.values():
            future.result(30)
        wait_until(lambda: self.leader_of(name, 0) >= 0, 30, f"a leader for {name}")
        return name

    def partitions(self, topic: str) -> dict[int, PartitionView]:
        metadata = self.admin().list_topics(topic, timeout=10)
        return {
            p.id: PartitionView(p.leader, tuple(p.replicas), tuple(sorted(p.isrs)))
            for p in metadata.topics[topic].partitions.values()
        }

    def leader_of(self, topic: str, partition: int) -> int:
        view = self.partitions(topic).get(partition)
        return -1 if view is None else view.leader

    def wait_full_isr(self, topic: str, timeout: float = 60) -> None:
        def full() -> bool:
            views = self.partitions(topic).values()
            return bool(views) and all(len(v.isr) == len(v.replicas) for v in views)

        wait_until(full, timeout, f"every replica of {topic} in the ISR", interval=0.2)

    def restart(self, node: int) -> None:
        self.brokers[node].start()


@dataclass
class SteadyProducer:
    """An idempotent acks=all confluent-kafka producer at a steady rate, in a thread.

    Values are ``seq-<n>``; every acknowledgement is kept with its offset and
    the wall-clock time it arrived, so tests can check for loss and measure
    the gap a failover leaves.
    """

    bootstrap: str
    topic: str
    rate: int = 400
    acked: list[tuple[int, int, int, float]] = field(default_factory=list)
    """(sequence, partition, offset, time acknowledged)"""
    errors: list[KafkaError] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    sent: int = 0

    def start(self) -> SteadyProducer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "retry.backoff.ms": 50,
                "retry.backoff.max.ms": 200,
                "reconnect.backoff.max.ms": 200,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                self.errors.append(err)
                return
            seq = int(msg.value().split(b"-")[1])
            self.acked.append((seq, msg.partition(), msg.offset(), time.monotonic()))

        interval = 1 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            producer.produce(self.topic, value=b"seq-%d" % self.sent, on_delivery=delivered)
            self.sent += 1
            next_at += interval
            producer.poll(max(0.0, next_at - time.monotonic()))
        remaining = producer.flush(60)
        assert remaining == 0, f"{remaining} records never acknowledged nor failed"

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(90)

    def acked_count(self) -> int:
        return len(self.acked)


def failover_gap(acked: list[tuple[int, int, int, float]], killed_at: float) -> float:
    """Seconds from the last acknowledgement before the kill to the first after it."""
    times = sorted(t for *_, t in acked)
    before = [t for t in times if t <= killed_at]
    after = [t for t in times if t > killed_at]
    assert before and after, "no acknowledgements on one side of the kill"
    return after[0] - before[-1]


def random_victim(views: dict[int, PartitionView], rng: random.Random) -> tuple[int, int]:
    """(partition, its leader): a random partition's leader, the broker to kill."""
    partition = rng.choice(sorted(views))
    return partition, views[partition].leader


def start_cluster(factory: Callable[..., BrokerProcess], size: int = 3) -> Cluster:
    """``size`` brokers from a ``broker_factory``, launched together and then waited
    for, so the cluster starts in about the time of one broker."""
    launched = [factory(node_id=i, env=dict(REPLICATED_ENV), wait=False) for i in range(size)]
    return Cluster([broker.wait_ready() for broker in launched])


def read_all(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """Every (offset, value) of the topic, read by a plain consumer to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    ends = {}
    for p in range(partitions):
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        ends[p] = high
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + 60
    while any(len(records[p]) < ends[p] for p in records) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error():
            continue
        records[message.partition()].append((message.offset(), message.value()))
    consumer.close()
    return records
