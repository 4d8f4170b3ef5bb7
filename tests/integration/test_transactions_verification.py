"""KIP-890 part 1 on three brokers: a transactional write is checked with the
transaction coordinator before it can open a transaction in a partition.

What an operator of a shared cluster checks: a TxnOffsetCommit carrying someone
else's producer id is refused, moves no offset and leaves no producer (so no open
transaction) in ``__consumer_offsets`` (DescribeProducers, what
kafka-transactions.sh describe-producers shows); a transactional batch for a
partition the producer never added is refused and leaves that partition empty and
stable; and confluent-kafka's consume-transform-produce loop still commits its
offsets with its transaction, straight to the brokers and through the gateway.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import GatewayCluster, module_gateway_cluster
from harness import EtcdServer, wait_until
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, request_class
from replicated import REPLICATED_ENV
from shoal.broker.coordinator.records import partition_for

from shoal.records import BatchOptions, NewRecord, build_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TXN_ENV = {
    **REPLICATED_ENV,
    "SHOAL_TRANSACTION_STATE_LOG_NUM_PARTITIONS": "6",
    "SHOAL_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS": "500",
}
OFFSETS_PARTITIONS = 6
"""SHOAL_OFFSETS_TOPIC_NUM_PARTITIONS in REPLICATED_ENV."""
GROUP, TRANSACTION = 0, 1
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    yield from module_gateway_cluster(
        etcd, tmp_path_factory, request, "transactions-verification", TXN_ENV
    )


# -- raw protocol helpers ------------------------------------------------------------------


def call(address: str, request: Any) -> Any:
    with RawConnection(address) as conn:
        return conn.call(request)


def coordinator(bootstrap: str, key: str, key_type: int) -> str:
    """host:port of the key's coordinator, once there is one."""
    found: list[str] = []

    def lookup() -> bool:
        answer = call(bootstrap, request_class(10, 3)(key=key, key_type=key_type))
        if answer.error_code != ErrorCode.none:
            return False
        found.append(f"{answer.host}:{answer.port}")
        return True

    wait_until(lookup, TIMEOUT_S, f"the coordinator of {key}")
    return found[-1]


def init_producer(address: str, transactional_id: str) -> tuple[int, int]:
    answer = call(
        address,
        request_class(22, 4)(
            transactional_id=transactional_id,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=-1,
            producer_epoch=-1,
        ),
    )
    assert answer.error_code == ErrorCode.none, answer
    return int(answer.producer_id), int(answer.producer_epoch)


def create_topic(bootstrap: str, partitions: int) -> str:
    name = f"verify-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions)]).values():
        future.result(30)
    wait_until(
        lambda: (
            all(
                p.leader >= 0
                for p in admin.list_topics(name, timeout=10).topics[name].partitions.values()
            )
            and len(admin.list_topics(name, timeout=10).topics[name].partitions) == partitions
        ),
        30,
        f"leaders for {name}",
    )
    return name


def leader_address(bootstrap: str, topic: str, partition: int) -> str:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    broker = metadata.brokers[metadata.topics[topic].partitions[partition].leader]
    return f"{broker.host}:{broker.port}"


def active_producers(address: str, topic: str, partition: int) -> dict[int, int]:
    """DescribeProducers: producer id -> the first offset of its open transaction (-1: none)."""
    answer = call(
        address,
        request_class(61, 0)(
            topics=(
                request_class(61, 0, "TopicRequest")(name=topic, partition_indexes=(partition,)),
            )
        ),
    )
    (found,) = [p for t in answer.topics for p in t.partitions]
    assert found.error_code == ErrorCode.none, found
    return {int(p.producer_id): int(p.current_txn_start_offset) for p in found.active_producers}


def latest_offsets(address: str, topic: str, partition: int) -> tuple[int, int]:
    """(high watermark, last stable offset): equal when no transaction is open."""

    def latest(isolation: int) -> int:
        answer = call(
            address,
            request_class(2, 7)(
                replica_id=-1,
                isolation_level=isolation,
                topics=(
                    request_class(2, 7, "ListOffsetsTopic")(
                        name=topic,
                        partitions=(
                            request_class(2, 7, "ListOffsetsPartition")(
                                partition_index=partition, current_leader_epoch=-1, timestamp=-1
                            ),
                        ),
                    ),
                ),
            ),
        )
        (found,) = [p for t in answer.topics for p in t.partitions]
        assert found.error_code == ErrorCode.none, found
        return int(found.offset)

    return latest(0), latest(1)


