"""Committed offsets: they survive broker restarts, and auto.offset.reset behaves as in Kafka;
static members come back without a rebalance; groups are listed, described and deleted."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient
from conftest import BrokerFactory
from harness import BrokerProcess
from kafka_clients import Rec, confluent_produce, create_topic


def group_consumer(bootstrap: str, group: str, **extra: object) -> Consumer:
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "auto.offset.reset": "earliest",
    }
    config.update(extra)
    return Consumer(config)


def read(consumer: Consumer, count: int, timeout: float = 30) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error() is not None:
            raise KafkaException(message.error())
        values.append(message.value())
    return values


def produce_values(bootstrap: str, topic: str, values: list[bytes]) -> None:
    confluent_produce(bootstrap, topic, [Rec(0, None, v) for v in values], "none")


def committed(bootstrap: str, group: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(group, [CTopicPartition(topic, 0)])
    result = admin.list_consumer_group_offsets([request])[group].result(30)
    return int(result.topic_partitions[0].offset)


@pytest.mark.parametrize("crash", [False, True])
def test_committed_offsets_survive_a_broker_restart(
    broker_factory: BrokerFactory, crash: bool
) -> None:
    broker = broker_factory()
    topic = create_topic(broker.bootstrap, 1)
    group = f"restart-{uuid.uuid4().hex[:6]}"
    produce_values(broker.bootstrap, topic, [b"%d" % i for i in range(10)])
    consumer = group_consumer(broker.bootstrap, group)
    consumer.subscribe([topic])
    assert read(consumer, 6) == [b"%d" % i for i in range(6)]
    consumer.commit(asynchronous=False)
    consumer.close()
    assert committed(broker.bootstrap, group, topic) == 6

    if crash:
        broker.kill()
    else:
        assert broker.stop() == 0
    broker.start()
    assert committed(broker.bootstrap, group, topic) == 6
    again = group_consumer(broker.bootstrap, group)
    again.subscribe([topic])
    assert read(again, 4) == [b"%d" % i for i in range(6, 10)]
    again.close()


def test_auto_offset_reset_earliest_latest_and_none(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 1)
    produce_values(broker.bootstrap, topic, [b"old-1", b"old-2"])

    earliest = group_consumer(
        broker.bootstrap, f"e-{uuid.uuid4().hex[:6]}", **{"auto.offset.reset": "earliest"}
    )
    earliest.subscribe([topic])
    assert read(earliest, 2) == [b"old-1", b"old-2"]
    earliest.close()

    latest = group_consumer(
        broker.bootstrap, f"l-{uuid.uuid4().hex[:6]}", **{"auto.offset.reset": "latest"}
    )
    latest.subscribe([topic])
    deadline = time.monotonic() + 30
    while not latest.assignment() and time.monotonic() < deadline:
        latest.poll(0.2)
    time.sleep(1)
    latest.poll(0.5)
    produce_values(broker.bootstrap, topic, [b"new"])
    assert read(latest, 1) == [b"new"]
    latest.close()

    none = group_consumer(
        broker.bootstrap, f"n-{uuid.uuid4().hex[:6]}", **{"auto.offset.reset": "error"}
    )
    none.subscribe([topic])
    with pytest.raises(KafkaException) as raised:
        read(none, 1)
    assert raised.value.args[0].code() == KafkaError._AUTO_OFFSET_RESET
    none.close()


def test_kafka_python_auto_offset_reset_none_raises(broker: BrokerProcess) -> None:
    from kafka import KafkaConsumer
    from kafka.errors import NoOffsetForPartitionError

    topic = create_topic(broker.bootstrap, 1)
    produce_values(broker.bootstrap, topic, [b"x"])
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id=f"kn-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="none",
        enable_auto_commit=False,
    )
    with pytest.raises(NoOffsetForPartitionError):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
    consumer.close()


def test_a_static_member_comes_back_without_a_rebalance(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 4)
    group = f"static-{uuid.uuid4().hex[:6]}"
    members = [
        group_consumer(broker.bootstrap, group, **{"group.instance.id": f"instance-{i}"})
        for i in range(2)
    ]
    for member in members:
        member.subscribe([topic])
    deadline = time.monotonic() + 30
    while sum(len(m.assignment()) for m in members) < 4 and time.monotonic() < deadline:
        for member in members:
            member.poll(0.1)
    before = sorted(tp.partition for tp in members[1].assignment())
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    generation_before = admin.describe_consumer_groups([group])[group].result(30)

    members[1].close()  # a static member's close does not leave the group
    replacement = group_consumer(broker.bootstrap, group, **{"group.instance.id": "instance-1"})
    replacement.subscribe([topic])
    deadline = time.monotonic() + 20
    while not replacement.assignment() and time.monotonic() < deadline:
        replacement.poll(0.1)
        members[0].poll(0.1)
    assert sorted(tp.partition for tp in replacement.assignment()) == before
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert len(described.members) == 2
    assert described.state == generation_before.state
    assert "event=static_member_replaced" in broker.log_tail(200_000)
    log_tail = broker.log_tail(200_000)
    assert log_tail.count(f"event=rebalance_completed group={group}") == 1
    replacement.close()
    members[0].close()


def test_groups_are_listed_described_and_deleted_only_when_empty(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 2)
    group = f"admin-{uuid.uuid4().hex[:6]}"
    produce_values(broker.bootstrap, topic, [b"a", b"b"])
    consumer = group_consumer(broker.bootstrap, group)
    consumer.subscribe([topic])
    read(consumer, 2)
    consumer.commit(asynchronous=False)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = {g.group_id: g for g in admin.list_consumer_groups().result(30).valid}
    assert group in listed
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert str(described.state).endswith("STABLE")
    assert len(described.members) == 1
    deleting = admin.delete_consumer_groups([group])[group]
    with pytest.raises(KafkaException) as raised:
        deleting.result(30)
    assert raised.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    consumer.close()
    admin.delete_consumer_groups([group])[group].result(30)
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(30).valid}
