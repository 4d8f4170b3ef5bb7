"""KIP-848 server-side assignors (uniform, range): pure functions, no coordinator."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import pytest
from shoal.broker.coordinator.assignors import MemberSpec, Partitions, range_, uniform

T = uuid.UUID(int=1)
U = uuid.UUID(int=2)


def spec(*topics: uuid.UUID, current: Partitions | None = None) -> MemberSpec:
    return MemberSpec(frozenset(topics), current or {})


def counts(assignment: Mapping[str, Partitions]) -> dict[str, int]:
    return {m: sum(len(ps) for ps in parts.values()) for m, parts in assignment.items()}


def owners(assignment: Mapping[str, Partitions]) -> dict[tuple[uuid.UUID, int], list[str]]:
    found: dict[tuple[uuid.UUID, int], list[str]] = {}
    for member, parts in assignment.items():
        for topic, numbers in parts.items():
            for n in numbers:
                found.setdefault((topic, n), []).append(member)
    return found


def assert_each_partition_once(assignment: Mapping[str, Partitions], topics: dict[uuid.UUID, int]):  # type: ignore[no-untyped-def]
    found = owners(assignment)
    expected = {(t, p) for t, n in topics.items() for p in range(n)}
    assert set(found) == expected
    assert all(len(members) == 1 for members in found.values())


@pytest.mark.parametrize("members", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("partitions", [1, 6, 7, 12])
def test_uniform_gives_every_partition_to_one_member_and_balances_to_one(
    members: int, partitions: int
) -> None:
    topics = {T: partitions}
    result = uniform({f"m{i}": spec(T) for i in range(members)}, topics)

    assert_each_partition_once(result, topics)
    sizes = counts(result).values()
    assert max(sizes) - min(sizes) <= 1


def test_uniform_moves_only_what_a_joining_member_must_take() -> None:
    topics = {T: 6}
    first = uniform({"a": spec(T), "b": spec(T)}, topics)

    second = uniform(
        {"a": spec(T, current=first["a"]), "b": spec(T, current=first["b"]), "c": spec(T)},
        topics,
    )

    assert counts(second) == {"a": 2, "b": 2, "c": 2}
    assert second["a"][T] <= first["a"][T]
    assert second["b"][T] <= first["b"][T]
    assert_each_partition_once(second, topics)


def test_uniform_keeps_everyone_in_place_when_a_member_leaves_except_its_partitions() -> None:
    topics = {T: 6}
    three = uniform({"a": spec(T), "b": spec(T), "c": spec(T)}, topics)

    two = uniform({"a": spec(T, current=three["a"]), "b": spec(T, current=three["b"])}, topics)

    assert three["a"][T] <= two["a"][T]
    assert three["b"][T] <= two["b"][T]
    assert counts(two) == {"a": 3, "b": 3}


def test_uniform_with_different_subscriptions_gives_each_topic_only_to_its_subscribers() -> None:
    topics = {T: 4, U: 2}
    result = uniform({"a": spec(T), "b": spec(T, U), "c": spec(U)}, topics)

    assert_each_partition_once(result, topics)
    assert U not in result["a"]
    assert T not in result["c"]
    assert max(counts(result).values()) - min(counts(result).values()) <= 1


def test_uniform_ignores_partitions_of_topics_that_are_gone() -> None:
    gone = uuid.UUID(int=9)
    result = uniform({"a": spec(T, current={gone: frozenset({0}), T: frozenset({0})})}, {T: 2})

    assert result == {"a": {T: frozenset({0, 1})}}


def test_range_gives_contiguous_ranges_the_first_members_one_more() -> None:
    result = range_({"b": spec(T), "a": spec(T), "c": spec(T)}, {T: 7})

    assert result["a"][T] == frozenset({0, 1, 2})
    assert result["b"][T] == frozenset({3, 4})
    assert result["c"][T] == frozenset({5, 6})


def test_range_gives_co_partitioned_topics_the_same_numbers() -> None:
    result = range_({"a": spec(T, U), "b": spec(T, U)}, {T: 4, U: 4})

    assert result["a"][T] == result["a"][U] == frozenset({0, 1})
    assert result["b"][T] == result["b"][U] == frozenset({2, 3})


def test_assignors_with_no_members_assign_nothing() -> None:
    assert uniform({}, {T: 3}) == {}
    assert range_({}, {T: 3}) == {}
