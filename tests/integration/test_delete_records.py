"""DeleteRecords (API 21) with real clients, against brokers and through the gateway.

``kafka-delete-records`` as confluent-kafka's and kafka-python's admin clients
do it: the partition's log start offset moves to the given offset (or the high
watermark for -1), the answer carries the new low watermark once every live
replica has it, ListOffsets(earliest) and consumers from the beginning start
there, fetching below it is OFFSET_OUT_OF_RANGE, and the segments below it
leave the disk (DescribeLogDirs shrinks). A broker SIGKILLed right after it
answered never serves a deleted record again, whether it restarts or a
follower takes over. Through the gateway a tenant needs DELETE on its topic,
and no spelling reaches another tenant's.
"""

from __future__ import annotations

import datetime
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from conftest import BrokerFactory
from gateway_env import TenantKey
from harness import BrokerProcess, wait_until
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, request_class
from replicated import start_cluster
from shoal.broker.log.checkpoint import read_offsets
from shoal.tenancy.acl import read_only_bindings

RECORDS = 40
SMALL_SEGMENTS = {"segment.bytes": "1000", "file.delete.delay.ms": "0"}
LOG_START_CHECKPOINT = "log-start-offset-checkpoint"


def new_topic() -> str:
    return f"dr-{uuid.uuid4().hex[:10]}"


def produce(config: dict[str, Any], topic: str, count: int, partitions: int = 1) -> None:
    """``count`` records of ~200 bytes per partition, acks=all, one batch each (many segments)."""
    producer = Producer({**config, "acks": "all", "linger.ms": 0})
    failures: list[Any] = []
    for partition in range(partitions):
        for i in range(count):
            producer.produce(
                topic,
                partition=partition,
                value=b"v" * 200 + b"%d" % i,
                on_delivery=lambda err, _m: failures.append(err) if err else None,
            )
            producer.flush(20)
    assert producer.flush(20) == 0
    assert failures == []


def create(config: dict[str, Any], topic: str, partitions: int = 1, **topic_config: str) -> None:
    admin = AdminClient(config)  # held: a collected client cancels its futures
    admin.create_topics([NewTopic(topic, partitions, config=topic_config)])[topic].result(30)


def delete_records(
    config: dict[str, Any], topic: str, offsets: dict[int, int]
) -> dict[int, int | KafkaException]:
    """confluent-kafka's AdminClient.delete_records: the low watermark (or error) per partition."""
    admin = AdminClient(config)
    futures = admin.delete_records([CTopicPartition(topic, p, o) for p, o in offsets.items()])
    out: dict[int, int | KafkaException] = {}
    for tp, future in futures.items():
        try:
            out[tp.partition] = int(future.result(60).low_watermark)
        except KafkaException as exc:
            out[tp.partition] = exc
    return out


def raw_delete_records(
    conn: RawConnection, topic: str, partition: int, offset: int, version: int = 2
) -> tuple[ErrorCode, int]:
    """One partition's (error, low watermark), as the broker (or gateway) answers it."""
    request = request_class(21, version)(
        timeout=datetime.timedelta(seconds=10),
        topics=(
            request_class(21, version, "DeleteRecordsTopic")(
                name=topic,
                partitions=(
                    request_class(21, version, "DeleteRecordsPartition")(
                        partition_index=partition, offset=offset
                    ),
                ),
            ),
        ),
    )
    (answer,) = conn.call(request).topics
    assert answer.name == topic
    (result,) = answer.partitions
    return result.error_code, result.low_watermark


def error_of(result: int | KafkaException) -> int:
    assert isinstance(result, KafkaException), f"expected an error, got low watermark {result}"
    return int(result.args[0].code())


def earliest(config: dict[str, Any], topic: str, partition: int = 0) -> int:
    admin = AdminClient(config)
    tp = CTopicPartition(topic, partition)
    return int(admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(30).offset)