def committed_offset(address: str, group: str, topic: str) -> tuple[ErrorCode, int]:
    """OffsetFetch with require_stable: an offset still in an open transaction is
    UNSTABLE_OFFSET_COMMIT."""
    answer = call(
        address,
        request_class(9, 7)(
            group_id=group,
            topics=(
                request_class(9, 7, "OffsetFetchRequestTopic")(name=topic, partition_indexes=(0,)),
            ),
            require_stable=True,
        ),
    )
    (found,) = [p for t in answer.topics for p in t.partitions]
    return found.error_code, int(found.committed_offset)


def txn_offset_commit(
    address: str, transactional_id: str, group: str, producer: tuple[int, int], topic: str
) -> ErrorCode:
    answer = call(
        address,
        request_class(28, 3)(
            transactional_id=transactional_id,
            group_id=group,
            producer_id=producer[0],
            producer_epoch=producer[1],
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=(
                request_class(28, 3, "TxnOffsetCommitRequestTopic")(
                    name=topic,
                    partitions=(
                        request_class(28, 3, "TxnOffsetCommitRequestPartition")(
                            partition_index=0,
                            committed_offset=42,
                            committed_leader_epoch=-1,
                            committed_metadata="",
                        ),
                    ),
                ),
            ),
        ),
    )
    (code,) = {p.error_code for t in answer.topics for p in t.partitions}
    return ErrorCode(code)


def end_txn(address: str, transactional_id: str, producer: tuple[int, int], commit: bool) -> None:
    answer = call(
        address,
        request_class(26, 3)(
            transactional_id=transactional_id,
            producer_id=producer[0],
            producer_epoch=producer[1],
            committed=commit,
        ),
    )
    assert answer.error_code == ErrorCode.none, answer


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- the tests -----------------------------------------------------------------------------


def test_txn_offset_commit_with_another_tenants_producer_id_is_refused_and_leaves_nothing(
    cluster: GatewayCluster,
) -> None:
    bootstrap = cluster.brokers[0].bootstrap
    topic = create_topic(bootstrap, 1)
    tenant_a, tenant_b = unique("tenant-a"), unique("tenant-b")
    # B's group on a broker other than B's transaction coordinator, so the group
    # coordinator has to ask across the cluster.
    b_coordinator = coordinator(bootstrap, tenant_b, TRANSACTION)
    group_b = next(
        g
        for g in (unique("group-b") for _ in range(100))
        if coordinator(bootstrap, g, GROUP) != b_coordinator
    )
    group_coordinator = coordinator(bootstrap, group_b, GROUP)
    offsets_partition = partition_for(group_b, OFFSETS_PARTITIONS)
    producer_a = init_producer(coordinator(bootstrap, tenant_a, TRANSACTION), tenant_a)
    producer_b = init_producer(b_coordinator, tenant_b)
    # B's transaction legitimately holds its group's offsets partition.
    added = call(
        b_coordinator,
        request_class(25, 3)(
            transactional_id=tenant_b,
            producer_id=producer_b[0],
            producer_epoch=producer_b[1],
            group_id=group_b,
        ),
    )
    assert added.error_code == ErrorCode.none

    borrowed = (producer_a[0], producer_a[1] + 1)
    code = txn_offset_commit(group_coordinator, tenant_b, group_b, borrowed, topic)
    assert code == ErrorCode.invalid_producer_id_mapping
    assert committed_offset(group_coordinator, group_b, topic) == (ErrorCode.none, -1)
    producers = active_producers(group_coordinator, "__consumer_offsets", offsets_partition)
    assert producer_a[0] not in producers, "A's producer id must not appear where B wrote"
    high_watermark, stable = latest_offsets(
        group_coordinator, "__consumer_offsets", offsets_partition
    )
    assert stable == high_watermark, "no transaction may be left open in __consumer_offsets"

    # B's own producer id is accepted, and its offsets commit with its transaction.
    assert txn_offset_commit(group_coordinator, tenant_b, group_b, producer_b, topic) == (
        ErrorCode.none
    )
    end_txn(b_coordinator, tenant_b, producer_b, commit=True)
    wait_until(
        lambda: committed_offset(group_coordinator, group_b, topic) == (ErrorCode.none, 42),
        TIMEOUT_S,
        "B's offsets committed with its transaction",
    )


