"""A partition this broker hosts: its log, and its role as leader or follower.

As leader it appends, tracks how far each follower has fetched, advances the
high watermark (the smallest log end offset in the ISR), answers acks=all
once the high watermark passes a batch, and says which followers should
leave or join the ISR. As follower its log is written only by the replica
fetcher, and its high watermark is the leader's, capped at its own log end.

Transactions: as leader it writes the coordinator's markers
(:meth:`Partition.append_marker`); read_committed consumers read below the
last stable offset, which moves with the high watermark and with markers,
and get the aborted transactions of what they read.

The logic here is pure (an injected clock, no store, no sockets): the replica
manager turns its ISR proposals into compare-and-swap writes, and the fetch
handler feeds it follower positions. Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Container
from dataclasses import dataclass, replace

from shoal.broker.cluster.model import NodeId, PartitionState
from shoal.broker.log.log import AppendInfo, FileSlice, Log
from shoal.broker.log.txn_index import AbortedTxn
from shoal.broker.tasks import wait_at_most

NO_EPOCH = -1
UNKNOWN_OFFSET = -1


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


class NotEnoughReplicasAfterAppendError(PartitionError):
    code = "not_enough_replicas_after_append"


class CommitTimeoutError(PartitionError):
    code = "request_timed_out"


@dataclass(frozen=True, slots=True)
class ReadInfo:
    records: FileSlice | None
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int = UNKNOWN_OFFSET
    aborted_transactions: tuple[AbortedTxn, ...] | None = None
    """For read_committed reads: the aborted transactions overlapping the records."""


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower, from its fetches (Kafka's ReplicaState)."""

    log_end_offset: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    """Its own log start, as its fetches report it: DeleteRecords waits for it."""
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    last_fetch_leader_end_offset: int = 0


