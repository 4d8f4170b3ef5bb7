"""A consumer that fetches in sessions (KIP-227) through the gateway: kafka-python.

kafka-python asks every broker for a fetch session and then sends only what
changed, as Kafka's Java client does (librdkafka does not ask). Through the
gateway the session is the broker's, passed through; here kafka-python reads
a six-partition topic while a producer writes to it, and gets every record
once and in order, and its fetcher's own log shows what went on: sessions
opened, continued incrementally, and never refused or found inconsistent.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from gateway_env import TenantKey
from kafka import KafkaConsumer

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 6
COUNT = 3000
FETCHER_LOG = "kafka.consumer.fetcher"


def produce_slowly(key: TenantKey, topic: str, done: threading.Event) -> None:
    """COUNT records round-robin over the partitions, over a few seconds."""
    producer = Producer(key.librdkafka(acks="all", **{"linger.ms": 5}))
    for i in range(COUNT):
        producer.produce(topic, value=b"%06d" % i, partition=i % PARTITIONS)
        if i % 200 == 199:
            producer.flush(30)
            time.sleep(0.1)
    assert producer.flush(30) == 0
    done.set()


def test_kafka_python_reads_every_record_once_in_incremental_sessions(
    gateway_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    key: TenantKey = gateway_cluster.tenant("sessions")
    admin = AdminClient(key.librdkafka())
    admin.create_topics([NewTopic("stream", PARTITIONS)])["stream"].result(30)
    caplog.set_level(logging.DEBUG, logger=FETCHER_LOG)
    consumer = KafkaConsumer(
        "stream",
        **key.python_client(),
        group_id="readers",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    done = threading.Event()
    writer = threading.Thread(target=produce_slowly, args=(key, "stream", done))
    writer.start()
    seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    try:
        deadline = time.monotonic() + 90
        while sum(map(len, seen.values())) < COUNT and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                seen[tp.partition].extend(int(m.value) for m in messages)
    finally:
        consumer.close()
        writer.join(60)
    assert done.is_set()

    for partition, values in seen.items():
        assert values == list(range(partition, COUNT, PARTITIONS)), partition
    fetcher = [r.getMessage() for r in caplog.records if r.name == FETCHER_LOG]
    created = [m for m in fetcher if "created a new incremental fetch session" in m]
    continued = [m for m in fetcher if "incremental fetch response for session" in m]
    troubles = [m for m in fetcher if "unable to process" in m or "invalid" in m]
    assert created, "kafka-python never got a session through the gateway"
    assert len(continued) > 10 * len(created), (len(continued), len(created))
    assert troubles == []