def offsets_from_beginning(
    config: dict[str, Any], topic: str, end: int, partition: int = 0
) -> list[int]:
    """Offsets a consumer assigned at the beginning reads up to ``end``."""
    consumer = Consumer(
        {**config, "group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    consumer.assign([CTopicPartition(topic, partition, OFFSET_BEGINNING)])
    offsets: list[int] = []
    deadline = time.monotonic() + 30
    try:
        while (not offsets or offsets[-1] < end - 1) and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            offsets.append(message.offset())
    finally:
        consumer.close()
    return offsets


def fetch_error(bootstrap: str, topic: str, offset: int) -> ErrorCode:
    version = 12
    request = request_class(1, version)(
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=1,
        topics=(
            request_class(1, version, "FetchTopic")(
                topic=topic,
                partitions=(
                    request_class(1, version, "FetchPartition")(
                        partition=0, fetch_offset=offset, partition_max_bytes=65536
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    with RawConnection(bootstrap) as conn:
        response = conn.call(request)
    return response.responses[0].partitions[0].error_code


def segment_bases(data_dir: Path, topic: str) -> list[int]:
    return sorted(int(p.stem) for p in Path(data_dir, f"{topic}-0").glob("*.log"))


def checkpointed_log_start(data_dir: Path, topic: str) -> int | None:
    return read_offsets(Path(data_dir, LOG_START_CHECKPOINT)).get((topic, 0))


def log_dir_size(broker: BrokerProcess, topic: str) -> int:
    """Partition 0's size on ``broker``, as DescribeLogDirs (kafka-python) reports it."""
    from kafka import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        (answer,) = client.describe_log_dirs({topic: [0]}, brokers=[broker.node_id])
    finally:
        client.close()
    (log_dir,) = answer["log_dirs"]
    (described,) = log_dir["topics"]
    (partition,) = described["partitions"]
    return int(partition["partition_size"])


def wholly_below_are_gone(data_dir: Path, topic: str, start: int) -> bool:
    """No segment whose successor starts at or below ``start`` is left."""
    bases = segment_bases(data_dir, topic)
    return len(bases) >= 1 and (len(bases) == 1 or bases[1] > start) and bases[0] <= start


# -- against the brokers ---------------------------------------------------------------


def test_delete_records_moves_the_low_watermark_on_every_replica(
    broker_factory: BrokerFactory,
) -> None:
    cluster = start_cluster(broker_factory)
    topic = cluster.create_topic(new_topic(), 1, **SMALL_SEGMENTS)
    cluster.wait_full_isr(topic)
    config = {"bootstrap.servers": cluster.bootstrap}
    produce(config, topic, RECORDS)
    leader = cluster.brokers[cluster.leader_of(topic, 0)]
    size_before = log_dir_size(leader, topic)

    assert delete_records(config, topic, {0: 25}) == {0: 25}

    # Answered only once every replica has the new start on disk.
    for broker in cluster.brokers.values():
        assert checkpointed_log_start(broker.data_dir, topic) == 25, broker.node_id
    assert earliest(config, topic) == 25
    assert offsets_from_beginning(config, topic, RECORDS) == list(range(25, RECORDS))
    assert fetch_error(leader.bootstrap, topic, 24) == ErrorCode.offset_out_of_range
    assert fetch_error(leader.bootstrap, topic, 25) == ErrorCode.none
    for broker in cluster.brokers.values():
        wait_until(
            lambda b=broker: wholly_below_are_gone(b.data_dir, topic, 25),
            10,
            f"segments below 25 to leave broker {broker.node_id}",
        )
    assert log_dir_size(leader, topic) < size_before

    # An offset below the log start changes nothing and answers where it is.
    assert delete_records(config, topic, {0: 10}) == {0: 25}
    # -1 is the high watermark: everything committed goes.
    assert delete_records(config, topic, {0: OFFSET_END}) == {0: RECORDS}
    assert earliest(config, topic) == RECORDS
    assert log_dir_size(leader, topic) == 0
    produce(config, topic, 1)
    assert offsets_from_beginning(config, topic, RECORDS + 1) == [RECORDS]


def test_delete_records_past_the_high_watermark_is_offset_out_of_range(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory()
    config = {"bootstrap.servers": broker.bootstrap}
    topic = new_topic()
    create(config, topic)
    produce(config, topic, 5)
    (result,) = delete_records(config, topic, {0: 6}).values()
    assert error_of(result) == ErrorCode.offset_out_of_range
    assert earliest(config, topic) == 0
    with RawConnection(broker.bootstrap) as conn:
        # librdkafka refuses these itself; the broker's own answers, for every version.
        for version in (0, 1, 2):
            assert raw_delete_records(conn, topic, 3, 1, version) == (
                ErrorCode.unknown_topic_or_partition,
                -1,
            )
            assert raw_delete_records(conn, topic, 0, -2, version) == (
                ErrorCode.offset_out_of_range,
                -1,
            )
        assert raw_delete_records(conn, topic, 0, 2) == (ErrorCode.none, 2)
        compacted = new_topic()
        create(config, compacted, **{"cleanup.policy": "compact"})
        assert raw_delete_records(conn, compacted, 0, 0) == (ErrorCode.policy_violation, -1)


def test_kafka_python_delete_records(broker_factory: BrokerFactory) -> None:
    from kafka import KafkaAdminClient, TopicPartition

    broker = broker_factory()
    config = {"bootstrap.servers": broker.bootstrap}
    topic = new_topic()
    create(config, topic, **SMALL_SEGMENTS)
    produce(config, topic, 20)
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = client.delete_records({TopicPartition(topic, 0): 12})
    finally:
        client.close()
    assert result[TopicPartition(topic, 0)]["low_watermark"] == 12
    assert earliest(config, topic) == 12
    assert offsets_from_beginning(config, topic, 20) == list(range(12, 20))


def test_a_broker_killed_right_after_delete_records_restarts_without_the_deleted_records(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory()
    config = {"bootstrap.servers": broker.bootstrap}
    topic = new_topic()
    # A long delete delay: the segment files are still on disk at the kill.
    create(config, topic, **{"segment.bytes": "1000"})
    produce(config, topic, RECORDS)
    assert delete_records(config, topic, {0: 27}) == {0: 27}
    broker.kill()

    broker.start()
    assert earliest(config, topic) == 27
    assert fetch_error(broker.bootstrap, topic, 26) == ErrorCode.offset_out_of_range
    assert fetch_error(broker.bootstrap, topic, 0) == ErrorCode.offset_out_of_range
    assert offsets_from_beginning(config, topic, RECORDS) == list(range(27, RECORDS))


def test_a_leader_killed_right_after_delete_records_leaves_followers_that_honour_it(
    broker_factory: BrokerFactory,
) -> None:
    cluster = start_cluster(broker_factory)
    topic = cluster.create_topic(new_topic(), 1, **{"segment.bytes": "1000"})
    cluster.wait_full_isr(topic)
    produce({"bootstrap.servers": cluster.bootstrap}, topic, RECORDS)
    old_leader = cluster.leader_of(topic, 0)
    assert delete_records({"bootstrap.servers": cluster.bootstrap}, topic, {0: 31}) == {0: 31}
    cluster.brokers[old_leader].kill()

    wait_until(lambda: cluster.leader_of(topic, 0) not in (-1, old_leader), 30, "a new leader", 0.2)
    live = {"bootstrap.servers": cluster.live_bootstrap()}
    assert earliest(live, topic) == 31
    new_leader = cluster.brokers[cluster.leader_of(topic, 0)]
    assert fetch_error(new_leader.bootstrap, topic, 30) == ErrorCode.offset_out_of_range
    assert offsets_from_beginning(live, topic, RECORDS) == list(range(31, RECORDS))

    cluster.restart(old_leader)
    cluster.wait_full_isr(topic)
    assert checkpointed_log_start(cluster.brokers[old_leader].data_dir, topic) == 31


# -- through the gateway ---------------------------------------------------------------


def tenant_topic(key: TenantKey, partitions: int = 2) -> str:
    name = new_topic()
    create(key.librdkafka(), name, partitions, **SMALL_SEGMENTS)
    return name


def test_a_tenant_deletes_records_of_its_topic_through_the_gateway(
    gateway_cluster: Any,
) -> None:
    key = gateway_cluster.tenant(f"dr-{uuid.uuid4().hex[:6]}")
    topic = tenant_topic(key)
    config = key.librdkafka()
    produce(config, topic, 20, partitions=2)

    assert delete_records(config, topic, {0: 8, 1: OFFSET_END}) == {0: 8, 1: 20}
    assert earliest(config, topic, 0) == 8
    assert earliest(config, topic, 1) == 20
    assert offsets_from_beginning(config, topic, 20, partition=0) == list(range(8, 20))


def test_kafka_python_deletes_records_through_the_gateway(gateway_cluster: Any) -> None:
    from kafka import KafkaAdminClient, TopicPartition

    key = gateway_cluster.tenant(f"dr-{uuid.uuid4().hex[:6]}")
    topic = tenant_topic(key, partitions=1)
    produce(key.librdkafka(), topic, 10)
    client = KafkaAdminClient(**key.python_client())
    try:
        result = client.delete_records({TopicPartition(topic, 0): 4})
    finally:
        client.close()
    assert result[TopicPartition(topic, 0)]["low_watermark"] == 4
    assert earliest(key.librdkafka(), topic) == 4


def test_no_other_key_changes_a_tenants_records(gateway_cluster: Any) -> None:
    a = gateway_cluster.tenant(f"dr-a-{uuid.uuid4().hex[:6]}")
    b = gateway_cluster.tenant(f"dr-b-{uuid.uuid4().hex[:6]}")
    topic = tenant_topic(a, partitions=1)
    produce(a.librdkafka(), topic, 10)
    # B has a topic of the same name, with records of its own.
    create(b.librdkafka(), topic)
    produce(b.librdkafka(), topic, 10)

    # A key without DELETE on the topic: TOPIC_AUTHORIZATION_FAILED, nothing moves.
    for tenant, owner in ((a.tenant, a), (b.tenant, b)):
        reader = gateway_cluster.tenant(tenant, bindings=read_only_bindings(tenant, "KEY"))
        (refused,) = delete_records(reader.librdkafka(), topic, {0: 5}).values()
        assert error_of(refused) == ErrorCode.topic_authorization_failed
        assert earliest(owner.librdkafka(), topic) == 0

    # B spelling A's topic the brokers' way reaches only its own namespace.
    spelled = f"{a.tenant}.{topic}"
    # librdkafka asks Metadata first, hears the topic is unknown, and finds no leader to ask.
    (unknown,) = delete_records(b.librdkafka(), spelled, {0: 5}).values()
    assert error_of(unknown) == KafkaError._NOENT
    with b.raw() as conn:
        # The name lands in B's namespace, where the brokers know no such topic.
        assert raw_delete_records(conn, spelled, 0, 5) == (
            ErrorCode.unknown_topic_or_partition,
            -1,
        )
    # B's own delete moves only B's topic.
    assert delete_records(b.librdkafka(), topic, {0: 7}) == {0: 7}
    assert earliest(a.librdkafka(), topic) == 0
    assert earliest(b.librdkafka(), topic) == 7
    assert offsets_from_beginning(a.librdkafka(), topic, 10) == list(range(10))
