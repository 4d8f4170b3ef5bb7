"""Which broker coordinates a group: the leader of its __consumer_offsets partition, once loaded.

Two offsets partitions: this broker (node 0) leads partition 0, node 1 leads
partition 1 unless a test moves leadership. Requests for a group on a
partition not led here get NOT_COORDINATOR; while the partition is being
read back, COORDINATOR_LOAD_IN_PROGRESS.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from coordinator_fixtures import (
    ELSEWHERE,
    CoordinatorEnv,
    E,
    coordinator_env,
    offset,
    settings,
    within,
)
from shoal.broker.coordinator.coordinator import GroupCoordinator
from shoal.broker.coordinator.records import partition_for

CONFIG = settings(offsets_topic_num_partitions=2)


def group_on(partition: int, prefix: str = "group") -> str:
    return next(
        f"{prefix}-{i}" for i in range(1000) if partition_for(f"{prefix}-{i}", 2) == partition
    )


HERE_GROUP = group_on(0)
THERE_GROUP = group_on(1)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[CoordinatorEnv]:
    async with coordinator_env(tmp_path / "data", CONFIG, {1: ELSEWHERE}) as built:
        yield built


async def every_answer(coordinator: GroupCoordinator, group: str) -> list[object]:
    """What each group request answers for ``group``, awaited inline (no loop turn first)."""
    joined = await coordinator.join_group(
        group, "", None, "c", "/h", 10_000, 10_000, "consumer", [("range", b"")], False
    )
    synced = await coordinator.sync_group(group, 1, "m", None, None, None, {})
    committed = await coordinator.commit_offsets(group, -1, "", None, {("t", 0): offset(1)})
    deleted_offsets = await coordinator.delete_offsets(group, [("t", 0)])
    return [
        joined.error,
        synced.error,
        coordinator.heartbeat(group, 1, "m", None),
        coordinator.leave_group(group, [("m", None)])[0],
        committed[("t", 0)],
        coordinator.fetch_offsets(group, None)[0],
        deleted_offsets[0],
        coordinator.describe_group(group).error,
        await coordinator.delete_group(group),
    ]


async def test_groups_of_a_partition_led_elsewhere_get_not_coordinator(
    env: CoordinatorEnv,
) -> None:
    assert env.coordinator.owner_error(THERE_GROUP) is E.not_coordinator
    assert set(await every_answer(env.coordinator, THERE_GROUP)) == {E.not_coordinator}
    assert env.coordinator.owner_error(HERE_GROUP) is None


async def test_groups_are_answered_load_in_progress_until_the_partition_is_read(
    env: CoordinatorEnv,
) -> None:
    await env.commit(HERE_GROUP, {("t", 0): offset(7)})
    fresh = await env.new_coordinator(wait=False)
    assert set(await every_answer(fresh, HERE_GROUP)) == {E.coordinator_load_in_progress}
    assert fresh.owner_error(THERE_GROUP) is E.not_coordinator
    await env.loaded(fresh)
    assert fresh.fetch_offsets(HERE_GROUP, None) == (E.none, {("t", 0): offset(7)})


async def test_losing_leadership_forgets_the_groups_and_answers_waiting_members(
    env: CoordinatorEnv,
) -> None:
    (leader,) = await env.stable_group(HERE_GROUP, 1)
    waiting = env.join(HERE_GROUP)  # a newcomer, waiting for the rebalance
    await env.settle()
    env.apply({0: ELSEWHERE, 1: ELSEWHERE}, revision=2)
    assert (await within(waiting)).error is E.not_coordinator
    assert HERE_GROUP not in env.coordinator.groups
    assert env.coordinator.loaded == set()
    assert env.heartbeat(HERE_GROUP, leader) is E.not_coordinator
    assert env.coordinator.list_groups(set(), set()) == []


async def test_regaining_leadership_reads_the_groups_back(env: CoordinatorEnv) -> None:
    leader, follower = await env.stable_group(HERE_GROUP, 2)
    await env.commit(
        HERE_GROUP,
        {("t", 0): offset(3)},
        generation=leader.generation,
        member_id=leader.member_id,
    )
    env.apply({0: ELSEWHERE, 1: ELSEWHERE}, revision=2)
    env.apply({1: ELSEWHERE}, revision=3)
    assert env.coordinator.owner_error(HERE_GROUP) is E.coordinator_load_in_progress
    await env.loaded(env.coordinator)
    assert env.coordinator.describe_group(HERE_GROUP).state == "Stable"
    assert env.heartbeat(HERE_GROUP, follower) is E.none
    assert env.coordinator.fetch_offsets(HERE_GROUP, None) == (E.none, {("t", 0): offset(3)})


async def test_gaining_a_partition_loads_its_groups(env: CoordinatorEnv) -> None:
    env.apply({}, revision=2)
    await env.loaded(env.coordinator)
    assert env.coordinator.loaded == {0, 1}
    assert await env.commit(THERE_GROUP, {("t", 0): offset(1)}) == {("t", 0): E.none}
    listed = {g.group_id for g in env.coordinator.list_groups(set(), set())}
    assert listed == {THERE_GROUP}


async def test_list_groups_only_lists_loaded_partitions(env: CoordinatorEnv) -> None:
    env.apply({}, revision=2)
    await env.loaded(env.coordinator)
    await env.commit(HERE_GROUP, {("t", 0): offset(1)})
    await env.commit(THERE_GROUP, {("t", 0): offset(1)})
    env.apply({1: ELSEWHERE}, revision=3)
    listed = {g.group_id for g in env.coordinator.list_groups(set(), set())}
    assert listed == {HERE_GROUP}
