"""Log compaction as real clients see it: confluent-kafka, kafka-python and kcat.

A compacted topic with small, quickly rolling segments gets every key
updated many times and some keys deleted (tombstones). Once the cleaner has
been over it, reading from the beginning gives exactly the latest value of
each live key in the cleaned part, offsets increasing with gaps; after
``delete.retention.ms`` the deleted keys are gone too. kcat and kafka-python
read the same records; a consumer group commits across the gaps; a record
without a key is refused. A broker killed (``SHOAL_CLEANER_FAULT``) in the
middle of a clean restarts with a correct log; a follower that catches up
from a compacted leader holds the same bytes.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import NewTopic
from conftest import BrokerFactory
from harness import wait_until
from kafka_clients import create_topic
from replicated import REPLICATED_ENV, Cluster
from shoal.broker.log.cleaner.faults import ENV_VAR, EXIT_CODE

CLEANER = {"SHOAL_LOG_CLEANER_BACKOFF_MS": "100"}
KEYS = 30
ROUNDS = 12
DELETED = {f"key-{i:02d}" for i in range(0, KEYS, 5)}
WRITTEN = KEYS * ROUNDS + len(DELETED)
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": "4000",
    "segment.ms": "1000",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "3000",
    "file.delete.delay.ms": "0",
}

Row = tuple[int, str, str | None]


def _produce(bootstrap: str, topic: str) -> dict[str, str | None]:
    # Idempotent: the cleaner keeps the producer's last batch, maybe empty, for its sequence.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    latest: dict[str, str | None] = {}
    for r in range(ROUNDS):
        for k in range(KEYS):
            key, value = f"key-{k:02d}", f"value-{r:02d}-{k:02d}"
            producer.produce(topic, key=key, value=value, partition=0)
            latest[key] = value
        producer.flush(30)
    for key in sorted(DELETED):
        producer.produce(topic, key=key, value=None, partition=0)
        latest[key] = None
    producer.flush(30)
    return latest


def _produce_kafka_python(bootstrap: str, topic: str) -> dict[str, str | None]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=True)
    latest: dict[str, str | None] = {}
    for r in range(ROUNDS):
        for k in range(KEYS):
            key, value = f"key-{k:02d}", f"value-{r:02d}-{k:02d}"
            producer.send(topic, key=key.encode(), value=value.encode(), partition=0)
            latest[key] = value
        producer.flush(30)
    for key in sorted(DELETED):
        producer.send(topic, key=key.encode(), value=None, partition=0)
        latest[key] = None
    producer.flush(30)
    producer.close()
    return latest


PRODUCERS = {"confluent-kafka": _produce, "kafka-python": _produce_kafka_python}


def _roll(bootstrap: str, topic: str) -> None:
    """Wait out segment.ms and append, so that everything before becomes cleanable."""
    time.sleep(1.2)
    producer = Producer({"bootstrap.servers": bootstrap})
    errors: list[KafkaError | None] = []
    producer.produce(
        topic, key="roller", value="x", partition=0, on_delivery=lambda e, _: errors.append(e)
    )
    producer.flush(30)
    assert errors == [None]


def _confluent_read(bootstrap: str, topic: str, group: str | None = None) -> list[Row]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    _, high = consumer.get_watermark_offsets(CTopicPartition(topic, 0), timeout=30)
    if group is None:
        consumer.assign([CTopicPartition(topic, 0, OFFSET_BEGINNING)])
    else:
        consumer.subscribe([topic])
    rows: list[Row] = []
    deadline = time.monotonic() + 30
    try:
        while (not rows or rows[-1][0] < high - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            value = msg.value()
            rows.append((msg.offset(), msg.key().decode(), value and value.decode()))
        if group is not None:
            consumer.commit(asynchronous=False)
            committed = consumer.committed([CTopicPartition(topic, 0)], timeout=30)
            assert committed[0].offset == high
    finally:
        consumer.close()
    return rows


def _kcat_read(bootstrap: str, topic: str) -> list[Row]:
    out = subprocess.run(
        ["kcat", "-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q",
         "-Z", "-f", "%o|%k|%S|%s\n"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()  # fmt: skip
    rows: list[Row] = []
    for line in out.splitlines():
        offset, key, size, value = line.split("|", 3)
        rows.append((int(offset), key, None if size == "-1" else value))
    return rows


def _kafka_python_read(bootstrap: str, topic: str) -> list[Row]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    high = consumer.end_offsets([tp])[tp]
    rows: list[Row] = []
    deadline = time.monotonic() + 30
    try:
        while consumer.position(tp) < high and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                rows.extend(
                    (r.offset, r.key.decode(), r.value and r.value.decode()) for r in records
                )
    finally:
        consumer.close()
    return rows


def _cleaned(rows: list[Row], latest: dict[str, str | None], tombstones: bool) -> bool:
    keys = [key for _, key, _ in rows if key != "roller"]
    expected = {k: v for k, v in latest.items() if v is not None or tombstones}
    return len(keys) == len(set(keys)) and dict((k, v) for _, k, v in rows if k != "roller") == (
        expected
    )


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_a_compacted_topic_reads_back_the_latest_value_of_each_key(
    broker_factory: BrokerFactory, client: str
) -> None:
    broker = broker_factory(env=CLEANER)
    topic = create_topic(broker.bootstrap, 1, **TOPIC_CONFIG)
    latest = PRODUCERS[client](broker.bootstrap, topic)
    _roll(broker.bootstrap, topic)

    rows = wait_until(
        lambda: (
            (r := _confluent_read(broker.bootstrap, topic))
            and _cleaned(r, latest, tombstones=True)
            and r
        ),
        30,
        "the cleaner to compact the topic",
    )
    offsets = [offset for offset, _, _ in rows]
    assert offsets == sorted(set(offsets))
    assert offsets[-1] == WRITTEN  # the roller, at its original offset
    assert len(offsets) < WRITTEN  # gaps

    # Tombstones go once delete.retention.ms has passed since the first clean.
    rows = wait_until(
        lambda: (
            (r := _confluent_read(broker.bootstrap, topic))
            and _cleaned(r, latest, tombstones=False)
            and r
        ),
        30,
        "the tombstones to go",
    )
    assert not {key for _, key, _ in rows} & DELETED
    assert _kcat_read(broker.bootstrap, topic) == rows
    assert _kafka_python_read(broker.bootstrap, topic) == rows
    assert _confluent_read(broker.bootstrap, topic, group=f"g-{uuid.uuid4().hex[:8]}") == rows
    assert not list(Path(broker.data_dir, f"{topic}-0").glob("*.swap"))


def test_a_record_without_a_key_is_refused_by_a_compacted_topic(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(env=CLEANER)
    topic = create_topic(broker.bootstrap, 1, **TOPIC_CONFIG)
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0})
    producer.produce(topic, value=b"no key", partition=0, on_delivery=lambda e, _: errors.append(e))
    producer.flush(30)
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.INVALID_RECORD


@pytest.mark.slow
@pytest.mark.parametrize(
    "step", ["cleaned_partly_written", "swap_renamed", "old_deleted_partly", "swap_live"]
)
def test_a_broker_killed_during_a_clean_restarts_with_a_correct_log(
    broker_factory: BrokerFactory, step: str
) -> None:
    # Written with the cleaner off, so that the kill comes after every write.
    broker = broker_factory(env={**CLEANER, "SHOAL_LOG_CLEANER_ENABLE": "false"})
    topic = create_topic(broker.bootstrap, 1, **TOPIC_CONFIG)
    latest = _produce(broker.bootstrap, topic)
    _roll(broker.bootstrap, topic)
    broker.stop()
    broker.env = {**CLEANER, ENV_VAR: step}
    with contextlib.suppress(RuntimeError):  # it may die before it is ready
        broker.start()
    wait_until(lambda: not broker.running, 30, f"the broker to die at {step}")
    assert broker.process is not None and broker.process.returncode == EXIT_CODE
    broker.env = dict(CLEANER)
    broker.start()

    rows = _confluent_read(broker.bootstrap, topic)
    offsets = [offset for offset, _, _ in rows]
    assert offsets == sorted(set(offsets))
    assert offsets[-1] == WRITTEN
    last = {key: value for _, key, value in rows if key != "roller"}
    assert last == latest
    wait_until(
        lambda: _cleaned(_confluent_read(broker.bootstrap, topic), latest, tombstones=False),
        30,
        "the restarted broker to finish compacting",
    )


def _log_bytes(data_dir: Path, topic: str) -> bytes:
    """The partition's batches as stored: its segment files in offset order, concatenated."""
    return b"".join(p.read_bytes() for p in sorted(Path(data_dir, f"{topic}-0").glob("*.log")))


