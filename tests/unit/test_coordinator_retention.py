"""Offset retention (KIP-211): when committed offsets, and then their group, expire.

Kafka's rules (GroupMetadata.removeExpiredOffsets): an empty group's offsets
expire ``offsets.retention.ms`` after the group became empty; a stable
consumer group keeps the offsets of topics it subscribes to and expires the
others by commit time; any other group with members keeps everything; an
offset committed with an explicit expiry (OffsetCommit v2-v4
retention_time, record v1) expires then and only then. The coordinator's
clock is driven by hand here; expiry runs by calling ``expire_offsets``.
"""

from __future__ import annotations

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

RETENTION = CONFIG.offsets_retention_ms


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[CoordinatorEnv]:
    async with coordinator_env(tmp_path / "data") as built:
        yield built


async def test_an_empty_groups_offsets_expire_retention_after_it_became_empty(
    env: CoordinatorEnv,
) -> None:
    (member,) = await env.stable_group("g", 1)
    await env.commit(
        "g", {("t", 0): offset(1)}, generation=member.generation, member_id=member.member_id
    )
    env.clock.advance(10_000)  # the group empties 10 s after the commit
    env.coordinator.leave_group("g", [(member.member_id, None)])
    assert env.state("g") == "Empty"
    env.clock.advance(RETENTION - 1)
    assert await env.coordinator.expire_offsets() == 0
    assert env.coordinator.fetch_offsets("g", [("t", 0)])[1] == {("t", 0): offset(1)}
    env.clock.advance(1)
    assert await env.coordinator.expire_offsets() == 1
    assert env.coordinator.fetch_offsets("g", [("t", 0)])[1] == {("t", 0): None}
    assert env.state("g") == "Dead"
    assert "g" not in env.coordinator.groups


async def test_an_expired_group_stays_gone_after_a_reload(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(1)})
    env.clock.advance(RETENTION)
    assert await env.coordinator.expire_offsets() == 1
    reloaded = await env.reload()
    assert reloaded.fetch_offsets("g", None) == (E.none, {})
    assert reloaded.describe_group("g").state == "Dead"


async def test_a_simple_groups_offsets_expire_by_commit_time(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(1, at=NOW)})
    env.clock.advance(5_000)
    await env.commit("g", {("t", 1): offset(2, at=NOW + 5_000)})
    env.clock.advance(RETENTION - 5_000)
    assert await env.coordinator.expire_offsets() == 1
    _, found = env.coordinator.fetch_offsets("g", None)
    assert set(found) == {("t", 1)}
    assert env.state("g") == "Empty"
    env.clock.advance(5_000)
    assert await env.coordinator.expire_offsets() == 1
    assert env.state("g") == "Dead"


async def test_an_offset_committed_after_the_group_emptied_lives_retention_from_its_commit(
    env: CoordinatorEnv,
) -> None:
    (member,) = await env.stable_group("g", 1)
    env.coordinator.leave_group("g", [(member.member_id, None)])
    env.clock.advance(30_000)
    await env.commit("g", {("t", 0): offset(1, at=env.clock.now)})
    env.clock.advance(RETENTION - 1)
    assert await env.coordinator.expire_offsets() == 0
    env.clock.advance(1)
    assert await env.coordinator.expire_offsets() == 1


async def test_a_stable_consumer_group_keeps_offsets_of_subscribed_topics(
    env: CoordinatorEnv,
) -> None:
    (member,) = await env.stable_group("g", 1, protocols=[("range", consumer_subscription("t"))])
    await env.commit(
        "g",
        {("t", 0): offset(1), ("u", 0): offset(2)},
        generation=member.generation,
        member_id=member.member_id,
    )
    env.clock.advance(RETENTION)
    assert await env.coordinator.expire_offsets() == 1
    _, found = env.coordinator.fetch_offsets("g", None)
    assert set(found) == {("t", 0)}
    assert env.state("g") == "Stable"
    env.clock.advance(10 * RETENTION)
    assert await env.coordinator.expire_offsets() == 0
    assert set(env.coordinator.fetch_offsets("g", None)[1]) == {("t", 0)}


