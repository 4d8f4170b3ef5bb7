"""KIP-848 consumer groups on the broker: ConsumerGroupHeartbeat, the timers, the records.

One heartbeat does what Kafka's GroupMetadataManager.consumerGroupHeartbeat
does, in three steps:

1. update the member (new, or changed fields); a new member, a changed
   subscription or changed partitions of a subscribed topic raise the group
   epoch;
2. if the group epoch passed the target assignment's epoch, the group's
   server-side assignor computes a new target for every member;
3. the member is reconciled towards its target
   (:func:`~shoal.broker.coordinator.consumer_group.reconcile`): revocations
   first, new partitions once their previous owner released them.

The changes of one heartbeat are one batch of records in the group's
``__consumer_offsets`` partition (:mod:`.consumer_records`), written and
replicated before they are applied and answered; a per-group lock keeps two
heartbeats of a group from computing over the same old state. A coordinator
that takes the partition over replays those records.

Timers, on the event loop: a member silent for
``group.consumer.session.timeout.ms`` is fenced (removed, its partitions free,
the group epoch raised); a member that does not confirm a revocation within
its rebalance timeout is fenced too, so one stuck member cannot hold
partitions another one waits for.

Metadata changes (a topic created, partitions added) are noticed on the next
heartbeat of any member of a group subscribed to it, as Kafka does.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from shoal.broker.coordinator.assignors import ASSIGNORS, Partitions, TopicId
from shoal.broker.coordinator.config import GroupConfig
from shoal.broker.coordinator.consumer_group import (
    LEAVE_GROUP_EPOCH,
    LEAVE_GROUP_STATIC_EPOCH,
    ConsumerGroup,
    ConsumerMember,
    MemberState,
    commit_refused_for,
    held_by_others,
    is_subset,
    reconcile,
    same_partitions,
)
from shoal.broker.coordinator.consumer_records import (
    Entry,
    current_assignment_record,
    group_epoch_record,
    group_tombstones,
    member_metadata_record,
    member_tombstones,
    target_epoch_record,
    target_member_record,
)

from shoal.topic_regex import TopicRegex, TopicRegexError
from shoal.wire import ErrorCode

log = logging.getLogger(__name__)
E = ErrorCode

TopicsView = Callable[[], Mapping[str, tuple[TopicId, int]]]
"""Every topic of the cluster: name -> (topic id, partition count)."""
Append = Callable[[str, Sequence[Entry]], Awaitable[ErrorCode]]
"""Write records to the group's partition and wait for the in-sync replicas; NONE or why not."""
ClassicState = Callable[[str], str]
"""A group id -> "absent", "empty" or "active" in the classic coordinator."""
_INTERNAL_TOPIC_PREFIX: Final = "__"


class ConsumerGroupError(Exception):
    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A ConsumerGroupHeartbeat request, as the coordinator needs it."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int
    subscribed_topic_names: tuple[str, ...] | None
    subscribed_topic_regex: str | None
    server_assignor: str | None
    owned: Partitions | None
    client_id: str
    client_host: str
    version: int = 1


@dataclass(frozen=True, slots=True)
class _Step:
    """What one heartbeat changes: records to write, then the state they describe."""

    records: list[Entry]
    member: ConsumerMember
    replaced: ConsumerMember | None
    group_epoch: int
    target_epoch: int
    target: dict[str, Partitions]
    metadata: dict[str, tuple[TopicId, int]]


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Partitions | None = None


