"""Partition reassignment (KIP-455) as the controller decides it: pure functions of the image.

A reassignment names a partition's target replicas. The controller stores
it at once: the topic's assignment becomes the target followed by the
replicas leaving (so Metadata shows current plus target while it lasts), and
the partition state records which replicas are being added and removed.
The replicas being added create the log and fetch from the leader like any
follower, and the leader adds them to the ISR once they have caught up.

When every target replica is in the ISR the controller completes the move:
the assignment becomes the target (in its order), the ISR keeps only target
replicas, and if the leader is leaving, the first target replica in the ISR
leads under a new leader epoch. Brokers that are no longer replicas see the
partition vanish from their assignment and delete their copy.

A null target cancels: the assignment goes back to the replicas the
partition had, minus those being added.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from shoal.broker.cluster.model import (
    ClusterImage,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
)
from shoal.broker.cluster.store import AssignmentChange, PartitionChange


class ReassignmentRefusedError(Exception):
    """A reassignment the controller refuses; ``code`` names the Kafka error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class ReassignmentRequest:
    """One partition of an AlterPartitionReassignments request; ``target`` None cancels."""

    topic: str
    index: int
    target: tuple[NodeId, ...] | None


def target_replicas(replicas: Sequence[NodeId], state: PartitionState) -> tuple[NodeId, ...]:
    """Where the partition is going (its replicas when no reassignment is under way)."""
    return tuple(r for r in replicas if r not in state.removing)


def original_replicas(replicas: Sequence[NodeId], state: PartitionState) -> tuple[NodeId, ...]:
    """Where the partition was before the reassignment under way began."""
    return tuple(r for r in replicas if r not in state.adding)


def _partition(image: ClusterImage, topic: str, index: int) -> tuple[TopicImage, PartitionState]:
    found = image.topics.get(TopicName(topic))
    state = found.partitions.get(index) if found is not None else None
    if found is None or state is None or not 0 <= index < found.record.partition_count:
        raise ReassignmentRefusedError(
            "unknown_topic_or_partition", f"no partition {topic}-{index}"
        )
    return found, state


def alter_reassignment(
    image: ClusterImage, request: ReassignmentRequest
) -> AssignmentChange | None:
    """The change that starts, replaces or cancels a partition's reassignment (None: the
    partition is there already), or why it is refused.

    A new target replaces one under way: replicas that were being added and
    are not in the new target are now being removed (they may be in the ISR
    already). A target whose replicas are all in sync completes at once.
    """
    topic, state = _partition(image, request.topic, request.index)
    replicas = topic.record.assignment[request.index]
    if request.target is None:
        if not state.reassigning:
            raise ReassignmentRefusedError(
                "no_reassignment_in_progress",
                f"no reassignment of {request.topic}-{request.index} is in progress",
            )
        return _cancel(topic, request.index, replicas, state)
    target = request.target
    if not target or len(set(target)) != len(target):
        raise ReassignmentRefusedError(
            "invalid_replica_assignment", f"replicas {list(target)} are empty or repeat a broker"
        )
    unknown = [n for n in target if n not in image.brokers]
    if unknown:
        raise ReassignmentRefusedError(
            "invalid_replica_assignment", f"replicas {list(target)} name unknown brokers {unknown}"
        )
    original = original_replicas(replicas, state)
    adding = tuple(n for n in target if n not in original)
    removing = tuple(n for n in replicas if n not in target)
    moving = (*target, *removing)
    if moving == replicas and adding == state.adding and removing == state.removing:
        return None
    started = replace(
        state, adding=adding, removing=removing, partition_epoch=state.partition_epoch + 1
    )
    completed = _completion(moving, started)
    if completed is not None:
        moving, done = completed
        started = replace(done, partition_epoch=state.partition_epoch + 1)
    return _assignment_change(topic, {request.index: (moving, started)})


def _cancel(
    topic: TopicImage, index: int, replicas: tuple[NodeId, ...], state: PartitionState
) -> AssignmentChange:
    original = original_replicas(replicas, state)
    isr = tuple(n for n in state.isr if n in original)
    if not isr:
        raise ReassignmentRefusedError(
            "invalid_replica_assignment",
            f"no original replica of {topic.record.name}-{index} is in sync; cancelling"
            " would leave it without a leader",
        )
    leader = state.leader if state.leader in original else next(n for n in original if n in isr)
    reverted = PartitionState(
        leader,
        state.leader_epoch + (1 if leader != state.leader else 0),
        isr,
        state.partition_epoch + 1,
    )
    return _assignment_change(topic, {index: (original, reverted)})


def _completion(
    replicas: tuple[NodeId, ...], state: PartitionState
) -> tuple[tuple[NodeId, ...], PartitionState] | None:
    """The assignment and state once the target is reached, if every target replica is
    in the ISR; None while some are still catching up."""
    if not state.reassigning:
        return None
    target = target_replicas(replicas, state)
    if not set(target) <= set(state.isr):
        return None
    isr = tuple(n for n in state.isr if n in target)
    leader = state.leader if state.leader in target else next(n for n in target if n in isr)
    done = PartitionState(
        leader,
        state.leader_epoch + (1 if leader != state.leader else 0),
        isr,
        state.partition_epoch + 1,
    )
    return target, done


def complete_reassignments(image: ClusterImage) -> list[AssignmentChange]:
    """One change per topic with partitions whose target replicas are all in sync."""
    changes = []
    for _, topic in sorted(image.topics.items()):
        done = dict(_completed(topic))
        if done:
            changes.append(_assignment_change(topic, done))
    return changes


def _completed(
    topic: TopicImage,
) -> Iterator[tuple[int, tuple[tuple[NodeId, ...], PartitionState]]]:
    for index, replicas in enumerate(topic.record.assignment):
        state = topic.partitions.get(index)
        completed = _completion(replicas, state) if state is not None else None
        if completed is not None:
            yield index, completed


def _assignment_change(
    topic: TopicImage, partitions: dict[int, tuple[tuple[NodeId, ...], PartitionState]]
) -> AssignmentChange:
    assignment = list(topic.record.assignment)
    changes = []
    for index, (replicas, state) in sorted(partitions.items()):
        assignment[index] = replicas
        revision = topic.partition_revisions.get(index, 0)
        changes.append(PartitionChange(topic.record.name, index, state, revision))
    record = replace(topic.record, assignment=tuple(assignment))
    return AssignmentChange(record, topic.revision, tuple(changes))


def ongoing(
    image: ClusterImage,
) -> Iterator[tuple[TopicName, int, tuple[NodeId, ...], PartitionState]]:
    """Every partition with a reassignment under way: topic, index, replicas, state."""
    for name, topic in sorted(image.topics.items()):
        for index, replicas in enumerate(topic.record.assignment):
            state = topic.partitions.get(index)
            if state is not None and state.reassigning:
                yield name, index, replicas, state