class Partition:
    def __init__(
        self,
        topic: str,
        index: int,
        topic_id: uuid.UUID,
        node_id: NodeId,
        log: Log,
        clock: Callable[[], int],
        may_lead: Callable[[], bool] = lambda: True,
    ) -> None:
        self.may_lead = may_lead
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.node_id = node_id
        self.log = log
        self.clock = clock
        self.replicas: tuple[NodeId, ...] = ()
        self.state = PartitionState(NodeId(-1), NO_EPOCH, ())
        self.revision = 0
        """Store revision of ``state``: the compare-and-swap guard of an ISR change."""
        self.followers: dict[NodeId, FollowerState] = {}
        self.pending_isr: tuple[NodeId, ...] | None = None
        """An ISR change written but not yet seen in the image."""
        self.leader_high_watermark: int | None = None
        """As a follower, the high watermark the leader last sent (DescribeLogDirs' lag)."""
        self._waiters: set[asyncio.Future[None]] = set()
        self._data_waiters: set[asyncio.Future[None]] = set()
        """Replicas' fetches: they read to the log end, so a new high watermark or log
        start alone gives them nothing to answer with."""

    @property
    def is_leader(self) -> bool:
        return self.state.leader == self.node_id

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def maximal_isr(self) -> frozenset[NodeId]:
        """The ISR with any pending change added: the high watermark waits for all of
        them, so no record counts as committed by a replica that is only leaving."""
        return frozenset(self.state.isr) | frozenset(self.pending_isr or ())

    # -- role changes ------------------------------------------------------------

    def update_state(
        self, replicas: tuple[NodeId, ...], state: PartitionState, revision: int
    ) -> bool:
        """Take a new state from the cluster image; True if this broker's role changed
        (became leader, or follows a new leader or epoch)."""
        old = self.state
        self.replicas = replicas
        self.state = state
        self.revision = revision
        if self.pending_isr is not None and (
            state.isr == self.pending_isr or state.partition_epoch != old.partition_epoch
        ):
            # Landed, or overtaken: the controller refuses a proposal made at an older
            # partition epoch (a new leader epoch is a new partition epoch too), and
            # an image may show only the change after ours.
            self.pending_isr = None
        new_role = state.leader != old.leader or state.leader_epoch != old.leader_epoch
        if new_role and self.is_leader:
            self._become_leader()
        elif new_role:
            self.followers = {}
            self.pending_isr = None
        if new_role:
            self.leader_high_watermark = None
        if self.is_leader:
            # A reassignment adds and removes replicas under the same leader: a removed
            # one must not be offered to the ISR again from its last known position.
            self.followers = {
                node: self.followers.get(node, FollowerState())
                for node in replicas
                if node != self.node_id
            }
            self.maybe_advance_high_watermark()
        self.wake()
        return new_role

    def _become_leader(self) -> None:
        """Followers' positions are unknown until they fetch from us; those in the ISR
        count as caught up now, so the ISR does not shrink before they had a chance."""
        now = self.clock()
        self.followers = {
            node: FollowerState(last_caught_up_ms=now if node in self.state.isr else 0)
            for node in self.replicas
            if node != self.node_id
        }
        self.pending_isr = None
        self.log.epochs.assign(self.leader_epoch, self.log.log_end_offset)

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
        if not self.may_lead():
            raise NotLeaderError(
                f"broker {self.node_id} cannot be sure its session with the cluster stands,"
                f" so another broker may lead {self.topic}-{self.index} now"
            )

    # -- writes ------------------------------------------------------------------

    def append_as_leader(self, records: bytes, required_acks: int) -> AppendInfo:
        self.require_leader()
        if required_acks == -1:
            self._check_min_isr()
        info = self.log.append_as_leader(records, self.leader_epoch)
        if not info.duplicate:
            self.maybe_advance_high_watermark()
            self.wake()  # followers long-polling for new data
        return info

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> AppendInfo:
        """Write a transaction marker (WriteTxnMarkers), as leader, in the current leader
        epoch. Raises NotLeaderError, NotEnoughReplicasError (Kafka writes markers with
        acks=all, so min.insync.replicas applies), or the log's InvalidProducerEpochError
        and TransactionCoordinatorFencedError; the caller waits for it with
        :meth:`wait_for_commit`."""
        self.require_leader()
        self._check_min_isr()
        info = self.log.append_marker(
            producer_id, producer_epoch, commit, coordinator_epoch, self.leader_epoch
        )
        self.maybe_advance_high_watermark()
        self.wake()
        return info

    def _check_min_isr(self) -> None:
        isr = self.state.isr
        if len(isr) < self.log.config.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{len(isr)} in-sync replicas is below min.insync.replicas"
                f" ({self.log.config.min_insync_replicas})"
            )

    async def wait_for_commit(self, next_offset: int, timeout_s: float) -> None:
        """acks=all: wait until the high watermark reaches ``next_offset``.

        As Kafka's DelayedProduce: NotLeaderError if leadership moves away
        meanwhile, NotEnoughReplicasAfterAppendError if the ISR that committed
        it is smaller than min.insync.replicas, CommitTimeoutError after
        ``timeout_s``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        epoch = self.leader_epoch
        while True:
            if not self.is_leader or self.leader_epoch != epoch:
                raise NotLeaderError(f"leadership of {self.topic}-{self.index} moved")
            if self.high_watermark >= next_offset:
                if len(self.state.isr) < self.log.config.min_insync_replicas:
                    raise NotEnoughReplicasAfterAppendError(
                        f"written, but only {len(self.state.isr)} replicas are in sync"
                        f" (min.insync.replicas={self.log.config.min_insync_replicas})"
                    )
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise CommitTimeoutError(
                    f"replicas did not confirm {self.topic}-{self.index} up to {next_offset}"
                )
            waiter = loop.create_future()
            self.add_waiter(waiter)
            try:
                await wait_at_most(waiter, remaining)
            finally:
                self.remove_waiter(waiter)

    def maybe_advance_high_watermark(self) -> None:
        """The high watermark is the smallest log end in the (maximal) ISR; it never goes back.

        Called on every follower fetch of every partition in its session, so it
        walks the ISR without building the maximal set unless a change is pending.
        """
        log = self.log
        own_end = log.log_end_offset
        isr = self.state.isr if self.pending_isr is None else self.maximal_isr
        candidate = None
        for node in isr:
            if node == self.node_id:
                end = own_end
            else:
                follower = self.followers.get(node)
                end = UNKNOWN_OFFSET if follower is None else follower.log_end_offset
            if candidate is None or end < candidate:
                candidate = end
        if candidate is None:
            candidate = own_end
        if candidate > log.high_watermark:
            # The last stable offset moves with it: read_committed waiters wake too.
            log.high_watermark = candidate
            self._wake_readers()

    # -- followers, seen from the leader -------------------------------------------

    def record_follower_fetch(
        self, node: NodeId, fetch_offset: int, log_start_offset: int = UNKNOWN_OFFSET
    ) -> None:
        """A follower fetched from ``fetch_offset``: it holds everything below it.

        As Kafka's updateFollowerFetchState: the follower is caught up now if
        it asked for our log end, or as of its previous fetch if it has
        reached the log end we had then.
        """
        follower = self.followers.get(node)
        if follower is None:
            return
        now = self.clock()
        leader_end = self.log.log_end_offset
        if fetch_offset >= leader_end:
            follower.last_caught_up_ms = now
        elif fetch_offset >= follower.last_fetch_leader_end_offset:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, follower.last_fetch_ms)
        follower.log_end_offset = fetch_offset
        follower.last_fetch_ms = now
        follower.last_fetch_leader_end_offset = leader_end
        if log_start_offset != follower.log_start_offset:
            follower.log_start_offset = log_start_offset
            self._wake_readers()  # a DeleteRecords waiting for this replica's low watermark
        self.maybe_advance_high_watermark()

    # -- the low watermark (DeleteRecords) -------------------------------------------

    def low_watermark(self, alive: Container[NodeId]) -> int:
        """The smallest log start offset among this leader and its live replicas.

        As Kafka's lowWatermarkIfLeader: every assigned replica counts, in the
        ISR or not, as long as its broker is registered; one that has not
        fetched since this broker became leader holds it at -1.
        """
        self.require_leader()
        low = self.log.log_start_offset
        for node, follower in self.followers.items():
            if node in alive:
                low = min(low, follower.log_start_offset)
        return low

    async def wait_for_low_watermark(
        self, target: int, timeout_s: float, alive: Callable[[], Container[NodeId]]
    ) -> int:
        """Wait until the low watermark reaches ``target`` (Kafka's DelayedDeleteRecords).

        Returns the low watermark then, or when ``timeout_s`` runs out (the
        caller compares it with ``target``); NotLeaderError if leadership
        moves meanwhile.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        epoch = self.leader_epoch
        while True:
            if self.leader_epoch != epoch:
                raise NotLeaderError(f"leadership of {self.topic}-{self.index} moved")
            low = self.low_watermark(alive())
            remaining = deadline - loop.time()
            if low >= target or remaining <= 0:
                return low
            waiter = loop.create_future()
            self.add_waiter(waiter)
            try:
                await wait_at_most(waiter, remaining)
            finally:
                self.remove_waiter(waiter)

    def isr_expansion(self) -> PartitionState | None:
        """The ISR with every caught-up follower added, or None if nobody qualifies.

        A follower rejoins once it holds everything committed and at least
        the start of the current leader epoch (so it has every record this
        leader wrote).
        """
        if not self.is_leader or self.pending_isr is not None:
            return None
        isr = self.state.isr
        outside = [(n, f) for n, f in self.followers.items() if n not in isr]
        if not outside:  # the common case, checked on every follower fetch
            return None
        least = max(self.high_watermark, self._epoch_start_offset())
        joining = [node for node, follower in outside if follower.log_end_offset >= least]
        if not joining:
            return None
        return self._with_isr((*self.state.isr, *sorted(joining)))

    def isr_shrink(self, max_lag_ms: int) -> PartitionState | None:
        """The ISR without followers not caught up for ``max_lag_ms``, or None if all are."""
        if not self.is_leader or self.pending_isr is not None:
            return None
        now = self.clock()
        lagging = {
            node
            for node in self.state.isr
            if node != self.node_id
            and now - self.followers.get(node, FollowerState()).last_caught_up_ms > max_lag_ms
        }
        if not lagging:
            return None
        return self._with_isr(tuple(n for n in self.state.isr if n not in lagging))

    def _with_isr(self, isr: tuple[NodeId, ...]) -> PartitionState:
        return replace(self.state, isr=isr, partition_epoch=self.state.partition_epoch + 1)

    def _epoch_start_offset(self) -> int:
        for epoch, start in reversed(self.log.epochs.entries):
            if epoch == self.leader_epoch:
                return start
        return self.log.log_end_offset

    # -- the follower's side -------------------------------------------------------

    def append_as_follower(self, records: bytes, leader_high_watermark: int) -> None:
        if records:
            self.log.append_as_follower(records)
        self.update_follower_high_watermark(leader_high_watermark)

    def follower_log_start_target(self, leader_log_start_offset: int) -> int | None:
        """Where this follower's log start should move for the leader's, or None to stay.

        Capped at our own high watermark: Kafka refuses a start past it, and
        we cannot drop what we have not committed. The leader's start is at
        most its high watermark, so the cap only bites while we catch up.
        """
        target = min(leader_log_start_offset, self.log.high_watermark)
        return target if target > self.log.log_start_offset else None

    def update_follower_high_watermark(self, leader_high_watermark: int) -> None:
        self.leader_high_watermark = leader_high_watermark
        new = min(leader_high_watermark, self.log.log_end_offset)
        self.log.high_watermark = max(self.log.high_watermark, new)

    # -- reads -------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        min_one: bool,
        up_to_log_end: bool,
        read_committed: bool = False,
    ) -> ReadInfo:
        """Records from ``offset``: below the high watermark for consumers, below the last
        stable offset for read_committed ones (with the aborted transactions among
        them), below the log end for followers (``up_to_log_end``)."""
        log = self.log
        stable = log.last_stable_offset
        if up_to_log_end:
            limit = log.log_end_offset
        else:
            limit = stable if read_committed else log.high_watermark
        records = log.read(offset, max_bytes, limit, min_one)
        aborted: tuple[AbortedTxn, ...] | None = None
        if read_committed:
            aborted = ()
            if records is not None:
                aborted = tuple(log.collect_aborted_txns(offset, records.upper_offset))
        return ReadInfo(
            records,
            log.high_watermark,
            log.log_start_offset,
            log.log_end_offset,
            stable,
            aborted,
        )

    # -- waiting for data ----------------------------------------------------------

    def add_waiter(self, waiter: asyncio.Future[None], *, data_only: bool = False) -> None:
        """``waiter`` is set at the next change; with ``data_only`` (a replica's fetch) only
        at new records or a state change, not at a new high watermark or log start."""
        (self._data_waiters if data_only else self._waiters).add(waiter)

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)
        self._data_waiters.discard(waiter)

    def wake(self) -> None:
        """New data or a state change: every waiter must look again."""
        self._wake_readers()
        waiters, self._data_waiters = self._data_waiters, set()
        _set_all(waiters)

    def _wake_readers(self) -> None:
        """A new high watermark (and last stable offset) or a follower's log start:
        consumers, acks=all produces and DeleteRecords look again; replicas' fetches,
        which would find nothing to answer with, sleep on."""
        waiters, self._waiters = self._waiters, set()
        _set_all(waiters)


def _set_all(waiters: set[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
