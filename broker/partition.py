"""A partition this broker hosts: its log, and its state as leader.

The leader appends, advances the high watermark (the smallest log end offset
in the ISR; with this broker alone in the ISR, its own log end), and wakes
the fetches waiting for new data. Followers and ISR changes arrive with the
replication issue; the state here (leader epoch, ISR, follower log ends) is
already the shape they need.

Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from shoal.broker.cluster.model import NodeId, PartitionState
from shoal.broker.log.log import AppendInfo, FileSlice, Log

NO_EPOCH = -1


class PartitionError(Exception):
    """Maps to a partition-level Kafka error code (named by ``code``)."""

    code = "unknown_server_error"


class NotLeaderError(PartitionError):
    code = "not_leader_or_follower"


class UnknownPartitionError(PartitionError):
    code = "unknown_topic_or_partition"


class FencedLeaderEpochError(PartitionError):
    code = "fenced_leader_epoch"


class UnknownLeaderEpochError(PartitionError):
    code = "unknown_leader_epoch"


class NotEnoughReplicasError(PartitionError):
    code = "not_enough_replicas"


@dataclass(frozen=True, slots=True)
class ReadInfo:
    records: FileSlice | None
    high_watermark: int
    log_start_offset: int
    log_end_offset: int


class Partition:
    def __init__(
        self,
        topic: str,
        index: int,
        topic_id: uuid.UUID,
        node_id: NodeId,
        log: Log,
        replicas: tuple[NodeId, ...],
        state: PartitionState,
    ) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.node_id = node_id
        self.log = log
        self.replicas = replicas
        self.state = state
        self.follower_end_offsets: dict[NodeId, int] = {}
        self._waiters: set[asyncio.Future[None]] = set()

    @property
    def is_leader(self) -> bool:
        return self.state.leader == self.node_id

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    def update_state(self, replicas: tuple[NodeId, ...], state: PartitionState) -> None:
        self.replicas = replicas
        self.state = state
        if self.is_leader:
            self.maybe_advance_high_watermark()
        self.wake()

    # -- leader epochs -----------------------------------------------------------

    def check_epoch(self, requested: int) -> None:
        """Fetch/ListOffsets/OffsetForLeaderEpoch ``current_leader_epoch`` check (KIP-320)."""
        if requested == NO_EPOCH:
            return
        if requested < self.leader_epoch:
            raise FencedLeaderEpochError(
                f"epoch {requested} is older than the leader's {self.leader_epoch}"
            )
        if requested > self.leader_epoch:
            raise UnknownLeaderEpochError(
                f"epoch {requested} is newer than the leader's {self.leader_epoch}"
            )

    def require_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderError(
                f"broker {self.node_id} is not the leader of {self.topic}-{self.index}"
            )

    # -- writes ------------------------------------------------------------------

    def append_as_leader(self, records: bytes, required_acks: int) -> AppendInfo:
        self.require_leader()
        isr = self.state.isr
        if required_acks == -1 and len(isr) < self.log.config.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{len(isr)} in-sync replicas is below min.insync.replicas"
                f" ({self.log.config.min_insync_replicas})"
            )
        info = self.log.append_as_leader(records, self.leader_epoch)
        self.maybe_advance_high_watermark()
        return info

    def maybe_advance_high_watermark(self) -> None:
        end_offsets = [
            self.log.log_end_offset
            if node == self.node_id
            else self.follower_end_offsets.get(node, self.log.log_start_offset)
            for node in self.state.isr
        ]
        candidate = min(end_offsets, default=self.log.log_end_offset)
        if candidate > self.log.high_watermark:
            self.log.high_watermark = candidate
            self.wake()

    # -- reads -------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, min_one: bool, up_to_log_end: bool) -> ReadInfo:
        """Records from ``offset``: below the high watermark for consumers,
        below the log end for followers (``up_to_log_end``)."""
        log = self.log
        limit = log.log_end_offset if up_to_log_end else log.high_watermark
        records = log.read(offset, max_bytes, limit, min_one)
        return ReadInfo(records, log.high_watermark, log.log_start_offset, log.log_end_offset)

    # -- waiting for data ----------------------------------------------------------

    def add_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.add(waiter)

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    def wake(self) -> None:
        """New data, or a state change a waiting fetch must see."""
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
