"""Transactional offset commits (TxnOffsetCommit) in the group coordinator.

A transactional producer's offsets are written to the group's partition of
``__consumer_offsets`` inside its transaction and stay pending until the
transaction coordinator's marker lands there: a commit marker makes them the
group's committed offsets, an abort marker drops them. The checks follow
Kafka's validateOffsetCommit for TxnOffsetCommit (KIP-447: generation, member
and static instance when the request carries them). Markers are written as
the WriteTxnMarkers handler writes them: ``Partition.append_marker``, wait for
the replicas, then ``complete_transaction``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from coordinator_fixtures import (
    ELSEWHERE,
    NOW,
    CoordinatorEnv,
    E,
    coordinator_env,
    offset,
    settings,
    within,
)
from shoal.broker.coordinator.coordinator import OFFSETS_TOPIC
from shoal.broker.coordinator.group import CommittedOffset
from shoal.broker.handlers.base import RequestContext
from shoal.broker.handlers.group_offsets import handle_offset_fetch, handle_txn_offset_commit
from shoal.broker.log.cleaner.cleanable import log_to_clean
from shoal.broker.log.cleaner.cleaner import Cleaner
from shoal.broker.server.connection import ConnectionInfo

from shoal.wire import ErrorCode, RequestHeader, schema

PRODUCER = 4000
OTHER_PRODUCER = 4001
EPOCH = 0
TXN_OFFSET_COMMIT = 28
OFFSET_FETCH = 9


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[CoordinatorEnv]:
    async with coordinator_env(tmp_path / "data") as built:
        yield built


async def txn_commit(
    env: CoordinatorEnv,
    group: str,
    offsets: dict[tuple[str, int], CommittedOffset],
    *,
    producer_id: int = PRODUCER,
    generation: int = -1,
    member_id: str = "",
    instance: str | None = None,
) -> dict[tuple[str, int], ErrorCode]:
    results: dict[tuple[str, int], ErrorCode] = await within(
        env.coordinator.commit_transactional_offsets(
            group, producer_id, EPOCH, member_id, generation, instance, offsets
        )
    )
    return results


async def end_txn(env: CoordinatorEnv, commit: bool, producer_id: int = PRODUCER) -> None:
    """What WriteTxnMarkers does for the group's partition (index 0 here)."""
    partition = env.replicas.get(OFFSETS_TOPIC, 0)
    assert partition is not None
    info = partition.append_marker(producer_id, EPOCH, commit, 0)
    await within(partition.wait_for_commit(info.last_offset + 1, 1.0))
    env.coordinator.complete_transaction(0, producer_id, commit)


def committed(env: CoordinatorEnv, group: str, *tps: tuple[str, int]) -> dict[Any, Any]:
    code, found = env.coordinator.fetch_offsets(group, list(tps))
    assert code is E.none
    return found


# -- pending until the marker ----------------------------------------------------------


async def test_transactional_offsets_are_invisible_until_the_commit_marker(
    env: CoordinatorEnv,
) -> None:
    assert await txn_commit(env, "g", {("t", 0): offset(10)}) == {("t", 0): E.none}
    assert committed(env, "g", ("t", 0)) == {("t", 0): None}
    assert env.coordinator.unstable_partitions("g") == {("t", 0)}
    await end_txn(env, commit=True)
    assert committed(env, "g", ("t", 0)) == {("t", 0): offset(10)}
    assert env.coordinator.unstable_partitions("g") == frozenset()


async def test_an_abort_marker_drops_the_pending_offsets(env: CoordinatorEnv) -> None:
    await env.commit("g", {("t", 0): offset(5)})
    await txn_commit(env, "g", {("t", 0): offset(10), ("t", 1): offset(11)})
    await end_txn(env, commit=False)
    assert committed(env, "g", ("t", 0), ("t", 1)) == {("t", 0): offset(5), ("t", 1): None}
    assert env.coordinator.unstable_partitions("g") == frozenset()


async def test_a_marker_completes_only_its_own_producer(env: CoordinatorEnv) -> None:
    await txn_commit(env, "g", {("t", 0): offset(10)})
    await txn_commit(env, "g", {("t", 1): offset(20)}, producer_id=OTHER_PRODUCER)
    await end_txn(env, commit=True)
    assert committed(env, "g", ("t", 0), ("t", 1)) == {("t", 0): offset(10), ("t", 1): None}
    assert env.coordinator.unstable_partitions("g") == {("t", 1)}


async def test_a_plain_commit_written_after_the_transactional_one_is_kept(
    env: CoordinatorEnv,
) -> None:
    await txn_commit(env, "g", {("t", 0): offset(10)})
    await env.commit("g", {("t", 0): offset(30)})
    await end_txn(env, commit=True)
    assert committed(env, "g", ("t", 0)) == {("t", 0): offset(30)}