@pytest.mark.parametrize(
    ("version", "refusal"),
    [(9, ErrorCode.invalid_txn_state), (11, ErrorCode.transaction_abortable)],
)
def test_a_transactional_batch_for_a_partition_not_in_the_transaction_is_refused(
    cluster: GatewayCluster, version: int, refusal: ErrorCode
) -> None:
    bootstrap = cluster.brokers[0].bootstrap
    topic = create_topic(bootstrap, 2)
    transactional_id = unique("writer")
    txn_coordinator = coordinator(bootstrap, transactional_id, TRANSACTION)
    producer = init_producer(txn_coordinator, transactional_id)
    added = call(
        txn_coordinator,
        request_class(24, 3)(
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=producer[0],
            v3_and_below_producer_epoch=producer[1],
            v3_and_below_topics=(
                request_class(24, 3, "AddPartitionsToTxnTopic")(name=topic, partitions=(0,)),
            ),
        ),
    )
    assert {
        p.partition_error_code
        for t in added.results_by_topic_v3_and_below
        for p in t.results_by_partition
    } == {ErrorCode.none}

    def produce(partition: int) -> ErrorCode:
        batch = build_batch(
            [NewRecord(None, b"value")],
            options=BatchOptions(
                producer_id=producer[0],
                producer_epoch=producer[1],
                base_sequence=0,
                transactional=True,
            ),
        )
        answer = call(
            leader_address(bootstrap, topic, partition),
            request_class(0, version)(
                transactional_id=transactional_id,
                acks=-1,
                timeout=datetime.timedelta(seconds=10),
                topic_data=(
                    request_class(0, version, "TopicProduceData")(
                        name=topic,
                        partition_data=(
                            request_class(0, version, "PartitionProduceData")(
                                index=partition, records=batch
                            ),
                        ),
                    ),
                ),
            ),
        )
        return ErrorCode(answer.responses[0].partition_responses[0].error_code)

    assert produce(1) == refusal
    assert produce(0) == ErrorCode.none
    end_txn(txn_coordinator, transactional_id, producer, commit=True)
    refused_leader = leader_address(bootstrap, topic, 1)
    assert latest_offsets(refused_leader, topic, 1) == (0, 0), "nothing appended, nothing open"
    assert producer[0] not in active_producers(refused_leader, topic, 1)


@pytest.mark.parametrize("route", ["direct", "gateway"])
def test_confluent_kafka_consume_transform_produce_still_commits_its_offsets(
    cluster: GatewayCluster, route: str
) -> None:
    if route == "direct":
        settings: dict[str, Any] = {"bootstrap.servers": cluster.internal_bootstrap}
    else:
        settings = cluster.tenant(f"t{uuid.uuid4().hex[:6]}").librdkafka()
    admin = AdminClient(settings)
    source, sink = unique("source"), unique("sink")
    for future in admin.create_topics([NewTopic(source, 2), NewTopic(sink, 2)]).values():
        future.result(30)
    plain = Producer(settings)
    inputs = [f"in-{i}" for i in range(10)]
    for i, value in enumerate(inputs):
        plain.produce(source, value=value.encode(), partition=i % 2)
    assert plain.flush(TIMEOUT_S) == 0

    group = unique("transform")
    consumer = Consumer(
        {
            **settings,
            "group.id": group,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([source])
    producer = Producer({**settings, "transactional.id": unique("transform")})
    producer.init_transactions(TIMEOUT_S)
    done = 0
    deadline = time.monotonic() + TIMEOUT_S
    while done < len(inputs) and time.monotonic() < deadline:
        messages = [m for m in consumer.consume(10, 2) if m.error() is None]
        if not messages:
            continue
        producer.begin_transaction()
        for message in messages:
            producer.produce(sink, value=message.value(), partition=message.partition())
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()),
            consumer.consumer_group_metadata(),
            TIMEOUT_S,
        )
        producer.commit_transaction(TIMEOUT_S)
        done += len(messages)
    assert done == len(inputs)
    committed = consumer.committed([TopicPartition(source, p) for p in range(2)], timeout=30)
    assert sum(tp.offset for tp in committed) == len(inputs), committed
    consumer.close()
