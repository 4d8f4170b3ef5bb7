"""Replica placement: Kafka's rack-unaware round-robin, and its rack-aware variant.

Exact expectations come from Kafka's own AdminRackAwareTest, so the two stay
interchangeable for the same brokers, racks and start.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoal.broker.cluster.model import NodeId
from shoal.broker.cluster.placement import PlacementError, assign_replicas, rack_alternated

Assignment = list[tuple[NodeId, ...]]


def ids(*values: int) -> list[NodeId]:
    return [NodeId(v) for v in values]


def racked(mapping: Mapping[int, str]) -> dict[NodeId, str]:
    return {NodeId(k): v for k, v in mapping.items()}


def leader_counts(assignment: Assignment) -> Counter[NodeId]:
    return Counter(replicas[0] for replicas in assignment)


def replica_counts(assignment: Assignment) -> Counter[NodeId]:
    return Counter(broker for replicas in assignment for broker in replicas)


def follower_counts(assignment: Assignment) -> Counter[NodeId]:
    return Counter(broker for replicas in assignment for broker in replicas[1:])


def spread(counts: Counter[NodeId], brokers: Sequence[NodeId]) -> int:
    """Largest minus smallest count, brokers with nothing counting as zero."""
    values = [counts[b] for b in brokers]
    return max(values) - min(values)


def racks_of(replicas: Sequence[NodeId], racks: Mapping[NodeId, str | None]) -> set[str | None]:
    return {racks[b] for b in replicas}


# Three racks of two brokers, listed so that ids and racks do not line up.
SIX_IN_THREE = racked({0: "rack1", 1: "rack2", 2: "rack2", 3: "rack3", 4: "rack3", 5: "rack1"})
SIX = ids(0, 1, 2, 3, 4, 5)


# Rack-unaware: unchanged.


def test_rack_unaware_matches_kafka() -> None:
    # Kafka's AdminRackAwareTest.testReplicaAssignment, fixed start 0.
    assert assign_replicas(ids(0, 1, 2, 3, 4), 10, 3, start=0) == [
        (0, 1, 2),
        (1, 2, 3),
        (2, 3, 4),
        (3, 4, 0),
        (4, 0, 1),
        (0, 2, 3),
        (1, 3, 4),
        (2, 4, 0),
        (3, 0, 1),
        (4, 1, 2),
    ]


def test_rack_unaware_positional_arguments_still_work() -> None:
    # topic_admin's CreatePartitions call passes first_partition positionally;
    # expected values are what placement gave before racks existed.
    assert assign_replicas(ids(2, 0, 1), 2, 2, 3, 1) == [(1, 0), (2, 1)]


@pytest.mark.parametrize("brokers", [1, 2, 3, 5, 6])
@pytest.mark.parametrize("rounds", [1, 2, 4])
@pytest.mark.parametrize("start", [None, 0, 3])
def test_rack_unaware_spreads_leaders_and_replicas(
    brokers: int, rounds: int, start: int | None
) -> None:
    nodes = ids(*range(10, 10 + brokers))
    for factor in range(1, brokers + 1):
        assignment = assign_replicas(nodes, brokers * rounds, factor, start=start)
        assert len(assignment) == brokers * rounds
        assert all(len(set(r)) == len(r) == factor for r in assignment)
        assert set(replica_counts(assignment)) <= set(nodes)
        assert spread(leader_counts(assignment), nodes) <= 1
        assert spread(replica_counts(assignment), nodes) == 0


def test_rack_unaware_when_racks_not_given() -> None:
    assert assign_replicas(SIX, 12, 3, start=4) == assign_replicas(SIX, 12, 3, start=4, racks=None)


# Falling back when rack information is partial.


@pytest.mark.parametrize(
    "racks",
    [
        {**SIX_IN_THREE, NodeId(5): None},
        {k: v for k, v in SIX_IN_THREE.items() if k != 5},
        {},
    ],
    ids=["one-rack-none", "one-broker-missing", "empty"],
)
def test_partial_racks_fall_back_to_rack_unaware(racks: Mapping[NodeId, str | None]) -> None:
    for start in range(6):
        unaware = assign_replicas(SIX, 12, 3, start=start)
        assert assign_replicas(SIX, 12, 3, start=start, racks=racks) == unaware


def test_racks_of_brokers_not_placed_on_are_ignored() -> None:
    racks = {**SIX_IN_THREE, NodeId(99): None}
    assert assign_replicas(SIX, 6, 3, start=0, racks=racks) == assign_replicas(
        SIX, 6, 3, start=0, racks=SIX_IN_THREE
    )


# Rack-aware.


def test_rack_alternated_list_matches_kafka() -> None:
    racks = racked({0: "r1", 1: "r3", 2: "r3", 3: "r2", 4: "r2", 5: "r1"})
    assert rack_alternated(racks) == [0, 3, 1, 5, 4, 2]
    del racks[NodeId(5)]
    assert rack_alternated(racks) == [0, 3, 1, 4, 2]


def test_rack_alternated_list_with_uneven_racks() -> None:
    racks = racked({0: "a", 1: "a", 2: "a", 3: "b", 4: "c", 5: "c"})
    assert rack_alternated(racks) == [0, 3, 4, 1, 5, 2]


def test_rack_aware_matches_kafka() -> None:
    # Kafka's AdminRackAwareTest.testGetRackAlternatedBrokerListAndAssignReplicasToBrokers.
    racks = racked({0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"})
    assert assign_replicas(SIX, 7, 3, start=0, racks=racks) == [
        (0, 3, 1),
        (3, 1, 5),
        (1, 5, 4),
        (5, 4, 2),
        (4, 2, 0),
        (2, 0, 3),
        (0, 4, 2),
    ]


@pytest.mark.parametrize("start", [None, 0, 1, 2, 3, 4, 5])
def test_three_racks_of_two_with_factor_three_span_all_racks(start: int | None) -> None:
    assignment = assign_replicas(SIX, 12, 3, start=start, racks=SIX_IN_THREE)
    assert all(racks_of(r, SIX_IN_THREE) == {"rack1", "rack2", "rack3"} for r in assignment)
    assert all(len(set(r)) == 3 for r in assignment)


@pytest.mark.parametrize("start", [None, 0, 1, 2, 3])
def test_two_racks_with_factor_three_span_both(start: int | None) -> None:
    brokers = ids(1, 2, 3, 4)
    racks = racked({1: "east", 2: "east", 3: "west", 4: "west"})
    for assignment in (
        assign_replicas(brokers, 8, 3, start=start, racks=racks),
        assign_replicas(brokers, 7, 3, 5, start=start, racks=racks),
    ):
        assert all(racks_of(r, racks) == {"east", "west"} for r in assignment)
        assert all(len(set(r)) == 3 for r in assignment)


@pytest.mark.parametrize("factor", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("rounds", [1, 2, 5])
@pytest.mark.parametrize("start", [None, 0, 2, 5])
def test_rack_aware_spreads_leaders_and_followers(
    factor: int, rounds: int, start: int | None
) -> None:
    assignment = assign_replicas(SIX, 6 * rounds, factor, start=start, racks=SIX_IN_THREE)
    assert spread(leader_counts(assignment), SIX) <= 1
    # With as many brokers in every rack, followers come out exactly even too.
    assert spread(follower_counts(assignment), SIX) == 0
    assert all(len(racks_of(r, SIX_IN_THREE)) == min(factor, 3) for r in assignment)


def test_rack_aware_leaders_even_with_uneven_racks() -> None:
    racks = racked({0: "rack1", 1: "rack1", 2: "rack2", 3: "rack3", 4: "rack3", 5: "rack1"})
    for start in range(6):
        assignment = assign_replicas(SIX, 12, 3, start=start, racks=racks)
        assert spread(leader_counts(assignment), SIX) == 0
        assert all(len(racks_of(r, racks)) == 3 for r in assignment)


def test_more_replicas_than_racks_cover_every_rack() -> None:
    # Kafka's testMoreReplicasThanRacks: five replicas, three racks.
    racks = racked({0: "rack1", 1: "rack2", 2: "rack2", 3: "rack3", 4: "rack3", 5: "rack2"})
    assignment = assign_replicas(SIX, 6, 5, start=0, racks=racks)
    assert all(len(set(r)) == 5 and len(racks_of(r, racks)) == 3 for r in assignment)


def test_full_racks_skip_brokers_already_chosen() -> None:
    # Kafka's testSkipBrokerWithReplicaAlreadyAssigned: once every rack holds a
    # replica, the walk may revisit chosen brokers and must step past them.
    brokers = ids(0, 1, 2, 3, 4)
    racks = racked({0: "a", 1: "b", 2: "c", 3: "a", 4: "a"})
    for start in range(5):
        assignment = assign_replicas(brokers, 6, 4, start=start, racks=racks)
        assert all(len(set(r)) == 4 and len(racks_of(r, racks)) == 3 for r in assignment)


def test_single_rack_places_as_without_racks() -> None:
    racks = {b: "only" for b in SIX}
    for factor in range(1, 7):
        for start in range(6):
            assert assign_replicas(SIX, 18, factor, start=start, racks=racks) == assign_replicas(
                SIX, 18, factor, start=start
            )


def test_start_makes_placement_deterministic() -> None:
    first = assign_replicas(SIX, 30, 3, start=4, racks=SIX_IN_THREE)
    assert first == assign_replicas(SIX, 30, 3, start=4, racks=SIX_IN_THREE)
    assert [r[0] for r in first[:6]] == rack_alternated(SIX_IN_THREE)[4:] + rack_alternated(
        SIX_IN_THREE
    )[:4]


def test_broker_order_given_does_not_matter() -> None:
    shuffled = ids(5, 3, 0, 4, 1, 2)
    assert assign_replicas(shuffled, 12, 3, start=1, racks=SIX_IN_THREE) == assign_replicas(
        SIX, 12, 3, start=1, racks=SIX_IN_THREE
    )


# Continuing a topic (CreatePartitions).


@pytest.mark.parametrize("created", [1, 4, 6, 7, 12])
@pytest.mark.parametrize("start", [0, 3])
def test_rack_aware_continuation_matches_creating_all_at_once(created: int, start: int) -> None:
    whole = assign_replicas(SIX, 20, 3, start=start, racks=SIX_IN_THREE)
    first = assign_replicas(SIX, created, 3, start=start, racks=SIX_IN_THREE)
    added = assign_replicas(SIX, 20 - created, 3, created, start, racks=SIX_IN_THREE)
    assert first + added == whole


@pytest.mark.parametrize("created", [1, 4, 5, 7, 12])
def test_rack_unaware_continuation_keeps_leader_rotation(created: int) -> None:
    brokers = ids(0, 1, 2, 3, 4)
    whole = assign_replicas(brokers, 20, 3, start=2)
    added = assign_replicas(brokers, 20 - created, 3, created, 2)
    assert [r[0] for r in added] == [r[0] for r in whole[created:]]
    assert all(len(set(r)) == 3 for r in added)


def test_continuation_spreads_the_added_partitions() -> None:
    added = assign_replicas(SIX, 12, 2, 12, racks=SIX_IN_THREE)
    assert spread(leader_counts(added), SIX) == 0
    assert spread(replica_counts(added), SIX) == 0
    assert all(len(racks_of(r, SIX_IN_THREE)) == 2 for r in added)


# Errors.


@pytest.mark.parametrize("racks", [None, SIX_IN_THREE])
def test_replication_factor_below_one(racks: Mapping[NodeId, str] | None) -> None:
    with pytest.raises(PlacementError, match=r"^replication factor must be at least 1$"):
        assign_replicas(SIX, 3, 0, racks=racks)


@pytest.mark.parametrize("racks", [None, SIX_IN_THREE])
def test_replication_factor_above_brokers(racks: Mapping[NodeId, str] | None) -> None:
    with pytest.raises(PlacementError) as caught:
        assign_replicas(SIX, 3, 7, racks=racks)
    assert str(caught.value) == "Replication factor: 7 larger than available brokers: 6."


def test_no_brokers() -> None:
    with pytest.raises(PlacementError, match="larger than available brokers: 0"):
        assign_replicas([], 1, 1, racks={})


def test_placement_error_is_a_value_error() -> None:
    assert issubclass(PlacementError, ValueError)


def test_no_partitions() -> None:
    assert assign_replicas(SIX, 0, 3, racks=SIX_IN_THREE) == []
    assert assign_replicas(SIX, 0, 3) == []


# Properties.


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeId], dict[NodeId, str | None]]:
    brokers = draw(st.lists(st.integers(0, 1000), min_size=1, max_size=12, unique=True))
    names = st.lists(st.sampled_from("abcdefgh"), min_size=len(brokers), max_size=len(brokers))
    rack_names = draw(names)
    return ids(*brokers), {NodeId(b): r for b, r in zip(brokers, rack_names, strict=True)}


@given(
    cluster=clusters(),
    data=st.data(),
    partitions=st.integers(0, 40),
    first_partition=st.integers(0, 50),
    start=st.none() | st.integers(0, 20),
)
def test_rack_aware_invariants(
    cluster: tuple[list[NodeId], dict[NodeId, str | None]],
    data: st.DataObject,
    partitions: int,
    first_partition: int,
    start: int | None,
) -> None:
    brokers, racks = cluster
    factor = data.draw(st.integers(1, len(brokers)), label="factor")
    rack_count = len(set(racks.values()))
    assignment = assign_replicas(brokers, partitions, factor, first_partition, start, racks=racks)
    assert len(assignment) == partitions
    for replicas in assignment:
        assert len(replicas) == len(set(replicas)) == factor
        assert set(replicas) <= set(brokers)
        assert len(racks_of(replicas, racks)) == min(factor, rack_count)
    if partitions % len(brokers) == 0:
        assert spread(leader_counts(assignment), brokers) == 0


@given(
    brokers=st.lists(st.integers(0, 1000), min_size=1, max_size=12, unique=True),
    data=st.data(),
    rounds=st.integers(0, 4),
    start=st.none() | st.integers(0, 20),
)
def test_rack_unaware_invariants(
    brokers: list[int], data: st.DataObject, rounds: int, start: int | None
) -> None:
    nodes = ids(*brokers)
    factor = data.draw(st.integers(1, len(nodes)), label="factor")
    assignment = assign_replicas(nodes, rounds * len(nodes), factor, start=start)
    assert all(len(r) == len(set(r)) == factor for r in assignment)
    assert rounds == 0 or spread(leader_counts(assignment), nodes) == 0
