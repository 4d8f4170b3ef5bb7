"""What the controller decides, as pure functions of the cluster image.

Kafka's rules, with etcd standing in for ZooKeeper:

* A partition whose leader is gone (its lease ended) or is shutting down
  gets the first replica, in assignment order, that is alive and in the ISR.
  Brokers that are gone or shutting down leave every ISR.
* If no replica in the ISR is alive, the partition goes offline (leader -1)
  and keeps its last ISR, so that one of those brokers leads when it is back.
  Only a topic with ``unclean.leader.election.enable=true`` takes any live
  replica instead, accepting the loss of what it had not copied.
* Preferred leaders come back: when more than ``imbalance_percent`` of the
  partitions that prefer a broker are led elsewhere, those whose preferred
  replica is alive and in the ISR move back to it.

An admin may ask for elections (ElectLeaders, :func:`elect_requested`):
preferred, or unclean for partitions that have no leader.

Leaders ask the controller to change their ISR (AlterPartition):
:func:`alter_isr` checks such a request against the image as Kafka's
controller does.

Every change bumps the partition epoch; every leader change bumps the leader
epoch, which is what fences the old leader and its followers.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from shoal.broker.cluster.model import (
    NO_LEADER,
    ClusterImage,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
)
from shoal.broker.cluster.store import PartitionChange


@dataclass(frozen=True, slots=True)
class _Slot:
    topic: TopicName
    index: int
    replicas: tuple[NodeId, ...]
    state: PartitionState
    revision: int


def _slots(image: ClusterImage) -> Iterator[tuple[TopicImage, _Slot]]:
    for name, topic in sorted(image.topics.items()):
        for index, replicas in enumerate(topic.record.assignment):
            state = topic.partitions.get(index)
            if state is not None:
                revision = topic.partition_revisions.get(index, 0)
                yield topic, _Slot(name, index, replicas, state, revision)


def changed_since(settled: ClusterImage | None, image: ClusterImage) -> ClusterImage:
    """What of ``image`` may need a decision, knowing ``settled`` needed none.

    With the same brokers, a topic the store kept as the same object (it
    keeps every topic no write touched) is as it was in ``settled``, so only
    the others are left; with other brokers, or nothing settled, the whole
    image. :func:`elect_leaders` and the completion of reassignments decide
    per partition from the brokers and the partition alone, so deciding on
    this part decides on the image, in time proportional to what changed.
    """
    if settled is None or settled.brokers != image.brokers:
        return image
    before = settled.topics
    changed = {name: topic for name, topic in image.topics.items() if before.get(name) is not topic}
    return ClusterImage.build(
        image.cluster_id, image.revision, image.brokers, changed, image.controller
    )


def _change(slot: _Slot, leader: NodeId, isr: tuple[NodeId, ...]) -> PartitionChange | None:
    state = slot.state
    if leader == state.leader and isr == state.isr:
        return None
    new = replace(
        state,
        leader=leader,
        isr=isr,
        leader_epoch=state.leader_epoch + (1 if leader != state.leader else 0),
        partition_epoch=state.partition_epoch + 1,
    )
    return PartitionChange(slot.topic, slot.index, new, slot.revision)


def elect_leaders(
    image: ClusterImage, unclean_allowed: Callable[[TopicImage], bool]
) -> list[PartitionChange]:
    """Changes for partitions whose leader or ISR members are gone or shutting down."""
    eligible = image.eligible_leaders()
    changes = []
    for topic, slot in _slots(image):
        state = slot.state
        isr = tuple(n for n in state.isr if n in eligible)
        if state.leader in eligible:
            change = _change(slot, state.leader, isr)
        else:
            candidates = [n for n in slot.replicas if n in isr]
            live = [n for n in slot.replicas if n in eligible]
            if candidates:
                change = _change(slot, candidates[0], isr)
            elif state.leader in image.brokers:
                # Shutting down, but no in-sync replica can take over: it keeps
                # leading until it stops, rather than lose data or go offline.
                change = None
            elif live and unclean_allowed(topic):
                change = _change(slot, live[0], (live[0],))
            else:
                change = _change(slot, NO_LEADER, state.isr)
        if change is not None:
            changes.append(change)
    return changes


def rebalance_preferred_leaders(
    image: ClusterImage, imbalance_percent: int
) -> list[PartitionChange]:
    """Move leadership back to preferred replicas on brokers past the imbalance threshold."""
    eligible = image.eligible_leaders()
    preferred: dict[NodeId, list[_Slot]] = {}
    for _, slot in _slots(image):
        if slot.replicas:
            preferred.setdefault(slot.replicas[0], []).append(slot)
    changes = []
    for node, slots in preferred.items():
        if node not in eligible:
            continue
        elsewhere = [s for s in slots if s.state.leader != node]
        if not elsewhere or len(elsewhere) * 100 <= imbalance_percent * len(slots):
            continue
        for slot in elsewhere:
            if node in slot.state.isr and slot.state.leader != NO_LEADER:
                change = _change(slot, node, slot.state.isr)
                if change is not None:
                    changes.append(change)
    return changes


PREFERRED_ELECTION = 0
UNCLEAN_ELECTION = 1


@dataclass(frozen=True, slots=True)
class ElectionOutcome:
    """What an ElectLeaders request does to one partition: a change, or why none."""

    topic: str
    index: int
    change: PartitionChange | None
    code: str | None
    """None when the partition gets a new leader, else the Kafka error name."""
    message: str | None = None


def elect_requested(
    image: ClusterImage,
    wanted: Sequence[tuple[str, int]] | None,
    election_type: int,
    unclean_allowed: Callable[[TopicImage], bool],
) -> list[ElectionOutcome]:
    """An admin's ElectLeaders over ``wanted`` partitions (None: every partition).

    Preferred: the first assigned replica leads, if it is alive and in the ISR
    (else PREFERRED_LEADER_NOT_AVAILABLE); ELECTION_NOT_NEEDED when it leads
    already. Unclean: only for a partition without a leader
    (ELECTION_NOT_NEEDED otherwise); an in-sync live replica if there is one,
    else any live replica where the topic allows unclean election, else
    ELIGIBLE_LEADERS_NOT_AVAILABLE. Asked for every partition, those that
    need no election are left out of the answer, as Kafka leaves them out.
    """
    every = wanted is None
    if wanted is None:
        wanted = [
            (name, i) for name, topic in sorted(image.topics.items()) for i in topic.partitions
        ]
    eligible = image.eligible_leaders()
    outcomes = []
    for name, index in wanted:
        topic = image.topics.get(TopicName(name))
        state = topic.partitions.get(index) if topic is not None else None
        if topic is None or state is None or not 0 <= index < topic.record.partition_count:
            missing = f"topic as {name}" if topic is None else f"partition as {name}-{index}"
            outcomes.append(
                ElectionOutcome(
                    name, index, None, "unknown_topic_or_partition", f"No such {missing}"
                )
            )
            continue
        slot = _Slot(
            topic.record.name,
            index,
            topic.record.assignment[index],
            state,
            topic.partition_revisions.get(index, 0),
        )
        outcome = (
            _elect_preferred(slot, eligible)
            if election_type == PREFERRED_ELECTION
            else _elect_unclean(slot, eligible, unclean_allowed(topic))
        )
        if not (every and outcome.code == "election_not_needed"):
            outcomes.append(outcome)
    return outcomes


def _elect_preferred(slot: _Slot, eligible: frozenset[NodeId]) -> ElectionOutcome:
    preferred = slot.replicas[0] if slot.replicas else NO_LEADER
    if slot.state.leader == preferred:
        return ElectionOutcome(slot.topic, slot.index, None, "election_not_needed")
    if preferred not in eligible or preferred not in slot.state.isr:
        return ElectionOutcome(
            slot.topic,
            slot.index,
            None,
            "preferred_leader_not_available",
            f"Preferred replica {preferred} of {slot.topic}-{slot.index} is not alive and"
            " in the ISR.",
        )
    return ElectionOutcome(slot.topic, slot.index, _change(slot, preferred, slot.state.isr), None)


def _elect_unclean(
    slot: _Slot, eligible: frozenset[NodeId], unclean_allowed: bool
) -> ElectionOutcome:
    state = slot.state
    if state.leader != NO_LEADER:
        return ElectionOutcome(slot.topic, slot.index, None, "election_not_needed")
    in_sync = [n for n in slot.replicas if n in state.isr and n in eligible]
    live = [n for n in slot.replicas if n in eligible]
    if in_sync:
        change = _change(slot, in_sync[0], tuple(n for n in state.isr if n in eligible))
    elif live and unclean_allowed:
        change = _change(slot, live[0], (live[0],))
    else:
        reason = (
            "no replica is alive"
            if not live
            else "no in-sync replica is alive and the topic does not allow"
            " unclean.leader.election.enable"
        )
        return ElectionOutcome(
            slot.topic,
            slot.index,
            None,
            "eligible_leaders_not_available",
            f"No leader can be elected for {slot.topic}-{slot.index}: {reason}.",
        )
    return ElectionOutcome(slot.topic, slot.index, change, None)


@dataclass(frozen=True, slots=True)
class IsrChangeRequest:
    """One partition of an AlterPartition request: a leader asks for a new ISR."""

    broker_id: NodeId
    topic_id: uuid.UUID
    index: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[NodeId, ...]


class IsrChangeRefusedError(Exception):
    """An AlterPartition the controller refuses; ``code`` names the Kafka error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def alter_isr(image: ClusterImage, request: IsrChangeRequest) -> PartitionChange | None:
    """The change a leader's ISR request makes (None: the ISR is that already), or why
    it is refused (Kafka's rules).

    Only the current leader, at the current leader and partition epochs, may
    change the ISR; the new ISR keeps the leader, names only replicas, and
    adds only brokers that are alive and not shutting down.
    """
    topic = image.topic_by_id(request.topic_id)
    if topic is None:
        raise IsrChangeRefusedError("unknown_topic_id", f"no topic {request.topic_id}")
    state = topic.partitions.get(request.index)
    if state is None or not 0 <= request.index < topic.record.partition_count:
        raise IsrChangeRefusedError(
            "unknown_topic_or_partition", f"no partition {topic.record.name}-{request.index}"
        )
    if request.leader_epoch != state.leader_epoch:
        raise IsrChangeRefusedError(
            "fenced_leader_epoch",
            f"leader epoch {request.leader_epoch}, the partition is at {state.leader_epoch}",
        )
    if request.broker_id != state.leader:
        raise IsrChangeRefusedError(
            "invalid_request", f"broker {request.broker_id} is not the leader ({state.leader})"
        )
    if request.partition_epoch != state.partition_epoch:
        raise IsrChangeRefusedError(
            "invalid_update_version",
            f"partition epoch {request.partition_epoch}, the partition is at"
            f" {state.partition_epoch}",
        )
    replicas = topic.record.assignment[request.index]
    isr = request.new_isr
    if state.leader not in isr or len(set(isr)) != len(isr) or not set(isr) <= set(replicas):
        raise IsrChangeRefusedError(
            "invalid_request", f"ISR {list(isr)} must hold the leader and only replicas"
        )
    eligible = image.eligible_leaders()
    joining = [n for n in isr if n not in state.isr and n not in eligible]
    if joining:
        raise IsrChangeRefusedError(
            "ineligible_replica", f"brokers {joining} are gone or shutting down"
        )
    slot = _Slot(
        topic.record.name,
        request.index,
        replicas,
        state,
        topic.partition_revisions.get(request.index, 0),
    )
    return _change(slot, state.leader, isr)
