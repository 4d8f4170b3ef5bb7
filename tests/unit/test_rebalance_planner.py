"""The operator's reassignment planner: where partitions go when brokers come or leave."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shoal.operator.cluster_state import PartitionInfo
from shoal.operator.rebalance import Plan, ReassignmentImpossible, plan_reassignment


def _partition(topic: str, index: int, replicas: Sequence[int]) -> PartitionInfo:
    return PartitionInfo(topic, index, replicas[0], tuple(replicas), tuple(replicas))


def _round_robin(brokers: Sequence[int], count: int, factor: int) -> list[PartitionInfo]:
    n = len(brokers)
    return [_partition("t", i, [brokers[(i + k) % n] for k in range(factor)]) for i in range(count)]


def _after(
    partitions: Sequence[PartitionInfo], plan: Plan
) -> dict[tuple[str, int], tuple[int, ...]]:
    return {
        (p.topic, p.partition): plan.get((p.topic, p.partition), p.replicas) for p in partitions
    }


def _moves(partitions: Sequence[PartitionInfo], plan: Plan) -> int:
    """Replicas that must be copied to a broker that lacks them."""
    return sum(
        len(set(plan[(p.topic, p.partition)]) - set(p.replicas))
        for p in partitions
        if (p.topic, p.partition) in plan
    )


def test_draining_a_broker_moves_only_its_replicas() -> None:
    partitions = _round_robin([0, 1, 2], 6, 2)
    plan = plan_reassignment(partitions, [0, 1])
    on_two = [(p.topic, p.partition) for p in partitions if 2 in p.replicas]
    assert sorted(plan) == sorted(on_two)
    assert _moves(partitions, plan) == len(on_two)
    for replicas in plan.values():
        assert sorted(replicas) == [0, 1]


def test_scaling_up_fills_the_new_broker_to_the_mean() -> None:
    partitions = _round_robin([0, 1, 2], 12, 2)
    plan = plan_reassignment(partitions, [0, 1, 2, 3])
    load = Counter(r for replicas in _after(partitions, plan).values() for r in replicas)
    assert load == {0: 6, 1: 6, 2: 6, 3: 6}
    assert _moves(partitions, plan) == 6


def test_a_leader_that_stays_stays_first_and_a_lost_one_goes_to_the_least_leading() -> None:
    partitions = [_partition("t", 0, [2, 0]), _partition("t", 1, [0, 2])]
    plan = plan_reassignment(partitions, [0, 1])
    assert plan[("t", 1)] == (0, 1)
    assert plan[("t", 0)] == (1, 0)


def test_a_partition_losing_its_leader_takes_the_least_leading_member() -> None:
    partitions = [
        _partition("t", 0, [0, 1]),
        _partition("t", 1, [2, 0]),
        _partition("t", 2, [1, 2]),
    ]
    plan = plan_reassignment(partitions, [0, 1])
    leaders = Counter(replicas[0] for replicas in _after(partitions, plan).values())
    assert max(leaders.values()) - min(leaders.values()) <= 1


def test_a_balanced_cluster_needs_no_plan() -> None:
    assert plan_reassignment(_round_robin([0, 1, 2], 9, 3), [0, 1, 2]) == {}
    assert plan_reassignment([], [0]) == {}


def test_too_few_brokers_for_a_partition_is_refused() -> None:
    partitions = _round_robin([0, 1, 2], 3, 3)
    with pytest.raises(ReassignmentImpossible, match="t-0 has 3 replicas, but only 2 brokers"):
        plan_reassignment(partitions, [0, 1])


_BROKER_IDS = st.integers(min_value=0, max_value=7)


@st.composite
def _clusters(
    draw: st.DrawFn, max_brokers: int = 6, max_partitions: int = 20
) -> tuple[list[PartitionInfo], list[int]]:
    allowed = draw(st.lists(_BROKER_IDS, min_size=1, max_size=max_brokers, unique=True))
    count = draw(st.integers(min_value=1, max_value=max_partitions))
    partitions = []
    for i in range(count):
        factor = draw(st.integers(min_value=1, max_value=len(allowed)))
        replicas = draw(st.lists(_BROKER_IDS, min_size=factor, max_size=factor, unique=True))
        topic = draw(st.sampled_from(["a", "b"]))
        partitions.append(_partition(topic, i, replicas))
    return partitions, allowed


@settings(max_examples=300, deadline=None)
@given(_clusters())
def test_any_plan_is_valid_and_balanced(cluster: tuple[list[PartitionInfo], list[int]]) -> None:
    partitions, allowed = cluster
    plan = plan_reassignment(partitions, allowed)
    result = _after(partitions, plan)
    for p in partitions:
        replicas = result[(p.topic, p.partition)]
        assert len(replicas) == len(p.replicas)
        assert len(set(replicas)) == len(replicas)
        assert set(replicas) <= set(allowed)
        if (p.topic, p.partition) in plan:
            assert set(replicas) != set(p.replicas)
            if p.leader in replicas:
                assert replicas[0] == p.leader
    load = Counter(r for replicas in result.values() for r in replicas)
    counts = [load[b] for b in allowed]
    assert max(counts) - min(counts) <= 1
    # Planning again over the result changes nothing: the plan is a fixed point.
    settled = [_partition(t, i, r) for (t, i), r in result.items()]
    assert plan_reassignment(settled, allowed) == {}


def _fewest_moves(partitions: Sequence[PartitionInfo], allowed: Sequence[int]) -> int:
    """The fewest moves of any balanced placement, by trying every placement."""
    total = sum(len(p.replicas) for p in partitions)
    low, high = total // len(allowed), -(-total // len(allowed))
    choices = [itertools.combinations(allowed, len(p.replicas)) for p in partitions]
    best = total
    for placement in itertools.product(*choices):
        load = Counter(b for replicas in placement for b in replicas)
        if all(low <= load[b] <= high for b in allowed):
            moves = sum(
                len(set(r) - set(p.replicas)) for r, p in zip(placement, partitions, strict=True)
            )
            best = min(best, moves)
    return best


@settings(max_examples=300, deadline=None)
@given(_clusters(max_brokers=4, max_partitions=4))
def test_moves_as_few_replicas_as_any_balanced_placement(
    cluster: tuple[list[PartitionInfo], list[int]],
) -> None:
    partitions, allowed = cluster
    plan = plan_reassignment(partitions, allowed)
    assert _moves(partitions, plan) == _fewest_moves(partitions, allowed)
