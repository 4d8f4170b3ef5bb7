"""The KIP-848 reconciliation state machine and the group's records, without I/O.

A member moves to a new target only through revocation first: it keeps its
epoch until a heartbeat shows it gave up what it must give up, and a
partition is handed over only once no other member holds it.
"""

from __future__ import annotations

import uuid

from shoal.broker.coordinator.consumer_group import (
    ConsumerGroup,
    ConsumerGroupState,
    ConsumerMember,
    MemberState,
    held_by_others,
    is_subset,
    reconcile,
)
from shoal.broker.coordinator.consumer_records import (
    ConsumerReplay,
    current_assignment_record,
    group_epoch_record,
    group_tombstones,
    member_metadata_record,
    member_tombstones,
    parse_consumer_key,
    target_epoch_record,
    target_member_record,
)

T = uuid.UUID(int=1)


def parts(*numbers: int) -> dict[uuid.UUID, frozenset[int]]:
    return {T: frozenset(numbers)} if numbers else {}


def stable(member_id: str, epoch: int, *numbers: int) -> ConsumerMember:
    return ConsumerMember(
        member_id,
        subscribed_topic_names=("t",),
        member_epoch=epoch,
        previous_member_epoch=epoch - 1,
        assigned=parts(*numbers),
    )


def test_a_new_member_gets_its_free_partitions_at_the_target_epoch() -> None:
    member = ConsumerMember("a")

    result = reconcile(member, 1, parts(0, 1, 2), {}, owned={})

    assert result.state is MemberState.STABLE
    assert result.member_epoch == 1
    assert result.assigned == parts(0, 1, 2)


def test_a_member_losing_partitions_keeps_its_epoch_until_it_confirms() -> None:
    member = stable("a", 1, 0, 1, 2)

    asked = reconcile(member, 2, parts(0, 1), {}, owned=None)

    assert asked.state is MemberState.UNREVOKED_PARTITIONS
    assert asked.member_epoch == 1
    assert asked.assigned == parts(0, 1)
    assert asked.pending_revocation == parts(2)

    still_owning = reconcile(asked, 2, parts(0, 1), {}, owned=parts(0, 1, 2))
    assert still_owning == asked

    confirmed = reconcile(asked, 2, parts(0, 1), {}, owned=parts(0, 1))
    assert confirmed.state is MemberState.STABLE
    assert confirmed.member_epoch == 2
    assert confirmed.pending_revocation == {}


def test_a_partition_still_held_by_another_member_is_not_given_yet() -> None:
    previous_owner = ConsumerMember(
        "a",
        member_epoch=1,
        state=MemberState.UNREVOKED_PARTITIONS,
        assigned=parts(0, 1),
        pending_revocation=parts(2),
    )
    newcomer = ConsumerMember("b")
    held = held_by_others({"a": previous_owner, "b": newcomer}, "b")

    waiting = reconcile(newcomer, 2, parts(2), held, owned={})

    assert waiting.state is MemberState.UNRELEASED_PARTITIONS
    assert waiting.member_epoch == 2
    assert waiting.assigned == {}

    released = reconcile(waiting, 2, parts(2), {}, owned={})
    assert released.state is MemberState.STABLE
    assert released.assigned == parts(2)


def test_a_member_already_at_the_target_epoch_is_left_alone() -> None:
    member = stable("a", 3, 0)

    assert reconcile(member, 3, parts(0, 1), {}, owned=None) is member


def test_a_previous_epoch_heartbeat_is_accepted_only_with_a_subset_of_the_assignment() -> None:
    assert is_subset(parts(0), parts(0, 1))
    assert not is_subset(parts(0, 5), parts(0, 1))
    assert not is_subset(None, parts(0, 1))


def test_the_group_state_follows_epochs_and_reconciliation() -> None:
    group = ConsumerGroup("g")
    assert group.state is ConsumerGroupState.EMPTY

    group.members["a"] = stable("a", 1, 0)
    group.group_epoch = group.assignment_epoch = 1
    assert group.state is ConsumerGroupState.STABLE

    group.group_epoch = 2
    assert group.state is ConsumerGroupState.ASSIGNING

    group.assignment_epoch = 2
    assert group.state is ConsumerGroupState.RECONCILING


def test_records_replay_into_the_same_group() -> None:
    member = ConsumerMember(
        "m-1",
        instance_id="i-1",
        rack_id=None,
        client_id="client",
        client_host="/127.0.0.1",
        subscribed_topic_names=("t", "u"),
        subscribed_topic_regex="v.*",
        rebalance_timeout_ms=30_000,
        server_assignor="range",
        member_epoch=4,
        previous_member_epoch=3,
        state=MemberState.UNREVOKED_PARTITIONS,
        assigned=parts(0, 1),
        pending_revocation=parts(2),
    )
    records = [
        member_metadata_record("g", member),
        group_epoch_record("g", 5),
        target_member_record("g", "m-1", parts(0, 1)),
        target_epoch_record("g", 5),
        current_assignment_record("g", member),
    ]
    replay = ConsumerReplay()
    for key, value in records:
        parsed = parse_consumer_key(key)
        assert parsed is not None
        replay.record(parsed, value)

    group = replay.result()["g"]
    assert group.group_epoch == 5
    assert group.assignment_epoch == 5
    assert group.target == {"m-1": parts(0, 1)}
    assert group.members == {"m-1": member}


def test_tombstones_remove_the_member_then_the_group() -> None:
    member = stable("m-1", 1, 0)
    replay = ConsumerReplay()
    entries = [
        member_metadata_record("g", member),
        current_assignment_record("g", member),
        group_epoch_record("g", 1),
        *member_tombstones("g", "m-1"),
    ]
    for key, value in entries:
        parsed = parse_consumer_key(key)
        assert parsed is not None
        replay.record(parsed, value)
    assert replay.result()["g"].members == {}

    for key, value in group_tombstones("g"):
        parsed = parse_consumer_key(key)
        assert parsed is not None
        replay.record(parsed, value)
    assert replay.result() == {}


def test_keys_of_classic_records_are_not_consumer_group_keys() -> None:
    assert parse_consumer_key(b"\x00\x02\x00\x01g") is None
    assert parse_consumer_key(b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x00") is None
