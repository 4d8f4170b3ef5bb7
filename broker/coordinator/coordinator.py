"""The group coordinator: Kafka's classic rebalance protocol and committed offsets.

A group belongs to one partition of ``__consumer_offsets`` (by
:func:`~shoal.broker.coordinator.records.partition_for`), and that partition's
leader coordinates it. Everything a group must not forget (its generation,
members and assignments after each rebalance, its committed offsets) is
appended to that partition before the client hears "done"; when a broker
becomes the partition's leader it reads the partition back and knows the
groups again (answering COORDINATOR_LOAD_IN_PROGRESS meanwhile).

Transactional offset commits (TxnOffsetCommit, as Kafka's GroupMetadataManager
does them): the offsets are appended as one transactional batch of the
producer and stay pending per producer id, invisible to OffsetFetch, until
the transaction coordinator's marker lands in the partition
(:meth:`GroupCoordinator.complete_transaction`): a commit makes them the
group's offsets unless a plain commit was written after them, an abort drops
them. Loading replays the same way, batch by batch, so a transaction still
open when leadership moved stays pending on the new leader.

Timers, all on the event loop:

* join: a rebalance waits for every member to rejoin, at most the largest
  rebalance timeout; a first rebalance of an empty group waits
  ``group.initial.rebalance.delay.ms`` more for others to arrive, extended
  while they keep arriving (as Kafka's InitialDelayedJoin);
* sync: after the join, every member has the rebalance timeout to send its
  SyncGroup (the leader with the assignment); members that did not sync by
  then are removed, even once the leader's assignment made the group Stable
  (as Kafka's pending-sync expiry);
* heartbeat: a member silent for its session timeout is removed, except while
  it waits in a join or a sync, which have their own deadlines;
* pending member (KIP-394): a member id handed out with MEMBER_ID_REQUIRED
  is forgotten if not used within the session timeout.

KIP-848 consumer groups (ConsumerGroupHeartbeat) live beside the classic
ones in :mod:`shoal.broker.coordinator.consumer_coordinator`
(``self.consumer``), in the same partitions and loaded by the same replay;
this class keeps every group's committed offsets, routes a group id to the
protocol that holds it, and lists both kinds.

All methods run on the event loop thread; a request handler awaits the join
or sync future of its member, never a lock (the consumer protocol's
heartbeats take a per-group lock around their write).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from shoal.broker.coordinator.config import GroupConfig
from shoal.broker.coordinator.consumer_coordinator import ConsumerCoordinator, TopicsView
from shoal.broker.coordinator.consumer_records import ConsumerReplay, Entry, parse_consumer_key
from shoal.broker.coordinator.group import (
    CommittedOffset,
    Group,
    GroupState,
    Member,
    PendingOffset,
)
from shoal.broker.coordinator.records import (
    GroupKey,
    OffsetKey,
    OffsetValue,
    RecordFormatError,
    group_key,
    group_value,
    offset_key,
    offset_value,
    parse_group_value,
    parse_key,
    parse_offset_value,
    partition_for,
)
from shoal.broker.log.log import AppendInfo, LogError
from shoal.broker.log.markers import read_marker
from shoal.broker.log.producer_state import ProducerStateError
from shoal.broker.partition import NotLeaderError, Partition, PartitionError
from shoal.broker.replica_manager import ReplicaManager

from shoal.records import (
    BatchHeader,
    BatchOptions,
    InvalidBatchError,
    NewRecord,
    Record,
    build_batch,
    iter_records,
)
from shoal.wire import ErrorCode

log = logging.getLogger(__name__)

OFFSETS_TOPIC: Final = "__consumer_offsets"
E = ErrorCode
NO_GENERATION: Final = -1
_COMMIT_TIMEOUT_S: Final = 5.0
"""offsets.commit.timeout.ms: how long a group write waits for the in-sync replicas."""


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    generation: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()
    skip_assignment: bool = False
    """KIP-814: a rejoined static leader gets the members but must not reassign."""


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    error: ErrorCode
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str
    group_type: str
    """"classic" or "consumer" (KIP-848), ListGroups v5's group type."""


class CoordinatorError(Exception):
    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


