"""Committed offsets, and listing, describing and deleting groups.

OffsetCommit checks follow Kafka's classic coordinator: a "simple" commit
(generation -1, no member id) is for groups without members; a member's
commit must carry its member id and the current generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from coordinator_fixtures import (
    CONFIG,
    NOW,
    CoordinatorEnv,
    E,
    consumer_subscription,
    coordinator_env,
    offset,
    within,
)
from shoal.broker.coordinator.group import CommittedOffset


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[CoordinatorEnv]:
    async with coordinator_env(tmp_path / "data") as built:
        yield built


# -- simple commits -----------------------------------------------------------------


async def test_a_simple_commit_creates_a_group_without_members(env: CoordinatorEnv) -> None:
    stored = CommittedOffset(42, 3, "from-admin", NOW + 5)
    assert await env.commit("simple", {("t", 0): stored}) == {("t", 0): E.none}
    code, found = env.coordinator.fetch_offsets("simple", [("t", 0)])
    assert code is E.none
    assert found == {("t", 0): stored}
    described = env.coordinator.describe_group("simple")
    assert (described.state, described.protocol_type, described.members) == ("Empty", "", ())


async def test_a_simple_commit_to_a_group_that_emptied_is_accepted(env: CoordinatorEnv) -> None:
    (leader,) = await env.stable_group("g", 1)
    env.coordinator.leave_group("g", [(leader.member_id, None)])
    assert env.state("g") == "Empty"
    assert await env.commit("g", {("t", 0): offset(7)}) == {("t", 0): E.none}


async def test_a_simple_commit_to_a_group_with_members_is_refused(env: CoordinatorEnv) -> None:
    await env.stable_group("g", 1)
    assert await env.commit("g", {("t", 0): offset(7)}) == {("t", 0): E.unknown_member_id}
    assert env.coordinator.fetch_offsets("g", [("t", 0)])[1] == {("t", 0): None}


async def test_a_commit_with_a_generation_to_an_unknown_group_is_illegal(
    env: CoordinatorEnv,
) -> None:
    result = await env.commit("nowhere", {("t", 0): offset(1)}, generation=1, member_id="m")
    assert result == {("t", 0): E.illegal_generation}
    assert "nowhere" not in env.coordinator.groups


async def test_a_commit_to_an_empty_group_id_is_invalid(env: CoordinatorEnv) -> None:
    assert await env.commit("", {("t", 0): offset(1)}) == {("t", 0): E.invalid_group_id}


# -- commits from members ------------------------------------------------------------


async def test_a_member_commits_with_its_generation_and_member_id(env: CoordinatorEnv) -> None:
    _leader, follower = await env.stable_group("g", 2)
    result = await env.commit(
        "g",
        {("t", 0): offset(10), ("t", 1): offset(11)},
        generation=follower.generation,
        member_id=follower.member_id,
    )
    assert result == {("t", 0): E.none, ("t", 1): E.none}
    _, found = env.coordinator.fetch_offsets("g", None)
    assert {tp: c.offset for tp, c in found.items()} == {("t", 0): 10, ("t", 1): 11}


async def test_a_commit_from_another_generation_is_illegal(env: CoordinatorEnv) -> None:
    (leader,) = await env.stable_group("g", 1)
    result = await env.commit(
        "g", {("t", 0): offset(1)}, generation=leader.generation + 1, member_id=leader.member_id
    )
    assert result == {("t", 0): E.illegal_generation}


async def test_a_commit_from_an_unknown_member_is_refused(env: CoordinatorEnv) -> None:
    (leader,) = await env.stable_group("g", 1)
    result = await env.commit(
        "g", {("t", 0): offset(1)}, generation=leader.generation, member_id="ghost"
    )
    assert result == {("t", 0): E.unknown_member_id}


async def test_a_commit_while_completing_a_rebalance_is_told_to_wait(
    env: CoordinatorEnv,
) -> None:
    (leader,) = await env.stable_group("g", 1, assign=False)
    result = await env.commit(
        "g", {("t", 0): offset(1)}, generation=leader.generation, member_id=leader.member_id
    )
    assert result == {("t", 0): E.rebalance_in_progress}


async def test_a_stale_commit_while_completing_a_rebalance_is_an_illegal_generation(
    env: CoordinatorEnv,
) -> None:
    # Kafka validates the member and generation before looking at the state.
    leader, follower = await env.stable_group("g", 2)
    rejoins = [env.join("g", leader.member_id), env.join("g", follower.member_id)]
    await within(asyncio.gather(*rejoins))
    assert env.state("g") == "CompletingRebalance"
    stale = await env.commit(
        "g", {("t", 0): offset(1)}, generation=leader.generation, member_id=leader.member_id
    )
    assert stale == {("t", 0): E.illegal_generation}
    unknown = await env.commit(
        "g", {("t", 0): offset(1)}, generation=leader.generation + 1, member_id="ghost"
    )
    assert unknown == {("t", 0): E.unknown_member_id}


async def test_a_member_may_commit_while_a_rebalance_is_prepared(env: CoordinatorEnv) -> None:
    # Kafka lets the current generation commit during PreparingRebalance: the
    # heartbeat, not the commit, tells it to rejoin.
    leader, follower = await env.stable_group("g", 2)
    env.join("g", leader.member_id)
    await env.settle()
    assert env.state("g") == "PreparingRebalance"
    result = await env.commit(
        "g", {("t", 0): offset(3)}, generation=follower.generation, member_id=follower.member_id
    )
    assert result == {("t", 0): E.none}


# -- what each partition may be refused for ----------------------------------------------


async def test_offsets_of_unknown_topics_or_partitions_are_refused_one_by_one(
    env: CoordinatorEnv,
) -> None:
    result = await env.commit(
        "g", {("t", 0): offset(1), ("missing", 0): offset(2), ("t", 99): offset(3)}
    )
    assert result == {
        ("t", 0): E.none,
        ("missing", 0): E.unknown_topic_or_partition,
        ("t", 99): E.unknown_topic_or_partition,
    }
    _, found = env.coordinator.fetch_offsets("g", None)
    assert list(found) == [("t", 0)]


async def test_metadata_longer_than_the_limit_is_refused(env: CoordinatorEnv) -> None:
    limit = CONFIG.offset_metadata_max_bytes
    result = await env.commit(
        "g", {("t", 0): offset(1, "m" * limit), ("t", 1): offset(2, "m" * (limit + 1))}
    )
    assert result == {("t", 0): E.none, ("t", 1): E.offset_metadata_too_large}
    _, found = env.coordinator.fetch_offsets("g", [("t", 0), ("t", 1)])
    assert found[("t", 1)] is None
    stored = found[("t", 0)]
    assert stored is not None and stored.metadata == "m" * limit


# -- fetching --------------------------------------------------------------------------------


async def test_fetch_returns_none_for_partitions_without_a_commit(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(5)})
    code, found = env.coordinator.fetch_offsets("g", [("t", 0), ("t", 1), ("u", 0)])
    assert code is E.none
    assert found == {("t", 0): offset(5), ("t", 1): None, ("u", 0): None}


async def test_fetch_of_all_partitions_returns_every_commit(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(5), ("u", 2): offset(6, "x", epoch=4)})
    code, found = env.coordinator.fetch_offsets("g", None)
    assert code is E.none
    assert found == {("t", 0): offset(5), ("u", 2): offset(6, "x", epoch=4)}


async def test_fetch_of_an_unknown_group_finds_nothing(env: CoordinatorEnv) -> None:
    assert env.coordinator.fetch_offsets("nowhere", [("t", 0)]) == (E.none, {("t", 0): None})
    assert env.coordinator.fetch_offsets("nowhere", None) == (E.none, {})
    assert env.coordinator.fetch_offsets("", None) == (E.invalid_group_id, {})


async def test_a_later_commit_replaces_the_earlier_one(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(5, "first")})
    await env.commit("g", {("t", 0): offset(9, "second", at=NOW + 1)})
    assert env.coordinator.fetch_offsets("g", [("t", 0)])[1] == {
        ("t", 0): offset(9, "second", at=NOW + 1)
    }


# -- deleting offsets --------------------------------------------------------------------


async def test_offsets_of_topics_a_stable_consumer_group_subscribes_to_are_not_deleted(
    env: CoordinatorEnv,
) -> None:
    (leader,) = await env.stable_group(
        "g", 1, protocols=[("range", consumer_subscription("t", "v"))]
    )
    await env.commit(
        "g",
        {("t", 0): offset(1), ("u", 0): offset(2), ("v", 0): offset(3)},
        generation=leader.generation,
        member_id=leader.member_id,
    )
    code, results = await env.coordinator.delete_offsets("g", [("t", 0), ("u", 0), ("u", 5)])
    assert code is E.none
    assert results == {
        ("t", 0): E.group_subscribed_to_topic,
        ("u", 0): E.none,
        ("u", 5): E.none,
    }
    _, found = env.coordinator.fetch_offsets("g", None)
    assert set(found) == {("t", 0), ("v", 0)}


async def test_an_empty_group_may_delete_any_offset(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(1), ("u", 0): offset(2)})
    code, results = await env.coordinator.delete_offsets("g", [("t", 0)])
    assert (code, results) == (E.none, {("t", 0): E.none})
    assert set(env.coordinator.fetch_offsets("g", None)[1]) == {("u", 0)}


async def test_deleting_offsets_of_an_unknown_group_is_group_id_not_found(
    env: CoordinatorEnv,
) -> None:
    assert await env.coordinator.delete_offsets("nowhere", [("t", 0)]) == (
        E.group_id_not_found,
        {},
    )


async def test_deleting_offsets_of_a_non_consumer_group_with_members_is_refused(
    env: CoordinatorEnv,
) -> None:
    # Kafka cannot tell what a non-consumer protocol uses, so it refuses the whole
    # request with NON_EMPTY_GROUP while the group has members.
    (member,) = await env.stable_group(
        "connect", 1, protocol_type="connect", protocols=[("v1", b"cfg")]
    )
    await env.commit(
        "connect", {("t", 0): offset(1)}, generation=member.generation, member_id=member.member_id
    )
    code, results = await env.coordinator.delete_offsets("connect", [("t", 0)])
    assert (code, results) == (E.non_empty_group, {})
    assert env.coordinator.fetch_offsets("connect", [("t", 0)])[1] == {("t", 0): offset(1)}


# -- deleting groups --------------------------------------------------------------------------


async def test_a_group_with_members_cannot_be_deleted(env: CoordinatorEnv) -> None:
    await env.stable_group("g", 1)
    assert await env.coordinator.delete_group("g") is E.non_empty_group
    assert env.state("g") == "Stable"


async def test_an_unknown_group_cannot_be_deleted(env: CoordinatorEnv) -> None:
    assert await env.coordinator.delete_group("nowhere") is E.group_id_not_found


async def test_deleting_an_empty_group_forgets_it_and_its_offsets(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(1)})
    assert await env.coordinator.delete_group("g") is E.none
    assert env.state("g") == "Dead"
    assert env.coordinator.fetch_offsets("g", None) == (E.none, {})
    assert [g.group_id for g in env.coordinator.list_groups(set(), set())] == []
    assert await env.coordinator.delete_group("g") is E.group_id_not_found


async def test_a_deleted_group_can_be_used_again(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(1)})
    await env.coordinator.delete_group("g")
    joined = await within(env.join("g"))
    assert joined.error is E.none
    assert joined.generation == 1


# -- listing and describing -------------------------------------------------------------------


async def test_list_groups_filters_by_state(env: CoordinatorEnv) -> None:
    await env.stable_group("stable", 1)
    await env.commit("empty", {("t", 0): offset(1)})
    await env.stable_group("completing", 1, assign=False)

    def listed(states: set[str], types: set[str] | None = None) -> set[str]:
        return {g.group_id for g in env.coordinator.list_groups(states, types or set())}

    assert listed(set()) == {"stable", "empty", "completing"}
    assert listed({"Stable"}) == {"stable"}
    assert listed({"empty", "COMPLETINGREBALANCE"}) == {"empty", "completing"}
    assert listed({"Dead"}) == set()
    assert listed(set(), {"classic"}) == {"stable", "empty", "completing"}
    assert listed(set(), {"consumer"}) == set()  # KIP-848 groups; all of these are classic


async def test_describe_of_an_unknown_group_is_dead(env: CoordinatorEnv) -> None:
    described = env.coordinator.describe_group("nowhere")
    assert described.error is E.none
    assert described.state == "Dead"
    assert described.members == ()


async def test_describe_shows_the_protocol_and_members(env: CoordinatorEnv) -> None:
    leader, follower = await env.stable_group("g", 2)
    described = env.coordinator.describe_group("g")
    assert (described.error, described.state) == (E.none, "Stable")
    assert (described.protocol_type, described.protocol_name) == ("consumer", "range")
    by_id = {m.member_id: m for m in described.members}
    assert set(by_id) == {leader.member_id, follower.member_id}
    assert by_id[follower.member_id].assignment == follower.member_id.encode()
    assert by_id[follower.member_id].client_id == "client"
