"""Partition reassignment (KIP-455) on a real three-broker cluster, and the operator's
drain and spread built on it.

AlterPartitionReassignments and ListPartitionReassignments go over the wire
as raw kio requests (neither librdkafka nor kafka-python sends them); records
go in and out with confluent-kafka. A move must lose nothing, end with the
target as replicas and ISR, and leave no copy on the broker that left.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from harness import BrokerProcess, EtcdServer, start_all, wait_until
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, request_class
from replicated import REPLICATED_ENV, Cluster
from shoal.operator.kafka_admin import ClusterAdmin, KafkaAdminError
from shoal.operator.rebalance import ReassignmentImpossible, drain_brokers, spread_onto

ALTER, LIST = 45, 46
RECORDS = 2000
# Replication factor 2 everywhere (offsets topic included), so that two brokers can
# hold everything and a drain of the third is possible.
ENV = {
    **REPLICATED_ENV,
    "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": "2",
    "SHOAL_DEFAULT_REPLICATION_FACTOR": "2",
}


@pytest.fixture(scope="module")
def cluster(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("reassign")
    chroot = etcd.chroot_url()  # a fresh cluster's namespace in the shared etcd
    brokers = [BrokerProcess(chroot, root / f"broker-{i}", i, env=dict(ENV)) for i in range(3)]
    try:
        start_all(brokers)
        cluster = Cluster(brokers)
        wait_until(
            lambda: len(cluster.admin().list_topics(timeout=10).brokers) == 3,
            30,
            "every broker registered",
        )
        yield cluster
    finally:
        for broker in brokers:
            if broker.running:
                broker.kill()
        shutil.rmtree(root, ignore_errors=True)


def _create(cluster: Cluster, name: str, replicas: list[int]) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = NewTopic(name, 1, replica_assignment=[replicas], config={"min.insync.replicas": "1"})
    for future in admin.create_topics([topic]).values():
        future.result(30)
    cluster.wait_full_isr(name)


def _alter(
    broker: BrokerProcess, moves: dict[tuple[str, int], Sequence[int] | None]
) -> dict[tuple[str, int], ErrorCode]:
    topics: dict[str, list[Any]] = {}
    for (name, index), replicas in moves.items():
        topics.setdefault(name, []).append(
            request_class(ALTER, 0, "ReassignablePartition")(
                partition_index=index, replicas=None if replicas is None else tuple(replicas)
            )
        )
    request = request_class(ALTER, 0)(
        topics=tuple(
            request_class(ALTER, 0, "ReassignableTopic")(name=name, partitions=tuple(parts))
            for name, parts in topics.items()
        )
    )
    with RawConnection(broker.bootstrap, timeout=30) as conn:
        response = conn.call(request)
    assert response.error_code == ErrorCode.none, response.error_message
    return {
        (t.name, p.partition_index): p.error_code for t in response.responses for p in t.partitions
    }


def _ongoing(broker: BrokerProcess) -> dict[tuple[str, int], tuple[tuple[int, ...], ...]]:
    """(topic, partition) -> (replicas, adding, removing) of every reassignment under way."""
    with RawConnection(broker.bootstrap) as conn:
        response = conn.call(request_class(LIST, 0)(topics=None))
    assert response.error_code == ErrorCode.none
    return {
        (t.name, p.partition_index): (p.replicas, p.adding_replicas, p.removing_replicas)
        for t in response.topics
        for p in t.partitions
    }


def _controller(cluster: Cluster) -> int:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    return int(admin.describe_cluster().result(10).controller.id)


def _produce(cluster: Cluster, topic: str, partition: int = 0, count: int = RECORDS) -> list[bytes]:
    values = [os.urandom(64) + b"%d" % i for i in range(count)]
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    failures: list[Any] = []
    for value in values:
        producer.produce(
            topic, value, partition=partition, on_delivery=lambda e, _: e and failures.append(e)
        )
    assert producer.flush(30) == 0
    assert failures == []
    return values


def _consume(cluster: Cluster, topic: str, count: int, partition: int = 0) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"{topic}-check",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0)])
    values: list[bytes] = []
    try:
        while len(values) < count:
            batch = consumer.consume(min(500, count - len(values)), timeout=10)
            assert batch, f"only {len(values)} of {count} records came back"
            for message in batch:
                assert message.error() is None, message.error()
                values.append(message.value())
    finally:
        consumer.close()
    return values


def _partition_dir(broker: BrokerProcess, topic: str) -> Path:
    return broker.data_dir / f"{topic}-0"


def test_a_partition_moves_to_new_replicas_without_losing_a_record(cluster: Cluster) -> None:
    _create(cluster, "moved", [0, 1])
    values = _produce(cluster, "moved")
    assert _partition_dir(cluster.brokers[0], "moved").is_dir()

    asked = cluster.brokers[2]
    assert _alter(asked, {("moved", 0): [1, 2]}) == {("moved", 0): ErrorCode.none}
    wait_until(lambda: ("moved", 0) not in _ongoing(asked), 30, "the move to finish")

    view = cluster.partitions("moved")[0]
    assert view.replicas == (1, 2)
    assert view.isr == (1, 2)
    assert view.leader in (1, 2)
    assert _consume(cluster, "moved", RECORDS) == values
    wait_until(
        lambda: not _partition_dir(cluster.brokers[0], "moved").exists(),
        15,
        "broker 0 to delete its copy",
    )


def test_a_pending_move_is_listed_and_can_be_cancelled(cluster: Cluster) -> None:
    # The broker joining is paused, so the move cannot finish while we look at it.
    joining = next(n for n in sorted(cluster.brokers, reverse=True) if n != _controller(cluster))
    original = [n for n in sorted(cluster.brokers) if n != joining]
    _create(cluster, "cancelled", original)
    cluster.brokers[joining].pause()
    try:
        target = [original[0], joining]
        assert _alter(cluster.brokers[original[0]], {("cancelled", 0): target}) == {
            ("cancelled", 0): ErrorCode.none
        }
        ongoing = _ongoing(cluster.brokers[original[0]])
        assert ongoing[("cancelled", 0)] == (
            (original[0], joining, original[1]),
            (joining,),
            (original[1],),
        )
        assert cluster.partitions("cancelled")[0].replicas == (original[0], joining, original[1])
        # A partition added meanwhile has the topic's two replicas, not the three listed.
        admin = AdminClient({"bootstrap.servers": cluster.brokers[original[0]].bootstrap})
        admin.create_partitions([NewPartitions("cancelled", 2)])["cancelled"].result(30)
        assert len(cluster.partitions("cancelled")[1].replicas) == 2

        assert _alter(cluster.brokers[original[0]], {("cancelled", 0): None}) == {
            ("cancelled", 0): ErrorCode.none
        }
        assert ("cancelled", 0) not in _ongoing(cluster.brokers[original[0]])
        assert cluster.partitions("cancelled")[0].replicas == tuple(original)
    finally:
        cluster.brokers[joining].resume()
    cluster.wait_full_isr("cancelled")
    wait_until(
        lambda: not _partition_dir(cluster.brokers[joining], "cancelled").exists(),
        15,
        f"broker {joining} to drop the copy it had started",
    )


def test_bad_reassignments_get_kafkas_errors(cluster: Cluster) -> None:
    _create(cluster, "refused", [0, 1])
    answers = _alter(
        cluster.brokers[1],
        {
            ("refused", 0): [0, 9],
            ("refused", 3): [0, 1],
            ("no-such-topic", 0): [0, 1],
        },
    )
    assert answers == {
        ("refused", 0): ErrorCode.invalid_replica_assignment,
        ("refused", 3): ErrorCode.unknown_topic_or_partition,
        ("no-such-topic", 0): ErrorCode.unknown_topic_or_partition,
    }
    assert _alter(cluster.brokers[0], {("refused", 0): [2, 2]}) == {
        ("refused", 0): ErrorCode.invalid_replica_assignment
    }
    assert _alter(cluster.brokers[0], {("refused", 0): None}) == {
        ("refused", 0): ErrorCode.no_reassignment_in_progress
    }
    # The operator's client names what the cluster refused.
    with pytest.raises(KafkaAdminError, match="refused-0: invalid_replica_assignment"):
        asyncio.run(ClusterAdmin(cluster.bootstrap).reassign({("refused", 0): [0, 9]}))
    assert cluster.partitions("refused")[0].replicas == (0, 1)


def _replica_counts(cluster: Cluster) -> Counter[int]:
    metadata = cluster.admin().list_topics(timeout=10)
    return Counter(
        r for t in metadata.topics.values() for p in t.partitions.values() for r in p.replicas
    )


def _partition_dirs(broker: BrokerProcess) -> list[str]:
    return sorted(d.name for d in broker.data_dir.iterdir() if d.is_dir() and "-" in d.name)


def test_the_operator_refuses_a_drain_that_leaves_too_few_brokers(cluster: Cluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("wide", 1, 3)])["wide"].result(30)
    try:
        with pytest.raises(ReassignmentImpossible, match="wide-0 has 3 replicas"):
            asyncio.run(drain_brokers(ClusterAdmin(cluster.bootstrap), {2}))
        assert _ongoing(cluster.brokers[0]) == {}
    finally:
        admin.delete_topics(["wide"])["wide"].result(30)


def test_the_operator_drains_a_broker_and_spreads_onto_it_again(cluster: Cluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("orders", 6, 2)])["orders"].result(30)
    cluster.wait_full_isr("orders")
    # The reads below use a group, whose first FindCoordinator creates the
    # offsets topic. Created after the drain, it would be placed on broker 2 as
    # well (a broker being drained is still a broker); created now, it is drained.
    offsets = ConsumerGroupTopicPartitions("orders-check")
    admin.list_consumer_group_offsets([offsets])["orders-check"].result(30)
    cluster.wait_full_isr("__consumer_offsets")
    written = {p: _produce(cluster, "orders", p, 300) for p in range(6)}
    assert _replica_counts(cluster)[2] > 0

    plan = asyncio.run(drain_brokers(ClusterAdmin(cluster.bootstrap), {2}))
    assert plan
    assert _replica_counts(cluster)[2] == 0
    for p in range(6):
        assert _consume(cluster, "orders", 300, p) == written[p]
    wait_until(lambda: _partition_dirs(cluster.brokers[2]) == [], 15, "broker 2 emptied")

    asyncio.run(spread_onto(ClusterAdmin(cluster.bootstrap), [0, 1, 2]))
    counts = _replica_counts(cluster)
    assert max(counts.values()) - min(counts[b] for b in (0, 1, 2)) <= 1
    cluster.wait_full_isr("orders")
    for p in range(6):
        assert _consume(cluster, "orders", 300, p) == written[p]