async def test_unknown_topics_and_large_metadata_are_refused_per_partition(
    env: CoordinatorEnv,
) -> None:
    result = await txn_commit(
        env,
        "g",
        {("t", 0): offset(1), ("nope", 0): offset(1), ("t", 1): offset(1, "m" * 65)},
    )
    assert result == {
        ("t", 0): E.none,
        ("nope", 0): E.unknown_topic_or_partition,
        ("t", 1): E.offset_metadata_too_large,
    }
    assert env.coordinator.unstable_partitions("g") == {("t", 0)}


# -- who may commit (KIP-447) ------------------------------------------------------------


async def test_an_unknown_group_is_created_by_a_transactional_commit(env: CoordinatorEnv) -> None:
    assert await txn_commit(env, "fresh", {("t", 0): offset(1)}) == {("t", 0): E.none}
    assert env.coordinator.describe_group("fresh").state == "Empty"


async def test_a_generation_for_an_unknown_group_names_no_member(env: CoordinatorEnv) -> None:
    result = await txn_commit(env, "fresh", {("t", 0): offset(1)}, generation=1, member_id="m")
    assert result == {("t", 0): E.unknown_member_id}
    assert env.coordinator.unstable_partitions("fresh") == frozenset()


async def test_a_member_commits_in_its_generation(env: CoordinatorEnv) -> None:
    (leader,) = await env.stable_group("g", 1)
    result = await txn_commit(
        env, "g", {("t", 0): offset(1)}, generation=leader.generation, member_id=leader.member_id
    )
    assert result == {("t", 0): E.none}


async def test_an_old_generation_is_illegal(env: CoordinatorEnv) -> None:
    (leader,) = await env.stable_group("g", 1)
    result = await txn_commit(
        env,
        "g",
        {("t", 0): offset(1)},
        generation=leader.generation - 1,
        member_id=leader.member_id,
    )
    assert result == {("t", 0): E.illegal_generation}


async def test_an_unknown_member_is_refused(env: CoordinatorEnv) -> None:
    (leader,) = await env.stable_group("g", 1)
    result = await txn_commit(
        env, "g", {("t", 0): offset(1)}, generation=leader.generation, member_id="stranger"
    )
    assert result == {("t", 0): E.unknown_member_id}


async def test_a_replaced_static_member_is_fenced(env: CoordinatorEnv) -> None:
    (leader,) = await env.stable_group("g", 1, instances=["i-1"])
    result = await txn_commit(
        env,
        "g",
        {("t", 0): offset(1)},
        generation=leader.generation,
        member_id="an-older-incarnation",
        instance="i-1",
    )
    assert result == {("t", 0): E.fenced_instance_id}


async def test_a_commit_without_generation_or_member_is_accepted_from_a_group_with_members(
    env: CoordinatorEnv,
) -> None:
    """TxnOffsetCommit before v3 carries neither, so Kafka does not check them."""
    await env.stable_group("g", 1)
    assert await txn_commit(env, "g", {("t", 0): offset(1)}) == {("t", 0): E.none}


async def test_a_commit_for_a_group_led_elsewhere_is_not_the_coordinators(
    tmp_path: Path,
) -> None:
    async with coordinator_env(tmp_path / "data", leaders={0: ELSEWHERE}) as env:
        result = await txn_commit(env, "g", {("t", 0): offset(1)})
        assert result == {("t", 0): E.not_coordinator}


# -- loading the partition back ----------------------------------------------------------


async def test_reloading_replays_committed_aborted_and_open_transactions(
    env: CoordinatorEnv,
) -> None:
    await txn_commit(env, "committed", {("t", 0): offset(10)}, producer_id=1)
    await end_txn(env, commit=True, producer_id=1)
    await env.commit("aborted", {("t", 0): offset(3)})
    await txn_commit(env, "aborted", {("t", 0): offset(20)}, producer_id=2)
    await end_txn(env, commit=False, producer_id=2)
    await txn_commit(env, "open", {("t", 0): offset(30)}, producer_id=3)

    reloaded = await env.reload()

    assert committed(env, "committed", ("t", 0)) == {("t", 0): offset(10)}
    assert committed(env, "aborted", ("t", 0)) == {("t", 0): offset(3)}
    assert committed(env, "open", ("t", 0)) == {("t", 0): None}
    assert reloaded.unstable_partitions("open") == {("t", 0)}
    assert reloaded.describe_group("open").state == "Empty"
    await end_txn(env, commit=True, producer_id=3)
    assert committed(env, "open", ("t", 0)) == {("t", 0): offset(30)}


