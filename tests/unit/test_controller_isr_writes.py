"""The controller writes the ISR changes of one AlterPartition together.

A broker that comes back to a cluster of thousands of partitions rejoins
each ISR through its leaders' AlterPartition requests; written one etcd
transaction each, 10,000 partitions took longer than ten minutes. The
changes of a request now go in transactions of up to ISR_WRITE_CHUNK, and a
transaction that loses a compare-and-swap is retried change by change, so
only the change that lost is refused.

When etcd does not take a write (no quorum where it went, found by the fault
schedule), the store's StoreUnavailableError once escaped the handler and
the connection was closed with a traceback logged; every change is answered
REQUEST_TIMED_OUT now, without trying the rest, and the leader proposes again.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from shoal.broker.cluster.model import (
    BrokerRegistration,
    ClusterImage,
    ControllerLease,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
)
from shoal.broker.cluster.store import ConflictError, PartitionChange, StoreUnavailableError
from shoal.broker.controller.controller import ISR_WRITE_CHUNK, Controller, ControllerSettings
from shoal.broker.controller.decisions import IsrChangeRequest
from shoal.broker.handlers.base import error

from shoal.wire import ErrorCode

PARTITIONS = 250
REPLICAS = (NodeId(1), NodeId(2), NodeId(3))
SHRUNK = PartitionState(NodeId(1), 3, (NodeId(1), NodeId(2)), 7)


class RecordingStore:
    """Takes every transaction, except one holding a change of a partition in ``moved``;
    ``without_quorum``, none (as etcd without a leader)."""

    def __init__(self, moved: set[int], without_quorum: bool = False) -> None:
        self.moved = moved
        self.without_quorum = without_quorum
        self.transactions: list[list[int]] = []

    async def update_partitions(self, changes: Sequence[PartitionChange], lease: Any) -> None:
        indexes = [change.index for change in changes]
        self.transactions.append(indexes)
        if self.without_quorum:
            raise StoreUnavailableError("etcd request failed: etcdserver: no leader")
        if self.moved & set(indexes):
            raise ConflictError("partition state changed concurrently")


def _image() -> ClusterImage:
    record = TopicRecord(
        TopicName("orders"), uuid.uuid5(uuid.NAMESPACE_DNS, "orders"), (REPLICAS,) * PARTITIONS
    )
    topic = TopicImage(record, dict.fromkeys(range(PARTITIONS), SHRUNK), 10)
    brokers = {n: BrokerRegistration(n, f"broker-{n}", 9092) for n in REPLICAS}
    return ClusterImage.build(
        "cluster", 500, brokers, {record.name: topic}, ControllerLease(NodeId(1), 42)
    )


def _rejoin_everywhere(store: RecordingStore) -> list[Any]:
    controller = Controller(NodeId(1), store, ControllerSettings(), lambda _: False)  # type: ignore[arg-type]
    image = _image()
    controller.on_image(image)
    topic_id = image.topics[TopicName("orders")].record.topic_id
    requests = [
        IsrChangeRequest(NodeId(1), topic_id, index, 3, 7, REPLICAS) for index in range(PARTITIONS)
    ]
    return asyncio.run(controller.alter_partitions(requests))


def test_a_broker_rejoining_every_isr_is_written_in_a_few_transactions() -> None:
    store = RecordingStore(moved=set())
    results = _rejoin_everywhere(store)
    assert [len(t) for t in store.transactions] == [ISR_WRITE_CHUNK, ISR_WRITE_CHUNK, 50]
    assert [r.code for r in results] == [None] * PARTITIONS
    assert all(r.state.isr == REPLICAS for r in results)
    assert all(r.state.partition_epoch == 8 for r in results)


def test_only_the_change_that_lost_its_compare_and_swap_is_refused() -> None:
    store = RecordingStore(moved={142})
    results = _rejoin_everywhere(store)
    refused = [at for at, r in enumerate(results) if r.code is not None]
    assert refused == [142]
    assert results[142].code == "invalid_update_version"
    assert results[142].state is None
    # The chunk holding it was tried whole, then change by change.
    assert store.transactions[1] == list(range(100, 200))
    assert len(store.transactions) == 3 + ISR_WRITE_CHUNK


def test_a_partition_named_twice_in_one_request_is_refused_the_second_time() -> None:
    store = RecordingStore(moved=set())
    controller = Controller(NodeId(1), store, ControllerSettings(), lambda _: False)  # type: ignore[arg-type]
    image = _image()
    controller.on_image(image)
    topic_id = image.topics[TopicName("orders")].record.topic_id
    twice = IsrChangeRequest(NodeId(1), topic_id, 0, 3, 7, REPLICAS)
    results = asyncio.run(controller.alter_partitions([twice, twice]))
    assert [r.code for r in results] == [None, "invalid_request"]
    assert store.transactions == [[0]]


def test_isr_changes_etcd_does_not_take_are_answered_request_timed_out() -> None:
    store = RecordingStore(moved=set(), without_quorum=True)
    results = _rejoin_everywhere(store)
    # Tried once; every change is answered without waiting on etcd again.
    assert len(store.transactions) == 1
    assert [r.code for r in results] == ["request_timed_out"] * PARTITIONS
    assert all(r.state is None for r in results)
    assert error(results[0].code) is ErrorCode.request_timed_out
