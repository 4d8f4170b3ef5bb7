"""Four Kafka clients we did not write, through the gateway, with SASL/PLAIN, plain and TLS.

For kcat, confluent-kafka, kafka-python and aiokafka, on the SASL_PLAINTEXT
listener and on the SASL_SSL one: the client produces keyed records to a
three-partition topic, reads them back as a member of a consumer group and
commits, and gets every key and value back byte for byte. The group's
committed offsets, read back through the gateway by another client, are
exactly where the member stopped: one past the last record of each partition.

One tenant and one gateway serve every case; each case has its own topic and
group, so the cases never see each other's records.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from gateway_env import TenantKey
from kafka_clients import KCAT_FORMAT, _parse_kcat

PARTITIONS = 3
COUNT = 30
DEADLINE_S = 30.0
# Keys and values kcat can carry on a line ("key:value\n"), with bytes that are
# not UTF-8 so that a client or the gateway decoding them would show.
RECORDS: list[tuple[bytes, bytes]] = [
    (b"key-%02d-\xc3\xa9" % i, b"value-%02d-\xff\xfe\x01\x80-" % i + b"x" * i) for i in range(COUNT)
]

# (partition, offset, key, value) of one consumed record.
Consumed = tuple[int, int, bytes | None, bytes | None]


@pytest.fixture(scope="module")
def key(gateway_cluster: Any) -> TenantKey:
    return gateway_cluster.tenant("clients")  # type: ignore[no-any-return]


def python_kwargs(key: TenantKey, tls: bool) -> dict[str, Any]:
    kwargs = key.python_client(tls)
    if tls:
        kwargs["ssl_context"] = key.ssl_context()
    return kwargs


def create_topic(key: TenantKey, tls: bool, name: str) -> None:
    admin = AdminClient(key.librdkafka(tls))
    admin.create_topics([NewTopic(name, PARTITIONS)])[name].result(30)


def committed_offsets(key: TenantKey, tls: bool, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets, as an admin client sees them through the gateway."""
    admin = AdminClient(key.librdkafka(tls))
    wanted = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p) for p in range(PARTITIONS)]
    )
    result = admin.list_consumer_group_offsets([wanted])[group].result(30)
    assert result.group_id == group
    offsets = {}
    for tp in result.topic_partitions:
        assert tp.error is None, tp.error
        assert tp.topic == topic
        offsets[tp.partition] = tp.offset
    return offsets


# -- confluent-kafka --------------------------------------------------------------------


def confluent_produce(key: TenantKey, tls: bool, topic: str) -> None:
    producer = Producer(key.librdkafka(tls, acks="all", **{"linger.ms": 5}))
    errors: list[str] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err.str())

    for k, v in RECORDS:
        producer.produce(topic, key=k, value=v, on_delivery=delivered)
    assert producer.flush(DEADLINE_S) == 0
    assert not errors, errors


def confluent_consume(key: TenantKey, tls: bool, topic: str, group: str) -> list[Consumed]:
    consumer = Consumer(
        key.librdkafka(
            tls,
            **{
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            },
        )
    )
    consumer.subscribe([topic])
    out: list[Consumed] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < COUNT and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return out


# -- kafka-python ---------------------------------------------------------------------------


def kafka_python_produce(key: TenantKey, tls: bool, topic: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(**python_kwargs(key, tls), acks="all", linger_ms=5)
    try:
        futures = [producer.send(topic, key=k, value=v) for k, v in RECORDS]
        producer.flush(DEADLINE_S)
        for future in futures:
            future.get(DEADLINE_S)
    finally:
        producer.close()


def kafka_python_consume(key: TenantKey, tls: bool, topic: str, group: str) -> list[Consumed]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        **python_kwargs(key, tls),
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    out: list[Consumed] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < COUNT and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500).values():
                out.extend((m.partition, m.offset, m.key, m.value) for m in messages)
        consumer.commit()
    finally:
        consumer.close(autocommit=False)
    return out