async def test_reloading_keeps_a_plain_commit_written_inside_the_transaction(
    env: CoordinatorEnv,
) -> None:
    await txn_commit(env, "g", {("t", 0): offset(10)})
    await env.commit("g", {("t", 0): offset(30)})
    await end_txn(env, commit=True)
    await env.reload()
    assert committed(env, "g", ("t", 0)) == {("t", 0): offset(30)}


async def test_a_restart_from_disk_replays_the_markers(env: CoordinatorEnv) -> None:
    await txn_commit(env, "g", {("t", 0): offset(10), ("t", 1): offset(11)})
    await end_txn(env, commit=True)
    await env.restart()
    assert committed(env, "g", ("t", 0), ("t", 1)) == {("t", 0): offset(10), ("t", 1): offset(11)}


# -- retention ----------------------------------------------------------------------------


async def test_expiry_keeps_a_group_whose_transaction_is_open(tmp_path: Path) -> None:
    async with coordinator_env(tmp_path / "data", settings(offsets_retention_ms=1_000)) as env:
        await env.commit("g", {("t", 0): offset(5, at=NOW)})
        await txn_commit(env, "g", {("t", 1): offset(10, at=NOW)})
        env.clock.advance(2_000)
        assert await env.coordinator.expire_offsets() == 1
        assert env.coordinator.describe_group("g").state == "Empty"
        await end_txn(env, commit=True)
        assert committed(env, "g", ("t", 0), ("t", 1)) == {
            ("t", 0): None,
            ("t", 1): offset(10, at=NOW),
        }


async def test_deleting_offsets_drops_their_pending_transactional_ones(
    env: CoordinatorEnv,
) -> None:
    await txn_commit(env, "g", {("t", 0): offset(10)})
    code, results = await env.coordinator.delete_offsets("g", [("t", 0)])
    assert (code, results) == (E.none, {("t", 0): E.none})
    await end_txn(env, commit=True)
    assert committed(env, "g", ("t", 0)) == {("t", 0): None}


# -- the handlers -------------------------------------------------------------------------


