"""A KIP-848 consumer group's state and the reconciliation of its members, without I/O.

Epochs, as Kafka keeps them:

* the **group epoch** rises whenever what the assignor must consider changes:
  a member joins, leaves or changes its subscription, or a subscribed
  topic's partitions change;
* the **target assignment** is what the assignor computed for the group
  epoch it carries (the assignment epoch); it is recomputed when the group
  epoch passes it;
* each member has a **member epoch**: the target assignment epoch it has
  reconciled to. A member moves to a new epoch only once it no longer owns
  a partition the target takes from it.

Reconciliation (Kafka's CurrentAssignmentBuilder), from a member's assigned
partitions A and its target T:

* A - T must be revoked first: the member stays in its epoch, in
  ``UNREVOKED_PARTITIONS``, keeping A & T, until a heartbeat reports owned
  partitions without the revoked ones;
* T - A is assigned once free, that is, once no other member holds it
  (assigned or pending revocation); partitions not free yet leave the
  member at the new epoch in ``UNRELEASED_PARTITIONS``, and later heartbeats
  add them as their owners release them;
* otherwise the member is ``STABLE`` at the target epoch.

Each partition a member holds (assigned or pending revocation) carries its
**assignment epoch** (KIP-1251): the target epoch at which it entered the
member's assignment, kept while the member keeps it. An offset commit with an
older member epoch than the member's is still good for a partition whose
assignment epoch is not after it (:func:`commit_refused_for`).

So a partition never has two owners, and a member whose partitions did not
move keeps consuming through other members' rebalances.

Everything here is plain data and functions: the coordinator
(:mod:`shoal.broker.coordinator.consumer_coordinator`) turns them into
records and timers.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from shoal.broker.coordinator.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    MemberSpec,
    Partitions,
    TopicId,
)

LEAVE_GROUP_EPOCH: Final = -1
LEAVE_GROUP_STATIC_EPOCH: Final = -2
"""A static member that will come back within its session timeout (KIP-848 with KIP-345)."""
NO_PARTITIONS: Final[Partitions] = {}


class MemberState(enum.IntEnum):
    """Kafka's MemberState values, as stored in ConsumerGroupCurrentMemberAssignmentValue."""

    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class ConsumerMember:
    """One member, immutable: every change builds a new one (and a record)."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    partition_epochs: Mapping[tuple[TopicId, int], int] = field(default_factory=dict, compare=False)
    """(topic id, partition) -> assignment epoch, for the partitions of ``assigned`` and
    ``pending_revocation``; one missing counts as assigned at the member's epoch (so
    equality leaves it out: :meth:`same_assignment` compares what it means)."""

    def assignment_epoch(self, topic_id: TopicId, partition: int) -> int | None:
        """The epoch ``partition`` was assigned to this member at, None if the member does
        not hold it (Kafka's assignmentEpoch, else pendingRevocationEpoch)."""
        if partition not in self.assigned.get(topic_id, frozenset()) and (
            partition not in self.pending_revocation.get(topic_id, frozenset())
        ):
            return None
        return self.partition_epochs.get((topic_id, partition), max(self.member_epoch, 0))

    def is_reconciled_to(self, epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == epoch

    def with_epoch(self, epoch: int) -> ConsumerMember:
        return replace(self, member_epoch=epoch, previous_member_epoch=self.member_epoch)

    def same_metadata(self, other: ConsumerMember) -> bool:
        """Whether the ConsumerGroupMemberMetadata record of the two is the same."""
        return (
            self.instance_id,
            self.rack_id,
            self.client_id,
            self.client_host,
            self.subscribed_topic_names,
            self.subscribed_topic_regex,
            self.rebalance_timeout_ms,
            self.server_assignor,
        ) == (
            other.instance_id,
            other.rack_id,
            other.client_id,
            other.client_host,
            other.subscribed_topic_names,
            other.subscribed_topic_regex,
            other.rebalance_timeout_ms,
            other.server_assignor,
        )

    def same_assignment(self, other: ConsumerMember) -> bool:
        """Whether the ConsumerGroupCurrentMemberAssignment record of the two is the same."""
        return (
            self.member_epoch,
            self.previous_member_epoch,
            self.state,
            _norm(self.assigned),
            _norm(self.pending_revocation),
            self._held_epochs(),
        ) == (
            other.member_epoch,
            other.previous_member_epoch,
            other.state,
            _norm(other.assigned),
            _norm(other.pending_revocation),
            other._held_epochs(),
        )

    def _held_epochs(self) -> dict[tuple[TopicId, int], int | None]:
        return {
            (topic_id, number): self.assignment_epoch(topic_id, number)
            for partitions in (self.assigned, self.pending_revocation)
            for topic_id, numbers in partitions.items()
            for number in numbers
        }


@dataclass(eq=False)
class ConsumerGroup:
    """A consumer group as the coordinator holds it. Mutated only by applying records'
    worth of changes (see the coordinator), so what is in memory is what was written."""

    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Partitions] = field(default_factory=dict)
    """member id -> its partitions in the target assignment of ``assignment_epoch``."""
    subscription_metadata: dict[str, tuple[TopicId, int]] = field(default_factory=dict)
    """Subscribed topic name -> (id, partition count) the target was computed with."""
    dead: bool = False

    @property
    def state(self) -> ConsumerGroupState:
        """Kafka's ConsumerGroup.maybeUpdateGroupState, computed on demand."""
        if self.dead:
            return ConsumerGroupState.DEAD
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(not m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def preferred_assignor(self) -> str:
        """The assignor most members ask for (Kafka's preferredServerAssignor), else uniform."""
        votes: dict[str, int] = {}
        for member in self.members.values():
            if member.server_assignor:
                votes[member.server_assignor] = votes.get(member.server_assignor, 0) + 1
        if not votes:
            return DEFAULT_ASSIGNOR
        return max(sorted(votes), key=lambda name: votes[name])

    def compute_target(
        self,
        metadata: Mapping[str, tuple[TopicId, int]],
        subscriptions: Mapping[str, frozenset[str]],
    ) -> dict[str, Partitions]:
        """A new target assignment for the current members over ``metadata``, each member
        over the topics of ``subscriptions`` (its names and what its regex matches)."""
        by_name = {name: topic_id for name, (topic_id, _count) in metadata.items()}
        specs = {
            member_id: MemberSpec(
                frozenset(by_name[t] for t in subscriptions.get(member_id, ()) if t in by_name),
                self.target.get(member_id, NO_PARTITIONS),
            )
            for member_id in self.members
        }
        counts = {topic_id: count for topic_id, count in metadata.values()}
        return ASSIGNORS[self.preferred_assignor()](specs, counts)


def held_by_others(
    members: Mapping[str, ConsumerMember], member_id: str
) -> dict[tuple[TopicId, int], int]:
    """Partitions some other member holds (assigned or pending revocation) -> its epoch:
    Kafka's currentPartitionEpoch, the test for "free"."""
    held: dict[tuple[TopicId, int], int] = {}
    for other in members.values():
        if other.member_id == member_id:
            continue
        for partitions in (other.assigned, other.pending_revocation):
            for topic_id, numbers in partitions.items():
                for number in numbers:
                    held[(topic_id, number)] = other.member_epoch
    return held


def reconcile(
    member: ConsumerMember,
    target_epoch: int,
    target: Partitions,
    held_by_others: Mapping[tuple[TopicId, int], int],
    owned: Partitions | None,
) -> ConsumerMember:
    """The member's next state towards ``target`` (Kafka's CurrentAssignmentBuilder.build).

    ``owned`` is what the member reported in this heartbeat, or None if it did
    not say (then it is assumed to still own everything it was given).
    """
    if member.state is MemberState.STABLE:
        if member.member_epoch == target_epoch:
            return member
        return _next_assignment(
            member, member.member_epoch, target_epoch, target, held_by_others, owned
        )
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if _owns_any(owned, member.pending_revocation):
            return member
        return _next_assignment(
            member, member.member_epoch + 1, target_epoch, target, held_by_others, owned
        )
    if member.state is MemberState.UNRELEASED_PARTITIONS:
        return _next_assignment(
            member, member.member_epoch, target_epoch, target, held_by_others, owned
        )
    return _next_assignment(member, target_epoch, target_epoch, target, held_by_others, owned)


def _next_assignment(
    member: ConsumerMember,
    epoch: int,
    target_epoch: int,
    target: Partitions,
    held_by_others: Mapping[tuple[TopicId, int], int],
    owned: Partitions | None,
) -> ConsumerMember:
    unreleased = False
    assigned: dict[TopicId, frozenset[int]] = {}
    revoking: dict[TopicId, frozenset[int]] = {}
    pending: dict[TopicId, frozenset[int]] = {}
    epochs: dict[tuple[TopicId, int], int] = {}
    for topic_id in set(target) | set(member.assigned):
        wanted = target.get(topic_id, frozenset())
        current = member.assigned.get(topic_id, frozenset())
        keep = current & wanted
        revoke = current - keep
        add = {p for p in wanted - keep if (topic_id, p) not in held_by_others}
        unreleased = unreleased or len(wanted - keep) > len(add)
        if keep:
            assigned[topic_id] = keep
        if revoke:
            revoking[topic_id] = revoke
        if add:
            pending[topic_id] = frozenset(add)
        for number in current:
            epochs[(topic_id, number)] = member.assignment_epoch(topic_id, number) or 0
        for number in add:
            epochs[(topic_id, number)] = target_epoch
    if revoking and _owns_any(owned, revoking):
        # The member keeps its epoch until it confirms the revocation.
        return replace(
            member.with_epoch(epoch),
            state=MemberState.UNREVOKED_PARTITIONS,
            assigned=assigned,
            pending_revocation=revoking,
            partition_epochs={
                tp: e for tp, e in epochs.items() if tp[1] in member.assigned.get(tp[0], ())
            },
        )
    for topic_id, partitions in pending.items():
        assigned[topic_id] = assigned.get(topic_id, frozenset()) | partitions
    return replace(
        member.with_epoch(target_epoch),
        state=MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE,
        assigned=assigned,
        pending_revocation={},
        partition_epochs={tp: e for tp, e in epochs.items() if tp[1] in assigned.get(tp[0], ())},
    )


def commit_refused_for(
    member: ConsumerMember,
    member_epoch: int,
    partitions: Iterable[tuple[TopicId | None, int]],
) -> bool:
    """Whether an offset commit of ``partitions`` (topic id, None for a topic unknown,
    and partition) sent with ``member_epoch`` is stale for ``member`` (Kafka's
    ConsumerGroup.validateOffsetCommit with KIP-1251's assignment epochs): the
    member's own epoch is always good, a later one never; an earlier one only if
    every partition is the member's (assigned or pending revocation) and was
    assigned to it at that epoch or before."""
    if member_epoch == member.member_epoch:
        return False
    if member_epoch > member.member_epoch:
        return True
    for topic_id, number in partitions:
        assigned_at = None if topic_id is None else member.assignment_epoch(topic_id, number)
        if assigned_at is None or member_epoch < assigned_at:
            return True
    return False


def _owns_any(owned: Partitions | None, partitions: Partitions) -> bool:
    """Whether the member may still hold any of ``partitions``: it does unless it said not."""
    if owned is None:
        return True
    return any(
        owned.get(topic_id, frozenset()) & numbers for topic_id, numbers in partitions.items()
    )


def is_subset(owned: Partitions | None, assigned: Partitions) -> bool:
    """Kafka's isSubset: a heartbeat with the previous epoch is accepted if the member
    owns nothing beyond what it is assigned now (the epoch bump's answer was lost)."""
    if owned is None:
        return False
    return all(
        numbers <= assigned.get(topic_id, frozenset())
        for topic_id, numbers in owned.items()
        if numbers
    )


def _norm(partitions: Partitions) -> dict[uuid.UUID, frozenset[int]]:
    return {t: frozenset(ps) for t, ps in partitions.items() if ps}


def same_partitions(a: Partitions, b: Partitions) -> bool:
    return _norm(a) == _norm(b)