# -- aiokafka --------------------------------------------------------------------------------


async def _aiokafka_produce(key: TenantKey, tls: bool, topic: str) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**python_kwargs(key, tls), acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=k, value=v) for k, v in RECORDS]
        await asyncio.wait_for(asyncio.gather(*futures), DEADLINE_S)
    finally:
        await producer.stop()


async def _aiokafka_consume(key: TenantKey, tls: bool, topic: str, group: str) -> list[Consumed]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        **python_kwargs(key, tls),
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    out: list[Consumed] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(out) < COUNT and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                out.extend((m.partition, m.offset, m.key, m.value) for m in messages)
        await consumer.commit()
    finally:
        await consumer.stop()
    return out


def aiokafka_produce(key: TenantKey, tls: bool, topic: str) -> None:
    asyncio.run(_aiokafka_produce(key, tls, topic))


def aiokafka_consume(key: TenantKey, tls: bool, topic: str, group: str) -> list[Consumed]:
    return asyncio.run(_aiokafka_consume(key, tls, topic, group))


# -- kcat --------------------------------------------------------------------------------------


def _kcat(properties: Path, args: list[str], stdin: bytes | None = None) -> bytes:
    result = subprocess.run(
        ["kcat", "-F", str(properties), "-q", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout


def kcat_produce(topic: str, properties: Path) -> None:
    """kcat's partitioner places each record by its key (no -p)."""
    lines = b"".join(k + b":" + v + b"\n" for k, v in RECORDS)
    _kcat(properties, ["-P", "-t", topic, "-K:", "-X", "acks=all"], stdin=lines)


def kcat_consume(topic: str, group: str, properties: Path) -> list[Consumed]:
    """Balanced consumer (-G): stops at the end of every assigned partition (-e), and
    commits what it consumed when it closes (auto commit of stored offsets)."""
    output = _kcat(
        properties,
        ["-G", group, "-X", "auto.offset.reset=earliest", "-e", "-f", KCAT_FORMAT, topic],
    )
    return [(r.partition, r.offset or 0, r.key, r.value) for r in _parse_kcat(output)]


Producing = Callable[[TenantKey, bool, str], None]
Consuming = Callable[[TenantKey, bool, str, str], list[Consumed]]
CLIENTS: dict[str, tuple[Producing, Consuming]] = {
    "confluent-kafka": (confluent_produce, confluent_consume),
    "kafka-python": (kafka_python_produce, kafka_python_consume),
    "aiokafka": (aiokafka_produce, aiokafka_consume),
}


@pytest.mark.slow
@pytest.mark.parametrize("tls", [False, True], ids=["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("client", ["kcat", *CLIENTS])
def test_client_produces_consumes_and_commits_in_a_group(
    key: TenantKey, client: str, tls: bool, tmp_path: Path
) -> None:
    suffix = f"{client}-{'tls' if tls else 'plain'}"
    topic, group = f"orders-{suffix}", f"group-{suffix}"
    create_topic(key, tls, topic)

    if client == "kcat":
        properties = key.properties_file(tmp_path / "client.properties", tls)
        kcat_produce(topic, properties)
        consumed = kcat_consume(topic, group, properties)
    else:
        produce, consume = CLIENTS[client]
        produce(key, tls, topic)
        consumed = consume(key, tls, topic, group)

    assert sorted((k, v) for _, _, k, v in consumed) == sorted(RECORDS)
    # Keyed records spread over every partition, each read from offset 0 in order.
    per_partition = Counter(p for p, _, _, _ in consumed)
    assert set(per_partition) == set(range(PARTITIONS))
    for partition, count in per_partition.items():
        offsets = [o for p, o, _, _ in consumed if p == partition]
        assert offsets == list(range(count)), (partition, offsets)

    assert committed_offsets(key, tls, group, topic) == dict(per_partition)
