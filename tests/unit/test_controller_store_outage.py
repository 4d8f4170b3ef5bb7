"""The controller when etcd does not take its write: an answer, never a dropped connection.

A leader's AlterPartition reached the controller while etcd had no quorum
where the write went (a member cut off with a minority, found by the fault
schedule): the store's StoreUnavailableError escaped the handler, and the
connection was closed with a traceback logged. It is answered now, with
REQUEST_TIMED_OUT for that partition, and the leader proposes again.
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
from shoal.broker.cluster.store import PartitionChange, StoreUnavailableError
from shoal.broker.controller.controller import Controller, ControllerSettings
from shoal.broker.controller.decisions import IsrChangeRequest
from shoal.broker.handlers.base import error

from shoal.wire import ErrorCode


class EtcdWithoutQuorum:
    """A metadata store whose writes all fail as etcd's do without a leader."""

    def __init__(self) -> None:
        self.asked: list[Sequence[PartitionChange]] = []

    async def update_partitions(self, changes: Sequence[PartitionChange], lease: Any) -> None:
        self.asked.append(changes)
        raise StoreUnavailableError("etcd request failed: etcdserver: no leader")


def image_with_two_partitions() -> ClusterImage:
    record = TopicRecord(
        TopicName("orders"),
        uuid.uuid5(uuid.NAMESPACE_DNS, "orders"),
        ((NodeId(1), NodeId(2), NodeId(3)),) * 2,
        {},
    )
    state = PartitionState(NodeId(1), 3, (NodeId(1), NodeId(2)), 7)
    topic = TopicImage(record, {0: state, 1: state}, 10)
    brokers = {NodeId(n): BrokerRegistration(NodeId(n), f"broker-{n}", 9092) for n in (1, 2, 3)}
    return ClusterImage.build(
        "cluster", 500, brokers, {record.name: topic}, ControllerLease(NodeId(1), 42)
    )


def test_an_isr_change_etcd_does_not_take_is_answered_request_timed_out() -> None:
    store = EtcdWithoutQuorum()
    controller = Controller(NodeId(1), store, ControllerSettings(), lambda _: False)  # type: ignore[arg-type]
    image = image_with_two_partitions()
    controller.on_image(image)
    topic_id = image.topics[TopicName("orders")].record.topic_id
    asked = [
        IsrChangeRequest(NodeId(1), topic_id, index, 3, 7, (NodeId(1), NodeId(2), NodeId(3)))
        for index in (0, 1)
    ]

    results = asyncio.run(controller.alter_partitions(asked))

    # Tried once; both are answered without waiting on etcd again.
    assert len(store.asked) == 1
    assert [r.code for r in results] == ["request_timed_out"] * 2
    assert all(r.state is None for r in results)
    assert error(results[0].code) is ErrorCode.request_timed_out
