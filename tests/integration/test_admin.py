"""Topic administration through confluent-kafka's AdminClient, as an operator would do it."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from harness import BrokerProcess, wait_until
from kafka_clients import Rec, confluent_consume, confluent_produce
from raw_kafka import RawConnection, request_class


def new_name() -> str:
    return f"admin-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def error_of(future: object) -> int:
    with pytest.raises(KafkaException) as raised:
        future.result(30)  # type: ignore[attr-defined]
    return int(raised.value.args[0].code())


def test_create_topic_is_visible_with_leaders_and_a_topic_id(admin: AdminClient) -> None:
    name = new_name()
    admin.create_topics([NewTopic(name, 3, 1)])[name].result(30)
    topic = admin.list_topics(name, timeout=30).topics[name]
    assert topic.error is None
    assert sorted(topic.partitions) == [0, 1, 2]
    assert all(
        p.leader == 0 and p.replicas == [0] and p.isrs == [0] for p in topic.partitions.values()
    )
    described = admin.describe_topics(__import__("confluent_kafka").TopicCollection([name]))[
        name
    ].result(30)
    assert str(described.topic_id) != "AAAAAAAAAAAAAAAAAAAAAA"


def test_create_topic_refusals_carry_kafka_error_codes(admin: AdminClient) -> None:
    existing = new_name()
    admin.create_topics([NewTopic(existing, 1, 1)])[existing].result(30)
    cases = {
        existing: (NewTopic(existing, 1, 1), KafkaError.TOPIC_ALREADY_EXISTS),
        "bad name!": (NewTopic("bad name!", 1, 1), KafkaError.TOPIC_EXCEPTION),
        "x" * 250: (NewTopic("x" * 250, 1, 1), KafkaError.TOPIC_EXCEPTION),
        "zero-partitions": (NewTopic("zero-partitions", 0, 1), KafkaError.INVALID_PARTITIONS),
        "too-many-replicas": (
            NewTopic("too-many-replicas", 1, 3),
            KafkaError.INVALID_REPLICATION_FACTOR,
        ),
        "bad-config-value": (
            NewTopic("bad-config-value", 1, 1, config={"retention.ms": "soon"}),
            KafkaError.INVALID_CONFIG,
        ),
        "unknown-config": (
            NewTopic("unknown-config", 1, 1, config={"retention.forever": "1"}),
            KafkaError.INVALID_CONFIG,
        ),
    }
    for name, (topic, code) in cases.items():
        assert error_of(admin.create_topics([topic])[name]) == code, name
    assert "too-many-replicas" not in admin.list_topics(timeout=30).topics


def test_validate_only_creates_nothing(admin: AdminClient) -> None:
    name = new_name()
    admin.create_topics([NewTopic(name, 2, 1)], validate_only=True)[name].result(30)
    assert name not in admin.list_topics(timeout=30).topics


def test_topic_names_that_differ_only_in_dot_and_underscore_collide(admin: AdminClient) -> None:
    base = new_name()
    admin.create_topics([NewTopic(f"{base}.a", 1, 1)])[f"{base}.a"].result(30)
    assert error_of(admin.create_topics([NewTopic(f"{base}_a", 1, 1)])[f"{base}_a"]) == (
        KafkaError.TOPIC_EXCEPTION
    )


def test_create_partitions_grows_and_refuses_to_shrink(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    name = new_name()
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    admin.create_partitions([NewPartitions(name, 5)])[name].result(30)
    assert sorted(admin.list_topics(name, timeout=30).topics[name].partitions) == [0, 1, 2, 3, 4]
    assert (
        error_of(admin.create_partitions([NewPartitions(name, 3)])[name])
        == KafkaError.INVALID_PARTITIONS
    )
    records = [Rec(4, b"k", b"in the new partition")]
    confluent_produce(broker.bootstrap, name, records, "none")
    assert [r.value for r in confluent_consume(broker.bootstrap, name, {4: 1})] == [
        b"in the new partition"
    ]


def test_topics_of_hundreds_of_partitions_are_created_and_grown(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    """More partitions than one etcd transaction takes (128 operations), at creation and
    in one CreatePartitions: once refused with REQUEST_TIMED_OUT from etcd."""
    name = new_name()
    admin.create_topics([NewTopic(name, 300, 1)], operation_timeout=60)[name].result(90)
    assert len(admin.list_topics(name, timeout=30).topics[name].partitions) == 300
    admin.create_partitions([NewPartitions(name, 450)], operation_timeout=60)[name].result(90)
    partitions = admin.list_topics(name, timeout=30).topics[name].partitions
    assert sorted(partitions) == list(range(450))
    assert all(p.leader == broker.node_id for p in partitions.values())
    records = [Rec(449, b"k", b"in the last new partition")]
    confluent_produce(broker.bootstrap, name, records, "none")
    assert [r.value for r in confluent_consume(broker.bootstrap, name, {449: 1})] == [
        b"in the last new partition"
    ]


def test_describe_configs_reports_values_and_sources(admin: AdminClient) -> None:
    name = new_name()
    config = {"retention.ms": "3600000", "cleanup.policy": "compact"}
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(30)
    resource = ConfigResource("topic", name)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["cleanup.policy"].value == "compact"
    assert configs["segment.bytes"].value == "1073741824"
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["max.message.bytes"].value == "1048588"


def test_describe_configs_of_an_unknown_topic_fails(admin: AdminClient) -> None:
    resource = ConfigResource("topic", "no-such-topic")
    assert (
        error_of(admin.describe_configs([resource])[resource]) == KafkaError.UNKNOWN_TOPIC_OR_PART
    )


def test_incremental_alter_configs_set_delete_append(admin: AdminClient) -> None:
    name = new_name()
    admin.create_topics([NewTopic(name, 1, 1, config={"retention.ms": "1000000"})])[name].result(30)

    def alter(*entries: ConfigEntry) -> object:
        resource = ConfigResource("topic", name, incremental_configs=list(entries))
        return admin.incremental_alter_configs([resource])[resource]

    def value(key: str) -> str:
        resource = ConfigResource("topic", name)
        return str(admin.describe_configs([resource])[resource].result(30)[key].value)

    alter(
        ConfigEntry("segment.ms", "600000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
    ).result(30)  # type: ignore[attr-defined]
    assert value("segment.ms") == "600000"
    assert value("retention.ms") == "604800000"
    assert value("cleanup.policy") == "delete,compact"
    bad = alter(ConfigEntry("segment.bytes", "-5", incremental_operation=AlterConfigOpType.SET))
    assert error_of(bad) == KafkaError.INVALID_CONFIG
    assert value("segment.bytes") == "1073741824"


def test_describe_cluster_and_broker_configs(admin: AdminClient, broker: BrokerProcess) -> None:
    cluster = admin.describe_cluster().result(30)
    assert cluster.cluster_id
    assert cluster.controller.id == 0
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, "127.0.0.1", broker.port)]
    resource = ConfigResource("broker", "0")
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["log.retention.ms"].value == "604800000"
    assert configs["auto.create.topics.enable"].value == "false"


def test_delete_topic_removes_it_and_its_files(admin: AdminClient, broker: BrokerProcess) -> None:
    name = new_name()
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    confluent_produce(broker.bootstrap, name, [Rec(0, b"k", b"old")], "none")
    assert Path(broker.data_dir, f"{name}-0").is_dir()
    admin.delete_topics([name])[name].result(30)
    assert name not in admin.list_topics(timeout=30).topics
    wait_until(
        lambda: not list(Path(broker.data_dir).glob(f"{name}-*")), 10, "partition dirs to go"
    )
    assert error_of(admin.delete_topics([name])[name]) == KafkaError.UNKNOWN_TOPIC_OR_PART

    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    confluent_produce(broker.bootstrap, name, [Rec(0, b"k", b"new")], "none")
    assert [(r.offset, r.value) for r in confluent_consume(broker.bootstrap, name, {0: 1})] == [
        (0, b"new")
    ]


def test_log_append_time_topics_stamp_the_broker_clock(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    name = new_name()
    admin.create_topics([NewTopic(name, 1, 1, config={"message.timestamp.type": "LogAppendTime"})])[
        name
    ].result(30)
    before = int(time.time() * 1000)
    confluent_produce(
        broker.bootstrap, name, [Rec(0, b"k", b"v", timestamp=1_000_000_000_000)], "none"
    )
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": name, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(name, 0, OFFSET_BEGINNING)])
    message = None
    deadline = time.monotonic() + 30
    while message is None and time.monotonic() < deadline:
        message = consumer.poll(0.5)
    consumer.close()
    assert message is not None and message.error() is None
    kind, timestamp = message.timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME
    assert before - 1000 <= timestamp <= int(time.time() * 1000) + 1000


def test_compact_policy_is_accepted_and_reported_as_active(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    name = new_name()
    admin.create_topics([NewTopic(name, 1, 1, config={"cleanup.policy": "compact"})])[name].result(
        30
    )
    request = request_class(32, 4)(
        resources=(
            request_class(32, 4, "DescribeConfigsResource")(
                resource_type=2, resource_name=name, configuration_keys=("cleanup.policy",)
            ),
        ),
        include_synonyms=False,
        include_documentation=True,
    )
    with RawConnection(broker.bootstrap) as conn:
        result = conn.call(request).results[0]
    (entry,) = result.configs
    assert entry.value == "compact"
    assert "not active" not in entry.documentation
    assert "log cleaner" in entry.documentation


def test_partition_counts_beyond_the_broker_limit_are_a_policy_violation(
    admin: AdminClient,
) -> None:
    name = new_name()
    assert error_of(admin.create_topics([NewTopic(name, 50_000, 1)])[name]) == (
        KafkaError.POLICY_VIOLATION
    )
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    assert error_of(admin.create_partitions([NewPartitions(name, 50_000)])[name]) == (
        KafkaError.POLICY_VIOLATION
    )


def test_describe_log_dirs_reports_bytes_on_disk_per_partition(
    admin: AdminClient, broker: BrokerProcess
) -> None:
    from kafka import KafkaAdminClient

    name = new_name()
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    confluent_produce(broker.bootstrap, name, [Rec(0, b"k", b"v" * 1000)], "none")
    on_disk = {
        index: sum(f.stat().st_size for f in Path(broker.data_dir, f"{name}-{index}").glob("*.log"))
        for index in (0, 1)
    }
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        (answer,) = client.describe_log_dirs({name: [0, 1]})
        everything = client.describe_log_dirs()
    finally:
        client.close()
    assert answer["broker"] == 0
    (log_dir,) = answer["log_dirs"]
    assert log_dir["error_code"] == 0
    assert log_dir["log_dir"] == str(Path(broker.data_dir).resolve())
    (topic,) = log_dir["topics"]
    assert topic["name"] == name
    sizes = {p["partition_index"]: p["partition_size"] for p in topic["partitions"]}
    assert sizes == on_disk
    assert sizes[0] > 1000 and sizes[1] == 0
    assert all(p["offset_lag"] == 0 and not p["is_future_key"] for p in topic["partitions"])
    (all_dirs,) = everything[0]["log_dirs"]
    assert name in {t["name"] for t in all_dirs["topics"]}

    # The oldest version (not flexible, no top-level error code) answers alike.
    v1 = request_class(35, 1)
    with RawConnection(broker.bootstrap) as conn:
        old = conn.call(
            v1(
                topics=(
                    request_class(35, 1, "DescribableLogDirTopic")(topic=name, partitions=(0,)),
                )
            )
        )
    assert [(p.partition_index, p.partition_size) for p in old.results[0].topics[0].partitions] == [
        (0, on_disk[0])
    ]
