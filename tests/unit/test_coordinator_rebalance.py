"""The classic rebalance protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup and their timers.

Each test drives the coordinator the way clients do (tasks awaiting their
JoinGroup/SyncGroup answers) over a real __consumer_offsets log; timeouts are
tens of milliseconds of real time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from coordinator_fixtures import (
    CONFIG,
    CoordinatorEnv,
    E,
    consumer_subscription,
    coordinator_env,
    settings,
    within,
)
from shoal.broker.coordinator.group import GroupState

DELAY_S = CONFIG.initial_rebalance_delay_ms / 1000


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[CoordinatorEnv]:
    async with coordinator_env(tmp_path / "data") as built:
        yield built


def now() -> float:
    return asyncio.get_running_loop().time()


# -- the first rebalance of an empty group ---------------------------------------------


async def test_first_member_waits_the_initial_delay_then_leads_generation_1(
    env: CoordinatorEnv,
) -> None:
    started = now()
    joined = await within(env.join("g"))
    assert now() - started >= DELAY_S * 0.9
    assert joined.error is E.none
    assert joined.generation == 1
    assert joined.leader == joined.member_id
    assert joined.member_id.startswith("client-")
    assert (joined.protocol_type, joined.protocol_name) == ("consumer", "range")
    assert joined.members == ((joined.member_id, None, consumer_subscription("t")),)
    assert env.state("g") == "CompletingRebalance"


async def test_members_joining_during_the_initial_delay_are_all_in_generation_1(
    env: CoordinatorEnv,
) -> None:
    first = env.join("g", protocols=[("range", b"meta-1")])
    await asyncio.sleep(DELAY_S / 3)
    second = env.join("g", protocols=[("range", b"meta-2")])
    third = env.join("g", protocols=[("range", b"meta-3")])
    results = await within(asyncio.gather(first, second, third))
    assert {r.error for r in results} == {E.none}
    assert {r.generation for r in results} == {1}
    leader_id = results[0].member_id
    assert {r.leader for r in results} == {leader_id}
    leader, *followers = results
    assert sorted(leader.members) == sorted(
        [(r.member_id, None, f"meta-{i}".encode()) for i, r in enumerate(results, 1)]
    )
    assert all(f.members == () for f in followers)


async def test_the_initial_delay_is_extended_while_members_keep_arriving(
    env: CoordinatorEnv,
) -> None:
    started = now()
    first = env.join("g")
    await asyncio.sleep(DELAY_S / 2)
    second = env.join("g")
    await within(asyncio.gather(first, second))
    # The first tick saw a new member, so the join waited one more delay.
    assert now() - started >= 2 * DELAY_S * 0.9


async def test_the_initial_delay_stops_at_the_rebalance_timeout(tmp_path: Path) -> None:
    # remaining = rebalance timeout - delay = 0: no extension, however many arrive.
    # A delay of its own, a second long: what tells "no extension" (one delay)
    # from an extension (two) must outlast a loaded machine's stalls, which
    # reached 0.4 s in CI against the 30 ms of the other tests.
    delay_ms = 1000
    async with coordinator_env(
        tmp_path / "data", settings(initial_rebalance_delay_ms=delay_ms)
    ) as env:
        started = now()
        first = env.join("g", rebalance_ms=delay_ms)
        await asyncio.sleep(delay_ms / 2000)
        second = env.join("g", rebalance_ms=delay_ms)
        results = await within(asyncio.gather(first, second), seconds=5)
        assert {r.generation for r in results} == {1}
        assert now() - started < 1.8 * delay_ms / 1000


# -- KIP-394: member ids handed out before joining ------------------------------------------


async def test_a_join_requiring_a_known_member_id_gets_member_id_required(
    env: CoordinatorEnv,
) -> None:
    first = await within(env.join("g", require_known=True))
    assert first.error is E.member_id_required
    assert first.member_id
    joined = await within(env.join("g", first.member_id))
    assert joined.error is E.none
    assert joined.member_id == first.member_id
    assert joined.generation == 1
    assert joined.leader == first.member_id


async def test_a_pending_member_id_unused_within_the_session_timeout_is_dropped(
    env: CoordinatorEnv,
) -> None:
    first = await within(env.join("g", require_known=True, session_ms=30))
    assert first.error is E.member_id_required
    await asyncio.sleep(0.08)
    assert env.coordinator.groups["g"].pending_members == {}
    late = await within(env.join("g", first.member_id))
    assert late.error is E.unknown_member_id


async def test_a_pending_member_id_holds_a_rebalance_until_it_expires(
    env: CoordinatorEnv,
) -> None:
    (leader,) = await env.stable_group("g", 1)
    pending = await within(env.join("g", require_known=True, session_ms=60))
    assert pending.error is E.member_id_required
    assert env.state("g") == "Stable"  # handing out an id is not a rebalance
    started = now()
    rejoined = await within(env.join("g", leader.member_id))  # the leader's rejoin rebalances
    assert now() - started >= 0.05
    assert rejoined.error is E.none
    assert rejoined.generation == 2
    assert [m[0] for m in rejoined.members] == [leader.member_id]


async def test_a_pending_member_that_joins_completes_the_rebalance(env: CoordinatorEnv) -> None:
    (leader,) = await env.stable_group("g", 1)
    pending = await within(env.join("g", require_known=True))
    rejoin = env.join("g", leader.member_id)
    await env.settle()
    assert not rejoin.done()
    joined = await within(env.join("g", pending.member_id))
    leader_again = await within(rejoin)
    assert joined.generation == leader_again.generation == 2
    assert {m[0] for m in leader_again.members} == {leader.member_id, pending.member_id}


# -- what a JoinGroup may be refused for ----------------------------------------------------


async def test_protocol_selection_is_by_votes_among_protocols_all_members_support(
    env: CoordinatorEnv,
) -> None:
    results = await within(
        asyncio.gather(
            env.join("g", protocols=[("sticky", b"s"), ("range", b"r")]),
            env.join("g", protocols=[("range", b"r"), ("roundrobin", b"rr"), ("sticky", b"s")]),
            env.join("g", protocols=[("sticky", b"s"), ("range", b"r"), ("roundrobin", b"rr")]),
        )
    )
    assert {r.protocol_name for r in results} == {"sticky"}
    leader = next(r for r in results if r.members)
    assert {metadata for _, _, metadata in leader.members} == {b"s"}


async def test_a_member_with_no_protocol_in_common_is_refused(env: CoordinatorEnv) -> None:
    await env.stable_group("g", 1)
    refused = await within(env.join("g", protocols=[("sticky", b"")]))
    assert refused.error is E.inconsistent_group_protocol
    assert env.state("g") == "Stable"


async def test_a_member_of_another_protocol_type_is_refused(env: CoordinatorEnv) -> None:
    await env.stable_group("g", 1)
    refused = await within(env.join("g", protocol_type="connect"))
    assert refused.error is E.inconsistent_group_protocol


async def test_a_member_with_no_protocols_is_refused_even_by_an_empty_group(
    env: CoordinatorEnv,
) -> None:
    refused = await within(env.join("g", protocols=[]))
    assert refused.error is E.inconsistent_group_protocol


@pytest.mark.parametrize(
    "session_ms", [CONFIG.min_session_timeout_ms - 1, CONFIG.max_session_timeout_ms + 1]
)
async def test_a_session_timeout_outside_the_configured_bounds_is_refused(
    env: CoordinatorEnv, session_ms: int
) -> None:
    refused = await within(env.join("g", session_ms=session_ms))
    assert refused.error is E.invalid_session_timeout
    assert "g" not in env.coordinator.groups


async def test_a_session_timeout_at_the_maximum_is_accepted(env: CoordinatorEnv) -> None:
    joined = await within(env.join("g", session_ms=CONFIG.max_session_timeout_ms))
    assert joined.error is E.none


async def test_an_empty_group_id_is_invalid(env: CoordinatorEnv) -> None:
    refused = await within(env.join(""))
    assert refused.error is E.invalid_group_id


async def test_an_unknown_member_id_is_refused(env: CoordinatorEnv) -> None:
    assert (await within(env.join("nowhere", "ghost"))).error is E.unknown_member_id
    await env.stable_group("g", 1)
    assert (await within(env.join("g", "ghost"))).error is E.unknown_member_id


async def test_a_new_member_beyond_the_group_max_size_is_refused(tmp_path: Path) -> None:
    async with coordinator_env(tmp_path / "data", settings(max_size=2)) as env:
        await env.stable_group("g", 2)
        refused = await within(env.join("g"))
        assert refused.error is E.group_max_size_reached
        assert env.state("g") == "Stable"


# -- rejoining ---------------------------------------------------------------------------


async def test_a_stable_follower_rejoining_unchanged_gets_the_current_generation(
    env: CoordinatorEnv,
) -> None:
    leader, follower = await env.stable_group("g", 2)
    again = await within(env.join("g", follower.member_id))
    assert again.error is E.none
    assert again.generation == follower.generation
    assert again.leader == leader.member_id
    assert again.members == ()
    assert env.state("g") == "Stable"
    assert env.heartbeat("g", leader) is E.none


async def test_the_leader_rejoining_triggers_a_rebalance(env: CoordinatorEnv) -> None:
    leader, follower = await env.stable_group("g", 2)
    rejoin = env.join("g", leader.member_id)
    await env.settle()
    assert env.state("g") == "PreparingRebalance"
    assert env.heartbeat("g", follower) is E.rebalance_in_progress
    follower_again = await within(env.join("g", follower.member_id))
    leader_again = await within(rejoin)
    assert leader_again.generation == follower_again.generation == leader.generation + 1
    assert leader_again.leader == leader.member_id
    assert len(leader_again.members) == 2


async def test_a_follower_rejoining_with_new_metadata_triggers_a_rebalance(
    env: CoordinatorEnv,
) -> None:
    leader, follower = await env.stable_group("g", 2)
    changed = [("range", consumer_subscription("t", "u"))]
    rejoin = env.join("g", follower.member_id, protocols=changed)
    await env.settle()
    assert env.state("g") == "PreparingRebalance"
    leader_again = await within(env.join("g", leader.member_id))
    await within(rejoin)
    assert (follower.member_id, None, consumer_subscription("t", "u")) in leader_again.members


async def test_a_rejoin_while_completing_returns_the_same_join_answer(
    env: CoordinatorEnv,
) -> None:
    leader, _follower = await env.stable_group("g", 2, assign=False)
    assert env.state("g") == "CompletingRebalance"
    again = await within(env.join("g", leader.member_id))
    assert again.generation == leader.generation
    assert sorted(again.members) == sorted(leader.members)
    assert env.state("g") == "CompletingRebalance"


# -- SyncGroup -------------------------------------------------------------------------------


async def test_the_leaders_sync_makes_the_group_stable_and_hands_out_assignments(
    env: CoordinatorEnv,
) -> None:
    leader, a, b = await env.stable_group("g", 3, assign=False)
    waiting = env.sync("g", a)
    await env.settle()
    assert not waiting.done()  # followers wait for the leader's assignment
    plan = {leader.member_id: b"for-leader", a.member_id: b"for-a"}
    from_leader = await within(env.sync("g", leader, plan))
    assert from_leader.error is E.none
    assert from_leader.assignment == b"for-leader"
    assert (await within(waiting)).assignment == b"for-a"
    assert env.state("g") == "Stable"
    late = await within(env.sync("g", b))  # b was left out of the plan
    assert late.error is E.none
    assert late.assignment == b""
    assert (late.protocol_type, late.protocol_name) == ("consumer", "range")


async def test_a_sync_in_a_stable_group_returns_the_assignment_again(
    env: CoordinatorEnv,
) -> None:
    _leader, follower = await env.stable_group("g", 2)
    again = await within(env.sync("g", follower))
    assert again.assignment == follower.member_id.encode()


async def test_a_sync_of_another_generation_is_illegal(env: CoordinatorEnv) -> None:
    leader, follower = await env.stable_group("g", 2, assign=False)
    stale = await within(env.sync("g", follower, generation=leader.generation - 1))
    assert stale.error is E.illegal_generation


async def test_a_sync_from_an_unknown_member_is_refused(env: CoordinatorEnv) -> None:
    (leader,) = await env.stable_group("g", 1, assign=False)
    result = await within(
        env.coordinator.sync_group("g", leader.generation, "ghost", None, None, None, {})
    )
    assert result.error is E.unknown_member_id


async def test_a_sync_with_another_protocol_is_inconsistent(env: CoordinatorEnv) -> None:
    (leader,) = await env.stable_group("g", 1, assign=False)
    result = await within(
        env.coordinator.sync_group(
            "g", leader.generation, leader.member_id, None, "consumer", "sticky", {}
        )
    )
    assert result.error is E.inconsistent_group_protocol


async def test_a_sync_while_preparing_a_rebalance_is_told_so(env: CoordinatorEnv) -> None:
    leader, follower = await env.stable_group("g", 2)
    env.join("g", leader.member_id)
    await env.settle()
    result = await within(env.sync("g", follower))
    assert result.error is E.rebalance_in_progress


async def test_a_waiting_sync_is_told_when_a_new_member_restarts_the_rebalance(
    env: CoordinatorEnv,
) -> None:
    _leader, follower = await env.stable_group("g", 2, assign=False)
    waiting = env.sync("g", follower)
    await env.settle()
    env.join("g")
    assert (await within(waiting)).error is E.rebalance_in_progress
    assert env.state("g") == "PreparingRebalance"


# -- Heartbeat ------------------------------------------------------------------------------


async def test_heartbeat_answers(env: CoordinatorEnv) -> None:
    leader, follower = await env.stable_group("g", 2)
    assert env.heartbeat("g", follower) is E.none
    gen = follower.generation
    assert env.coordinator.heartbeat("g", gen + 1, follower.member_id, None) is (
        E.illegal_generation
    )
    assert env.coordinator.heartbeat("g", gen, "ghost", None) is E.unknown_member_id
    assert env.coordinator.heartbeat("nowhere", gen, "ghost", None) is E.unknown_member_id
    env.join("g", leader.member_id)
    await env.settle()
    assert env.heartbeat("g", follower) is E.rebalance_in_progress


async def test_heartbeat_while_completing_a_rebalance_is_fine(env: CoordinatorEnv) -> None:
    _leader, follower = await env.stable_group("g", 2, assign=False)
    assert env.heartbeat("g", follower) is E.none


# -- timeouts -------------------------------------------------------------------------------


async def test_a_member_whose_heartbeats_stop_is_removed_and_the_group_rebalances(
    env: CoordinatorEnv,
) -> None:
    leader, follower = await env.stable_group("g", 2, session_ms=400)
    group = env.coordinator.groups["g"]
    # The leader heartbeats at a tenth of its session (a busy machine's stalls must not
    # expire it too) until the silent follower has expired.
    deadline = now() + 3
    while follower.member_id in group.members and now() < deadline:
        await asyncio.sleep(0.04)
        env.heartbeat("g", leader)
    assert follower.member_id not in group.members
    assert env.heartbeat("g", leader) is E.rebalance_in_progress
    again = await within(env.join("g", leader.member_id, session_ms=400))
    assert again.generation == leader.generation + 1
    assert [m[0] for m in again.members] == [leader.member_id]
    assert env.heartbeat("g", follower) is E.unknown_member_id


async def test_a_member_that_heartbeats_stays(env: CoordinatorEnv) -> None:
    leader, follower = await env.stable_group("g", 2, session_ms=300)
    for _ in range(10):  # 0.5 s in all, heartbeats a sixth of a session apart
        await asyncio.sleep(0.05)
        assert env.heartbeat("g", leader) is E.none
        assert env.heartbeat("g", follower) is E.none
    assert env.state("g") == "Stable"


async def test_members_that_do_not_rejoin_within_the_rebalance_timeout_are_removed(
    env: CoordinatorEnv,
) -> None:
    leader, follower = await env.stable_group("g", 2, rebalance_ms=60)
    started = now()
    again = await within(env.join("g", leader.member_id, rebalance_ms=60))
    assert now() - started >= 0.05
    assert again.generation == leader.generation + 1
    assert [m[0] for m in again.members] == [leader.member_id]
    assert env.heartbeat("g", follower) is E.unknown_member_id


async def test_members_that_do_not_sync_within_the_rebalance_timeout_are_removed(
    env: CoordinatorEnv,
) -> None:
    _leader, follower = await env.stable_group("g", 2, rebalance_ms=60, assign=False)
    waiting = env.sync("g", follower)  # the follower syncs, the leader never does
    result = await within(waiting)
    assert result.error is E.rebalance_in_progress
    group = env.coordinator.groups["g"]
    assert list(group.members) == [follower.member_id]
    again = await within(env.join("g", follower.member_id, rebalance_ms=60))
    assert again.generation == follower.generation + 1
    assert again.leader == follower.member_id


async def test_a_follower_that_never_syncs_is_removed_even_after_the_leader_did(
    env: CoordinatorEnv,
) -> None:
    # Kafka's pending-sync expiry covers CompletingRebalance and Stable alike: the
    # leader's assignment does not excuse a follower that never asked for its own.
    leader, follower = await env.stable_group("g", 2, rebalance_ms=60, assign=False)
    await within(env.sync("g", leader, {leader.member_id: b"a", follower.member_id: b"b"}))
    assert env.state("g") == "Stable"
    group = env.coordinator.groups["g"]
    for _ in range(20):
        await asyncio.sleep(0.01)
        if follower.member_id not in group.members:
            break
        assert env.heartbeat("g", leader) is E.none
        assert env.heartbeat("g", follower) is E.none
    assert follower.member_id not in group.members
    assert env.heartbeat("g", leader) is E.rebalance_in_progress
    again = await within(env.join("g", leader.member_id, rebalance_ms=60))
    assert again.generation == leader.generation + 1
    assert [m[0] for m in again.members] == [leader.member_id]


async def test_members_that_all_synced_are_not_removed_after_the_rebalance_timeout(
    env: CoordinatorEnv,
) -> None:
    leader, follower = await env.stable_group("g", 2, rebalance_ms=40)
    await asyncio.sleep(0.08)
    assert env.state("g") == "Stable"
    assert set(env.coordinator.groups["g"].members) == {leader.member_id, follower.member_id}


# -- LeaveGroup ------------------------------------------------------------------------------


async def test_a_member_leaving_makes_the_others_rebalance(env: CoordinatorEnv) -> None:
    leader, follower = await env.stable_group("g", 2)
    code, results = env.coordinator.leave_group("g", [(follower.member_id, None)])
    assert code is E.none
    assert results == [(follower.member_id, None, E.none)]
    assert env.state("g") == "PreparingRebalance"
    again = await within(env.join("g", leader.member_id))
    assert again.generation == leader.generation + 1
    assert [m[0] for m in again.members] == [leader.member_id]


async def test_the_leader_leaving_hands_leadership_to_another_member(
    env: CoordinatorEnv,
) -> None:
    leader, follower = await env.stable_group("g", 2)
    env.coordinator.leave_group("g", [(leader.member_id, None)])
    again = await within(env.join("g", follower.member_id))
    assert again.leader == follower.member_id
    assert again.generation == leader.generation + 1


async def test_the_last_member_leaving_empties_the_group_and_bumps_its_generation(
    env: CoordinatorEnv,
) -> None:
    (leader,) = await env.stable_group("g", 1)
    _, results = env.coordinator.leave_group("g", [(leader.member_id, None)])
    assert results == [(leader.member_id, None, E.none)]
    group = env.coordinator.groups["g"]
    assert group.state is GroupState.EMPTY
    assert group.generation == leader.generation + 1
    assert group.protocol_name is None
    assert group.members == {}


async def test_leaving_in_a_batch_by_member_id_and_by_instance_id(env: CoordinatorEnv) -> None:
    a, b, c = await env.stable_group("g", 3, instances=["i-a", "i-b", None])
    dynamic = next(j for j in (a, b, c) if env.instance[j.member_id] is None)
    static = [j for j in (a, b, c) if j is not dynamic]
    by_instance = env.instance[static[0].member_id]
    code, results = env.coordinator.leave_group(
        "g",
        [
            (dynamic.member_id, None),
            ("", by_instance),
            ("ghost", None),
            ("", "no-such-instance"),
        ],
    )
    assert code is E.none
    assert results == [
        (dynamic.member_id, None, E.none),
        ("", by_instance, E.none),
        ("ghost", None, E.unknown_member_id),
        ("", "no-such-instance", E.unknown_member_id),
    ]
    assert list(env.coordinator.groups["g"].members) == [static[1].member_id]


async def test_leaving_with_an_instance_id_held_by_another_member_is_fenced(
    env: CoordinatorEnv,
) -> None:
    (member,) = await env.stable_group("g", 1, instances=["i-a"])
    _, results = env.coordinator.leave_group("g", [("someone-else", "i-a")])
    assert results == [("someone-else", "i-a", E.fenced_instance_id)]
    assert member.member_id in env.coordinator.groups["g"].members


async def test_leaving_an_unknown_group_is_an_unknown_member(env: CoordinatorEnv) -> None:
    code, results = env.coordinator.leave_group("nowhere", [("m", None)])
    assert code is E.none
    assert results == [("m", None, E.unknown_member_id)]


async def test_a_pending_member_can_leave(env: CoordinatorEnv) -> None:
    pending = await within(env.join("g", require_known=True))
    _, results = env.coordinator.leave_group("g", [(pending.member_id, None)])
    assert results == [(pending.member_id, None, E.none)]
    assert env.coordinator.groups["g"].pending_members == {}


async def test_a_member_waiting_in_a_join_that_leaves_is_answered(env: CoordinatorEnv) -> None:
    leader, _follower = await env.stable_group("g", 2)
    rejoin = env.join("g", leader.member_id)
    await env.settle()
    env.coordinator.leave_group("g", [(leader.member_id, None)])
    assert (await within(rejoin)).error is E.unknown_member_id
