"""Loading groups back from __consumer_offsets: what a new coordinator knows after a failover.

"Reload" is a second coordinator over the same partition (what a broker that
becomes the partition's leader does); "restart" also reopens the log from
disk. Records that Kafka itself may have written (older value versions,
record types this coordinator does not use) are appended by hand.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from coordinator_fixtures import (
    NOW,
    OFFSETS_TOPIC,
    CoordinatorEnv,
    E,
    consumer_subscription,
    coordinator_env,
    offset,
    within,
)
from shoal.broker.coordinator.group import CommittedOffset, GroupState
from shoal.broker.coordinator.records import (
    GroupValue,
    MemberValue,
    group_key,
    group_value,
    offset_key,
)

from shoal.records import BatchOptions, NewRecord, build_batch


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[CoordinatorEnv]:
    async with coordinator_env(tmp_path / "data") as built:
        yield built


def append(env: CoordinatorEnv, records: list[tuple[bytes, bytes | None]]) -> None:
    """Append records to __consumer_offsets-0 as some other writer (Kafka) would have."""
    partition = env.replicas.get(OFFSETS_TOPIC, 0)
    assert partition is not None
    batch = build_batch([NewRecord(k, v) for k, v in records], options=BatchOptions())
    partition.append_as_leader(batch, -1)


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def string(v: str) -> bytes:
    return i16(len(v.encode())) + v.encode()


# -- groups with members -------------------------------------------------------------


async def test_a_stable_group_comes_back_with_its_generation_members_and_assignments(
    env: CoordinatorEnv,
) -> None:
    leader, follower = await env.stable_group("g", 2)
    await env.commit(
        "g", {("t", 0): offset(5, "m")}, generation=leader.generation, member_id=leader.member_id
    )
    reloaded = await env.reload()
    described = reloaded.describe_group("g")
    assert (described.state, described.protocol_type, described.protocol_name) == (
        "Stable",
        "consumer",
        "range",
    )
    group = reloaded.groups["g"]
    assert group.generation == leader.generation
    assert group.leader_id == leader.member_id
    assert set(group.members) == {leader.member_id, follower.member_id}
    assert env.heartbeat("g", follower) is E.none
    again = await within(env.sync("g", follower))
    assert again.error is E.none
    assert again.assignment == follower.member_id.encode()
    assert reloaded.fetch_offsets("g", [("t", 0)])[1] == {("t", 0): offset(5, "m")}


async def test_a_loaded_follower_rejoining_unchanged_causes_no_rebalance(
    env: CoordinatorEnv,
) -> None:
    _leader, follower = await env.stable_group("g", 2)
    await env.reload()
    again = await within(env.join("g", follower.member_id))
    assert again.error is E.none
    assert again.generation == follower.generation
    assert env.state("g") == "Stable"


async def test_loaded_members_that_do_not_heartbeat_expire(env: CoordinatorEnv) -> None:
    leader, _follower = await env.stable_group("g", 2, session_ms=40, rebalance_ms=40)
    reloaded = await env.reload()
    group = reloaded.groups["g"]
    assert group.state is GroupState.STABLE
    for _ in range(30):
        await asyncio.sleep(0.01)
        if group.state is GroupState.EMPTY:
            break
    assert group.state is GroupState.EMPTY
    assert group.members == {}
    assert group.generation == leader.generation + 1


async def test_a_loaded_member_that_heartbeats_stays(env: CoordinatorEnv) -> None:
    # Ten heartbeats outlast three sessions; the session leaves room for a
    # loaded machine's scheduling stalls between two of them.
    (member,) = await env.stable_group("g", 1, session_ms=300)
    await env.reload()
    for _ in range(10):
        await asyncio.sleep(0.1)
        assert env.heartbeat("g", member) is E.none
    assert env.state("g") == "Stable"


async def test_an_emptied_group_comes_back_empty_with_its_generation(
    env: CoordinatorEnv,
) -> None:
    (member,) = await env.stable_group("g", 1)
    env.coordinator.leave_group("g", [(member.member_id, None)])
    await env.settle()
    reloaded = await env.reload()
    group = reloaded.groups["g"]
    assert group.state is GroupState.EMPTY
    assert group.generation == member.generation + 1
    assert group.protocol_type == "consumer"
    assert group.members == {}
    assert (await within(env.join("g"))).generation == member.generation + 2


async def test_a_replaced_static_member_comes_back_under_its_new_member_id(
    env: CoordinatorEnv,
) -> None:
    _leader, follower = await env.stable_group("g", 2, instances=["i-a", "i-b"])
    instance = env.instance[follower.member_id]
    assert instance is not None
    back = await within(env.join("g", instance=instance))
    reloaded = await env.reload()
    group = reloaded.groups["g"]
    assert group.static_members[instance] == back.member_id
    assert follower.member_id not in group.members
    assert group.members[back.member_id].assignment == follower.member_id.encode()


# -- offsets and tombstones --------------------------------------------------------------


async def test_offsets_of_a_simple_group_come_back(env: CoordinatorEnv) -> None:
    committed = {("t", 0): offset(1, "a", epoch=2), ("u", 3): offset(9, "b")}
    await env.commit("simple", committed)
    reloaded = await env.reload()
    assert reloaded.fetch_offsets("simple", None) == (E.none, committed)
    assert reloaded.describe_group("simple").state == "Empty"


async def test_the_latest_commit_of_a_partition_wins(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(1)})
    await env.commit("g", {("t", 0): offset(2, at=NOW + 1)})
    await env.commit("g", {("t", 0): offset(3, at=NOW + 2)})
    reloaded = await env.reload()
    assert reloaded.fetch_offsets("g", [("t", 0)])[1] == {("t", 0): offset(3, at=NOW + 2)}


async def test_deleted_offsets_stay_deleted(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(1), ("t", 1): offset(2)})
    await env.coordinator.delete_offsets("g", [("t", 0)])
    reloaded = await env.reload()
    assert reloaded.fetch_offsets("g", None) == (E.none, {("t", 1): offset(2)})


async def test_a_deleted_group_stays_deleted(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(1)})
    (member,) = await env.stable_group("h", 1)
    env.coordinator.leave_group("h", [(member.member_id, None)])
    await env.settle()
    assert await env.coordinator.delete_group("g") is E.none
    assert await env.coordinator.delete_group("h") is E.none
    reloaded = await env.reload()
    assert "g" not in reloaded.groups and "h" not in reloaded.groups
    assert reloaded.describe_group("h").state == "Dead"


async def test_a_group_deleted_as_soon_as_it_emptied_stays_deleted(env: CoordinatorEnv) -> None:
    # The emptied group's metadata is stored by a task; it must not land after
    # the deletion's tombstone and bring the group back.
    (member,) = await env.stable_group("g", 1)
    env.coordinator.leave_group("g", [(member.member_id, None)])
    assert await env.coordinator.delete_group("g") is E.none
    await env.settle()
    reloaded = await env.reload()
    assert "g" not in reloaded.groups


async def test_a_group_used_again_after_deletion_loads_only_its_new_offsets(
    env: CoordinatorEnv,
) -> None:
    await env.commit("g", {("t", 0): offset(1), ("t", 1): offset(2)})
    await env.coordinator.delete_group("g")
    await env.commit("g", {("u", 0): offset(3)})
    reloaded = await env.reload()
    assert reloaded.fetch_offsets("g", None) == (E.none, {("u", 0): offset(3)})


async def test_everything_survives_a_restart_from_disk(env: CoordinatorEnv) -> None:
    leader, follower = await env.stable_group("g", 2)
    await env.commit(
        "g", {("t", 0): offset(5)}, generation=leader.generation, member_id=leader.member_id
    )
    await env.commit("simple", {("u", 1): offset(6)})
    restarted = await env.restart()
    assert restarted.describe_group("g").state == "Stable"
    assert restarted.groups["g"].members[follower.member_id].assignment == (
        follower.member_id.encode()
    )
    assert restarted.fetch_offsets("g", None) == (E.none, {("t", 0): offset(5)})
    assert restarted.fetch_offsets("simple", None) == (E.none, {("u", 1): offset(6)})


# -- records that Kafka wrote ------------------------------------------------------------------


async def test_records_in_kafkas_older_versions_are_loaded(env: CoordinatorEnv) -> None:
    v0_group = (
        i16(0)
        + string("consumer")
        + struct.pack(">i", 4)
        + string("range")
        + string("m-1")
        + struct.pack(">i", 1)
        + string("m-1")
        + string("client")
        + string("/host")
        + struct.pack(">i", 30_000)
        + struct.pack(">i", len(consumer_subscription("t")))
        + consumer_subscription("t")
        + struct.pack(">i", 3)
        + b"abc"
    )
    v0_offset = i16(0) + struct.pack(">q", 11) + string("old") + struct.pack(">q", NOW)
    v1_offset = i16(1) + struct.pack(">q", 12) + string("") + struct.pack(">qq", NOW, NOW + 5_000)
    key_v0 = i16(0) + string("kafka") + string("t") + struct.pack(">i", 0)
    append(
        env,
        [
            (group_key("kafka"), v0_group),
            (key_v0, v0_offset),
            (offset_key("kafka", "t", 1), v1_offset),
            (i16(3) + string("kafka"), b"a KIP-848 record, not ours"),
        ],
    )
    reloaded = await env.reload()
    group = reloaded.groups["kafka"]
    assert (group.state, group.generation, group.protocol_name) == (GroupState.STABLE, 4, "range")
    member = group.members["m-1"]
    assert (member.session_timeout_ms, member.rebalance_timeout_ms) == (30_000, 30_000)
    assert member.assignment == b"abc"
    assert group.subscribed_topics() == {"t"}
    assert reloaded.fetch_offsets("kafka", None)[1] == {
        ("t", 0): CommittedOffset(11, -1, "old", NOW),
        ("t", 1): CommittedOffset(12, -1, "", NOW, NOW + 5_000),
    }


async def test_tombstones_written_by_another_coordinator_are_honoured(
    env: CoordinatorEnv,
) -> None:
    await env.commit("g", {("t", 0): offset(1), ("t", 1): offset(2)})
    await env.commit("gone", {("t", 0): offset(1)})
    append(
        env,
        [
            (offset_key("g", "t", 0), None),
            (offset_key("gone", "t", 0), None),
            (group_key("gone"), None),
        ],
    )
    reloaded = await env.reload()
    assert reloaded.fetch_offsets("g", None) == (E.none, {("t", 1): offset(2)})
    assert "gone" not in reloaded.groups


async def test_a_group_value_followed_by_a_newer_one_loads_the_newer(
    env: CoordinatorEnv,
) -> None:
    member = MemberValue("m", None, "c", "/h", 100, 10_000, consumer_subscription("t"), b"x")
    append(
        env,
        [
            (group_key("g"), group_value(GroupValue("consumer", 1, "range", "m", NOW, (member,)))),
            (group_key("g"), group_value(GroupValue("consumer", 2, None, None, NOW + 1, ()))),
        ],
    )
    reloaded = await env.reload()
    group = reloaded.groups["g"]
    assert (group.state, group.generation, group.members) == (GroupState.EMPTY, 2, {})
    assert group.state_timestamp == NOW + 1


async def test_loading_walks_every_batch_in_order(env: CoordinatorEnv) -> None:
    for i in range(300):
        await env.commit(f"g-{i % 7}", {("t", i % 5): offset(i, "x" * 40)})
    reloaded = await env.reload()
    for g in range(7):
        _, found = reloaded.fetch_offsets(f"g-{g}", None)
        expected = {
            ("t", p): max(i for i in range(300) if i % 7 == g and i % 5 == p) for p in range(5)
        }
        assert {tp: c.offset for tp, c in found.items()} == expected
