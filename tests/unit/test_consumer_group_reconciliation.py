"""The KIP-848 reconciliation state machine and the group's records, without I/O.

A member moves to a new target only through revocation first: it keeps its
epoch until a heartbeat shows it gave up what it must give up, and a
partition is handed over only once no other member holds it.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import replace

from shoal.broker.coordinator.consumer_group import (
    ConsumerGroup,
    ConsumerGroupState,
    ConsumerMember,
    MemberState,
    commit_refused_for,
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


def test_kept_partitions_keep_their_assignment_epoch_and_new_ones_get_the_target_epoch() -> None:
    """KIP-1251: the epoch a partition entered the member's assignment at, as Kafka 4.3's
    CurrentAssignmentBuilder records it."""
    member = replace(stable("a", 3, 0, 1), partition_epochs={(T, 0): 1, (T, 1): 3})

    grown = reconcile(member, 5, parts(0, 1, 2), {}, owned=parts(0, 1))
    assert (grown.member_epoch, grown.state) == (5, MemberState.STABLE)
    assert [grown.assignment_epoch(T, n) for n in (0, 1, 2)] == [1, 3, 5]

    shrinking = reconcile(grown, 7, parts(2), {}, owned=parts(0, 1, 2))
    assert (shrinking.member_epoch, shrinking.state) == (5, MemberState.UNREVOKED_PARTITIONS)
    assert [shrinking.assignment_epoch(T, n) for n in (0, 1, 2)] == [1, 3, 5]  # 0, 1 revoking

    shrunk = reconcile(shrinking, 7, parts(2), {}, owned=parts(2))
    assert (shrunk.member_epoch, shrunk.assigned) == (7, parts(2))
    assert [shrunk.assignment_epoch(T, n) for n in (0, 1, 2)] == [None, None, 5]
    # Given back later, a partition counts from then.
    regained = reconcile(shrunk, 9, parts(0, 2), {}, owned=parts(2))
    assert [regained.assignment_epoch(T, n) for n in (0, 2)] == [9, 5]


def test_a_partition_without_a_recorded_epoch_counts_from_the_members_epoch() -> None:
    member = stable("a", 4, 0)

    assert member.assignment_epoch(T, 0) == 4
    assert member.assignment_epoch(T, 1) is None
    # Kept over a bump, it keeps the epoch it counted from before the bump.
    assert reconcile(member, 6, parts(0), {}, owned=parts(0)).assignment_epoch(T, 0) == 4


def test_a_commit_with_an_older_epoch_is_good_for_partitions_assigned_by_then() -> None:
    """Kafka 4.3's validateOffsetCommit (KIP-1251): assignment epoch <= commit epoch <=
    member epoch for every partition committed, which must be assigned or pending
    revocation; the member's own epoch is always good."""
    member = ConsumerMember(
        "a",
        member_epoch=5,
        previous_member_epoch=4,
        state=MemberState.UNREVOKED_PARTITIONS,
        assigned=parts(0, 1),
        pending_revocation=parts(2),
        partition_epochs={(T, 0): 3, (T, 1): 5, (T, 2): 2},
    )
    other = uuid.UUID(int=2)

    assert not commit_refused_for(member, 5, [(T, 0), (T, 1), (T, 3), (None, 0)])
    assert commit_refused_for(member, 6, [(T, 0)])
    assert not commit_refused_for(member, 4, [(T, 0)])
    assert not commit_refused_for(member, 3, [(T, 0), (T, 2)])
    assert not commit_refused_for(member, 4, [])
    assert commit_refused_for(member, 4, [(T, 1)])  # assigned at 5
    assert commit_refused_for(member, 4, [(T, 0), (T, 1)])  # one stale refuses all
    assert commit_refused_for(member, 2, [(T, 0)])  # before 0 was assigned
    assert commit_refused_for(member, 4, [(T, 3)])  # not the member's
    assert commit_refused_for(member, 4, [(other, 0)])
    assert commit_refused_for(member, 4, [(None, 0)])  # a topic that does not exist


def test_assignment_epochs_are_kafkas_tagged_field_and_replay() -> None:
    member = ConsumerMember(
        "m-1",
        member_epoch=5,
        previous_member_epoch=4,
        state=MemberState.UNREVOKED_PARTITIONS,
        assigned=parts(0, 1),
        pending_revocation=parts(2),
        partition_epochs={(T, 0): 3, (T, 1): 5, (T, 2): 2},
    )
    _key, value = current_assignment_record("g", member)

    assert value is not None
    # Each TopicPartitions entry: topic id, [partitions], then tagged field 0
    # (AssignmentEpochs: compact int32 array) with the epochs in the partitions' order.
    assigned = T.bytes + b"\x03" + struct.pack(">ii", 0, 1) + b"\x01\x00\x09\x03"
    assigned += struct.pack(">ii", 3, 5)
    revoking = T.bytes + b"\x02" + struct.pack(">i", 2) + b"\x01\x00\x05\x02"
    revoking += struct.pack(">i", 2)
    header = struct.pack(">hiib", 0, 5, 4, MemberState.UNREVOKED_PARTITIONS)
    assert value == header + b"\x02" + assigned + b"\x02" + revoking + b"\x00"

    replayed = replay_member(member, value)
    assert replayed.same_assignment(member)
    assert [replayed.assignment_epoch(T, n) for n in (0, 1, 2)] == [3, 5, 2]


def test_an_assignment_record_without_epochs_replays_them_as_the_members_epoch() -> None:
    """As Kafka reads a record written before 4.3: stricter for commits, never looser."""
    header = struct.pack(">hiib", 0, 5, 4, MemberState.STABLE)
    assigned = b"\x02" + T.bytes + b"\x03" + struct.pack(">ii", 0, 1) + b"\x00"
    value = header + assigned + b"\x01" + b"\x00"

    replayed = replay_member(stable("m-1", 5), value)

    assert replayed.assigned == parts(0, 1)
    assert [replayed.assignment_epoch(T, n) for n in (0, 1)] == [5, 5]


def replay_member(member: ConsumerMember, value: bytes) -> ConsumerMember:
    replay = ConsumerReplay()
    for key, record in [member_metadata_record("g", member), group_epoch_record("g", 5)]:
        parsed = parse_consumer_key(key)
        assert parsed is not None
        replay.record(parsed, record)
    key, _value = current_assignment_record("g", member)
    parsed = parse_consumer_key(key)
    assert parsed is not None
    replay.record(parsed, value)
    return replay.result()["g"].members[member.member_id]


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