@pytest.mark.slow
def test_a_follower_copies_a_compacted_leader_with_its_gaps(
    broker_factory: BrokerFactory,
) -> None:
    env = {**REPLICATED_ENV, **CLEANER}
    brokers = {i: broker_factory(node_id=i, env=dict(env)) for i in range(2)}
    cluster = Cluster(list(brokers.values()))
    topic = f"t-{uuid.uuid4().hex[:10]}"
    config = {**TOPIC_CONFIG, "min.insync.replicas": "1", "delete.retention.ms": "3600000"}
    admin = cluster.admin()
    admin.create_topics([NewTopic(topic, 1, 2, config=config)])[topic].result(30)
    cluster.wait_full_isr(topic)
    leader = brokers[cluster.leader_of(topic, 0)]
    follower = brokers[1 - leader.node_id]
    follower.stop()
    latest = _produce(leader.bootstrap, topic)
    _roll(leader.bootstrap, topic)
    rows = wait_until(
        lambda: (
            (r := _confluent_read(leader.bootstrap, topic))
            and _cleaned(r, latest, tombstones=True)
            and r
        ),
        30,
        "the leader to compact",
    )
    # The follower keeps what it fetched as it was: its own cleaner stays off.
    follower.env = {**env, "SHOAL_LOG_CLEANER_ENABLE": "false"}
    follower.start()
    cluster.wait_full_isr(topic)
    follower.stop()
    leader.stop()
    assert _log_bytes(follower.data_dir, topic) == _log_bytes(leader.data_dir, topic)
    assert len(rows) < WRITTEN
