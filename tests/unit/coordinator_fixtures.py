"""A group coordinator over a real log, without sockets, for tests/unit/test_coordinator_*.py.

:class:`CoordinatorEnv` builds what the broker builds at startup: a
:class:`LogManager` on a temporary directory, a :class:`ReplicaManager`
holding the partitions of ``__consumer_offsets`` (led by node 0 unless a
test says otherwise) and a :class:`GroupCoordinator` that has loaded them.
Timers run on the event loop in real time, so the timeouts here are tens of
milliseconds; the coordinator's own clock (state timestamps, offset
retention) is a :class:`Clock` the test moves by hand. The log keeps the wall
clock: the coordinator's batches carry wall-clock record timestamps, which
the log checks against its clock.

A "restart" is a second coordinator over the same logs (:meth:`reload`), or a
whole new LogManager over the same directory (:meth:`restart`).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from shoal.broker.cluster.model import (
    ClusterImage,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
)
from shoal.broker.coordinator.config import GroupConfig
from shoal.broker.coordinator.coordinator import (
    OFFSETS_TOPIC,
    GroupCoordinator,
    JoinResult,
    SyncResult,
)
from shoal.broker.coordinator.group import CommittedOffset
from shoal.broker.log.manager import LogManager
from shoal.broker.replica_manager import ReplicaManager

from shoal.wire import ErrorCode

E = ErrorCode
NOW = 1_700_000_000_000
"""The clock's starting time, in ms."""
OFFSETS_TOPIC_ID = uuid.UUID("00000000-0000-0000-0000-00000000c0ff")
HERE = NodeId(0)
ELSEWHERE = NodeId(1)

LONG_SESSION_MS = 10_000
"""A session timeout no test outlives: members only leave when a test says so."""
LONG_REBALANCE_MS = 10_000

CONFIG = GroupConfig(
    min_session_timeout_ms=10,
    max_session_timeout_ms=60_000,
    initial_rebalance_delay_ms=30,
    offsets_retention_ms=60_000,
    offsets_retention_check_interval_ms=600_000,
    offset_metadata_max_bytes=64,
    offsets_topic_num_partitions=1,
    offsets_topic_replication_factor=1,
)


def topic_id(name: str) -> uuid.UUID:
    """A stable id per topic name, for the tests' cluster of KIP-848 groups."""
    return uuid.uuid5(uuid.NAMESPACE_DNS, name)