async def test_unsubscribed_offsets_of_a_stable_group_wait_for_retention(
    env: CoordinatorEnv,
) -> None:
    (member,) = await env.stable_group("g", 1)
    await env.commit(
        "g", {("u", 0): offset(2)}, generation=member.generation, member_id=member.member_id
    )
    env.clock.advance(RETENTION - 1)
    assert await env.coordinator.expire_offsets() == 0
    assert set(env.coordinator.fetch_offsets("g", None)[1]) == {("u", 0)}


async def test_a_group_with_members_of_another_protocol_type_keeps_all_offsets(
    env: CoordinatorEnv,
) -> None:
    # A "connect" group's member metadata says nothing about topics: Kafka keeps them.
    (member,) = await env.stable_group(
        "g", 1, protocol_type="connect", protocols=[("default", b"worker-config")]
    )
    await env.commit(
        "g", {("t", 0): offset(1)}, generation=member.generation, member_id=member.member_id
    )
    env.clock.advance(10 * RETENTION)
    assert await env.coordinator.expire_offsets() == 0
    assert set(env.coordinator.fetch_offsets("g", None)[1]) == {("t", 0)}


async def test_a_rebalancing_group_keeps_all_offsets(env: CoordinatorEnv) -> None:
    # Kafka expires a non-empty group's offsets only while it is Stable.
    leader, _follower = await env.stable_group("g", 2)
    await env.commit(
        "g", {("u", 0): offset(1)}, generation=leader.generation, member_id=leader.member_id
    )
    env.join("g", leader.member_id)
    await env.settle()
    assert env.state("g") == "PreparingRebalance"
    env.clock.advance(10 * RETENTION)
    assert await env.coordinator.expire_offsets() == 0
    assert set(env.coordinator.fetch_offsets("g", None)[1]) == {("u", 0)}


async def test_an_explicit_expire_timestamp_decides_alone(env: CoordinatorEnv) -> None:
    # OffsetCommit v2-v4 retention_time: Kafka then ignores offsets.retention.ms.
    longer = CommittedOffset(1, -1, "", NOW, NOW + 3 * RETENTION)
    shorter = CommittedOffset(2, -1, "", NOW, NOW + 1_000)
    await env.commit("g", {("t", 0): longer, ("t", 1): shorter})
    env.clock.advance(1_000)
    assert await env.coordinator.expire_offsets() == 1
    assert set(env.coordinator.fetch_offsets("g", None)[1]) == {("t", 0)}
    env.clock.advance(RETENTION)
    assert await env.coordinator.expire_offsets() == 0
    env.clock.advance(2 * RETENTION)
    assert await env.coordinator.expire_offsets() == 1
    assert env.state("g") == "Dead"


async def test_an_explicit_expire_timestamp_survives_a_reload(env: CoordinatorEnv) -> None:
    committed = CommittedOffset(1, -1, "m", NOW, NOW + 3 * RETENTION)
    await env.commit("g", {("t", 0): committed})
    reloaded = await env.reload()
    assert reloaded.fetch_offsets("g", [("t", 0)])[1] == {("t", 0): committed}
    env.clock.advance(2 * RETENTION)
    assert await reloaded.expire_offsets() == 0


async def test_an_empty_group_without_offsets_is_removed(env: CoordinatorEnv) -> None:
    (member,) = await env.stable_group("g", 1)
    env.coordinator.leave_group("g", [(member.member_id, None)])
    assert env.state("g") == "Empty"
    assert await env.coordinator.expire_offsets() == 0
    assert env.state("g") == "Dead"
    reloaded = await env.reload()
    assert reloaded.describe_group("g").state == "Dead"
    assert (await within(env.join("g"))).generation == 1
