"""Fetch sessions (KIP-227) between brokers and with a consumer that asks for them.

Three brokers, replication factor 3, each with a metrics endpoint. The wire
format is compared with Apache Kafka in the differential scenario
``fetch_sessions``; here, what sessions must not break: a follower of quiet
partitions stays in the ISR though its requests no longer name them, every
acknowledged record reaches every replica, and kafka-python (which asks for
sessions, unlike librdkafka) reads every record once, in order.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, Producer
from conftest import BrokerFactory
from harness import free_port, wait_until
from kafka import KafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from replicated import REPLICATED_ENV, Cluster, SteadyProducer, read_all

pytestmark = pytest.mark.timeout(300)

LAG_MAX_MS = 1000
"""Short, so that a follower whose idle partitions went unrecorded would leave the ISR
within the test."""


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(url, timeout=5).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


@pytest.fixture
def cluster(broker_factory: BrokerFactory) -> tuple[Cluster, list[str]]:
    env = {**REPLICATED_ENV, "SHOAL_REPLICA_LAG_TIME_MAX_MS": str(LAG_MAX_MS)}
    ports = [free_port() for _ in range(3)]
    launched = [
        broker_factory(
            node_id=i,
            env={**env, "SHOAL_METRICS_LISTEN": f"127.0.0.1:{ports[i]}"},
            wait=False,
        )
        for i in range(3)
    ]
    return (
        Cluster([broker.wait_ready() for broker in launched]),
        [f"http://127.0.0.1:{port}/metrics" for port in ports],
    )


def total(urls: list[str], name: str) -> float:
    return sum(scrape(url).get(name, 0.0) for url in urls)


def test_followers_fetch_in_sessions_and_idle_partitions_stay_in_the_isr(
    cluster: tuple[Cluster, list[str]],
) -> None:
    brokers, metrics = cluster
    topic = brokers.create_topic("sessions", 3)
    brokers.wait_full_isr(topic)
    # Each broker leads one partition, so each has the two others' fetch sessions.
    wait_until(
        lambda: [scrape(url).get("shoal_broker_fetch_sessions") for url in metrics] == [2, 2, 2],
        30,
        "two follower sessions on every broker",
    )
    acked = produce_to_one_partition(brokers.bootstrap, topic, 5 * LAG_MAX_MS / 1000)
    assert acked > 100

    views = brokers.partitions(topic)
    assert all(len(v.isr) == 3 for v in views.values()), views
    assert total(metrics, "shoal_broker_isr_shrinks_total") == 0
    assert len(read_all(brokers.bootstrap, topic, 3)[0]) == acked
    assert [scrape(url).get("shoal_broker_fetch_sessions") for url in metrics] == [2, 2, 2]


def produce_to_one_partition(bootstrap: str, topic: str, seconds: float) -> int:
    """Records acknowledged (acks=all) on partition 0, written for ``seconds`` at about
    400/s while partitions 1 and 2 stay idle; fails on any delivery error."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    acked = 0

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        nonlocal acked
        assert err is None, err
        acked += 1

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        producer.produce(topic, b"v", partition=0, on_delivery=delivered)
        producer.poll(0.0025)
    assert producer.flush(30) == 0
    return acked


def test_kafka_python_reads_everything_once_in_its_fetch_sessions(
    cluster: tuple[Cluster, list[str]],
) -> None:
    brokers, metrics = cluster
    topic = brokers.create_topic("consumed", 3)
    brokers.wait_full_isr(topic)
    wait_until(lambda: total(metrics, "shoal_broker_fetch_sessions") == 6, 30, "follower sessions")
    producer = SteadyProducer(brokers.bootstrap, topic).start()
    consumer = KafkaConsumer(
        bootstrap_servers=brokers.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    consumer.assign([TopicPartition(topic, p) for p in range(3)])
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    sessions_seen = 0.0
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            poll_into(consumer, seen)
            sessions_seen = max(sessions_seen, total(metrics, "shoal_broker_fetch_sessions"))
        producer.stop()
        assert not producer.errors, producer.errors[:3]
        acked = _acked_offsets(producer)
        wait_until(
            lambda: poll_into(consumer, seen) or all(len(seen[p]) >= len(acked[p]) for p in seen),
            30,
            "every acknowledged record read",
        )
    finally:
        consumer.close()
    # The consumer fetched from each of the three leaders in a session of its own.
    assert sessions_seen == 9
    for partition, offsets in seen.items():
        assert offsets == list(range(len(offsets))), f"partition {partition}: gaps or repeats"
        assert set(acked[partition]) <= set(offsets)


def poll_into(consumer: KafkaConsumer, seen: dict[int, list[int]]) -> None:
    for tp, records in consumer.poll(timeout_ms=100).items():
        seen[tp.partition].extend(record.offset for record in records)


def _acked_offsets(producer: SteadyProducer) -> dict[int, list[int]]:
    acked: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for _, partition, offset, _ in producer.acked:
        acked[partition].append(offset)
    return acked
