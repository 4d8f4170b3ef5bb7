"""The controller's reassignment decisions (KIP-455): start, replace, cancel, complete.

Each test builds a cluster image, asks for a change and checks it as Kafka's
controller would make it: the assignment (target first, then the replicas
leaving), the adding/removing lists, the ISR and leader at completion, the
epochs, and the revisions guarding the compare-and-swap.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest
from shoal.broker.cluster.model import (
    BrokerRegistration,
    ClusterImage,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
)
from shoal.broker.cluster.store import AssignmentChange
from shoal.broker.controller.reassignments import (
    ReassignmentRefusedError,
    ReassignmentRequest,
    alter_reassignment,
    complete_reassignments,
    ongoing,
    original_replicas,
    target_replicas,
)


def _nodes(ids: Sequence[int]) -> tuple[NodeId, ...]:
    return tuple(NodeId(n) for n in ids)


def _state(
    leader: int,
    isr: Sequence[int],
    adding: Sequence[int] = (),
    removing: Sequence[int] = (),
) -> PartitionState:
    return PartitionState(NodeId(leader), 3, _nodes(isr), 7, _nodes(adding), _nodes(removing))


def _image(
    partitions: Sequence[tuple[Sequence[int], PartitionState]], live: Sequence[int] = (0, 1, 2, 3)
) -> ClusterImage:
    record = TopicRecord(TopicName("t"), uuid.uuid4(), tuple(_nodes(r) for r, _ in partitions), {})
    topic = TopicImage(
        record,
        {i: state for i, (_, state) in enumerate(partitions)},
        revision=10,
        partition_revisions={i: 100 + i for i in range(len(partitions))},
    )
    brokers = {NodeId(n): BrokerRegistration(NodeId(n), f"b{n}", 9092) for n in live}
    return ClusterImage.build("c", 500, brokers, {TopicName("t"): topic})


def _request(index: int, target: Sequence[int] | None) -> ReassignmentRequest:
    return ReassignmentRequest("t", index, None if target is None else _nodes(target))


def _only(change: AssignmentChange | None) -> tuple[tuple[NodeId, ...], PartitionState, int]:
    """The one partition a change touches: its new replicas, new state, guarding revision."""
    assert change is not None
    (partition,) = change.partitions
    return change.record.assignment[partition.index], partition.state, partition.expected_revision


def test_starting_lists_target_then_leaving_and_records_adding_and_removing() -> None:
    image = _image([([0, 1], _state(0, [0, 1])), ([1, 2], _state(1, [1, 2]))])
    change = alter_reassignment(image, _request(0, [1, 2]))
    assert change is not None and change.expected_revision == 10
    replicas, state, revision = _only(change)
    assert replicas == (1, 2, 0)
    assert (state.adding, state.removing) == ((2,), (0,))
    assert (state.leader, state.leader_epoch, state.isr) == (0, 3, (0, 1))
    assert state.partition_epoch == 8 and revision == 100
    assert change.record.assignment[1] == (1, 2)
    assert target_replicas(replicas, state) == (1, 2)
    assert original_replicas(replicas, state) == (1, 0)


def test_completion_waits_for_every_target_replica_in_the_isr() -> None:
    moving = _state(0, [0, 1], adding=[2], removing=[0])
    assert complete_reassignments(_image([([1, 2, 0], moving)])) == []
    caught_up = _state(0, [0, 1, 2], adding=[2], removing=[0])
    (change,) = complete_reassignments(_image([([1, 2, 0], caught_up)]))
    replicas, state, revision = _only(change)
    assert replicas == (1, 2)
    assert state.isr == (1, 2)
    assert (state.leader, state.leader_epoch) == (1, 4)
    assert (state.adding, state.removing, state.partition_epoch) == ((), (), 8)
    assert revision == 100 and change.expected_revision == 10


def test_a_leader_that_stays_keeps_its_epoch_at_completion() -> None:
    caught_up = _state(2, [2, 0, 3], adding=[3], removing=[0])
    (change,) = complete_reassignments(_image([([3, 2, 0], caught_up)]))
    replicas, state, _ = _only(change)
    assert replicas == (3, 2)
    assert (state.leader, state.leader_epoch, state.isr) == (2, 3, (2, 3))


def test_completions_of_one_topic_are_one_change() -> None:
    done = _state(0, [0, 1, 2], adding=[2], removing=[0])
    image = _image([([1, 2, 0], done), ([0, 1], _state(0, [0, 1])), ([2, 1, 0], done)])
    (change,) = complete_reassignments(image)
    assert [p.index for p in change.partitions] == [0, 2]
    assert change.record.assignment == ((1, 2), (0, 1), (2, 1))


def test_a_target_already_in_sync_completes_at_once() -> None:
    image = _image([([0, 1, 2], _state(0, [0, 1, 2]))])
    replicas, state, _ = _only(alter_reassignment(image, _request(0, [2, 1])))
    assert replicas == (2, 1)
    assert (state.leader, state.leader_epoch, state.isr) == (2, 4, (1, 2))
    assert not state.reassigning and state.partition_epoch == 8


def test_the_same_target_again_changes_nothing() -> None:
    assert alter_reassignment(_image([([0, 1], _state(0, [0, 1]))]), _request(0, [0, 1])) is None
    moving = _image([([1, 2, 0], _state(0, [0, 1], adding=[2], removing=[0]))])
    assert alter_reassignment(moving, _request(0, [1, 2])) is None


def test_a_new_target_replaces_the_one_under_way() -> None:
    moving = _image([([1, 2, 0], _state(0, [0, 1], adding=[2], removing=[0]))])
    replicas, state, _ = _only(alter_reassignment(moving, _request(0, [1, 3])))
    assert replicas == (1, 3, 2, 0)
    assert (state.adding, state.removing) == ((3,), (2, 0))


def test_cancelling_goes_back_to_the_original_replicas() -> None:
    moving = _image([([1, 2, 0], _state(0, [0, 1, 2], adding=[2], removing=[0]))])
    replicas, state, _ = _only(alter_reassignment(moving, _request(0, None)))
    assert replicas == (1, 0)
    assert (state.leader, state.leader_epoch, state.isr) == (0, 3, (0, 1))
    assert not state.reassigning


def test_cancelling_moves_leadership_off_an_added_replica() -> None:
    moving = _image([([2, 1, 0], _state(2, [2, 1], adding=[2], removing=[0]))])
    replicas, state, _ = _only(alter_reassignment(moving, _request(0, None)))
    assert replicas == (1, 0)
    assert (state.leader, state.leader_epoch, state.isr) == (1, 4, (1,))


@pytest.mark.parametrize(
    ("index", "target", "code"),
    [
        (5, [0, 1], "unknown_topic_or_partition"),
        (0, [1, 1], "invalid_replica_assignment"),
        (0, [], "invalid_replica_assignment"),
        (0, [1, 7], "invalid_replica_assignment"),
        (0, None, "no_reassignment_in_progress"),
    ],
)
def test_refusals_carry_kafkas_error(index: int, target: list[int] | None, code: str) -> None:
    image = _image([([0, 1], _state(0, [0, 1]))])
    with pytest.raises(ReassignmentRefusedError) as refused:
        alter_reassignment(image, _request(index, target))
    assert refused.value.code == code


def test_an_unknown_topic_is_refused() -> None:
    image = _image([([0, 1], _state(0, [0, 1]))])
    with pytest.raises(ReassignmentRefusedError, match="no partition other-0"):
        alter_reassignment(image, ReassignmentRequest("other", 0, _nodes([0, 1])))


def test_ongoing_lists_only_partitions_being_moved() -> None:
    image = _image(
        [([1, 2, 0], _state(0, [0, 1], adding=[2], removing=[0])), ([0, 1], _state(0, [0, 1]))]
    )
    assert [(name, index, replicas) for name, index, replicas, _ in ongoing(image)] == [
        ("t", 0, (1, 2, 0))
    ]


def test_the_reassignment_survives_the_store() -> None:
    state = _state(0, [0, 1], adding=[2], removing=[0])
    assert PartitionState.from_json(state.to_json()) == state
    plain = _state(0, [0, 1])
    assert b"adding" not in plain.to_json()
    assert PartitionState.from_json(plain.to_json()) == plain
