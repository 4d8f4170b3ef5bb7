"""Static membership (KIP-345): a restarted client with a group.instance.id takes its old place."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from coordinator_fixtures import (
    CoordinatorEnv,
    E,
    consumer_subscription,
    coordinator_env,
    offset,
    within,
)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[CoordinatorEnv]:
    async with coordinator_env(tmp_path / "data") as built:
        yield built


async def test_a_static_follower_rejoining_takes_its_old_place_without_a_rebalance(
    env: CoordinatorEnv,
) -> None:
    leader, follower = await env.stable_group("g", 2, instances=["i-a", "i-b"])
    instance = env.instance[follower.member_id]
    assert instance is not None
    back = await within(env.join("g", instance=instance))
    assert back.error is E.none
    assert back.member_id != follower.member_id
    assert back.generation == follower.generation
    assert back.leader == leader.member_id
    assert back.members == ()
    assert env.state("g") == "Stable"
    assert env.heartbeat("g", leader) is E.none  # nobody is asked to rebalance
    synced = await within(env.sync("g", back))
    assert synced.error is E.none
    assert synced.assignment == follower.member_id.encode()  # the old member's assignment
    group = env.coordinator.groups["g"]
    assert group.static_members[instance] == back.member_id
    assert set(group.members) == {leader.member_id, back.member_id}


async def test_the_replaced_member_id_is_fenced(env: CoordinatorEnv) -> None:
    _leader, follower = await env.stable_group("g", 2, instances=["i-a", "i-b"])
    instance = env.instance[follower.member_id]
    back = await within(env.join("g", instance=instance))
    assert back.error is E.none
    gen = follower.generation
    coordinator = env.coordinator
    assert coordinator.heartbeat("g", gen, follower.member_id, instance) is E.fenced_instance_id
    synced = await within(
        coordinator.sync_group("g", gen, follower.member_id, instance, None, None, {})
    )
    assert synced.error is E.fenced_instance_id
    committed = await env.commit(
        "g", {("t", 0): offset(5)}, generation=gen, member_id=follower.member_id, instance=instance
    )
    assert committed == {("t", 0): E.fenced_instance_id}
    rejoined = await within(env.join("g", follower.member_id, instance=instance))
    assert rejoined.error is E.fenced_instance_id
    # The new holder of the instance id is fine.
    assert env.heartbeat("g", back) is E.none
    committed = await env.commit(
        "g", {("t", 0): offset(5)}, generation=gen, member_id=back.member_id, instance=instance
    )
    assert committed == {("t", 0): E.none}


async def test_a_static_leader_rejoining_is_told_to_skip_the_assignment(
    env: CoordinatorEnv,
) -> None:
    # KIP-814: the returning leader learns the members (so it can watch their
    # subscriptions) but must not assign again; nobody else notices.
    leader, follower = await env.stable_group("g", 2, instances=["i-a", "i-b"])
    instance = env.instance[leader.member_id]
    back = await within(env.join("g", instance=instance))
    assert back.error is E.none
    assert back.skip_assignment
    assert back.generation == leader.generation
    assert back.leader == back.member_id != leader.member_id
    assert {m[0] for m in back.members} == {back.member_id, follower.member_id}
    assert env.state("g") == "Stable"
    assert env.heartbeat("g", follower) is E.none
    synced = await within(env.sync("g", back))
    assert synced.error is E.none
    assert synced.assignment == leader.member_id.encode()  # the old leader's assignment


async def test_a_static_member_rejoining_with_new_metadata_keeps_the_generation(
    env: CoordinatorEnv,
) -> None:
    # As in Kafka, only a change of the group's selected protocol forces a
    # rebalance; a new subscription is the leader's to notice in the metadata.
    leader, follower = await env.stable_group("g", 2, instances=["i-a", "i-b"])
    instance = env.instance[follower.member_id]
    changed = [("range", consumer_subscription("t", "u"))]
    back = await within(env.join("g", instance=instance, protocols=changed))
    assert back.error is E.none
    assert not back.skip_assignment
    assert back.generation == follower.generation
    assert env.state("g") == "Stable"
    described = env.coordinator.describe_group("g")
    metadata = {m.member_id: m.metadata_for("range") for m in described.members}
    assert metadata[back.member_id] == consumer_subscription("t", "u")
    assert env.heartbeat("g", leader) is E.none


async def test_a_static_member_changing_the_selected_protocol_triggers_a_rebalance(
    env: CoordinatorEnv,
) -> None:
    both = [("range", consumer_subscription("t")), ("roundrobin", consumer_subscription("t"))]
    flipped = list(reversed(both))
    joined = [
        env.join("g", instance="i-a", protocols=both),
        env.join("g", instance="i-b", protocols=both),
        env.join("g", instance="i-c", protocols=flipped),
    ]
    first = list(await within(asyncio.gather(*joined)))
    assert {j.protocol_name for j in first} == {"range"}
    by_instance = {env.instance[j.member_id]: j for j in first}
    back = env.join("g", instance="i-b", protocols=flipped)  # now roundrobin has two votes
    await env.settle()
    assert env.state("g") == "PreparingRebalance"
    a, c = by_instance["i-a"], by_instance["i-c"]
    others = [
        env.join("g", a.member_id, instance="i-a", protocols=both),
        env.join("g", c.member_id, instance="i-c", protocols=flipped),
    ]
    again = list(await within(asyncio.gather(back, *others)))
    assert {j.error for j in again} == {E.none}
    assert {j.generation for j in again} == {first[0].generation + 1}
    assert {j.protocol_name for j in again} == {"roundrobin"}


async def test_a_static_member_replaced_while_waiting_in_a_join_is_fenced(
    env: CoordinatorEnv,
) -> None:
    leader, b, c = await env.stable_group("g", 3, instances=["i-a", "i-b", "i-c"])
    instance_b = env.instance[b.member_id]
    instance_c = env.instance[c.member_id]
    leader_rejoin = env.join("g", leader.member_id, instance=env.instance[leader.member_id])
    old_b = env.join("g", b.member_id, instance=instance_b)
    await env.settle()
    new_b = env.join("g", instance=instance_b)
    assert (await within(old_b)).error is E.fenced_instance_id
    await env.settle()
    assert not new_b.done()  # still a rebalance, waiting for c
    await within(env.join("g", c.member_id, instance=instance_c))
    leader_result = await within(leader_rejoin)
    new_b_result = await within(new_b)
    assert new_b_result.generation == leader_result.generation == leader.generation + 1
    assert {m[0] for m in leader_result.members} == {
        leader.member_id,
        new_b_result.member_id,
        c.member_id,
    }


async def test_a_static_member_replaced_while_completing_triggers_a_rebalance(
    env: CoordinatorEnv,
) -> None:
    leader, follower = await env.stable_group("g", 2, instances=["i-a", "i-b"], assign=False)
    waiting = env.sync("g", follower)
    await env.settle()
    back = env.join("g", instance=env.instance[follower.member_id])
    assert (await within(waiting)).error is E.fenced_instance_id
    await env.settle()
    assert env.state("g") == "PreparingRebalance"
    await within(env.join("g", leader.member_id, instance=env.instance[leader.member_id]))
    assert (await within(back)).generation == leader.generation + 1


async def test_a_static_member_whose_session_expires_is_removed(env: CoordinatorEnv) -> None:
    leader, follower = await env.stable_group("g", 2, instances=["i-a", "i-b"], session_ms=400)
    group = env.coordinator.groups["g"]
    # The leader heartbeats at a tenth of its session, so a busy machine's stalls do not
    # expire it too; the silent follower expires.
    deadline = asyncio.get_running_loop().time() + 3
    while follower.member_id in group.members and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.04)
        env.heartbeat("g", leader)
    assert follower.member_id not in group.members
    assert env.instance[follower.member_id] not in group.static_members
    assert env.state("g") == "PreparingRebalance"


async def test_a_static_rejoin_of_an_unknown_instance_is_a_new_member(
    env: CoordinatorEnv,
) -> None:
    (leader,) = await env.stable_group("g", 1, instances=["i-a"])
    newcomer = env.join("g", instance="i-new")
    await env.settle()
    assert env.state("g") == "PreparingRebalance"
    await within(env.join("g", leader.member_id, instance="i-a"))
    result = await within(newcomer)
    assert result.error is E.none
    assert env.coordinator.groups["g"].static_members["i-new"] == result.member_id


async def test_a_new_static_member_is_never_asked_for_a_member_id_first(
    env: CoordinatorEnv,
) -> None:
    # KIP-394's MEMBER_ID_REQUIRED is for dynamic members: a static one is known
    # by its instance id already.
    joined = await within(env.join("g", instance="i-a", require_known=True))
    assert joined.error is E.none
    assert joined.generation == 1
    assert env.coordinator.groups["g"].pending_members == {}
