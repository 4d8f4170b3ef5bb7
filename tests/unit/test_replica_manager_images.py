"""The replica manager follows images change by change, as the etcd store builds them.

The store's images keep the objects of what did not change, so a change
among thousands of partitions costs the replica manager its own topic only;
these tests check both halves and that following changes that way leaves
the broker where a walk over everything would: roles, dropped partitions,
deleted and recreated topics.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from shoal.broker.cluster.etcd_store import ImageBuilder
from shoal.broker.cluster.model import ClusterImage, NodeId, PartitionState, TopicRecord
from shoal.broker.log.manager import LogManager
from shoal.broker.partition import Partition
from shoal.broker.replica_manager import ReplicaManager

ROOT = b"/shoal"
ME = NodeId(0)
ALL = (NodeId(0), NodeId(1), NodeId(2))
LEADER = NodeId(1)
"""Every new partition's leader: this broker follows until a change says otherwise."""


class Store:
    """An ImageBuilder fed as the etcd watch feeds it, one revision per write."""

    def __init__(self) -> None:
        self.builder = ImageBuilder(ROOT)
        self.revision = 1
        self._put(b"cluster/id", b"c")

    def _put(self, key: bytes, value: bytes) -> None:
        self.revision += 1
        self.builder.put(ROOT + b"/" + key, value, self.revision, self.revision)

    def topic(self, name: str, assignment: list[tuple[NodeId, ...]]) -> TopicRecord:
        record = TopicRecord(name, uuid.uuid4(), tuple(assignment))
        for index, replicas in enumerate(assignment):
            self.state(name, index, PartitionState(LEADER, 0, replicas))
        self._put(f"topics/{name}".encode(), record.to_json())
        return record

    def state(self, name: str, index: int, state: PartitionState) -> None:
        self._put(f"partitions/{name}/{index}".encode(), state.to_json())

    def delete_topic(self, name: str, partitions: int) -> None:
        self.builder.delete(ROOT + f"/topics/{name}".encode())
        for index in range(partitions):
            self.builder.delete(ROOT + f"/partitions/{name}/{index}".encode())

    def image(self) -> ClusterImage:
        return self.builder.image(self.revision)


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[ReplicaManager]:
    def clock() -> int:
        return int(time.time() * 1000)

    manager = ReplicaManager(ME, LogManager(tmp_path, clock), {}, clock)
    yield manager
    await manager.close()


@pytest.fixture
def state_updates(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Every partition whose state the replica manager took, in order."""
    taken: list[tuple[str, int]] = []
    update = Partition.update_state

    def spy(self: Partition, *args: object) -> bool:
        taken.append((self.topic, self.index))
        return update(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Partition, "update_state", spy)
    yield taken


def test_an_image_keeps_the_topics_no_write_touched(store: Store) -> None:
    store.topic("a", [ALL] * 3)
    store.topic("b", [ALL] * 3)
    first = store.image()
    store.state("a", 1, PartitionState(NodeId(1), 1, ALL))
    second = store.image()
    assert second.topics["b"] is first.topics["b"]
    assert second.topics["a"] is not first.topics["a"]
    assert second.topics["a"].partitions[0] is first.topics["a"].partitions[0]
    assert second.topics["a"].partitions[1].leader == 1

    store.builder.delete(ROOT + b"/topics/a")
    assert "a" not in store.image().topics  # no record, no topic


async def test_one_partitions_change_is_all_the_replica_manager_looks_at(
    store: Store, replicas: ReplicaManager, state_updates: list[tuple[str, int]]
) -> None:
    for name in ("a", "b", "c"):
        store.topic(name, [ALL] * 10)
    replicas.apply(store.image())
    assert len(state_updates) == 30
    state_updates.clear()

    store.state("b", 4, PartitionState(ME, 1, ALL, 1))
    replicas.apply(store.image())
    assert state_updates == [("b", 4)]
    assert replicas.partitions["b", 4].is_leader
    assert not replicas.partitions["b", 3].is_leader  # led by broker 1, as before

    replicas.apply(store.image())  # an image with nothing new (another broker's key)
    assert state_updates == [("b", 4)]


async def test_partitions_moved_away_and_topics_deleted_are_dropped_with_their_logs(
    store: Store, replicas: ReplicaManager
) -> None:
    elsewhere = (NodeId(1), NodeId(2), NodeId(3))
    store.topic("kept", [ALL, ALL])
    store.topic("gone", [ALL, ALL])
    replicas.apply(store.image())
    assert set(replicas.logs.logs) == {("kept", 0), ("kept", 1), ("gone", 0), ("gone", 1)}

    # A reassignment moved kept-1 off this broker: a new record for the topic.
    record = TopicRecord("kept", replicas.partitions["kept", 0].topic_id, (ALL, elsewhere))
    store._put(b"topics/kept", record.to_json())
    store.delete_topic("gone", 2)
    replicas.apply(store.image())
    assert set(replicas.partitions) == {("kept", 0)}
    assert set(replicas.logs.logs) == {("kept", 0)}


async def test_a_topic_made_again_under_its_name_starts_from_empty_logs(
    store: Store, replicas: ReplicaManager, helpers: Any
) -> None:
    store.topic("t", [ALL])
    replicas.apply(store.image())
    old = replicas.partitions["t", 0]
    old.log.append_as_leader(helpers.make_batch(), leader_epoch=0)
    assert old.log.log_end_offset == 1

    # Deleted and created again between two images: only the record's id tells.
    made_again = store.topic("t", [ALL])
    replicas.apply(store.image())
    new = replicas.partitions["t", 0]
    assert new is not old
    assert new.topic_id == made_again.topic_id
    assert new.log.log_end_offset == 0