class AgreeingVerifier:
    """The transaction coordinator's check (KIP-890), answered "in the transaction";
    test_txn_verification.py covers its refusals."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, int, list[tuple[str, int]]]] = []

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: list[tuple[str, int]],
        abortable: bool = False,
    ) -> dict[tuple[str, int], ErrorCode]:
        self.asked.append((transactional_id, producer_id, producer_epoch, partitions))
        return {tp: E.none for tp in partitions}


class Services:
    """The part of BrokerServices the offset handlers use."""

    def __init__(self, env: CoordinatorEnv) -> None:
        self.groups = env.coordinator
        self.clock = env.clock
        self.verifier = AgreeingVerifier()


def handler_context(api_key: int, version: int) -> RequestContext:
    return RequestContext(
        RequestHeader(api_key, version, 1, "test"), schema(api_key, version), ConnectionInfo("", 0)
    )


def txn_offset_commit_request(version: int, **fields: Any) -> Any:
    api = schema(TXN_OFFSET_COMMIT, version)
    partition = api.make_request(
        "TxnOffsetCommitRequestPartition",
        partition_index=0,
        committed_offset=42,
        committed_leader_epoch=3,
        committed_metadata="meta",
    )
    topic = api.make_request("TxnOffsetCommitRequestTopic", name="t", partitions=(partition,))
    base = {
        "transactional_id": "txn",
        "group_id": "g",
        "producer_id": PRODUCER,
        "producer_epoch": EPOCH,
        "generation_id": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": (topic,),
    }
    base.update(fields)
    return api.request(**base)


@pytest.mark.parametrize("version", [0, 3])
async def test_the_txn_offset_commit_handler_stores_pending_offsets(
    env: CoordinatorEnv, version: int
) -> None:
    ctx = handler_context(TXN_OFFSET_COMMIT, version)
    services = Services(env)
    request = txn_offset_commit_request(version)
    response = await handle_txn_offset_commit(services, ctx, request)  # type: ignore[arg-type]
    (topic,) = response.topics
    assert (topic.name, [(p.partition_index, p.error_code) for p in topic.partitions]) == (
        "t",
        [(0, E.none)],
    )
    # The group's offsets partition is checked against the producer's transaction first.
    offsets_partition = (OFFSETS_TOPIC, env.coordinator.partition_of("g"))
    assert services.verifier.asked == [
        (request.transactional_id, request.producer_id, request.producer_epoch, [offsets_partition])
    ]
    await end_txn(env, commit=True)
    stored = committed(env, "g", ("t", 0))[("t", 0)]
    assert (stored.offset, stored.metadata, stored.commit_timestamp) == (42, "meta", NOW)
    assert stored.leader_epoch == (3 if version >= 2 else -1)


async def test_the_txn_offset_commit_handler_answers_the_coordinators_errors(
    env: CoordinatorEnv,
) -> None:
    ctx = handler_context(TXN_OFFSET_COMMIT, 3)
    response = await handle_txn_offset_commit(
        Services(env),  # type: ignore[arg-type]
        ctx,
        txn_offset_commit_request(3, generation_id=4, member_id="m"),
    )
    assert response.topics[0].partitions[0].error_code is E.unknown_member_id


@pytest.mark.parametrize("version", [7, 8])
async def test_offset_fetch_requiring_stable_offsets_sees_the_open_transaction(
    env: CoordinatorEnv, version: int
) -> None:
    await env.commit("g", {("t", 1): offset(7)})
    await txn_commit(env, "g", {("t", 0): offset(10)})
    api = schema(OFFSET_FETCH, version)

    async def fetch(require_stable: bool) -> dict[int, tuple[int, ErrorCode]]:
        if version >= 8:
            group = api.make_request(
                "OffsetFetchRequestGroup",
                group_id="g",
                member_id=None,
                member_epoch=-1,
                topics=(
                    api.make_request(
                        "OffsetFetchRequestTopics", name="t", partition_indexes=(0, 1)
                    ),
                ),
            )
            request = api.request(groups=(group,), require_stable=require_stable)
        else:
            topic = api.make_request("OffsetFetchRequestTopic", name="t", partition_indexes=(0, 1))
            request = api.request(group_id="g", topics=(topic,), require_stable=require_stable)
        response = await handle_offset_fetch(
            Services(env),  # type: ignore[arg-type]
            handler_context(OFFSET_FETCH, version),
            request,
        )
        topics = response.groups[0].topics if version >= 8 else response.topics
        return {p.partition_index: (p.committed_offset, p.error_code) for p in topics[0].partitions}

    assert await fetch(require_stable=True) == {
        0: (-1, E.unstable_offset_commit),
        1: (7, E.none),
    }
    assert await fetch(require_stable=False) == {0: (-1, E.none), 1: (7, E.none)}
    await end_txn(env, commit=True)
    assert await fetch(require_stable=True) == {0: (10, E.none), 1: (7, E.none)}


# -- compaction ---------------------------------------------------------------------------
#
# The cleaner of __consumer_offsets must keep what loading needs: an open
# transaction's records (the cleaner stops at the first unstable offset), a
# committed transaction's records until its marker can go, and never bring an
# aborted transaction's offsets back.


async def clean(env: CoordinatorEnv) -> None:
    partition = env.replicas.get(OFFSETS_TOPIC, 0)
    assert partition is not None
    log = partition.log
    log.roll()
    target = log_to_clean(log, None, log.clock())
    assert target is not None
    await Cleaner(max_map_entries=1000).clean(log, target)


async def test_a_cleaned_partition_loads_committed_aborted_and_open_transactions(
    env: CoordinatorEnv,
) -> None:
    await txn_commit(env, "g", {("t", 0): offset(10)}, producer_id=1)
    await end_txn(env, commit=True, producer_id=1)
    await env.commit("g", {("t", 1): offset(5)})
    await txn_commit(env, "g", {("t", 1): offset(20)}, producer_id=2)
    await end_txn(env, commit=False, producer_id=2)
    for n in range(20):
        await env.commit("other", {("u", 0): offset(n)})
    await txn_commit(env, "g", {("t", 2): offset(30)}, producer_id=3)
    for n in range(20, 40):
        await env.commit("other", {("u", 0): offset(n)})

    await clean(env)
    reloaded = await env.reload()

    assert committed(env, "g", ("t", 0), ("t", 1), ("t", 2)) == {
        ("t", 0): offset(10),
        ("t", 1): offset(5),
        ("t", 2): None,
    }
    assert reloaded.unstable_partitions("g") == {("t", 2)}
    await end_txn(env, commit=True, producer_id=3)
    assert committed(env, "g", ("t", 2)) == {("t", 2): offset(30)}


async def test_cleaning_never_lets_an_aborted_offset_hide_a_committed_one(
    env: CoordinatorEnv,
) -> None:
    await txn_commit(env, "g", {("t", 0): offset(30)}, producer_id=1)
    await end_txn(env, commit=True, producer_id=1)
    await txn_commit(env, "g", {("t", 0): offset(50)}, producer_id=2)
    await end_txn(env, commit=False, producer_id=2)
    for n in range(20):
        await env.commit("other", {("u", 0): offset(n)})

    await clean(env)
    await env.reload()

    assert committed(env, "g", ("t", 0)) == {("t", 0): offset(30)}
