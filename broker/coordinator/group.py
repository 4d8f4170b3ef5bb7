"""A consumer group's state, as Kafka's classic group coordinator keeps it.

States, and what moves a group between them::

    Empty --join--> PreparingRebalance --all rejoined or timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup stored--> Stable
    Stable / CompletingRebalance --join, leave, expiry--> PreparingRebalance
    PreparingRebalance --nobody rejoined--> Empty
    Empty --offsets expired, or DeleteGroups--> Dead

Members are dynamic (the coordinator names them) or static (the client names
them with ``group.instance.id``, KIP-345, and a restarted client takes its
old place without a rebalance). Assignment happens on the client: the
coordinator picks the protocol every member supports (by votes), hands the
leader everyone's subscription, and hands each member what the leader
assigned it.

This module holds state and the decisions that need no I/O; timers, futures
and persistence live in :mod:`shoal.broker.coordinator.coordinator`.
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from shoal.broker.coordinator.records import GroupValue, MemberValue


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class PendingOffset:
    """A transactional offset commit written to the log, waiting for its transaction's marker."""

    position: int
    """Offset of the record's batch in ``__consumer_offsets``: the later write wins."""
    offset: CommittedOffset


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    is_new: bool = False
    join_future: asyncio.Future[Any] | None = None
    sync_future: asyncio.Future[Any] | None = None
    heartbeat_timer: asyncio.TimerHandle | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_future is not None and not self.sync_future.done()

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def vote(self, candidates: set[str]) -> str:
        """The first protocol of this member's preference that everyone supports."""
        return next(name for name, _ in self.protocols if name in candidates)


