"""Apache Kafka itself, the reference system, runs here as benchmarks run it.

`make kafka` fetches the pinned Kafka from Maven Central (on a fresh machine
too: these tests never skip) and shoal.benchmarks.apache_kafka starts a KRaft
cluster of one controller and three brokers. Kafka's own tools and
confluent-kafka check that it has the shape Shoal's dev cluster has and takes
`acks=all` writes to a topic of replication factor 3 with
`min.insync.replicas=2`.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from harness import wait_until
from shoal.benchmarks.apache_kafka import (
    BROKER_IDS,
    CONTROLLER_ID,
    SHORT_RUN_JVM_OPTS,
    ApacheKafka,
    api_keys,
    default_kafka_home,
)

# A cold `make kafka` downloads about 150 MB from Maven Central.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
BROKER_REGISTRATION = 62  # an API only a KRaft controller serves


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=840)
    cluster = ApacheKafka(
        tmp_path_factory.mktemp("apache-kafka"), home, jvm_opts=SHORT_RUN_JVM_OPTS
    )
    with cluster:
        yield cluster
    for node in cluster.nodes:
        assert node.process is not None
        assert node.process.returncode is not None, f"{node.role} {node.node_id} still runs"


def tool(kafka: ApacheKafka, main_class: str, *args: str) -> str:
    done = subprocess.run(
        kafka.java_command(main_class, *args), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{main_class} {args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def admin(kafka: ApacheKafka) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka.bootstrap})


def test_three_brokers_and_a_dedicated_controller(kafka: ApacheKafka) -> None:
    assert len(kafka.pids()) == 4
    assert len(kafka.bootstrap.split(",")) == 3

    metadata = admin(kafka).list_topics(timeout=30)
    assert sorted(metadata.brokers) == sorted(BROKER_IDS)
    assert {f"{b.host}:{b.port}" for b in metadata.brokers.values()} == set(
        kafka.bootstrap.split(",")
    )

    # The controller listens on its own port and serves the controller's APIs;
    # the brokers do not.
    assert BROKER_REGISTRATION in api_keys(kafka.controller.port)
    assert BROKER_REGISTRATION not in api_keys(kafka.brokers[0].port)

    # Kafka's own view of the quorum: the controller alone votes and leads,
    # the three brokers follow it as observers.
    status = tool(
        kafka,
        "org.apache.kafka.tools.MetadataQuorumCommand",
        "--bootstrap-controller",
        kafka.bootstrap_controller,
        "describe",
        "--status",
    )
    fields = dict(re.findall(r"^(\w+):\s*(.*)$", status, re.MULTILINE))
    assert fields["LeaderId"] == str(CONTROLLER_ID), status
    voters = [int(i) for i in re.findall(r'"id":\s*(\d+)', fields["CurrentVoters"])]
    observers = [int(i) for i in re.findall(r'"id":\s*(\d+)', fields["CurrentObservers"])]
    assert voters == [CONTROLLER_ID], status
    assert sorted(observers) == sorted(BROKER_IDS), status


@pytest.fixture(scope="module")
def rf3_topic(kafka: ApacheKafka) -> str:
    """A topic of replication factor 3 with ``min.insync.replicas=2``, as Shoal's default."""
    topic = f"reference-{uuid.uuid4().hex[:8]}"
    client = admin(kafka)
    new = NewTopic(
        topic, num_partitions=1, replication_factor=3, config={"min.insync.replicas": "2"}
    )
    client.create_topics([new])[topic].result(30)
    # The controller answers CreateTopics before every broker has applied the
    # new metadata; Kafka's clients wait for it, as this does, at each broker
    # (the tests' requests go to any of them). A new client asks its only
    # bootstrap broker first.
    for broker in kafka.brokers:
        wait_until(
            lambda address=broker.address: knows_partition_0(address, topic),
            30,
            f"{topic} in broker {broker.node_id}'s metadata",
        )
    return topic


def knows_partition_0(address: str, topic: str) -> bool:
    """Whether the broker at ``address`` has ``topic``'s partition 0 in its metadata."""
    found = AdminClient({"bootstrap.servers": address}).list_topics(topic, timeout=10)
    return 0 in found.topics[topic].partitions


def test_rf3_min_isr_2_topic_takes_acks_all_and_reads_back(
    kafka: ApacheKafka, rf3_topic: str
) -> None:
    client = admin(kafka)
    partition = client.list_topics(rf3_topic, timeout=30).topics[rf3_topic].partitions[0]
    assert sorted(partition.replicas) == sorted(BROKER_IDS)
    resource = ConfigResource(ConfigResource.Type.TOPIC, rf3_topic)
    configs = client.describe_configs([resource])[resource].result(30)
    assert configs["min.insync.replicas"].value == "2"

    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap, "acks": "all", "enable.idempotence": True}
    )
    acked: list[tuple[bytes, int]] = []
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(error)
        else:
            acked.append((message.value(), message.offset()))

    sent = [f"record-{i}".encode() for i in range(100)]
    for value in sent:
        producer.produce(rf3_topic, value, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert errors == []
    assert [value for value, _ in sorted(acked, key=lambda a: a[1])] == sent

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": f"reader-{rf3_topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    received: list[bytes] = []
    try:
        consumer.subscribe([rf3_topic])
        for _ in range(300):
            if len(received) >= len(sent):
                break
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            received.append(message.value())
    finally:
        consumer.close()
    assert received == sent


def test_kafka_topics_tool_lists_and_describes_the_topic(
    kafka: ApacheKafka, rf3_topic: str
) -> None:
    topics = "org.apache.kafka.tools.TopicCommand"  # bin/kafka-topics.sh
    listed = tool(kafka, topics, "--bootstrap-server", kafka.bootstrap, "--list")
    assert rf3_topic in listed.split()
    described = tool(
        kafka, topics, "--bootstrap-server", kafka.bootstrap, "--describe", "--topic", rf3_topic
    )
    assert "ReplicationFactor: 3" in described, described
    assert "min.insync.replicas=2" in described, described
