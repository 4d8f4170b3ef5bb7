"""The transaction coordinator over a real __transaction_state log, markers faked.

Two state partitions: this broker (node 0) leads partition 0, node 1 leads
partition 1. ``HERE_ID`` is a transactional id on partition 0.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from coordinator_fixtures import ELSEWHERE, HERE, within
from prometheus_client import CollectorRegistry
from shoal.broker.coordinator.coordinator import OFFSETS_TOPIC
from shoal.broker.metrics import BrokerCollector, RequestMetrics
from shoal.broker.txn.coordinator import TXN_TOPIC
from shoal.broker.txn.markers import TxnMarker
from shoal.broker.txn.metadata import MAX_EPOCH, TxnState
from txn_fixtures import TxnEnv, id_on, run_soon, txn_env, txn_image

from shoal.wire import ErrorCode

E = ErrorCode
HERE_ID = id_on(0)
THERE_ID = id_on(1)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[TxnEnv]:
    async with txn_env(tmp_path / "data", {1: ELSEWHERE}) as built:
        yield built


# -- InitProducerId ------------------------------------------------------------------------


async def test_a_new_transactional_id_gets_a_producer_id_at_epoch_0_then_bumps(
    env: TxnEnv,
) -> None:
    producer_id, epoch = await env.init(HERE_ID)
    assert epoch == 0
    assert await env.init(HERE_ID) == (producer_id, 1)
    assert env.state(HERE_ID) == "Empty"


@pytest.mark.parametrize("timeout_ms", [0, 60_001])
async def test_a_timeout_beyond_the_maximum_is_refused(env: TxnEnv, timeout_ms: int) -> None:
    result = await env.coordinator.init_producer_id(HERE_ID, timeout_ms)
    assert result.error is E.invalid_transaction_timeout


async def test_an_empty_transactional_id_is_an_invalid_request(env: TxnEnv) -> None:
    assert (await env.coordinator.init_producer_id("", 1000)).error is E.invalid_request


async def test_ids_of_a_partition_led_elsewhere_get_not_coordinator(env: TxnEnv) -> None:
    coordinator = env.coordinator
    assert (await coordinator.init_producer_id(THERE_ID, 1000)).error is E.not_coordinator
    assert await coordinator.add_partitions(THERE_ID, 1, 0, [("t", 0)]) is E.not_coordinator
    assert await coordinator.end_txn(THERE_ID, 1, 0, True) is E.not_coordinator


async def test_ids_are_answered_load_in_progress_until_the_partition_is_read(
    env: TxnEnv,
) -> None:
    fresh = await env.new_coordinator(wait=False)
    assert (await fresh.init_producer_id(HERE_ID, 1000)).error is E.coordinator_load_in_progress
    await env.loaded(fresh)
    assert (await fresh.init_producer_id(HERE_ID, 1000)).error is E.none


async def test_kip_360_init_with_the_current_producer_bumps_and_a_stranger_is_fenced(
    env: TxnEnv,
) -> None:
    producer_id, epoch = await env.init(HERE_ID)
    bumped = await env.coordinator.init_producer_id(HERE_ID, 1000, (producer_id, epoch))
    assert (bumped.error, bumped.producer_epoch) == (E.none, 1)
    retried = await env.coordinator.init_producer_id(HERE_ID, 1000, (producer_id, epoch))
    assert (retried.error, retried.producer_epoch) == (E.none, 1)
    stranger = await env.coordinator.init_producer_id(HERE_ID, 1000, (producer_id + 50, 0))
    assert stranger.error is E.producer_fenced


# -- a transaction's life ----------------------------------------------------------------------


async def test_a_committed_transaction_is_marked_everywhere_then_complete(env: TxnEnv) -> None:
    producer_id, epoch = await env.begin(HERE_ID, ("t", 0), ("u", 1))
    assert env.state(HERE_ID) == "Ongoing"
    assert await env.coordinator.end_txn(HERE_ID, producer_id, epoch, True) is E.none
    await env.eventually(lambda: env.state(HERE_ID) == "CompleteCommit")
    assert env.markers.written == [
        TxnMarker(producer_id, epoch, True, 1, frozenset({("t", 0), ("u", 1)}))
    ]
    assert await env.coordinator.end_txn(HERE_ID, producer_id, epoch, True) is E.none
    assert await env.coordinator.end_txn(HERE_ID, producer_id, epoch, False) is E.invalid_txn_state


async def test_an_aborted_transaction_is_marked_as_an_abort(env: TxnEnv) -> None:
    producer_id, epoch = await env.begin(HERE_ID)
    assert await env.coordinator.end_txn(HERE_ID, producer_id, epoch, False) is E.none
    await env.eventually(lambda: env.state(HERE_ID) == "CompleteAbort")
    assert [m.commit for m in env.markers.written] == [False]


async def test_the_next_transaction_starts_from_a_completed_one(env: TxnEnv) -> None:
    producer_id, epoch = await env.begin(HERE_ID)
    await env.coordinator.end_txn(HERE_ID, producer_id, epoch, True)
    await env.eventually(lambda: env.state(HERE_ID) == "CompleteCommit")
    assert await env.coordinator.add_partitions(HERE_ID, producer_id, epoch, [("v", 2)]) is E.none
    assert env.coordinator.txns[HERE_ID].partitions == {("v", 2)}


async def test_while_markers_are_written_the_producer_is_told_to_wait(env: TxnEnv) -> None:
    producer_id, epoch = await env.begin(HERE_ID)
    env.markers.gate.clear()
    assert await env.coordinator.end_txn(HERE_ID, producer_id, epoch, True) is E.none
    await env.settle()
    assert env.state(HERE_ID) == "PrepareCommit"
    coordinator = env.coordinator
    assert await coordinator.end_txn(HERE_ID, producer_id, epoch, True) is E.concurrent_transactions
    assert await coordinator.end_txn(HERE_ID, producer_id, epoch, False) is E.invalid_txn_state
    added = await coordinator.add_partitions(HERE_ID, producer_id, epoch, [("t", 1)])
    assert added is E.concurrent_transactions
    assert (await coordinator.init_producer_id(HERE_ID, 1000)).error is E.concurrent_transactions
    env.markers.gate.set()
    await env.eventually(lambda: env.state(HERE_ID) == "CompleteCommit")


async def test_adding_partitions_checks_the_producer(env: TxnEnv) -> None:
    producer_id, epoch = await env.init(HERE_ID)
    add = env.coordinator.add_partitions
    assert await add("unknown", producer_id, epoch, [("t", 0)]) in (
        E.invalid_producer_id_mapping,
        E.not_coordinator,
    )
    assert await add(HERE_ID, producer_id + 1, epoch, [("t", 0)]) is E.invalid_producer_id_mapping
    assert await add(HERE_ID, producer_id, epoch - 1, [("t", 0)]) is E.producer_fenced
    assert await add(HERE_ID, producer_id, epoch, [("t", 0)]) is E.none


async def test_add_offsets_adds_the_groups_offsets_partition(env: TxnEnv) -> None:
    producer_id, epoch = await env.init(HERE_ID)
    assert await env.coordinator.add_offsets(HERE_ID, producer_id, epoch, "group") is E.none
    assert env.coordinator.txns[HERE_ID].partitions == {(OFFSETS_TOPIC, 7)}


async def test_ending_an_empty_transaction(env: TxnEnv) -> None:
    producer_id, epoch = await env.init(HERE_ID)
    assert await env.coordinator.end_txn(HERE_ID, producer_id, epoch, False) is E.none
    assert await env.coordinator.end_txn(HERE_ID, producer_id, epoch, True) is E.invalid_txn_state
    assert env.markers.written == []


# -- fencing -------------------------------------------------------------------------------------


async def test_a_new_producer_instance_aborts_the_ongoing_transaction_and_fences_the_old(
    env: TxnEnv,
) -> None:
    producer_id, epoch = await env.begin(HERE_ID)
    result = await env.coordinator.init_producer_id(HERE_ID, 10_000)
    assert result.error is E.concurrent_transactions
    await env.eventually(lambda: env.state(HERE_ID) == "CompleteAbort")
    assert env.markers.written == [
        TxnMarker(producer_id, epoch + 1, False, 1, frozenset({("t", 0)}))
    ]
    assert await env.init(HERE_ID) == (producer_id, epoch + 2)
    zombie = await env.coordinator.add_partitions(HERE_ID, producer_id, epoch, [("t", 0)])
    assert zombie is E.producer_fenced
    assert await env.coordinator.end_txn(HERE_ID, producer_id, epoch, True) is E.producer_fenced


async def test_a_transaction_past_its_timeout_is_aborted_with_its_producer_fenced(
    env: TxnEnv,
) -> None:
    producer_id, epoch = await env.begin(HERE_ID, timeout_ms=1000)
    assert await env.coordinator.abort_timed_out_transactions() == 0
    env.clock.advance(1001)
    assert await env.coordinator.abort_timed_out_transactions() == 1
    await env.eventually(lambda: env.state(HERE_ID) == "CompleteAbort")
    assert env.markers.written[-1].producer_epoch == epoch + 1
    assert await env.coordinator.end_txn(HERE_ID, producer_id, epoch, True) is E.producer_fenced


async def test_markers_given_up_leave_the_transaction_prepared(env: TxnEnv) -> None:
    producer_id, epoch = await env.begin(HERE_ID)
    env.markers.answer = False
    await env.coordinator.end_txn(HERE_ID, producer_id, epoch, True)
    await env.settle()
    assert env.state(HERE_ID) == "PrepareCommit"


# -- persistence and ownership -----------------------------------------------------------------


async def test_state_is_read_back_by_the_next_coordinator(env: TxnEnv) -> None:
    producer_id, epoch = await env.begin(HERE_ID, ("t", 0), ("u", 3))
    other = id_on(0, "other")
    await env.init(other)
    coordinator = await env.reload()
    metadata = coordinator.txns[HERE_ID]
    assert (metadata.producer_id, metadata.producer_epoch) == (producer_id, epoch)
    assert metadata.state is TxnState.ONGOING
    assert metadata.partitions == {("t", 0), ("u", 3)}
    assert coordinator.txns[other].state is TxnState.EMPTY
    assert await coordinator.end_txn(HERE_ID, producer_id, epoch, True) is E.none
    await env.eventually(lambda: env.state(HERE_ID) == "CompleteCommit")


async def test_a_decided_transaction_found_on_load_is_completed(env: TxnEnv) -> None:
    producer_id, epoch = await env.begin(HERE_ID)
    env.markers.gate.clear()
    await env.coordinator.end_txn(HERE_ID, producer_id, epoch, False)
    await env.settle()
    await env.coordinator.close()
    env.markers.gate.set()
    env.replicas.apply(txn_image(2, {1: ELSEWHERE}, revision=2))
    env.coordinator = await env.new_coordinator()
    await env.eventually(lambda: env.state(HERE_ID) == "CompleteAbort")
    assert env.markers.written[-1] == TxnMarker(producer_id, epoch, False, 2, frozenset({("t", 0)}))


async def test_losing_leadership_forgets_the_partitions_ids(env: TxnEnv) -> None:
    await env.init(HERE_ID)
    env.apply({0: ELSEWHERE, 1: ELSEWHERE}, revision=2)
    assert HERE_ID not in env.coordinator.txns
    assert (await env.coordinator.init_producer_id(HERE_ID, 1000)).error is E.not_coordinator
    env.apply({1: ELSEWHERE}, revision=3)
    await env.loaded(env.coordinator)
    assert env.coordinator.loaded == {0: 3}
    assert env.state(HERE_ID) == "Empty"


async def test_a_marker_writer_stops_once_the_partition_moved(env: TxnEnv) -> None:
    producer_id, epoch = await env.begin(HERE_ID)
    env.markers.gate.clear()
    await env.coordinator.end_txn(HERE_ID, producer_id, epoch, True)
    await env.settle()
    env.apply({0: ELSEWHERE, 1: ELSEWHERE}, revision=2)
    env.markers.gate.set()
    await env.settle()
    assert env.markers.written == []


async def test_state_writes_go_to_the_transaction_state_log(env: TxnEnv) -> None:
    await env.begin(HERE_ID)
    partition = env.replicas.get(TXN_TOPIC, 0)
    assert partition is not None
    assert partition.log.log_end_offset == 2  # Empty, then Ongoing


async def test_a_request_while_the_ids_state_is_being_written_is_told_to_wait(
    env: TxnEnv,
) -> None:
    env.apply({1: ELSEWHERE}, revision=2, followers_in_sync=True)
    await env.loaded(env.coordinator)
    first = run_soon(env.coordinator.init_producer_id(HERE_ID, 1000))
    await env.settle()
    second = await env.coordinator.init_producer_id(HERE_ID, 1000)
    assert second.error is E.concurrent_transactions
    partition = env.replicas.get(TXN_TOPIC, 0)
    assert partition is not None
    partition.record_follower_fetch(ELSEWHERE, partition.log.log_end_offset)
    assert (await within(first)).error is E.none


async def test_idle_transactional_ids_expire(env: TxnEnv) -> None:
    await env.init(HERE_ID)
    producer_id, _ = await env.begin(id_on(0, "busy"))
    env.clock.advance(env.config.transactional_id_expiration_ms)
    assert await env.coordinator.expire_transactional_ids() == 1
    assert HERE_ID not in env.coordinator.txns
    coordinator = await env.reload()
    assert HERE_ID not in coordinator.txns
    assert coordinator.txns[id_on(0, "busy")].producer_id == producer_id


# -- admin -----------------------------------------------------------------------------------------


async def test_describe_and_list(env: TxnEnv) -> None:
    await env.begin(HERE_ID)
    await env.init(id_on(0, "idle"))
    code, metadata = env.coordinator.describe(HERE_ID)
    assert code is E.none and metadata is not None and metadata.state is TxnState.ONGOING
    assert env.coordinator.describe("nobody-0")[0] in (
        E.transactional_id_not_found,
        E.not_coordinator,
    )
    code, found = env.coordinator.list_transactions({TxnState.ONGOING}, set(), -1)
    assert [m.transactional_id for m in found] == [HERE_ID]
    code, found = env.coordinator.list_transactions(set(), set(), -1)
    assert len(found) == 2


async def test_verify_says_which_partitions_are_in_the_ongoing_transaction(env: TxnEnv) -> None:
    producer_id, epoch = await env.begin(HERE_ID, ("t", 0))
    verify = env.coordinator.verify_partitions
    assert verify(HERE_ID, producer_id, epoch, [("t", 0), ("t", 1)]) == {
        ("t", 0): E.none,
        ("t", 1): E.transaction_abortable,
    }
    assert verify(HERE_ID, producer_id, epoch - 1, [("t", 0)]) == {("t", 0): E.producer_fenced}
    assert verify(HERE_ID, producer_id + 1, epoch, [("t", 0)]) == {
        ("t", 0): E.invalid_producer_id_mapping
    }
    assert verify(THERE_ID, producer_id, epoch, [("t", 0)]) == {("t", 0): E.not_coordinator}
    assert verify("", producer_id, epoch, [("t", 0)]) == {("t", 0): E.invalid_request}


async def test_once_the_epochs_are_used_up_init_rotates_the_producer_id(env: TxnEnv) -> None:
    producer_id, _ = await env.init(HERE_ID)
    env.coordinator.txns[HERE_ID].producer_epoch = MAX_EPOCH - 1
    new_id, epoch = await env.init(HERE_ID)
    assert (new_id != producer_id, epoch) == (True, 0)
    assert env.coordinator.txns[HERE_ID].previous_producer_id == producer_id


# -- metrics ---------------------------------------------------------------------------------


async def test_decisions_and_open_transactions_show_in_the_metrics(env: TxnEnv) -> None:
    registry = CollectorRegistry(auto_describe=False)
    collector = BrokerCollector(
        HERE,
        env.replicas,
        SimpleNamespace(image=env.replicas.image),  # type: ignore[arg-type]
        RequestMetrics(),
        lambda: 0,
        env.coordinator,
    )
    registry.register(collector)
    value = registry.get_sample_value
    committed_id, stalled_id = id_on(0, "committed"), id_on(0, "stalled")
    producer_id, epoch = await env.begin(committed_id)
    await env.begin(stalled_id, timeout_ms=1000)
    env.clock.advance(500)
    assert await env.coordinator.end_txn(committed_id, producer_id, epoch, True) is E.none
    assert value("shoal_txn_transactional_ids", {"state": "Ongoing"}) == 1
    assert value("shoal_txn_oldest_open_seconds") == 0.5

    env.clock.advance(600)
    assert await env.coordinator.abort_timed_out_transactions() == 1
    await env.eventually(lambda: env.state(stalled_id) == "CompleteAbort")
    assert value("shoal_txn_decided_total", {"result": "commit", "reason": "client"}) == 1
    assert value("shoal_txn_decided_total", {"result": "abort", "reason": "timeout"}) == 1
    assert value("shoal_txn_duration_seconds_count", {"result": "abort"}) == 1
    assert value("shoal_txn_duration_seconds_sum", {"result": "abort"}) == 1.1
    assert value("shoal_txn_transactional_ids", {"state": "Ongoing"}) == 0
    assert value("shoal_txn_oldest_open_seconds") == 0