@dataclass(eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation: int = 0
    leader_id: str | None = None
    state_timestamp: int = -1
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    """group.instance.id -> the member id that holds it now."""
    pending_members: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    """Member ids handed out with MEMBER_ID_REQUIRED (KIP-394), not joined yet."""
    pending_sync: set[str] = field(default_factory=set)
    """Members given this generation that have not sent a SyncGroup for it yet."""
    offsets: dict[tuple[str, int], CommittedOffset] = field(default_factory=dict)
    offset_positions: dict[tuple[str, int], int] = field(default_factory=dict)
    """Where in ``__consumer_offsets`` each committed offset was written, so a
    transaction that commits later cannot undo a plain commit written after it."""
    pending_txn_offsets: dict[int, dict[tuple[str, int], PendingOffset]] = field(
        default_factory=dict
    )
    """producer id -> offsets its open transaction wrote (TxnOffsetCommit), not visible yet."""
    new_member_added: bool = False
    initial_join: bool = False
    """The first rebalance of an empty group: it waits out its delay, never ends early."""
    join_timer: asyncio.TimerHandle | None = None
    sync_timer: asyncio.TimerHandle | None = None

    def is_(self, *states: GroupState) -> bool:
        return self.state in states

    # -- offsets -------------------------------------------------------------------

    def store_offsets(self, position: int, offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        """Offsets a plain commit wrote at ``position``: visible now."""
        self.offsets.update(offsets)
        self.offset_positions.update(dict.fromkeys(offsets, position))

    def remove_offsets(self, partitions: list[tuple[str, int]]) -> None:
        """Forget committed offsets, and the pending transactional ones of the same partitions
        (as Kafka's removeOffsets: a deleted offset is not brought back by a later marker)."""
        for tp in partitions:
            self.offsets.pop(tp, None)
            self.offset_positions.pop(tp, None)
            for pending in self.pending_txn_offsets.values():
                pending.pop(tp, None)

    def prepare_txn_offsets(
        self, producer_id: int, position: int, offsets: dict[tuple[str, int], CommittedOffset]
    ) -> None:
        pending = self.pending_txn_offsets.setdefault(producer_id, {})
        for tp, committed in offsets.items():
            pending[tp] = PendingOffset(position, committed)

    def forget_txn_offsets(self, producer_id: int, position: int) -> None:
        """A transactional write that failed: drop what it made pending (unless a later
        write of the same producer replaced it)."""
        pending = self.pending_txn_offsets.get(producer_id, {})
        for tp in [tp for tp, entry in pending.items() if entry.position == position]:
            del pending[tp]
        if not pending:
            self.pending_txn_offsets.pop(producer_id, None)

    def complete_txn_offsets(self, producer_id: int, commit: bool) -> int:
        """The producer's transaction ended: its offsets become committed, or are dropped.

        A committed one replaces the current offset only if it was written
        after it (Kafka's olderThan): a plain commit written while the
        transaction was open stays. Returns how many offsets were committed.
        """
        pending = self.pending_txn_offsets.pop(producer_id, {})
        if not commit:
            return 0
        applied = 0
        for tp, entry in pending.items():
            if self.offset_positions.get(tp, -1) < entry.position:
                self.offsets[tp] = entry.offset
                self.offset_positions[tp] = entry.position
                applied += 1
        return applied

    def has_pending_offset(self, tp: tuple[str, int]) -> bool:
        return any(tp in pending for pending in self.pending_txn_offsets.values())

    @property
    def has_offsets(self) -> bool:
        """Committed or pending: a group with either is not dead yet (Kafka's hasOffsets)."""
        return bool(self.offsets) or any(self.pending_txn_offsets.values())

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Kafka's rule: an empty group takes anything; else same type and a protocol in common."""
        names = {name for name, _ in protocols}
        if not self.members:
            return bool(protocol_type) and bool(names)
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())

    def candidate_protocols(self) -> set[str]:
        """Protocols every member supports."""
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return votes.most_common(1)[0][0]

    @property
    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def subscribed_topics(self) -> frozenset[str]:
        """Topics any member subscribes to, for consumer groups; empty for other protocols."""
        if self.protocol_type != "consumer":
            return frozenset()
        return frozenset().union(
            *(subscribed_topics(m.metadata_for(self.protocol_name)) for m in self.members.values())
        )

    def all_rejoined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        self.pending_sync.discard(member_id)
        instance = member.group_instance_id
        if instance is not None and self.static_members.get(instance) == member_id:
            del self.static_members[instance]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp = now_ms

    def to_value(self) -> GroupValue:
        return GroupValue(
            self.protocol_type or "",
            self.generation,
            self.protocol_name,
            self.leader_id,
            self.state_timestamp,
            tuple(
                MemberValue(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata_for(self.protocol_name),
                    m.assignment,
                )
                for m in self.members.values()
            ),
        )

    @classmethod
    def from_value(cls, group_id: str, value: GroupValue) -> Group:
        """A group as stored: Stable if it had members (their sessions then run out), else Empty."""
        group = cls(group_id)
        group.protocol_type = value.protocol_type or None
        group.generation = value.generation
        group.protocol_name = value.protocol
        group.leader_id = value.leader
        group.state_timestamp = value.current_state_timestamp
        for stored in value.members:
            member = Member(
                stored.member_id,
                stored.group_instance_id,
                stored.client_id,
                stored.client_host,
                stored.session_timeout_ms,
                stored.rebalance_timeout_ms,
                value.protocol_type,
                [(value.protocol or "", stored.subscription)],
                stored.assignment,
            )
            group.members[member.member_id] = member
            if member.group_instance_id is not None:
                group.static_members[member.group_instance_id] = member.member_id
        group.state = GroupState.STABLE if group.members else GroupState.EMPTY
        return group


_SUBSCRIPTION_HEADER = 6  # int16 version, int32 topic count


def subscribed_topics(metadata: bytes) -> frozenset[str]:
    """Topics in a consumer-protocol subscription (member metadata of protocol type "consumer").

    Every version of ConsumerProtocolSubscription starts with an int16 version
    and an array of int16-length topic names; the rest (user data, owned
    partitions, generation, rack) is not needed here, so this reads only that
    prefix, and an unreadable one counts as no topics.
    """
    if len(metadata) < _SUBSCRIPTION_HEADER:
        return frozenset()
    count = int.from_bytes(metadata[2:6], "big", signed=True)
    pos = _SUBSCRIPTION_HEADER
    topics = []
    for _ in range(max(count, 0)):
        if pos + 2 > len(metadata):
            return frozenset()
        length = int.from_bytes(metadata[pos : pos + 2], "big", signed=True)
        pos += 2
        if length < 0 or pos + length > len(metadata):
            return frozenset()
        topics.append(metadata[pos : pos + length].decode(errors="replace"))
        pos += length
    return frozenset(topics)