class ConsumerCoordinator:
    """The consumer groups of the offsets partitions this broker leads."""

    def __init__(
        self,
        config: GroupConfig,
        owner_error: Callable[[str], ErrorCode | None],
        append: Append,
        topics: TopicsView,
        classic_state: ClassicState,
        forget_classic: Callable[[str], Awaitable[ErrorCode]],
    ) -> None:
        self.config = config
        self.owner_error = owner_error
        self.append = append
        self.topics = topics
        self.classic_state = classic_state
        self.forget_classic = forget_classic
        self.groups: dict[str, ConsumerGroup] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._sessions: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._rebalances: dict[tuple[str, str], asyncio.TimerHandle] = {}

    # -- loading -------------------------------------------------------------------

    def install(self, groups: Mapping[str, ConsumerGroup]) -> None:
        """Groups read back from a partition this broker now leads: their members'
        sessions start now (as Kafka's onLoaded does)."""
        for group in groups.values():
            self.groups[group.group_id] = group
            group.subscription_metadata = self._metadata_for(group, None)
            for member in group.members.values():
                self._schedule_session(group.group_id, member.member_id)
                if member.state is MemberState.UNREVOKED_PARTITIONS:
                    self._schedule_rebalance(group.group_id, member)

    def unload(self, group_ids: Sequence[str]) -> None:
        for group_id in group_ids:
            group = self.groups.pop(group_id, None)
            if group is None:
                continue
            for member_id in group.members:
                self._cancel_timers(group_id, member_id)
            self._locks.pop(group_id, None)

    def close(self) -> None:
        self.unload(list(self.groups))

    def is_consumer_group(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and not group.dead

    def has_members(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and not group.dead and bool(group.members)

    # -- ConsumerGroupHeartbeat -------------------------------------------------------

    async def heartbeat(self, request: Heartbeat) -> HeartbeatResult:
        try:
            self._validate(request)
            error = self.owner_error(request.group_id)
            if error is not None:
                raise ConsumerGroupError(error)
            async with self._lock(request.group_id):
                if request.member_epoch in (LEAVE_GROUP_EPOCH, LEAVE_GROUP_STATIC_EPOCH):
                    return await self._leave(request)
                return await self._heartbeat(request)
        except ConsumerGroupError as exc:
            return HeartbeatResult(exc.code, str(exc) if str(exc) != exc.code.name else None)

    def _lock(self, group_id: str) -> asyncio.Lock:
        lock = self._locks.get(group_id)
        if lock is None:
            lock = self._locks[group_id] = asyncio.Lock()
        return lock

    def _validate(self, request: Heartbeat) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        if not request.group_id:
            raise _invalid("GroupId can't be empty.")
        if request.instance_id == "":
            raise _invalid("InstanceId can't be empty.")
        if request.rack_id == "":
            raise _invalid("RackId can't be empty.")
        if request.version >= 1 and not request.member_id:
            raise _invalid("MemberId can't be empty.")
        _validate_epoch(request)
        if request.subscribed_topic_regex:
            try:
                TopicRegex(request.subscribed_topic_regex)
            except TopicRegexError as exc:
                raise ConsumerGroupError(
                    E.invalid_regular_expression, f"SubscribedTopicRegex is invalid: {exc}"
                ) from exc
        if request.server_assignor is not None and request.server_assignor not in ASSIGNORS:
            raise ConsumerGroupError(
                E.unsupported_assignor,
                f"ServerAssignor {request.server_assignor} is not supported. "
                f"Supported assignors: {', '.join(ASSIGNORS)}.",
            )

    async def _group_for(self, request: Heartbeat) -> ConsumerGroup:
        """Kafka's getOrMaybeCreateConsumerGroup: a join (epoch 0) creates the group; an
        empty classic group of the same id gives way; an active one refuses."""
        group_id = request.group_id
        group = self.groups.get(group_id)
        if group is not None and not group.dead:
            return group
        if request.member_epoch != 0:
            raise ConsumerGroupError(E.group_id_not_found, f"Consumer group {group_id} not found.")
        classic = self.classic_state(group_id)
        if classic == "active":
            raise ConsumerGroupError(
                E.group_id_not_found, f"Group {group_id} is not a consumer group."
            )
        if classic == "empty":
            code = await self.forget_classic(group_id)
            if code is not E.none:
                raise ConsumerGroupError(code)
        # Known to the coordinator once the first member's records are written (_apply).
        return ConsumerGroup(group_id)

    async def _heartbeat(self, request: Heartbeat) -> HeartbeatResult:
        group = await self._group_for(request)
        member_id = request.member_id or _new_member_id()
        existing = group.members.get(member_id)
        if existing is None and len(group.members) >= self.config.consumer_max_size:
            raise ConsumerGroupError(
                E.group_max_size_reached,
                f"The consumer group has reached its maximum capacity of "
                f"{self.config.consumer_max_size} members.",
            )
        member, replaced = self._member_for(group, request, member_id, existing)
        updated = _updated(member, request)
        step = self._plan(group, request, member, updated, replaced, is_new=existing is None)
        if step.records:
            await self._write(group.group_id, step.records)
        # Written: now it is the group's state.
        self._apply(group, member, step)
        reconciled = step.member
        if existing is None:
            log.info(
                "event=consumer_member_joined group=%s member=%s topics=%s regex=%s assignor=%s",
                group.group_id,
                member_id,
                ",".join(reconciled.subscribed_topic_names) or "-",
                reconciled.subscribed_topic_regex or "-",
                reconciled.server_assignor or "-",
            )
        if reconciled.member_epoch != member.member_epoch or existing is None:
            log.info(
                "event=consumer_member_epoch group=%s member=%s epoch=%d state=%s group_epoch=%d",
                group.group_id,
                member_id,
                reconciled.member_epoch,
                reconciled.state.name,
                group.group_epoch,
            )
        full = request.member_epoch == 0 or (
            request.rebalance_timeout_ms != -1
            and (
                request.subscribed_topic_names is not None
                or request.subscribed_topic_regex is not None
            )
            and request.owned is not None
        )
        changed = existing is None or not same_partitions(reconciled.assigned, member.assigned)
        return HeartbeatResult(
            E.none,
            member_id=member_id,
            member_epoch=reconciled.member_epoch,
            heartbeat_interval_ms=self.config.consumer_heartbeat_interval_ms,
            assignment=reconciled.assigned if full or changed else None,
        )

    def _member_for(
        self,
        group: ConsumerGroup,
        request: Heartbeat,
        member_id: str,
        existing: ConsumerMember | None,
    ) -> tuple[ConsumerMember, ConsumerMember | None]:
        """The member as it stands before this heartbeat, and the static member it
        replaces (if any)."""
        if request.instance_id is not None and request.member_epoch == 0:
            return self._static_join(group, request, member_id, existing)
        if existing is None:
            if request.member_epoch != 0:
                raise ConsumerGroupError(
                    E.unknown_member_id,
                    f"Member {member_id} is not a member of group {group.group_id}.",
                )
            return ConsumerMember(member_id), None
        return self._checked_member(existing, request), None

    def _plan(
        self,
        group: ConsumerGroup,
        request: Heartbeat,
        member: ConsumerMember,
        updated: ConsumerMember,
        replaced: ConsumerMember | None,
        is_new: bool,
    ) -> _Step:
        """The heartbeat's three steps, computed without changing the group: the records
        to write and the state to apply once they are written."""
        group_id, member_id = group.group_id, updated.member_id
        records: list[Entry] = []
        if replaced is not None:
            records += member_tombstones(group_id, replaced.member_id)
        if is_new or not updated.same_metadata(member):
            records.append(member_metadata_record(group_id, updated))
        subscription_changed = is_new or (
            updated.subscribed_topic_names,
            updated.subscribed_topic_regex,
            updated.server_assignor,
        ) != (member.subscribed_topic_names, member.subscribed_topic_regex, member.server_assignor)

        # 1. The group epoch.
        metadata = self._metadata_for(group, updated)
        group_epoch = group.group_epoch
        if subscription_changed or metadata != group.subscription_metadata:
            group_epoch += 1
            records.append(group_epoch_record(group_id, group_epoch))

        # 2. The target assignment.
        members = dict(group.members)
        if replaced is not None:
            members.pop(replaced.member_id, None)
        members[member_id] = updated
        target = dict(group.target)
        if replaced is not None and replaced.member_id in target:
            target[member_id] = target.pop(replaced.member_id)
            records.append(target_member_record(group_id, member_id, target[member_id]))
        target_epoch = group.assignment_epoch
        if group_epoch > group.assignment_epoch:
            draft = ConsumerGroup(group_id, members=members, target=target)
            topics = self.topics()
            computed = draft.compute_target(
                metadata, {mid: _subscribed(m, topics) for mid, m in members.items()}
            )
            for mid, partitions in computed.items():
                if mid not in target or not same_partitions(target[mid], partitions):
                    records.append(target_member_record(group_id, mid, partitions))
            target, target_epoch = computed, group_epoch
            records.append(target_epoch_record(group_id, target_epoch))

        # 3. Reconciliation.
        reconciled = updated
        if not updated.is_reconciled_to(target_epoch):
            reconciled = reconcile(
                updated,
                target_epoch,
                target.get(member_id, {}),
                held_by_others(members, member_id),
                request.owned,
            )
        if is_new or replaced is not None or not reconciled.same_assignment(member):
            records.append(current_assignment_record(group_id, reconciled))
        return _Step(records, reconciled, replaced, group_epoch, target_epoch, target, metadata)

    def _apply(self, group: ConsumerGroup, before: ConsumerMember, step: _Step) -> None:
        member = step.member
        self.groups[group.group_id] = group
        if step.replaced is not None:
            group.members.pop(step.replaced.member_id, None)
            self._cancel_timers(group.group_id, step.replaced.member_id)
        group.members[member.member_id] = member
        group.group_epoch = step.group_epoch
        group.assignment_epoch = step.target_epoch
        group.target = {mid: step.target.get(mid, {}) for mid in group.members}
        group.subscription_metadata = step.metadata
        self._schedule_session(group.group_id, member.member_id)
        if member.state is not MemberState.UNREVOKED_PARTITIONS:
            self._cancel_rebalance(group.group_id, member.member_id)
        elif (group.group_id, member.member_id) not in self._rebalances or (
            before.state is not MemberState.UNREVOKED_PARTITIONS
            or before.member_epoch != member.member_epoch
        ):
            # A new revocation (or one at a new epoch) gets a full rebalance timeout.
            self._schedule_rebalance(group.group_id, member)

    def _checked_member(self, member: ConsumerMember, request: Heartbeat) -> ConsumerMember:
        """Kafka's throwIfConsumerGroupMemberEpochIsInvalid; a rejoin (epoch 0) of a known
        member id starts it over without partitions."""
        received = request.member_epoch
        if received == 0:
            return replace(
                member,
                member_epoch=0,
                previous_member_epoch=0,
                state=MemberState.STABLE,
                assigned={},
                pending_revocation={},
                partition_epochs={},
            )
        if received > member.member_epoch:
            raise ConsumerGroupError(
                E.fenced_member_epoch,
                f"The consumer group member has a greater member epoch ({received}) than the "
                f"one known by the group coordinator ({member.member_epoch}). The member must "
                "abandon all its partitions and rejoin.",
            )
        if received < member.member_epoch and (
            received != member.previous_member_epoch
            or not is_subset(request.owned, member.assigned)
        ):
            raise ConsumerGroupError(
                E.fenced_member_epoch,
                f"The consumer group member has a smaller member epoch ({received}) than the "
                f"one known by the group coordinator ({member.member_epoch}). The member must "
                "abandon all its partitions and rejoin.",
            )
        return member

    def _static_join(
        self,
        group: ConsumerGroup,
        request: Heartbeat,
        member_id: str,
        existing: ConsumerMember | None,
    ) -> tuple[ConsumerMember, ConsumerMember | None]:
        """A static member (re)joins: it takes the place of the instance's previous member
        if that one left with epoch -2 (KIP-848 with KIP-345), keeping its partitions."""
        assert request.instance_id is not None
        holder = group.static_member(request.instance_id)
        if holder is None or holder.member_id == member_id:
            if existing is not None:
                return self._checked_member(existing, request), None
            return ConsumerMember(member_id), None
        if holder.member_epoch != LEAVE_GROUP_STATIC_EPOCH:
            raise ConsumerGroupError(
                E.unreleased_instance_id,
                f"Static member {holder.member_id} with instance id {request.instance_id} "
                "cannot be replaced because it has not left the group.",
            )
        return replace(holder, member_id=member_id, member_epoch=0, previous_member_epoch=0), holder

    # -- leaving -------------------------------------------------------------------

    async def _leave(self, request: Heartbeat) -> HeartbeatResult:
        group = self.groups.get(request.group_id)
        if group is None or group.dead:
            raise ConsumerGroupError(E.group_id_not_found, f"Group {request.group_id} not found.")
        if request.instance_id is None:
            member = group.members.get(request.member_id)
            if member is None:
                raise ConsumerGroupError(
                    E.unknown_member_id,
                    f"Member {request.member_id} is not a member of group {group.group_id}.",
                )
        else:
            found = group.static_member(request.instance_id)
            if found is None:
                raise ConsumerGroupError(
                    E.unknown_member_id, f"Instance id {request.instance_id} is unknown."
                )
            if found.member_id != request.member_id:
                raise ConsumerGroupError(
                    E.fenced_instance_id,
                    f"Static member {request.member_id} with instance id "
                    f"{request.instance_id} is not the member of the instance.",
                )
            member = found
            if request.member_epoch == LEAVE_GROUP_STATIC_EPOCH:
                # Gone for now, back within its session timeout: its partitions stay its own.
                away = replace(
                    member,
                    member_epoch=LEAVE_GROUP_STATIC_EPOCH,
                    pending_revocation={},
                    partition_epochs={
                        (t, n): member.assignment_epoch(t, n) or 0
                        for t, numbers in member.assigned.items()
                        for n in numbers
                    },
                )
                await self._write(group.group_id, [current_assignment_record(group.group_id, away)])
                group.members[member.member_id] = away
                self._cancel_rebalance(group.group_id, member.member_id)
                log.info(
                    "event=consumer_static_member_away group=%s member=%s instance=%s",
                    group.group_id,
                    member.member_id,
                    request.instance_id,
                )
                return HeartbeatResult(
                    E.none, member_id=member.member_id, member_epoch=LEAVE_GROUP_STATIC_EPOCH
                )
        await self._fence(group, member, "left the group")
        return HeartbeatResult(
            E.none, member_id=request.member_id, member_epoch=request.member_epoch
        )

    async def _fence(self, group: ConsumerGroup, member: ConsumerMember, reason: str) -> None:
        """Remove a member: its partitions are free at once; the group epoch rises, so the
        next heartbeat of any member computes a new target (Kafka's consumerGroupFenceMember)."""
        epoch = group.group_epoch + 1
        records = member_tombstones(group.group_id, member.member_id)
        records.append(group_epoch_record(group.group_id, epoch))
        await self._write(group.group_id, records)
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        group.group_epoch = epoch
        self._cancel_timers(group.group_id, member.member_id)
        log.info(
            "event=consumer_member_removed group=%s member=%s reason=%s group_epoch=%d",
            group.group_id,
            member.member_id,
            reason.replace(" ", "_"),
            epoch,
        )

    async def _write(self, group_id: str, records: Sequence[Entry]) -> None:
        code = await self.append(group_id, records)
        if code is not E.none:
            raise ConsumerGroupError(code)

    # -- timers ----------------------------------------------------------------------

    def _schedule_session(self, group_id: str, member_id: str) -> None:
        key = (group_id, member_id)
        old = self._sessions.pop(key, None)
        if old is not None:
            old.cancel()
        self._sessions[key] = asyncio.get_running_loop().call_later(
            self.config.consumer_session_timeout_ms / 1000,
            self._expire,
            group_id,
            member_id,
            "session timeout",
            None,
        )

    def _schedule_rebalance(self, group_id: str, member: ConsumerMember) -> None:
        self._cancel_rebalance(group_id, member.member_id)
        timeout = max(member.rebalance_timeout_ms, 0)
        self._rebalances[(group_id, member.member_id)] = asyncio.get_running_loop().call_later(
            timeout / 1000,
            self._expire,
            group_id,
            member.member_id,
            "revocation not confirmed within the rebalance timeout",
            member.member_epoch,
        )

    def _cancel_rebalance(self, group_id: str, member_id: str) -> None:
        handle = self._rebalances.pop((group_id, member_id), None)
        if handle is not None:
            handle.cancel()

    def _cancel_timers(self, group_id: str, member_id: str) -> None:
        handle = self._sessions.pop((group_id, member_id), None)
        if handle is not None:
            handle.cancel()
        self._cancel_rebalance(group_id, member_id)

    def _expire(self, group_id: str, member_id: str, reason: str, epoch: int | None) -> None:
        # The handle that fired is the current one (rescheduling cancels the old one).
        timers = self._sessions if epoch is None else self._rebalances
        timers.pop((group_id, member_id), None)
        task = asyncio.get_running_loop().create_task(
            self._expire_member(group_id, member_id, reason, epoch)
        )
        task.add_done_callback(_log_failure)

    async def _expire_member(
        self, group_id: str, member_id: str, reason: str, epoch: int | None
    ) -> None:
        async with self._lock(group_id):
            group = self.groups.get(group_id)
            member = group.members.get(member_id) if group is not None else None
            if group is None or member is None:
                return
            if epoch is not None and (
                member.state is not MemberState.UNREVOKED_PARTITIONS or member.member_epoch != epoch
            ):
                return
            try:
                await self._fence(group, member, reason)
            except ConsumerGroupError as exc:
                log.warning(
                    "event=consumer_member_fence_failed group=%s member=%s error=%s",
                    group_id,
                    member_id,
                    exc.code.name,
                )

    # -- subscriptions ----------------------------------------------------------------

    def _metadata_for(
        self, group: ConsumerGroup, replacing: ConsumerMember | None
    ) -> dict[str, tuple[TopicId, int]]:
        """(id, partition count) of every existing topic some member subscribes to, by name
        or by regex (RE2, whole names; internal topics never match a regex, as in Kafka)."""
        topics = self.topics()
        members = dict(group.members)
        if replacing is not None:
            members[replacing.member_id] = replacing
        wanted: set[str] = set()
        for member in members.values():
            wanted.update(_subscribed(member, topics))
        return {name: topics[name] for name in sorted(wanted) if name in topics}

    # -- describing, offsets, deleting ------------------------------------------------

    def describe(self, group_id: str) -> ConsumerGroup | ErrorCode:
        error = self.owner_error(group_id)
        if error is not None:
            return error
        group = self.groups.get(group_id)
        if group is None or group.dead:
            return E.group_id_not_found
        return group

    def topic_names(self) -> dict[TopicId, str]:
        return {topic_id: name for name, (topic_id, _count) in self.topics().items()}

    def validate_commit(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        api_version: int,
        partitions: Iterable[tuple[str, int]] = (),
        transactional: bool = False,
    ) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetCommit; None if the commit of ``partitions``
        (topic name, partition) may go in. An epoch older than the member's is good for
        the partitions the member got at that epoch or before (KIP-1251); one that is
        not refuses the whole commit with STALE_MEMBER_EPOCH, as in Kafka."""
        group = self.groups.get(group_id)
        if group is None or group.dead:
            return None
        if member_epoch < 0 and not group.members:
            return None
        member = group.members.get(member_id)
        if member is None:
            return E.unknown_member_id
        if not transactional and api_version < 9:
            return E.unsupported_version
        if member_epoch == member.member_epoch:
            return None
        topics = self.topics() if member_epoch < member.member_epoch else {}
        ids = [(topics[name][0] if name in topics else None, number) for name, number in partitions]
        if commit_refused_for(member, member_epoch, ids):
            return E.stale_member_epoch
        return None

    def validate_fetch(
        self, group_id: str, member_id: str | None, member_epoch: int
    ) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetFetch; None if the fetch may be answered."""
        group = self.groups.get(group_id)
        if group is None or group.dead or (member_id is None and member_epoch < 0):
            return None
        member = group.members.get(member_id or "")
        if member is None:
            return E.unknown_member_id
        if member_epoch != member.member_epoch:
            return E.stale_member_epoch
        return None

    def subscribed_topics(self, group_id: str) -> frozenset[str]:
        group = self.groups.get(group_id)
        if group is None:
            return frozenset()
        return frozenset(group.subscription_metadata)

    async def delete(self, group_id: str) -> ErrorCode | None:
        """DeleteGroups of a consumer group: only an empty one goes (its records tombstoned).
        None when the id is not a consumer group here."""
        group = self.groups.get(group_id)
        if group is None or group.dead:
            return None
        async with self._lock(group_id):
            if group.members:
                return E.non_empty_group
            try:
                await self._write(group_id, group_tombstones(group_id))
            except ConsumerGroupError as exc:
                return exc.code
            group.dead = True
            self.groups.pop(group_id, None)
            log.info("event=consumer_group_deleted group=%s", group_id)
            return E.none


def _invalid(message: str) -> ConsumerGroupError:
    return ConsumerGroupError(E.invalid_request, message)


def _validate_epoch(request: Heartbeat) -> None:
    """What each kind of heartbeat (join, heartbeat, leave) must carry."""
    epoch = request.member_epoch
    if epoch > 0 or epoch == LEAVE_GROUP_EPOCH:
        if not request.member_id:
            raise _invalid("MemberId can't be empty.")
    elif epoch == 0:
        if request.rebalance_timeout_ms == -1:
            raise _invalid("RebalanceTimeoutMs must be provided in first request.")
        if request.owned is None or any(request.owned.values()):
            raise _invalid("TopicPartitions must be empty when (re-)joining.")
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise _invalid(
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
    elif epoch == LEAVE_GROUP_STATIC_EPOCH:
        if not request.member_id:
            raise _invalid("MemberId can't be empty.")
        if request.instance_id is None:
            raise _invalid("InstanceId can't be null.")
    else:
        raise _invalid("MemberEpoch is invalid.")


def _updated(member: ConsumerMember, request: Heartbeat) -> ConsumerMember:
    """The member with the fields this heartbeat sets (null or -1 means unchanged)."""

    def given(value: object, current: object) -> Any:
        return current if value is None else value

    regex = request.subscribed_topic_regex
    return replace(
        member,
        instance_id=given(request.instance_id, member.instance_id),
        rack_id=given(request.rack_id, member.rack_id),
        rebalance_timeout_ms=(
            member.rebalance_timeout_ms
            if request.rebalance_timeout_ms == -1
            else request.rebalance_timeout_ms
        ),
        server_assignor=given(request.server_assignor, member.server_assignor),
        subscribed_topic_names=given(request.subscribed_topic_names, member.subscribed_topic_names),
        # An empty regex clears the regex subscription.
        subscribed_topic_regex=member.subscribed_topic_regex if regex is None else (regex or None),
        client_id=request.client_id,
        client_host=request.client_host,
    )


def _subscribed(member: ConsumerMember, topics: Mapping[str, object]) -> frozenset[str]:
    """The topics a member subscribes to: its names, and what its regex matches now."""
    names = set(member.subscribed_topic_names)
    if member.subscribed_topic_regex:
        names.update(_matching(member.subscribed_topic_regex, topics))
    return frozenset(names)


def _matching(pattern: str, topics: Mapping[str, object]) -> list[str]:
    try:
        compiled = TopicRegex(pattern)
    except TopicRegexError:
        return []
    return [
        name
        for name in topics
        if not name.startswith(_INTERNAL_TOPIC_PREFIX) and compiled.fullmatch(name)
    ]


def _new_member_id() -> str:
    """ConsumerGroupHeartbeat v0: the coordinator names new members."""
    return str(uuid.uuid4())


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("event=consumer_coordinator_task_failed error=%s", task.exception())