class GroupCoordinator:
    def __init__(
        self,
        replicas: ReplicaManager,
        config: GroupConfig,
        clock: Callable[[], int],
        topic_exists: Callable[[str, int], bool],
        topics: TopicsView | None = None,
    ) -> None:
        self.replicas = replicas
        self.config = config
        self.clock = clock
        self.topic_exists = topic_exists
        self.groups: dict[str, Group] = {}
        """Classic groups, and the committed offsets of every group (a KIP-848 group's
        offsets live in an Empty entry here, as Kafka keeps offsets apart from membership)."""
        self.consumer = ConsumerCoordinator(
            config,
            self.owner_error,
            self._append_entries,
            topics or dict,
            self._classic_state,
            self._forget_classic,
        )
        self.loaded: set[int] = set()
        self.loading: dict[int, asyncio.Task[None]] = {}
        self._expiry: asyncio.Task[None] | None = None

    # -- ownership ---------------------------------------------------------------

    @property
    def partitions(self) -> int:
        return self.config.offsets_topic_num_partitions

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.partitions)

    def owner_error(self, group_id: str) -> ErrorCode | None:
        """Why this broker cannot serve ``group_id`` now, or None if it can."""
        index = self.partition_of(group_id)
        if index in self.loaded:
            return None
        if index in self.loading:
            return E.coordinator_load_in_progress
        partition = self.replicas.get(OFFSETS_TOPIC, index)
        if partition is None or not partition.is_leader:
            return E.not_coordinator
        return E.coordinator_load_in_progress

    def on_partitions_changed(self) -> None:
        """Load offsets partitions this broker now leads; forget those it lost."""
        led = {
            index
            for (topic, index), partition in self.replicas.partitions.items()
            if topic == OFFSETS_TOPIC and partition.is_leader
        }
        for index in led - self.loaded - set(self.loading):
            self.loading[index] = asyncio.get_running_loop().create_task(
                self._load(index), name=f"load-offsets-{index}"
            )
        for index in (self.loaded | set(self.loading)) - led:
            self._unload(index)

    def start(self) -> None:
        self._expiry = asyncio.get_running_loop().create_task(self._expire_forever())

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        for task in self.loading.values():
            task.cancel()
        for index in list(self.loaded):
            self._unload(index)
        self.consumer.close()

    async def _load(self, index: int) -> None:
        partition = self.replicas.get(OFFSETS_TOPIC, index)
        try:
            if partition is not None:
                replay = self._replay(partition)
                groups = replay.groups()
                consumer_groups = replay.consumer.result()
                self.consumer.install(consumer_groups)
                now = self.clock()
                for group in groups.values():
                    self.groups[group.group_id] = group
                    for member in group.members.values():
                        self._schedule_heartbeat(group, member)
                    if group.state is GroupState.EMPTY and group.state_timestamp < 0:
                        group.state_timestamp = now
                log.info(
                    "event=offsets_partition_loaded partition=%d groups=%d consumer_groups=%d",
                    index,
                    len(groups),
                    len(consumer_groups),
                )
            self.loaded.add(index)
        except (LogError, RecordFormatError, OSError):
            log.exception("event=offsets_partition_load_failed partition=%d", index)
        finally:
            self.loading.pop(index, None)

    def _read_groups(self, partition: Partition) -> dict[str, Group]:
        """The classic groups and the offsets of a partition (see :meth:`_replay`)."""
        return self._replay(partition).groups()

    def _replay(self, partition: Partition) -> _Replay:
        """Replay the partition: the latest record per key wins, null values delete;
        transactional offsets count once their commit marker is read."""
        replay = _Replay()
        plog = partition.log
        start = plog.log_start_offset
        # To the log end, as Kafka loads: a new leader's high watermark lags
        # until its followers fetch, but everything committed is in its log.
        for batch, header in plog.replay(start, plog.log_end_offset):
            try:
                if header.is_control:
                    marker = read_marker(batch) if header.base_offset >= start else None
                    if marker is not None:
                        replay.marker(header.producer_id, marker.commit)
                    continue
                records = list(iter_records(batch))
            except InvalidBatchError as exc:
                log.warning(
                    "event=offsets_batch_skipped partition=%d offset=%d error=%s",
                    partition.index,
                    header.base_offset,
                    exc,
                )
                continue
            for record in records:
                if record.offset < start or record.key is None:
                    continue
                try:
                    replay.record(header, record)
                except RecordFormatError as exc:
                    log.warning(
                        "event=offsets_record_skipped partition=%d offset=%d error=%s",
                        partition.index,
                        record.offset,
                        exc,
                    )
        return replay

    def _unload(self, index: int) -> None:
        task = self.loading.pop(index, None)
        if task is not None:
            task.cancel()
        self.loaded.discard(index)
        self.consumer.unload([g for g in self.consumer.groups if self.partition_of(g) == index])
        for group_id in [g for g in self.groups if self.partition_of(g) == index]:
            group = self.groups.pop(group_id)
            self._cancel_timers(group)
            for member in group.members.values():
                _resolve(member.join_future, JoinResult(E.not_coordinator))
                _resolve(member.sync_future, SyncResult(E.not_coordinator))
        log.info("event=offsets_partition_unloaded partition=%d", index)

    # -- persistence -------------------------------------------------------------

    async def _append(
        self,
        group_id: str,
        entries: Sequence[tuple[bytes, bytes | None]],
        options: BatchOptions | None = None,
    ) -> int:
        """Append records to the group's partition and wait until every in-sync replica
        has them (acks=all, as Kafka's coordinator writes); CoordinatorError if not.
        Returns the batch's offset."""
        partition, info = self._write(group_id, entries, options)
        await self._replicated(group_id, partition, info)
        return info.first_offset

    def _write(
        self,
        group_id: str,
        entries: Sequence[tuple[bytes, bytes | None]],
        options: BatchOptions | None,
    ) -> tuple[Partition, AppendInfo]:
        partition = self.replicas.get(OFFSETS_TOPIC, self.partition_of(group_id))
        if partition is None or not partition.is_leader:
            raise CoordinatorError(E.not_coordinator)
        batch = build_batch(
            [NewRecord(key, value) for key, value in entries], options=options or BatchOptions()
        )
        try:
            return partition, partition.append_as_leader(batch, -1)
        except NotLeaderError as exc:
            raise CoordinatorError(E.not_coordinator, str(exc)) from exc
        except ProducerStateError as exc:
            # A fenced or unknown producer: the client must hear it as it is.
            raise CoordinatorError(ErrorCode[exc.code], str(exc)) from exc
        except (LogError, PartitionError, OSError) as exc:
            log.warning("event=offsets_append_failed group=%s error=%s", group_id, exc)
            raise CoordinatorError(E.coordinator_not_available, str(exc)) from exc

    async def _replicated(self, group_id: str, partition: Partition, info: AppendInfo) -> None:
        try:
            await partition.wait_for_commit(info.last_offset + 1, _COMMIT_TIMEOUT_S)
        except NotLeaderError as exc:
            raise CoordinatorError(E.not_coordinator, str(exc)) from exc
        except (LogError, PartitionError, OSError) as exc:
            log.warning("event=offsets_append_failed group=%s error=%s", group_id, exc)
            raise CoordinatorError(E.coordinator_not_available, str(exc)) from exc

    async def _append_entries(self, group_id: str, entries: Sequence[Entry]) -> ErrorCode:
        """The consumer coordinator's writes: NONE once replicated, else the error to answer."""
        try:
            await self._append(group_id, entries)
        except CoordinatorError as exc:
            return exc.code
        return E.none

    def _classic_state(self, group_id: str) -> str:
        """Whether a classic group holds ``group_id``: "absent", "empty" or "active"."""
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return "absent"
        return "empty" if group.is_(GroupState.EMPTY) else "active"

    async def _forget_classic(self, group_id: str) -> ErrorCode:
        """An empty classic group gives its id to a consumer group (as Kafka's
        maybeDeleteEmptyClassicGroup): its metadata goes, its offsets stay."""
        group = self.groups.get(group_id)
        if group is None or (group.protocol_type is None and group.generation == 0):
            return E.none
        code = await self._append_entries(group_id, [(group_key(group_id), None)])
        if code is E.none:
            group.protocol_type = group.protocol_name = group.leader_id = None
            group.generation = 0
        return code

    async def _store_group(self, group: Group) -> None:
        await self._append(
            group.group_id, [(group_key(group.group_id), group_value(group.to_value()))]
        )

    # -- timers ------------------------------------------------------------------

    def _later(
        self, delay_ms: int, callback: Callable[..., None], *args: Any
    ) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay_ms / 1000, callback, *args)

    def _schedule_heartbeat(self, group: Group, member: Member) -> None:
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
        member.heartbeat_timer = self._later(
            member.session_timeout_ms, self._heartbeat_expired, group, member
        )

    def _heartbeat_expired(self, group: Group, member: Member) -> None:
        member.heartbeat_timer = None
        if group.members.get(member.member_id) is not member:
            return
        if member.awaiting_join:
            return
        if member.awaiting_sync:
            return
        log.info(
            "event=member_expired group=%s member=%s session_timeout_ms=%d",
            group.group_id,
            member.member_id,
            member.session_timeout_ms,
        )
        self._remove_member(group, member.member_id)

    def _cancel_timers(self, group: Group) -> None:
        for handle in (group.join_timer, group.sync_timer, *group.pending_members.values()):
            if handle is not None:
                handle.cancel()
        for member in group.members.values():
            if member.heartbeat_timer is not None:
                member.heartbeat_timer.cancel()

    # -- rebalancing ---------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.is_(GroupState.COMPLETING_REBALANCE):
            for member in group.members.values():
                _resolve(member.sync_future, SyncResult(E.rebalance_in_progress))
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None
        group.pending_sync.clear()
        if group.join_timer is not None:
            group.join_timer.cancel()
        initial = group.is_(GroupState.EMPTY)
        group.initial_join = initial
        group.transition(GroupState.PREPARING_REBALANCE, self.clock())
        log.info(
            "event=rebalance_started group=%s generation=%d members=%d reason=%s",
            group.group_id,
            group.generation,
            len(group.members),
            reason,
        )
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.max_rebalance_timeout_ms - delay, 0)
            group.new_member_added = False
            group.join_timer = self._later(delay, self._initial_join_tick, group, delay, remaining)
        else:
            group.join_timer = self._later(
                group.max_rebalance_timeout_ms, self._complete_join, group
            )
            self._maybe_complete_join(group)

    def _initial_join_tick(self, group: Group, delay: int, remaining: int) -> None:
        if group.new_member_added and remaining > 0:
            group.new_member_added = False
            step = min(delay, remaining)
            group.join_timer = self._later(
                step, self._initial_join_tick, group, delay, max(remaining - step, 0)
            )
            return
        self._complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
        """End the join phase early once everyone rejoined (never during the initial delay)."""
        if (
            group.is_(GroupState.PREPARING_REBALANCE)
            and group.all_rejoined()
            and not group.initial_join
        ):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        group.initial_join = False
        if not group.is_(GroupState.PREPARING_REBALANCE):
            return
        # Static members keep their place through a join they miss; their
        # session timeout decides (as Kafka: only dynamic ones go here).
        for member in [
            m for m in group.members.values() if not m.awaiting_join and m.group_instance_id is None
        ]:
            log.info(
                "event=member_removed group=%s member=%s reason=did_not_rejoin",
                group.group_id,
                member.member_id,
            )
            self._drop(group, member, JoinResult(E.unknown_member_id))
        now = self.clock()
        group.generation += 1
        if not group.members:
            group.protocol_name = None
            group.transition(GroupState.EMPTY, now)
            self._spawn(self._store_quietly(group))
            log.info("event=group_empty group=%s generation=%d", group.group_id, group.generation)
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.transition(GroupState.COMPLETING_REBALANCE, now)
        group.pending_sync = set(group.members)
        everyone = tuple(
            (m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
            for m in group.members.values()
        )
        for member in group.members.values():
            member.is_new = False
            _resolve(member.join_future, self._join_result(group, member, everyone))
            member.join_future = None
            self._schedule_heartbeat(group, member)
        group.sync_timer = self._later(
            group.max_rebalance_timeout_ms, self._sync_expired, group, group.generation
        )
        log.info(
            "event=rebalance_joined group=%s generation=%d members=%d protocol=%s leader=%s",
            group.group_id,
            group.generation,
            len(group.members),
            group.protocol_name,
            group.leader_id,
        )

    def _join_result(
        self,
        group: Group,
        member: Member,
        everyone: tuple[tuple[str, str | None, bytes], ...] | None = None,
    ) -> JoinResult:
        if everyone is None and member.member_id == group.leader_id:
            everyone = tuple(
                (m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
                for m in group.members.values()
            )
        return JoinResult(
            E.none,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            member.member_id,
            everyone if member.member_id == group.leader_id and everyone else (),
        )

    def _sync_expired(self, group: Group, generation: int) -> None:
        group.sync_timer = None
        if group.generation != generation or not group.is_(
            GroupState.COMPLETING_REBALANCE, GroupState.STABLE
        ):
            return
        late = [m for m in group.members.values() if m.member_id in group.pending_sync]
        if not late:
            return
        for member in late:
            log.info(
                "event=member_removed group=%s member=%s reason=did_not_sync",
                group.group_id,
                member.member_id,
            )
            self._drop(group, member, None)
        self._prepare_rebalance(group, "members did not sync in time")

    def _drop(self, group: Group, member: Member, join_answer: JoinResult | None) -> None:
        group.remove(member.member_id)
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
        if join_answer is not None:
            _resolve(member.join_future, join_answer)
        _resolve(member.sync_future, SyncResult(E.unknown_member_id))

    def _remove_member(self, group: Group, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is None:
            return
        self._drop(group, member, JoinResult(E.unknown_member_id))
        if group.is_(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"member {member_id} left")
        elif group.is_(GroupState.PREPARING_REBALANCE):
            self._maybe_complete_join(group)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(_log_failure)

    async def _store_quietly(self, group: Group) -> None:
        if self.groups.get(group.group_id) is not group:
            return  # deleted or unloaded meanwhile: storing it now would bring it back
        try:
            await self._store_group(group)
        except CoordinatorError as exc:
            log.warning("event=group_store_failed group=%s error=%s", group.group_id, exc)

    # -- JoinGroup -----------------------------------------------------------------

    async def join_group(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
    ) -> JoinResult:
        if not group_id:
            return JoinResult(E.invalid_group_id)
        error = self.owner_error(group_id)
        if error is not None:
            return JoinResult(error)
        config = self.config
        if not config.min_session_timeout_ms <= session_timeout_ms <= config.max_session_timeout_ms:
            return JoinResult(E.invalid_session_timeout)
        if self.consumer.is_consumer_group(group_id):
            # Kafka 4 lets classic members join a consumer group (a mixed group);
            # Shoal does not: an empty one gives way, a live one refuses.
            deleted = await self.consumer.delete(group_id)
            if deleted is E.non_empty_group:
                return JoinResult(E.inconsistent_group_protocol)
            if deleted is not None and deleted is not E.none:
                return JoinResult(deleted)
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return JoinResult(E.unknown_member_id)
            group = self.groups[group_id] = Group(group_id, state_timestamp=self.clock())
        if group.is_(GroupState.DEAD):
            return JoinResult(E.coordinator_not_available)
        if not group.supports(protocol_type, protocols):
            return JoinResult(E.inconsistent_group_protocol)
        proto = Member(
            member_id or f"{client_id}-{uuid.uuid4()}",
            group_instance_id,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            list(protocols),
        )
        if not member_id:
            return await self._join_new_member(group, proto, require_known_member_id)
        return await self._join_known_member(group, proto)

    async def _join_new_member(
        self, group: Group, proto: Member, require_known_member_id: bool
    ) -> JoinResult:
        if len(group.members) + len(group.pending_members) >= self.config.max_size:
            return JoinResult(E.group_max_size_reached)
        instance = proto.group_instance_id
        if instance is not None and instance in group.static_members:
            return await self._replace_static_member(group, proto)
        if instance is None and require_known_member_id:
            group.pending_members[proto.member_id] = self._later(
                proto.session_timeout_ms, self._pending_expired, group, proto.member_id
            )
            return JoinResult(E.member_id_required, member_id=proto.member_id)
        return await self._add_and_rebalance(group, proto)

    def _pending_expired(self, group: Group, member_id: str) -> None:
        if group.pending_members.pop(member_id, None) is not None:
            self._maybe_complete_join(group)

    async def _add_and_rebalance(self, group: Group, member: Member) -> JoinResult:
        member.is_new = True
        member.join_future = asyncio.get_running_loop().create_future()
        # Completing the join below hands the answer over and clears member.join_future.
        future = member.join_future
        group.add(member)
        group.new_member_added = True
        if group.is_(GroupState.EMPTY, GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"member {member.member_id} joined")
        else:
            self._maybe_complete_join(group)
        result: JoinResult = await future
        return result

    async def _update_and_rebalance(
        self, group: Group, member: Member, proto: Member, reason: str
    ) -> JoinResult:
        member.protocols = proto.protocols
        member.session_timeout_ms = proto.session_timeout_ms
        member.rebalance_timeout_ms = proto.rebalance_timeout_ms
        member.client_id, member.client_host = proto.client_id, proto.client_host
        _resolve(member.join_future, JoinResult(E.rebalance_in_progress))
        member.join_future = asyncio.get_running_loop().create_future()
        future = member.join_future
        if group.is_(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, reason)
        else:
            self._maybe_complete_join(group)
        result: JoinResult = await future
        return result

    async def _join_known_member(self, group: Group, proto: Member) -> JoinResult:
        member_id = proto.member_id
        pending = group.pending_members.pop(member_id, None)
        if pending is not None:
            pending.cancel()
            return await self._add_and_rebalance(group, proto)
        instance = proto.group_instance_id
        if instance is not None and group.static_members.get(instance) != member_id:
            return JoinResult(E.fenced_instance_id)
        member = group.members.get(member_id)
        if member is None or group.is_(GroupState.EMPTY, GroupState.DEAD):
            return JoinResult(E.unknown_member_id)
        unchanged = member.protocols == proto.protocols
        if group.is_(GroupState.PREPARING_REBALANCE):
            return await self._update_and_rebalance(group, member, proto, "member rejoined")
        if group.is_(GroupState.COMPLETING_REBALANCE) and unchanged:
            return self._join_result(group, member)
        if group.is_(GroupState.STABLE) and unchanged and member_id != group.leader_id:
            self._schedule_heartbeat(group, member)
            return self._join_result(group, member)
        return await self._update_and_rebalance(
            group, member, proto, f"member {member_id} changed its subscription or leads"
        )

    async def _replace_static_member(self, group: Group, proto: Member) -> JoinResult:
        """A static member rejoined under a new member id: it takes its old place (KIP-345)."""
        instance = proto.group_instance_id
        assert instance is not None
        old_id = group.static_members[instance]
        old = group.members.pop(old_id)
        if old.heartbeat_timer is not None:
            old.heartbeat_timer.cancel()
        _resolve(old.join_future, JoinResult(E.fenced_instance_id))
        _resolve(old.sync_future, SyncResult(E.fenced_instance_id))
        proto.assignment = old.assignment
        group.members[proto.member_id] = proto
        group.static_members[instance] = proto.member_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(proto.member_id)
        was_leader = group.leader_id == old_id
        if was_leader:
            group.leader_id = proto.member_id
        log.info(
            "event=static_member_replaced group=%s instance=%s old=%s new=%s",
            group.group_id,
            instance,
            old_id,
            proto.member_id,
        )
        if group.is_(GroupState.STABLE) and group.select_protocol() == group.protocol_name:
            # As Kafka: no rebalance while the group's protocol stays the same; a
            # returning leader is told to skip the assignment (KIP-814).
            try:
                await self._store_group(group)
            except CoordinatorError as exc:
                self._restore_static_member(group, old, proto, was_leader)
                return JoinResult(exc.code)
            self._schedule_heartbeat(group, proto)
            result = self._join_result(group, proto)
            return replace(result, skip_assignment=was_leader)
        if group.is_(GroupState.EMPTY):
            return await self._add_and_rebalance(group, proto)
        return await self._update_and_rebalance(group, proto, proto, "static member rejoined")

    def _restore_static_member(
        self, group: Group, old: Member, new: Member, was_leader: bool
    ) -> None:
        """Undo a replacement that could not be stored: the old member id holds the place."""
        assert old.group_instance_id is not None
        group.members.pop(new.member_id, None)
        group.members[old.member_id] = old
        group.static_members[old.group_instance_id] = old.member_id
        if was_leader:
            group.leader_id = old.member_id
        self._schedule_heartbeat(group, old)

    # -- SyncGroup, Heartbeat, LeaveGroup ---------------------------------------------

    def _validate_member(
        self, group_id: str, generation: int, member_id: str, group_instance_id: str | None
    ) -> tuple[Group, Member]:
        error = self.owner_error(group_id)
        if error is not None:
            raise CoordinatorError(error)
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            raise CoordinatorError(E.unknown_member_id)
        if group_instance_id is not None:
            holder = group.static_members.get(group_instance_id)
            if holder is not None and holder != member_id:
                raise CoordinatorError(E.fenced_instance_id)
        member = group.members.get(member_id)
        if member is None:
            raise CoordinatorError(E.unknown_member_id)
        if generation != group.generation:
            raise CoordinatorError(E.illegal_generation)
        return group, member

    async def sync_group(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
    ) -> SyncResult:
        try:
            group, member = self._validate_member(
                group_id, generation, member_id, group_instance_id
            )
        except CoordinatorError as exc:
            return SyncResult(exc.code)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(E.inconsistent_group_protocol)
        if group.is_(GroupState.EMPTY):
            return SyncResult(E.unknown_member_id)
        if group.is_(GroupState.PREPARING_REBALANCE):
            return SyncResult(E.rebalance_in_progress)
        self._schedule_heartbeat(group, member)
        group.pending_sync.discard(member_id)
        if not group.pending_sync and group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None
        if group.is_(GroupState.STABLE):
            return SyncResult(E.none, group.protocol_type, group.protocol_name, member.assignment)
        _resolve(member.sync_future, SyncResult(E.rebalance_in_progress))
        member.sync_future = asyncio.get_running_loop().create_future()
        future = member.sync_future
        if member_id == group.leader_id:
            await self._apply_assignment(group, assignments)
        result: SyncResult = await future
        return result

    async def _apply_assignment(self, group: Group, assignments: Mapping[str, bytes]) -> None:
        generation = group.generation
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, b"")
        try:
            await self._store_group(group)
        except CoordinatorError as exc:
            if group.generation == generation and group.is_(GroupState.COMPLETING_REBALANCE):
                for member in group.members.values():
                    _resolve(member.sync_future, SyncResult(exc.code))
                self._prepare_rebalance(group, "storing the assignment failed")
            return
        if group.generation != generation or not group.is_(GroupState.COMPLETING_REBALANCE):
            return
        group.transition(GroupState.STABLE, self.clock())
        for member in group.members.values():
            _resolve(
                member.sync_future,
                SyncResult(E.none, group.protocol_type, group.protocol_name, member.assignment),
            )
        log.info(
            "event=rebalance_completed group=%s generation=%d members=%d",
            group.group_id,
            generation,
            len(group.members),
        )

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, group_instance_id: str | None
    ) -> ErrorCode:
        try:
            group, member = self._validate_member(
                group_id, generation, member_id, group_instance_id
            )
        except CoordinatorError as exc:
            return exc.code
        if group.is_(GroupState.EMPTY):
            return E.unknown_member_id
        self._schedule_heartbeat(group, member)
        if group.is_(GroupState.PREPARING_REBALANCE):
            return E.rebalance_in_progress
        return E.none

    def leave_group(
        self, group_id: str, members: Iterable[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        error = self.owner_error(group_id)
        if error is not None:
            return error, []
        group = self.groups.get(group_id)
        results = []
        for member_id, instance in members:
            results.append((member_id, instance, self._leave_one(group, member_id, instance)))
        return E.none, results

    def _leave_one(self, group: Group | None, member_id: str, instance: str | None) -> ErrorCode:
        if group is None or group.is_(GroupState.DEAD):
            return E.unknown_member_id
        if instance is not None:
            holder = group.static_members.get(instance)
            if holder is None:
                return E.unknown_member_id
            if member_id and holder != member_id:
                return E.fenced_instance_id
            member_id = holder
        pending = group.pending_members.pop(member_id, None)
        if pending is not None:
            pending.cancel()
            self._maybe_complete_join(group)
            return E.none
        if member_id not in group.members:
            return E.unknown_member_id
        log.info("event=member_left group=%s member=%s", group.group_id, member_id)
        self._remove_member(group, member_id)
        return E.none

    # -- offsets -----------------------------------------------------------------------

    async def commit_offsets(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[tuple[str, int], CommittedOffset],
        api_version: int = 9,
    ) -> dict[tuple[str, int], ErrorCode]:
        """Store offsets for a group member, or for a "simple" group (generation -1, no member).

        For a KIP-848 group ``generation`` is the member epoch (OffsetCommit v9's
        generation_id_or_member_epoch)."""

        def everywhere(code: ErrorCode) -> dict[tuple[str, int], ErrorCode]:
            return dict.fromkeys(offsets, code)

        checked = self._committer(
            group_id, generation, member_id, group_instance_id, api_version, offsets
        )
        if not isinstance(checked, Group):
            return everywhere(checked)
        group = checked
        results, accepted = self._acceptable(offsets)
        if accepted:
            entries = [
                (
                    offset_key(group_id, topic, partition),
                    offset_value(
                        OffsetValue(
                            c.offset,
                            c.leader_epoch,
                            c.metadata,
                            c.commit_timestamp,
                            c.expire_timestamp,
                        )
                    ),
                )
                for (topic, partition), c in accepted.items()
            ]
            try:
                position = await self._append(group_id, entries)
            except CoordinatorError as exc:
                results.update(dict.fromkeys(accepted, exc.code))
                return results
            group.store_offsets(position, accepted)
            results.update(dict.fromkeys(accepted, E.none))
        return results

    def _acceptable(
        self, offsets: Mapping[tuple[str, int], CommittedOffset]
    ) -> tuple[dict[tuple[str, int], ErrorCode], dict[tuple[str, int], CommittedOffset]]:
        """The offsets a commit may store, and the errors of the others."""
        refused: dict[tuple[str, int], ErrorCode] = {}
        accepted: dict[tuple[str, int], CommittedOffset] = {}
        for tp, committed in offsets.items():
            if not self.topic_exists(*tp):
                refused[tp] = E.unknown_topic_or_partition
            elif _java_length(committed.metadata) > self.config.offset_metadata_max_bytes:
                refused[tp] = E.offset_metadata_too_large
            else:
                accepted[tp] = committed
        return refused, accepted

    # -- transactional offsets (KIP-98, KIP-447) ------------------------------------------

    async def commit_transactional_offsets(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        offsets: Mapping[tuple[str, int], CommittedOffset],
    ) -> dict[tuple[str, int], ErrorCode]:
        """TxnOffsetCommit: write the offsets in the producer's transaction, visible at its
        commit marker (:meth:`complete_transaction`).

        The offsets go to the group's partition as one transactional batch of
        the producer (base sequence -1: the coordinator's own write, which the
        log does not sequence-check); the producer's AddOffsetsToTxn put that
        partition in the transaction, so its marker lands there too.
        """
        checked = self._txn_committer(
            group_id, generation_id, member_id, group_instance_id, offsets
        )
        if isinstance(checked, ErrorCode):
            return dict.fromkeys(offsets, checked)
        results, accepted = self._acceptable(offsets)
        if not accepted:
            return results
        group = self.groups.get(group_id)
        if group is None:
            # Kafka creates the group a transaction commits to; it lives on its offsets.
            group = self.groups[group_id] = Group(group_id, state_timestamp=self.clock())
        entries = [
            (
                offset_key(group_id, topic, partition),
                offset_value(
                    OffsetValue(
                        c.offset, c.leader_epoch, c.metadata, c.commit_timestamp, c.expire_timestamp
                    )
                ),
            )
            for (topic, partition), c in accepted.items()
        ]
        options = BatchOptions(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=-1,
            transactional=True,
        )
        try:
            partition, info = self._write(group_id, entries, options)
        except CoordinatorError as exc:
            results.update(dict.fromkeys(accepted, exc.code))
            return results
        # Pending from the moment the records are in the log: a marker the
        # transaction coordinator writes while we wait for the replicas must
        # find them (Kafka's prepareTxnOffsetCommit).
        group.prepare_txn_offsets(producer_id, info.first_offset, accepted)
        try:
            await self._replicated(group_id, partition, info)
        except CoordinatorError as exc:
            group.forget_txn_offsets(producer_id, info.first_offset)
            results.update(dict.fromkeys(accepted, exc.code))
            return results
        log.debug(
            "event=txn_offsets_pending group=%s producer_id=%d count=%d",
            group_id,
            producer_id,
            len(accepted),
        )
        results.update(dict.fromkeys(accepted, E.none))
        return results

    def _txn_committer(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        partitions: Iterable[tuple[str, int]] = (),
    ) -> ErrorCode | None:
        """Why a transactional commit may not go to the group (Kafka's validateOffsetCommit
        for TxnOffsetCommit), or None. Unlike a plain commit, one without generation and
        member id is accepted from a group with members: TxnOffsetCommit before v3
        (KIP-447) carries neither."""
        if not group_id:
            return E.invalid_group_id
        error = self.owner_error(group_id)
        if error is not None:
            return error
        if self.consumer.is_consumer_group(group_id):
            return self._consumer_txn_committer(
                group_id, generation, member_id, group_instance_id, partitions
            )
        group = self.groups.get(group_id)
        if group is None:
            # Kafka creates the group first; an empty group has no current member.
            return None if generation < 0 else E.unknown_member_id
        if group.is_(GroupState.DEAD):
            return E.coordinator_not_available
        if generation < 0 and group.is_(GroupState.EMPTY):
            return None
        if generation < 0 and not member_id and group_instance_id is None:
            return None
        if group_instance_id is not None:
            holder = group.static_members.get(group_instance_id)
            if holder is None:
                return E.unknown_member_id
            if holder != member_id:
                return E.fenced_instance_id
        if member_id not in group.members:
            return E.unknown_member_id
        if generation != group.generation:
            return E.illegal_generation
        return None

    def _consumer_txn_committer(
        self,
        group_id: str,
        member_epoch: int,
        member_id: str,
        group_instance_id: str | None,
        partitions: Iterable[tuple[str, int]],
    ) -> ErrorCode | None:
        """A KIP-848 group's TxnOffsetCommit: one without member (before v3) goes in, else
        the member's epoch is checked as for OffsetCommit (KIP-1251 included)."""
        if member_epoch == -1 and not member_id and group_instance_id is None:
            return None
        return self.consumer.validate_commit(
            group_id, member_id, member_epoch, 9, partitions, transactional=True
        )

    def complete_transaction(self, offsets_partition: int, producer_id: int, commit: bool) -> None:
        """A marker of ``producer_id`` is in ``offsets_partition`` (and replicated): its
        pending offsets in that partition's groups are committed or dropped.

        A partition still loading needs nothing: its loader reads the marker
        from the log. A group that moved away is the new owner's business.
        """
        if offsets_partition not in self.loaded:
            return
        for group in self.groups.values():
            if (
                producer_id in group.pending_txn_offsets
                and self.partition_of(group.group_id) == offsets_partition
            ):
                applied = group.complete_txn_offsets(producer_id, commit)
                log.info(
                    "event=txn_offsets_completed group=%s producer_id=%d commit=%s applied=%d",
                    group.group_id,
                    producer_id,
                    commit,
                    applied,
                )

    def unstable_partitions(self, group_id: str) -> frozenset[tuple[str, int]]:
        """Partitions with transactional offsets awaiting their marker: OffsetFetch with
        require_stable answers UNSTABLE_OFFSET_COMMIT for them (KIP-447)."""
        group = self.groups.get(group_id)
        if group is None:
            return frozenset()
        return frozenset(tp for pending in group.pending_txn_offsets.values() for tp in pending)

    def _committer(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        api_version: int = 9,
        partitions: Iterable[tuple[str, int]] = (),
    ) -> Group | ErrorCode:
        """The group a commit goes to, or why it may not (Kafka's OffsetCommit checks)."""
        if not group_id:
            return E.invalid_group_id
        error = self.owner_error(group_id)
        if error is not None:
            return error
        if self.consumer.is_consumer_group(group_id):
            return self._consumer_committer(
                group_id, generation, member_id, api_version, partitions
            )
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            if generation >= 0:
                return E.illegal_generation
            if member_id:
                return E.unknown_member_id
            group = self.groups[group_id] = Group(group_id, state_timestamp=self.clock())
            return group
        if generation < 0 and group.is_(GroupState.EMPTY):
            return group
        if group_instance_id is not None:
            holder = group.static_members.get(group_instance_id)
            if holder is not None and holder != member_id:
                return E.fenced_instance_id
        member = group.members.get(member_id)
        if member is None:
            return E.unknown_member_id
        if generation != group.generation:
            return E.illegal_generation
        if group.is_(GroupState.COMPLETING_REBALANCE):
            return E.rebalance_in_progress
        self._schedule_heartbeat(group, member)
        return group

    def _consumer_committer(
        self,
        group_id: str,
        member_epoch: int,
        member_id: str,
        api_version: int,
        partitions: Iterable[tuple[str, int]],
    ) -> Group | ErrorCode:
        """A KIP-848 group's commit: the member's epoch must be current, or not older than
        the assignment of each partition committed (KIP-1251); the offsets go to the
        group's entry here, made if it has none yet."""
        refusal = self.consumer.validate_commit(
            group_id, member_id, member_epoch, api_version, partitions
        )
        if refusal is not None:
            return refusal
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            group = self.groups[group_id] = Group(group_id, state_timestamp=self.clock())
        return group

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]] | None
    ) -> tuple[ErrorCode, dict[tuple[str, int], CommittedOffset | None]]:
        """Committed offsets (None where there is none); all of them when ``partitions`` is None."""
        if not group_id:
            return E.invalid_group_id, {}
        error = self.owner_error(group_id)
        if error is not None:
            return error, {}
        group = self.groups.get(group_id)
        stored = group.offsets if group is not None else {}
        if partitions is None:
            return E.none, dict(stored)
        return E.none, {tp: stored.get(tp) for tp in partitions}

    async def delete_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        error = self.owner_error(group_id)
        if error is not None:
            return error, {}
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return E.group_id_not_found, {}
        if self.consumer.is_consumer_group(group_id):
            return await self._delete_offsets_of(
                group, partitions, self.consumer.subscribed_topics(group_id)
            )
        if not group.is_(GroupState.EMPTY) and group.protocol_type != "consumer":
            # Only a consumer group's subscriptions say which offsets are in use.
            return E.non_empty_group, {}
        subscribed = group.subscribed_topics() if not group.is_(GroupState.EMPTY) else frozenset()
        return await self._delete_offsets_of(group, partitions, subscribed)

    async def _delete_offsets_of(
        self, group: Group, partitions: Iterable[tuple[str, int]], subscribed: frozenset[str]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        group_id = group.group_id
        results: dict[tuple[str, int], ErrorCode] = {}
        removed = []
        for tp in partitions:
            if tp[0] in subscribed:
                results[tp] = E.group_subscribed_to_topic
            else:
                results[tp] = E.none
                removed.append(tp)
        doomed = [tp for tp in removed if tp in group.offsets]
        if doomed:
            try:
                await self._append(group_id, [(offset_key(group_id, *tp), None) for tp in doomed])
            except CoordinatorError as exc:
                return exc.code, {}
        group.remove_offsets(removed)
        return E.none, results

    # -- listing, describing, deleting groups ------------------------------------------

    def list_groups(self, states: set[str], types: set[str]) -> list[ListedGroup]:
        """Classic and consumer (KIP-848) groups of the loaded partitions, as ListGroups
        shows them; ``states`` and ``types`` filter case-insensitively when not empty."""
        wanted_types = {t.lower() for t in types}
        wanted = {s.lower() for s in states}
        listed: list[ListedGroup] = []
        for index in sorted(self.loaded):
            if not wanted_types or "classic" in wanted_types:
                listed.extend(
                    ListedGroup(g.group_id, g.protocol_type or "", g.state.value, "classic")
                    for g in self.groups.values()
                    if self.partition_of(g.group_id) == index
                    and not g.is_(GroupState.DEAD)
                    and not self.consumer.is_consumer_group(g.group_id)
                )
            if not wanted_types or "consumer" in wanted_types:
                listed.extend(
                    ListedGroup(c.group_id, "consumer", c.state.value, "consumer")
                    for c in self.consumer.groups.values()
                    if self.partition_of(c.group_id) == index and not c.dead
                )
        return [g for g in listed if not wanted or g.state.lower() in wanted]

    def describe_group(self, group_id: str) -> DescribedGroup:
        error = self.owner_error(group_id)
        if error is not None:
            return DescribedGroup(error, group_id, "", "", "", ())
        if self.consumer.is_consumer_group(group_id):
            # As Kafka 4 answers DescribeGroups up to v5: classic groups only, any other
            # group is Dead (ConsumerGroupDescribe describes it).
            return DescribedGroup(E.none, group_id, GroupState.DEAD.value, "", "", ())
        group = self.groups.get(group_id)
        if group is None:
            return DescribedGroup(E.none, group_id, GroupState.DEAD.value, "", "", ())
        return DescribedGroup(
            E.none,
            group_id,
            group.state.value,
            group.protocol_type or "",
            group.protocol_name or "",
            tuple(group.members.values()),
        )

    async def delete_group(self, group_id: str) -> ErrorCode:
        error = self.owner_error(group_id)
        if error is not None:
            return error
        deleted = await self.consumer.delete(group_id)
        if deleted is not None and deleted is not E.none:
            return deleted
        group = self.groups.get(group_id)
        if deleted is E.none and (group is None or group.is_(GroupState.DEAD)):
            return E.none
        if group is None or group.is_(GroupState.DEAD):
            return E.group_id_not_found
        if not group.is_(GroupState.EMPTY):
            return E.non_empty_group
        await self._bury(group)
        return E.none

    async def _bury(self, group: Group) -> None:
        """Write tombstones for everything the group had, then forget it."""
        entries: list[tuple[bytes, bytes | None]] = [
            (offset_key(group.group_id, *tp), None) for tp in group.offsets
        ]
        entries.append((group_key(group.group_id), None))
        try:
            await self._append(group.group_id, entries)
        except CoordinatorError:
            return
        group.transition(GroupState.DEAD, self.clock())
        self._cancel_timers(group)
        self.groups.pop(group.group_id, None)
        if self.consumer.is_consumer_group(group.group_id):
            await self.consumer.delete(group.group_id)  # its epoch records go too
        log.info("event=group_deleted group=%s", group.group_id)

    # -- offset retention (KIP-211) -------------------------------------------------------

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            try:
                await self.expire_offsets()
            except Exception:
                log.exception("event=offset_expiry_failed")

    async def expire_offsets(self) -> int:
        """Drop offsets past ``offsets.retention.ms``; an emptied, member-less group goes too.

        An empty group's offsets expire that long after it became empty (or
        after the commit, if later); a Stable consumer group keeps the offsets
        of the topics its members subscribe to and expires the others by
        commit time; any other group with members keeps all (Kafka cannot
        tell what a rebalancing or non-consumer group uses). An offset
        committed with its own expiry (OffsetCommit v2-v4 retention_time)
        expires then, whatever the retention.
        """
        now = self.clock()
        retention = self.config.offsets_retention_ms

        def due(c: CommittedOffset, since: int) -> bool:
            if c.expire_timestamp >= 0:
                return now >= c.expire_timestamp
            return now - since >= retention

        expired = 0
        for group in list(self.groups.values()):
            if self.partition_of(group.group_id) not in self.loaded or group.is_(GroupState.DEAD):
                continue
            if self.consumer.has_members(group.group_id):
                # A KIP-848 group with members keeps its offsets (the subscription rule
                # Kafka applies to it is not built); an empty one expires as any group.
                continue
            if group.is_(GroupState.EMPTY):
                doomed = [
                    tp
                    for tp, c in group.offsets.items()
                    if due(c, max(c.commit_timestamp, group.state_timestamp))
                ]
            elif group.is_(GroupState.STABLE) and group.protocol_type == "consumer":
                subscribed = group.subscribed_topics()
                doomed = [
                    tp
                    for tp, c in group.offsets.items()
                    if tp[0] not in subscribed and due(c, c.commit_timestamp)
                ]
            else:
                doomed = []
            in_transactions = any(group.pending_txn_offsets.values())
            if (
                group.is_(GroupState.EMPTY)
                and len(doomed) == len(group.offsets)
                and not in_transactions
            ):
                expired += len(doomed)
                await self._bury(group)
                continue
            if doomed:
                try:
                    await self._append(
                        group.group_id, [(offset_key(group.group_id, *tp), None) for tp in doomed]
                    )
                except CoordinatorError:
                    continue
                # Only committed offsets expire: an open transaction's stay pending
                # (and keep the group alive, as Kafka's hasOffsets does).
                for tp in doomed:
                    group.offsets.pop(tp, None)
                    group.offset_positions.pop(tp, None)
                expired += len(doomed)
        if expired:
            log.info("event=offsets_expired count=%d", expired)
        return expired


class _Replay:
    """What loading an offsets partition has gathered so far, batch by batch (Kafka's
    loadGroupsAndOffsets): plain offsets by key, group metadata, and per producer the
    offsets its open transaction wrote, which its marker commits or drops."""

    def __init__(self) -> None:
        self.offsets: dict[str, dict[tuple[str, int], PendingOffset | None]] = {}
        self.metadata: dict[str, Group | None] = {}
        self.pending: dict[int, dict[tuple[str, tuple[str, int]], PendingOffset | None]] = {}
        self.consumer = ConsumerReplay()

    def marker(self, producer_id: int, commit: bool) -> None:
        """The producer's transaction ended here: its offsets count (commit) or not."""
        written = self.pending.pop(producer_id, {})
        if not commit:
            return
        for (group_id, tp), entry in written.items():
            if entry is None:
                continue
            current = self.offsets.setdefault(group_id, {}).get(tp)
            if current is None or current.position < entry.position:
                self.offsets[group_id][tp] = entry

    def record(self, header: BatchHeader, record: Record) -> None:
        assert record.key is not None
        key = parse_key(record.key)
        if key is None:
            consumer_key = parse_consumer_key(record.key)
            if consumer_key is not None:
                self.consumer.record(consumer_key, record.value)
            return
        if isinstance(key, OffsetKey):
            tp = (key.topic, key.partition)
            entry = None
            if record.value is not None:
                v = parse_offset_value(record.value)
                committed = CommittedOffset(
                    v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp
                )
                entry = PendingOffset(header.base_offset, committed)
            if header.is_transactional:
                self.pending.setdefault(header.producer_id, {})[(key.group, tp)] = entry
            else:
                self.offsets.setdefault(key.group, {})[tp] = entry
        elif isinstance(key, GroupKey):
            self.metadata[key.group] = (
                None
                if record.value is None
                else Group.from_value(key.group, parse_group_value(record.value))
            )

    def groups(self) -> dict[str, Group]:
        open_txns: dict[str, dict[int, dict[tuple[str, int], PendingOffset]]] = {}
        for producer_id, written in self.pending.items():
            for (group_id, tp), entry in written.items():
                if entry is not None:
                    open_txns.setdefault(group_id, {}).setdefault(producer_id, {})[tp] = entry
        groups: dict[str, Group] = {}
        for group_id in set(self.offsets) | set(self.metadata) | set(open_txns):
            group = self.metadata.get(group_id) or Group(group_id)
            stored = {tp: entry for tp, entry in self.offsets.get(group_id, {}).items() if entry}
            group.offsets = {tp: entry.offset for tp, entry in stored.items()}
            group.offset_positions = {tp: entry.position for tp, entry in stored.items()}
            group.pending_txn_offsets = open_txns.get(group_id, {})
            if group.members or group.has_offsets or self.metadata.get(group_id) is not None:
                groups[group_id] = group
        return groups


def _java_length(text: str) -> int:
    """String.length() in Java: UTF-16 code units, what offset.metadata.max.bytes counts."""
    return len(text.encode("utf-16-le")) // 2


def _resolve(future: asyncio.Future[Any] | None, value: Any) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("event=coordinator_task_failed error=%s", task.exception())
