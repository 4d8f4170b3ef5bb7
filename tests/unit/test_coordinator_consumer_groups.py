"""KIP-848 consumer groups in the group coordinator, over a real log, without sockets.

Members are driven by ConsumerGroupHeartbeat as librdkafka and the Java
client drive them: join with epoch 0, heartbeat with the epoch they were
given and the partitions they own, leave with -1. Timeouts are tens of
milliseconds on the real event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from coordinator_fixtures import (
    CoordinatorEnv,
    E,
    coordinator_env,
    offset,
    settings,
    topic_id,
    within,
)
from shoal.broker.coordinator.assignors import Partitions
from shoal.broker.coordinator.consumer_coordinator import Heartbeat, HeartbeatResult
from shoal.broker.coordinator.consumer_group import ConsumerGroupState, MemberState

T = topic_id("t")
JOIN_TIMEOUT_MS = 60_000


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[CoordinatorEnv]:
    async with coordinator_env(tmp_path / "data") as built:
        built.partition_counts["t"] = 6
        yield built


def request(
    member_id: str,
    epoch: int,
    *,
    group: str = "g",
    topics: tuple[str, ...] | None = None,
    owned: Partitions | None = None,
    instance: str | None = None,
    rebalance_ms: int = -1,
    assignor: str | None = None,
    regex: str | None = None,
) -> Heartbeat:
    return Heartbeat(
        group_id=group,
        member_id=member_id,
        member_epoch=epoch,
        instance_id=instance,
        rack_id=None,
        rebalance_timeout_ms=rebalance_ms,
        subscribed_topic_names=topics,
        subscribed_topic_regex=regex,
        server_assignor=assignor,
        owned=owned,
        client_id="client",
        client_host="/127.0.0.1",
    )


async def join(
    env: CoordinatorEnv,
    member_id: str,
    *,
    group: str = "g",
    topics: tuple[str, ...] | None = ("t",),
    rebalance_ms: int = JOIN_TIMEOUT_MS,
    instance: str | None = None,
    regex: str | None = None,
) -> HeartbeatResult:
    result = await within(
        env.coordinator.consumer.heartbeat(
            request(
                member_id,
                0,
                group=group,
                topics=topics,
                owned={},
                rebalance_ms=rebalance_ms,
                instance=instance,
                regex=regex,
            )
        )
    )
    assert result.error is E.none, result
    return result


async def beat(
    env: CoordinatorEnv, member_id: str, epoch: int, owned: Partitions | None, group: str = "g"
) -> HeartbeatResult:
    return await within(
        env.coordinator.consumer.heartbeat(request(member_id, epoch, group=group, owned=owned))
    )


class Client:
    """A member as a client keeps it: the epoch and partitions it was last given."""

    def __init__(self, env: CoordinatorEnv, member_id: str) -> None:
        self.env = env
        self.member_id = member_id
        self.epoch = 0
        self.owned: Partitions = {}

    async def join(self) -> None:
        result = await join(self.env, self.member_id)
        self._take(result)

    async def beat(self) -> HeartbeatResult:
        result = await beat(self.env, self.member_id, self.epoch, self.owned)
        assert result.error is E.none, result
        self._take(result)
        return result

    def _take(self, result: HeartbeatResult) -> None:
        self.epoch = result.member_epoch
        if result.assignment is not None:
            self.owned = {t: ps for t, ps in result.assignment.items() if ps}

    @property
    def partitions(self) -> frozenset[int]:
        return self.owned.get(T, frozenset())


def never_shared(clients: list[Client]) -> None:
    seen: set[int] = set()
    for client in clients:
        assert not (seen & client.partitions), "a partition has two owners"
        seen |= client.partitions


async def converge(clients: list[Client], rounds: int = 6) -> None:
    for _ in range(rounds):
        for client in clients:
            await client.beat()
            never_shared(clients)


async def test_a_first_member_gets_every_partition_at_epoch_one(env: CoordinatorEnv) -> None:
    result = await join(env, "a")

    assert result.member_epoch == 1
    assert result.assignment == {T: frozenset(range(6))}
    assert result.heartbeat_interval_ms == env.config.consumer_heartbeat_interval_ms


async def test_a_second_member_gets_partitions_only_after_the_first_revokes_them(
    env: CoordinatorEnv,
) -> None:
    a, b = Client(env, "a"), Client(env, "b")
    await a.join()
    await b.join()
    assert b.partitions == frozenset()  # all six are still a's

    revoke = await a.beat()
    assert revoke.member_epoch == 1  # a keeps its epoch until it confirms
    assert a.partitions and len(a.partitions) == 3
    await b.beat()
    assert b.partitions == frozenset()  # a has not confirmed yet
    await a.beat()  # now a reports owning only its three
    await b.beat()

    assert len(b.partitions) == 3
    assert a.partitions | b.partitions == frozenset(range(6))
    never_shared([a, b])
    described = env.coordinator.consumer.groups["g"]
    assert described.state is ConsumerGroupState.STABLE


async def test_one_then_three_members_each_own_two_partitions(env: CoordinatorEnv) -> None:
    clients = [Client(env, name) for name in "abc"]
    await clients[0].join()
    await clients[1].join()
    await clients[2].join()
    await converge(clients)

    assert sorted(len(c.partitions) for c in clients) == [2, 2, 2]
    assert frozenset().union(*(c.partitions for c in clients)) == frozenset(range(6))


async def test_a_leaving_member_frees_its_partitions_for_the_others(env: CoordinatorEnv) -> None:
    a, b = Client(env, "a"), Client(env, "b")
    await a.join()
    await b.join()
    await converge([a, b])

    left = await beat(env, "a", -1, None)
    assert (left.error, left.member_epoch) == (E.none, -1)
    await converge([b])

    assert b.partitions == frozenset(range(6))


async def test_a_silent_member_is_fenced_after_the_session_timeout(tmp_path: Path) -> None:
    config = settings(consumer_session_timeout_ms=100)
    async with coordinator_env(tmp_path / "data", config) as env:
        env.partition_counts["t"] = 6
        a, b = Client(env, "a"), Client(env, "b")
        await a.join()
        await b.join()
        for _ in range(6):
            await asyncio.sleep(0.03)
            await b.beat()

        assert "a" not in env.coordinator.consumer.groups["g"].members
        assert b.partitions == frozenset(range(6))
        gone = await beat(env, "a", a.epoch, a.owned)
        assert gone.error is E.unknown_member_id


async def test_a_member_that_never_confirms_a_revocation_is_fenced_after_its_rebalance_timeout(
    env: CoordinatorEnv,
) -> None:
    await join(env, "a", rebalance_ms=50)
    b = Client(env, "b")
    await b.join()
    result = await beat(env, "a", 1, None)  # told to revoke; never confirms
    assert env.coordinator.consumer.groups["g"].members["a"].state is (
        MemberState.UNREVOKED_PARTITIONS
    ), result
    await asyncio.sleep(0.15)

    assert "a" not in env.coordinator.consumer.groups["g"].members
    await converge([b])
    assert b.partitions == frozenset(range(6))


async def test_heartbeat_errors_match_kafka(env: CoordinatorEnv) -> None:
    await join(env, "a")

    ahead = await beat(env, "a", 5, None)
    behind = await beat(env, "a", -3, None)
    unknown = await beat(env, "nobody", 1, None)
    no_group = await beat(env, "a", 1, None, group="other")
    leave_unknown = await beat(env, "nobody", -1, None)

    assert ahead.error is E.fenced_member_epoch
    assert behind.error is E.invalid_request
    assert unknown.error is E.unknown_member_id
    assert no_group.error is E.group_id_not_found
    assert leave_unknown.error is E.unknown_member_id


async def test_a_new_coordinator_reloads_members_epochs_and_assignments(
    env: CoordinatorEnv,
) -> None:
    a, b = Client(env, "a"), Client(env, "b")
    await a.join()
    await b.join()
    await converge([a, b])
    before = env.coordinator.consumer.groups["g"]
    members_before = dict(before.members)

    await env.reload()

    after = env.coordinator.consumer.groups["g"]
    assert after.group_epoch == before.group_epoch
    assert after.assignment_epoch == before.assignment_epoch
    assert after.members == members_before
    assert after.target == before.target
    await converge([a, b])  # the members carry on with their epochs
    assert a.partitions | b.partitions == frozenset(range(6))


async def test_new_partitions_are_picked_up_on_the_next_heartbeat(env: CoordinatorEnv) -> None:
    a = Client(env, "a")
    await a.join()
    env.partition_counts["t"] = 8

    await a.beat()

    assert a.partitions == frozenset(range(8))
    assert a.epoch == 2


async def test_a_regex_subscription_takes_matching_topics(env: CoordinatorEnv) -> None:
    env.partition_counts.update({"orders-eu": 1, "orders-us": 1, "__internal": 1})
    result = await join(env, "a", topics=None, regex="orders-.*|__.*")

    assert result.assignment == {
        topic_id("orders-eu"): frozenset({0}),
        topic_id("orders-us"): frozenset({0}),
    }


async def test_commits_need_the_current_member_epoch(env: CoordinatorEnv) -> None:
    env.topics.add("t")
    a = await join(env, "a")
    tp = ("t", 0)

    stale = await env.coordinator.commit_offsets(
        "g", a.member_epoch + 1, "a", None, {tp: offset(5)}
    )
    unknown = await env.coordinator.commit_offsets("g", a.member_epoch, "zz", None, {tp: offset(5)})
    old_version = await env.coordinator.commit_offsets(
        "g", a.member_epoch, "a", None, {tp: offset(5)}, api_version=8
    )
    ok = await env.coordinator.commit_offsets("g", a.member_epoch, "a", None, {tp: offset(5)})

    assert stale[tp] is E.stale_member_epoch
    assert unknown[tp] is E.unknown_member_id
    assert old_version[tp] is E.unsupported_version
    assert ok[tp] is E.none
    code, found = env.coordinator.fetch_offsets("g", [tp])
    assert code is E.none and found[tp] is not None and found[tp].offset == 5
    assert env.coordinator.consumer.validate_fetch("g", "a", a.member_epoch + 1) is (
        E.stale_member_epoch
    )


async def test_a_commit_racing_an_epoch_bump_is_good_for_the_partitions_the_member_kept(
    env: CoordinatorEnv,
) -> None:
    """KIP-1251, as in Kafka 4.3: an epoch older than the member's is accepted for the
    partitions it has held since that epoch, for OffsetCommit and TxnOffsetCommit alike."""
    env.topics.add("t")
    a, b = Client(env, "a"), Client(env, "b")
    await a.join()
    await b.join()
    await a.beat()  # told to give three partitions up, at epoch 1 still
    await a.beat()  # gave them up: epoch 2
    await b.beat()  # and b gets them at epoch 2
    assert (a.epoch, b.epoch) == (2, 2)
    kept = ("t", min(a.partitions))
    given = ("t", min(b.partitions))

    racing = await env.coordinator.commit_offsets("g", 1, "a", None, {kept: offset(7)})
    lost = await env.coordinator.commit_offsets(
        "g", 1, "a", None, {kept: offset(8), given: offset(8)}
    )
    early = await env.coordinator.commit_offsets("g", 1, "b", None, {given: offset(9)})
    txn = await within(
        env.coordinator.commit_transactional_offsets("g", 4000, 0, "a", 1, None, {kept: offset(10)})
    )
    txn_lost = await within(
        env.coordinator.commit_transactional_offsets(
            "g", 4001, 0, "a", 1, None, {given: offset(10)}
        )
    )

    assert racing == {kept: E.none}
    assert lost == {kept: E.stale_member_epoch, given: E.stale_member_epoch}
    assert early == {given: E.stale_member_epoch}
    assert txn == {kept: E.none}
    assert txn_lost == {given: E.stale_member_epoch}
    code, found = env.coordinator.fetch_offsets("g", [kept, given])
    assert code is E.none and found[given] is None
    assert found[kept] is not None and found[kept].offset == 7

    await env.reload()  # the assignment epochs are in the records: a new coordinator keeps them

    again = await env.coordinator.commit_offsets("g", 1, "a", None, {kept: offset(11)})
    assert again == {kept: E.none}
    for name in "ab":
        member = env.coordinator.consumer.groups["g"].members[name]
        assert member.assignment_epoch(T, kept[1]) == (1 if name == "a" else None)


async def test_classic_and_consumer_groups_keep_to_their_own_ids(env: CoordinatorEnv) -> None:
    await join(env, "a", group="new")
    classic = await within(env.join("old"), 2)
    assert classic.error is E.none

    refused = await env.coordinator.consumer.heartbeat(
        request("x", 0, group="old", topics=("t",), owned={}, rebalance_ms=1000)
    )
    into_consumer = await within(env.join("new"))

    assert refused.error is E.group_id_not_found
    assert into_consumer.error is E.inconsistent_group_protocol
    listed = {
        (g.group_id, g.group_type, g.protocol_type)
        for g in env.coordinator.list_groups(set(), set())
    }
    assert ("new", "consumer", "consumer") in listed
    assert ("old", "classic", "consumer") in listed
    assert {g.group_id for g in env.coordinator.list_groups(set(), {"consumer"})} == {"new"}


async def test_an_empty_consumer_group_is_deleted_with_its_offsets(env: CoordinatorEnv) -> None:
    env.topics.add("t")
    a = await join(env, "a")
    await env.coordinator.commit_offsets("g", a.member_epoch, "a", None, {("t", 0): offset(1)})
    assert await env.coordinator.delete_group("g") is E.non_empty_group
    await beat(env, "a", -1, None)

    assert await env.coordinator.delete_group("g") is E.none

    assert "g" not in env.coordinator.consumer.groups
    await env.reload()
    assert "g" not in env.coordinator.consumer.groups
    assert env.coordinator.fetch_offsets("g", [("t", 0)])[1][("t", 0)] is None


async def test_a_static_member_that_left_for_a_while_is_replaced_with_its_partitions(
    env: CoordinatorEnv,
) -> None:
    first = await join(env, "a", instance="i-1")
    away = await beat_static_leave(env, "a", "i-1")
    assert away.member_epoch == -2

    back = await join(env, "a2", instance="i-1")

    assert back.assignment == first.assignment
    assert set(env.coordinator.consumer.groups["g"].members) == {"a2"}


async def beat_static_leave(env: CoordinatorEnv, member_id: str, instance: str) -> HeartbeatResult:
    return await within(
        env.coordinator.consumer.heartbeat(request(member_id, -2, instance=instance))
    )


async def test_an_empty_consumer_group_expires_with_its_offsets(env: CoordinatorEnv) -> None:
    env.topics.add("t")
    a = await join(env, "a")
    await env.coordinator.commit_offsets("g", a.member_epoch, "a", None, {("t", 0): offset(1)})
    env.clock.advance(env.config.offsets_retention_ms + 1)
    assert await env.coordinator.expire_offsets() == 0  # a member: the offsets stay

    await beat(env, "a", -1, None)
    env.clock.advance(env.config.offsets_retention_ms + 1)

    assert await env.coordinator.expire_offsets() == 1
    assert "g" not in env.coordinator.consumer.groups
    await env.reload()
    assert "g" not in env.coordinator.consumer.groups
