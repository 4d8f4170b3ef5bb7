"""Transaction markers into real partitions: the local write, the sender's retries,
and the WriteTxnMarkers handler."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from coordinator_fixtures import ELSEWHERE, HERE, wall_clock_ms, within
from shoal.broker.cluster.model import (
    BrokerRegistration,
    ClusterImage,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
)
from shoal.broker.coordinator.coordinator import OFFSETS_TOPIC
from shoal.broker.handlers.txn_markers import handle_write_txn_markers
from shoal.broker.log.manager import LogManager
from shoal.broker.partition import NotLeaderError, Partition
from shoal.broker.replica_manager import ReplicaManager
from shoal.broker.txn.markers import TxnMarker, TxnMarkerSender, write_markers

from shoal.records import iter_batches
from shoal.wire import ErrorCode, schema

E = ErrorCode


def image(leaders: dict[tuple[str, int], NodeId], revision: int = 1) -> ClusterImage:
    """Topics t (2 partitions) and __consumer_offsets (1), replicated on nodes 0 and 1,
    led by node 0 unless ``leaders`` says otherwise; both brokers registered (node 1
    at a port nobody listens on)."""
    topics = {}
    for number, (name, count) in enumerate([("t", 2), (OFFSETS_TOPIC, 1)]):
        record = TopicRecord(
            TopicName(name),
            uuid.UUID(int=number + 1),
            tuple((HERE, ELSEWHERE) for _ in range(count)),
        )
        states = {
            index: PartitionState(
                leaders.get((name, index), HERE), revision, (leaders.get((name, index), HERE),)
            )
            for index in range(count)
        }
        topics[TopicName(name)] = TopicImage(record, states, revision)
    brokers = {
        HERE: BrokerRegistration(HERE, "127.0.0.1", 1),
        ELSEWHERE: BrokerRegistration(ELSEWHERE, "127.0.0.1", 9),
    }
    return ClusterImage.build("test-cluster", revision, brokers, topics)


@dataclass
class MarkerEnv:
    replicas: ReplicaManager
    completed: list[tuple[int, int, bool]] = field(default_factory=list)

    def lookup(self, topic: str, index: int) -> Partition:
        partition = self.replicas.get(topic, index)
        if partition is None:
            raise NotLeaderError(f"{topic}-{index}")
        return partition

    def complete(self, offsets_partition: int, producer_id: int, commit: bool) -> None:
        self.completed.append((offsets_partition, producer_id, commit))

    async def write(self, marker: TxnMarker) -> dict[tuple[str, int], ErrorCode]:
        return await write_markers(self.lookup, self.complete, marker, timeout_s=1.0)

    def control_batches(self, topic: str, index: int) -> list[tuple[int, int]]:
        """(producer id, epoch) of each control batch in the partition."""
        partition = self.lookup(topic, index)
        plog = partition.log
        chunk = plog.read(0, 1 << 20, plog.log_end_offset, min_one=True)
        if chunk is None:
            return []
        data = os.pread(chunk.file.fileno(), chunk.size, chunk.position)
        return [(h.producer_id, h.producer_epoch) for _, h in iter_batches(data) if h.is_control]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[MarkerEnv]:
    logs = LogManager(tmp_path / "data", wall_clock_ms)
    replicas = ReplicaManager(HERE, logs, {}, wall_clock_ms)
    replicas.apply(image({("t", 1): ELSEWHERE}))
    try:
        yield MarkerEnv(replicas)
    finally:
        await replicas.close()
        await logs.close()


def marker(
    *partitions: tuple[str, int], commit: bool = True, coordinator_epoch: int = 3
) -> TxnMarker:
    return TxnMarker(42, 0, commit, coordinator_epoch, frozenset(partitions))


async def test_a_marker_is_a_committed_control_batch_of_the_producer(env: MarkerEnv) -> None:
    codes = await env.write(marker(("t", 0)))
    assert codes == {("t", 0): E.none}
    assert env.control_batches("t", 0) == [(42, 0)]
    partition = env.lookup("t", 0)
    assert partition.high_watermark == partition.log.log_end_offset == 1
    assert env.completed == []


async def test_an_offsets_partitions_marker_settles_the_staged_offsets(env: MarkerEnv) -> None:
    assert await env.write(marker((OFFSETS_TOPIC, 0), commit=False)) == {(OFFSETS_TOPIC, 0): E.none}
    assert env.completed == [(0, 42, False)]


async def test_partitions_not_led_here_answer_not_leader(env: MarkerEnv) -> None:
    codes = await env.write(marker(("t", 0), ("t", 1), ("gone", 0)))
    assert codes == {
        ("t", 0): E.none,
        ("t", 1): E.not_leader_or_follower,
        ("gone", 0): E.not_leader_or_follower,
    }


async def test_a_marker_from_a_deposed_coordinator_is_fenced(env: MarkerEnv) -> None:
    await env.write(marker(("t", 0), coordinator_epoch=5))
    codes = await env.write(marker(("t", 0), coordinator_epoch=4))
    assert codes == {("t", 0): E.transaction_coordinator_fenced}


def sender(env: MarkerEnv, current: Callable[[], ClusterImage]) -> TxnMarkerSender:
    return TxnMarkerSender(HERE, current, env.write, retry_backoff_ms=5)


async def test_the_sender_writes_local_partitions_and_drops_deleted_topics(env: MarkerEnv) -> None:
    send = sender(env, lambda: image({}))
    try:
        done = await within(
            send.write(marker(("t", 0), (OFFSETS_TOPIC, 0), ("gone", 3)), lambda: True)
        )
    finally:
        await send.close()
    assert done
    assert env.control_batches("t", 0) == [(42, 0)]
    assert env.completed == [(0, 42, True)]


async def test_the_sender_retries_until_the_leader_can_be_reached(env: MarkerEnv) -> None:
    leaders = {("t", 1): ELSEWHERE}
    attempts = 0

    def current() -> ClusterImage:
        nonlocal attempts
        attempts += 1
        if attempts == 3:
            # Leadership comes here, as after the unreachable leader failed.
            env.replicas.apply(image({}, revision=2))
            leaders.clear()
        return image(leaders, revision=2 if not leaders else 1)

    send = sender(env, current)
    try:
        assert await within(send.write(marker(("t", 0), ("t", 1)), lambda: True), 15)
    finally:
        await send.close()
    assert env.control_batches("t", 1) == [(42, 0)]
    assert env.control_batches("t", 0) == [(42, 0)]


async def test_the_sender_stops_when_the_transaction_is_no_longer_its_own(env: MarkerEnv) -> None:
    send = sender(env, lambda: image({("t", 1): ELSEWHERE}))
    wanted = iter([True, True, False])
    try:
        assert not await within(send.write(marker(("t", 1)), lambda: next(wanted)), 15)
    finally:
        await send.close()


async def test_the_sender_gives_up_a_fenced_transaction(env: MarkerEnv) -> None:
    await env.write(marker(("t", 0), coordinator_epoch=9))
    send = sender(env, lambda: image({}))
    try:
        assert not await within(send.write(marker(("t", 0)), lambda: True))
    finally:
        await send.close()


async def test_the_handler_answers_per_marker_and_partition(env: MarkerEnv) -> None:
    api = schema(27, 1)
    request = api.request(
        markers=(
            api.make_request(
                "WritableTxnMarker",
                producer_id=42,
                producer_epoch=0,
                transaction_result=True,
                topics=(
                    api.make_request("WritableTxnMarkerTopic", name="t", partition_indexes=(0, 1)),
                ),
                coordinator_epoch=1,
            ),
        )
    )
    services: Any = SimpleNamespace(
        partition=env.lookup, groups=SimpleNamespace(complete_transaction=env.complete)
    )
    ctx: Any = SimpleNamespace(api=api)
    response = await handle_write_txn_markers(services, ctx, request)
    (result,) = response.markers
    assert result.producer_id == 42
    assert [
        (t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in result.topics
    ] == [("t", [(0, E.none), (1, E.not_leader_or_follower)])]


async def test_markers_waiting_for_one_leader_go_in_one_request(env: MarkerEnv) -> None:
    send = sender(env, lambda: image({("t", 1): ELSEWHERE}))
    requests: list[list[TxnMarker]] = []

    async def request(node: NodeId, link: Any, markers: list[TxnMarker]) -> list[Any]:
        requests.append(markers)
        return [dict.fromkeys(m.partitions, E.none) for m in markers]

    send._request = request  # type: ignore[method-assign]
    first = TxnMarker(1, 0, True, 3, frozenset({("t", 1)}))
    second = TxnMarker(2, 0, False, 3, frozenset({("t", 1)}))
    try:
        done = await within(
            asyncio.gather(send.write(first, lambda: True), send.write(second, lambda: True))
        )
    finally:
        await send.close()
    assert done == [True, True]
    assert requests == [[first, second]]
