"""A transaction coordinator over a real log, without sockets, for tests/unit/test_txn_*.py.

:class:`TxnEnv` builds what the broker builds: a :class:`LogManager` on a
temporary directory, a :class:`ReplicaManager` holding the partitions of
``__transaction_state`` (led by node 0 unless a test says otherwise) and a
:class:`TransactionCoordinator` that has loaded them. Markers go to a
:class:`FakeMarkers`, which records them and can be held back or made to
fail; producer ids come from a counter. The coordinator's clock is a
:class:`Clock` the test moves by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator_fixtures import ELSEWHERE, HERE, Clock, wall_clock_ms, within
from shoal.broker.cluster.model import (
    ClusterImage,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
)
from shoal.broker.coordinator.records import partition_for
from shoal.broker.log.manager import LogManager
from shoal.broker.replica_manager import ReplicaManager
from shoal.broker.txn.config import TransactionConfig
from shoal.broker.txn.coordinator import TXN_TOPIC, TransactionCoordinator
from shoal.broker.txn.markers import TxnMarker

TXN_TOPIC_ID = uuid.UUID("00000000-0000-0000-0000-0000000007c0")
CONFIG = TransactionConfig(
    transaction_state_log_num_partitions=2,
    transaction_state_log_replication_factor=1,
    transaction_max_timeout_ms=60_000,
    transactional_id_expiration_ms=3_600_000,
    marker_retry_backoff_ms=5,
)


def txn_image(
    partitions: int,
    leaders: dict[int, NodeId] | None = None,
    revision: int = 1,
    followers_in_sync: bool = False,
) -> ClusterImage:
    """__transaction_state alone, every partition replicated on nodes 0 and 1
    (``leaders`` overrides who leads; the leader epoch is the revision). The ISR
    is the leader alone, unless ``followers_in_sync``: then writes wait for node 1."""
    leaders = leaders or {}
    record = TopicRecord(
        TopicName(TXN_TOPIC), TXN_TOPIC_ID, tuple((HERE, ELSEWHERE) for _ in range(partitions))
    )
    states = {
        index: PartitionState(
            leaders.get(index, HERE),
            revision,
            (HERE, ELSEWHERE) if followers_in_sync else (leaders.get(index, HERE),),
        )
        for index in range(partitions)
    }
    topic = TopicImage(record, states, revision)
    return ClusterImage.build("test-cluster", revision, {}, {TopicName(TXN_TOPIC): topic})


def id_on(partition: int, prefix: str = "tx") -> str:
    return next(
        f"{prefix}-{i}"
        for i in range(1000)
        if partition_for(f"{prefix}-{i}", CONFIG.transaction_state_log_num_partitions) == partition
    )


@dataclass
class FakeMarkers:
    """Records each transaction's markers; ``gate`` holds writes back until set."""

    written: list[TxnMarker] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    answer: bool = True

    def __post_init__(self) -> None:
        self.gate.set()

    async def write(self, marker: TxnMarker, wanted: Callable[[], bool]) -> bool:
        await self.gate.wait()
        if not wanted():
            return False
        self.written.append(marker)
        return self.answer


@dataclass
class TxnEnv:
    data_dir: Path
    config: TransactionConfig = CONFIG
    clock: Clock = field(default_factory=Clock)
    markers: FakeMarkers = field(default_factory=FakeMarkers)
    logs: LogManager = field(init=False)
    replicas: ReplicaManager = field(init=False)
    coordinator: TransactionCoordinator = field(init=False)
    coordinators: list[TransactionCoordinator] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))

    async def start(self, leaders: dict[int, NodeId] | None = None) -> TxnEnv:
        self.logs = LogManager(self.data_dir, wall_clock_ms)
        self.replicas = ReplicaManager(HERE, self.logs, {}, self.clock)
        self.replicas.apply(txn_image(self.config.transaction_state_log_num_partitions, leaders))
        self.coordinator = await self.new_coordinator()
        return self

    async def producer_id(self) -> int:
        return next(self._ids)

    async def new_coordinator(self, wait: bool = True) -> TransactionCoordinator:
        coordinator = TransactionCoordinator(
            self.replicas,
            self.config,
            self.clock,
            self.producer_id,
            self.markers,
            lambda group: 7,
        )
        self.coordinators.append(coordinator)
        coordinator.on_partitions_changed()
        if wait:
            await self.loaded(coordinator)
        return coordinator

    async def loaded(self, coordinator: TransactionCoordinator) -> None:
        await within(asyncio.gather(*(task for _epoch, task in coordinator.loading.values())))

    async def reload(self) -> TransactionCoordinator:
        """A new coordinator over the same logs, as after a failover: the old one goes."""
        await self.coordinator.close()
        self.coordinator = await self.new_coordinator()
        return self.coordinator

    def apply(
        self, leaders: dict[int, NodeId], revision: int, followers_in_sync: bool = False
    ) -> None:
        self.replicas.apply(
            txn_image(
                self.config.transaction_state_log_num_partitions,
                leaders,
                revision,
                followers_in_sync,
            )
        )
        self.coordinator.on_partitions_changed()

    async def settle(self) -> None:
        """Let spawned tasks (markers, then Complete*) run."""
        for _ in range(20):
            await asyncio.sleep(0)

    async def eventually(self, check: Callable[[], bool], seconds: float = 1.0) -> None:
        """Wait for ``check`` to hold: markers and Complete* follow an answer in the background."""
        for _ in range(int(seconds / 0.005)):
            if check():
                return
            await asyncio.sleep(0.005)
        assert check()

    async def close(self) -> None:
        for coordinator in self.coordinators:
            await coordinator.close()
        await self.replicas.close()
        await self.logs.close()

    # -- a transactional producer, as a client drives it ---------------------------------

    async def init(self, transactional_id: str, timeout_ms: int = 10_000) -> tuple[int, int]:
        result = await self.coordinator.init_producer_id(transactional_id, timeout_ms)
        assert result.error.name == "none", result
        return result.producer_id, result.producer_epoch

    async def begin(
        self, transactional_id: str, *partitions: tuple[str, int], timeout_ms: int = 10_000
    ) -> tuple[int, int]:
        """InitProducerId, then AddPartitionsToTxn: an Ongoing transaction."""
        producer_id, epoch = await self.init(transactional_id, timeout_ms)
        code = await self.coordinator.add_partitions(
            transactional_id, producer_id, epoch, partitions or [("t", 0)]
        )
        assert code.name == "none", code
        return producer_id, epoch

    def state(self, transactional_id: str) -> str:
        return self.coordinator.txns[transactional_id].state.kafka_name


@contextlib.asynccontextmanager
async def txn_env(
    data_dir: Path,
    leaders: dict[int, NodeId] | None = None,
    config: TransactionConfig = CONFIG,
) -> AsyncIterator[TxnEnv]:
    env = await TxnEnv(data_dir, config).start(leaders)
    try:
        yield env
    finally:
        await env.close()


def run_soon(job: Awaitable[Any]) -> asyncio.Task[Any]:
    async def run() -> Any:
        return await job

    return asyncio.get_running_loop().create_task(run())