@dataclass
class Clock:
    now: int = NOW

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def consumer_subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: version, topics (int16-length names), null user data."""
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name
    return out + struct.pack(">i", -1)


def offsets_image(
    partitions: int, leaders: dict[int, NodeId] | None = None, revision: int = 1
) -> ClusterImage:
    """An image whose only topic is __consumer_offsets, every partition on node 0.

    ``leaders`` overrides the leader of some partitions (node 0 stays a replica,
    so its log stays on disk when another node leads).
    """
    leaders = leaders or {}
    record = TopicRecord(
        TopicName(OFFSETS_TOPIC),
        OFFSETS_TOPIC_ID,
        tuple((HERE, ELSEWHERE) for _ in range(partitions)),
    )
    states = {
        index: PartitionState(
            leaders.get(index, HERE),
            revision,
            (leaders.get(index, HERE),),
        )
        for index in range(partitions)
    }
    topic = TopicImage(record, states, revision)
    return ClusterImage.build("test-cluster", revision, {}, {TopicName(OFFSETS_TOPIC): topic})


def offset(value: int, metadata: str = "", *, at: int = NOW, epoch: int = -1) -> CommittedOffset:
    return CommittedOffset(value, epoch, metadata, at)


@dataclass
class CoordinatorEnv:
    data_dir: Path
    config: GroupConfig = CONFIG
    clock: Clock = field(default_factory=Clock)
    topics: set[str] = field(default_factory=lambda: {"t", "u", "v"})
    """Topics that exist, for the coordinator's topic_exists."""
    partition_counts: dict[str, int] = field(default_factory=dict)
    """Partition counts of the topics KIP-848 groups see (by name; ids from topic_id())."""
    logs: LogManager = field(init=False)
    replicas: ReplicaManager = field(init=False)
    coordinator: GroupCoordinator = field(init=False)
    coordinators: list[GroupCoordinator] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    instance: dict[str, str | None] = field(default_factory=dict)
    """member id -> the group.instance.id it joined with (None for dynamic members)."""

    # -- building ---------------------------------------------------------------

    async def start(self, leaders: dict[int, NodeId] | None = None) -> CoordinatorEnv:
        self.logs = LogManager(self.data_dir, wall_clock_ms)
        self.replicas = ReplicaManager(HERE, self.logs, {}, self.clock)
        self.replicas.apply(offsets_image(self.config.offsets_topic_num_partitions, leaders))
        self.coordinator = await self.new_coordinator()
        return self

    def topic_view(self) -> dict[str, tuple[uuid.UUID, int]]:
        return {name: (topic_id(name), count) for name, count in self.partition_counts.items()}

    def topic_exists(self, topic: str, partition: int) -> bool:
        return topic in self.topics and 0 <= partition < 8

    async def new_coordinator(self, wait: bool = True) -> GroupCoordinator:
        coordinator = GroupCoordinator(
            self.replicas, self.config, self.clock, self.topic_exists, self.topic_view
        )
        self.coordinators.append(coordinator)
        coordinator.on_partitions_changed()
        if wait:
            await self.loaded(coordinator)
        return coordinator

    async def loaded(self, coordinator: GroupCoordinator) -> None:
        await within(asyncio.gather(*coordinator.loading.values()))

    async def reload(self) -> GroupCoordinator:
        """A new coordinator over the same logs, as after a failover: the old one goes."""
        await self.coordinator.close()
        self.coordinator = await self.new_coordinator()
        return self.coordinator

    async def restart(self) -> GroupCoordinator:
        """Close everything and reopen the data directory from disk."""
        await self.coordinator.close()
        await self.settle()
        await self.logs.close()
        self.logs = LogManager(self.data_dir, wall_clock_ms)
        self.replicas = ReplicaManager(HERE, self.logs, {}, self.clock)
        image = offsets_image(self.config.offsets_topic_num_partitions)
        self.logs.load_all(lambda _topic: self.replicas.log_config(None))
        self.replicas.apply(image)
        self.coordinator = await self.new_coordinator()
        return self.coordinator

    def apply(self, leaders: dict[int, NodeId], revision: int) -> None:
        """A new cluster image, then the coordinator hears of it, as the broker wires it."""
        self.replicas.apply(
            offsets_image(self.config.offsets_topic_num_partitions, leaders, revision)
        )
        self.coordinator.on_partitions_changed()

    async def settle(self) -> None:
        """Let callbacks and spawned tasks (such as storing an emptied group) run."""
        for _ in range(5):
            await asyncio.sleep(0)

    async def close(self) -> None:
        for coordinator in self.coordinators:
            await coordinator.close()
        for task in self.tasks:
            if not task.done():
                task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.replicas.close()
        await self.logs.close()

    # -- the group protocol, as a client drives it --------------------------------

    def spawn(self, awaitable: Awaitable[Any]) -> asyncio.Task[Any]:
        async def run() -> Any:
            return await awaitable

        task = asyncio.get_running_loop().create_task(run())
        self.tasks.append(task)
        return task

    def join(
        self,
        group: str,
        member_id: str = "",
        *,
        instance: str | None = None,
        protocols: list[tuple[str, bytes]] | None = None,
        protocol_type: str = "consumer",
        session_ms: int = LONG_SESSION_MS,
        rebalance_ms: int = LONG_REBALANCE_MS,
        require_known: bool = False,
        client_id: str = "client",
    ) -> asyncio.Task[JoinResult]:
        """Send a JoinGroup; the answer is the task's result (it may wait for a rebalance)."""
        coordinator = self.coordinator
        if protocols is None:
            protocols = [("range", consumer_subscription("t"))]

        async def joining() -> JoinResult:
            result = await coordinator.join_group(
                group,
                member_id,
                instance,
                client_id,
                "/127.0.0.1",
                session_ms,
                rebalance_ms,
                protocol_type,
                protocols,
                require_known,
            )
            if result.member_id:
                self.instance[result.member_id] = instance
            return result

        return self.spawn(joining())

    def sync(
        self,
        group: str,
        joined: JoinResult,
        assignments: dict[str, bytes] | None = None,
        *,
        generation: int | None = None,
    ) -> asyncio.Task[SyncResult]:
        return self.spawn(
            self.coordinator.sync_group(
                group,
                joined.generation if generation is None else generation,
                joined.member_id,
                self.instance.get(joined.member_id),
                joined.protocol_type,
                joined.protocol_name,
                assignments or {},
            )
        )

    async def stable_group(
        self,
        group: str,
        count: int,
        *,
        instances: list[str | None] | None = None,
        assign: bool = True,
        **join_args: Any,
    ) -> list[JoinResult]:
        """``count`` members join together (one generation) and sync; the leader comes first.

        Each member is assigned its own member id as bytes, so a test can tell
        assignments apart. ``self.instance`` remembers each member's
        group.instance.id.
        """
        chosen = instances if instances is not None else [None] * count
        tasks = [self.join(group, instance=chosen[i], **join_args) for i in range(count)]
        joined = list(await within(asyncio.gather(*tasks)))
        assert {j.error for j in joined} == {E.none}, joined
        assert len({j.generation for j in joined}) == 1, joined
        joined.sort(key=lambda j: j.member_id != j.leader)
        if assign:
            plan = {j.member_id: j.member_id.encode() for j in joined}
            syncs = [self.sync(group, joined[0], plan)]
            syncs += [self.sync(group, j) for j in joined[1:]]
            results = await within(asyncio.gather(*syncs))
            assert {s.error for s in results} == {E.none}, results
        return joined

    def heartbeat(self, group: str, joined: JoinResult) -> ErrorCode:
        return self.coordinator.heartbeat(
            group, joined.generation, joined.member_id, self.instance.get(joined.member_id)
        )

    async def commit(
        self,
        group: str,
        offsets: dict[tuple[str, int], CommittedOffset],
        *,
        generation: int = -1,
        member_id: str = "",
        instance: str | None = None,
    ) -> dict[tuple[str, int], ErrorCode]:
        return await self.coordinator.commit_offsets(
            group, generation, member_id, instance, offsets
        )

    def state(self, group: str) -> str:
        return self.coordinator.describe_group(group).state


async def within(awaitable: Awaitable[Any], seconds: float = 1.0) -> Any:
    """Await with a deadline, so a coordinator that never answers fails the test, not the run."""
    return await asyncio.wait_for(awaitable, seconds)


def settings(**changes: Any) -> GroupConfig:
    return replace(CONFIG, **changes)


@contextlib.asynccontextmanager
async def coordinator_env(
    data_dir: Path, config: GroupConfig = CONFIG, leaders: dict[int, NodeId] | None = None
) -> AsyncIterator[CoordinatorEnv]:
    env = await CoordinatorEnv(data_dir, config).start(leaders)
    try:
        yield env
    finally:
        await env.close()
