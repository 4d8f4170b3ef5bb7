"""Transactions in the log: open, commit and abort, the last stable offset, the aborted
transaction index through restarts, truncation and replication, fencing of markers,
read_committed reads, and the cleaner with transactional data.

A transactional producer is simulated by appending transactional batches
(its sequence numbers continuing across transactions) and the coordinator by
``append_marker``; the high watermark is set by hand as a partition would,
except in the Partition tests.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid
from types import SimpleNamespace

import pytest
from shoal.broker.cluster.model import NodeId, PartitionState
from shoal.broker.fetch_sessions import FetchSessionCache
from shoal.broker.handlers.fetch import handle_fetch
from shoal.broker.handlers.offsets import LATEST, list_offset
from shoal.broker.log.cleaner.batches import DELETE_HORIZON_BIT
from shoal.broker.log.cleaner.cleanable import log_to_clean
from shoal.broker.log.cleaner.cleaner import Cleaner
from shoal.broker.log.cleaner.faults import Faults, InjectedFaultError
from shoal.broker.log.log import Log
from shoal.broker.log.producer_state import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)
from shoal.broker.log.txn_index import AbortedTxn
from shoal.broker.partition import NotEnoughReplicasError, NotLeaderError, Partition

from shoal.records import BatchOptions, NewRecord, build_batch, iter_records
from shoal.wire.codec import schema

PID, OTHER = 5000, 5001
NOW = 1_700_000_000_000


class Producer:
    """A transactional producer's batches: sequences continue across transactions."""

    def __init__(self, helpers, pid: int = PID, epoch: int = 0) -> None:
        self.helpers = helpers
        self.pid = pid
        self.epoch = epoch
        self.sequence = 0

    def batch(self, count: int = 1, tag: str = "t", transactional: bool = True) -> bytes:
        options = BatchOptions(
            producer_id=self.pid,
            producer_epoch=self.epoch,
            base_sequence=self.sequence,
            transactional=transactional,
        )
        self.sequence += count
        return self.helpers.make_batch(count, tag=tag, options=options)

    def keyed(self, pairs: list[tuple[str, str]]) -> bytes:
        options = BatchOptions(
            producer_id=self.pid,
            producer_epoch=self.epoch,
            base_sequence=self.sequence,
            transactional=True,
        )
        self.sequence += len(pairs)
        records = [NewRecord(k.encode(), v.encode(), timestamp=NOW) for k, v in pairs]
        return build_batch(records, 0, options)


def _marker(log: Log, pid: int, commit: bool, epoch: int = 0, coordinator_epoch: int = 0):
    return log.append_marker(pid, epoch, commit, coordinator_epoch, 0)


def _commit_all(log: Log) -> None:
    log.high_watermark = log.log_end_offset


# -- producer state and the last stable offset ------------------------------------------


def test_transaction_is_unstable_until_its_marker_is_replicated(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(2), 0)
    producer = Producer(helpers)
    log.append_as_leader(producer.batch(3), 0)
    log.append_as_leader(producer.batch(1), 0)
    _commit_all(log)
    assert log.producer_state.producers[PID].current_txn_first_offset == 2
    assert log.first_unstable_offset == 2
    assert log.last_stable_offset == 2
    info = _marker(log, PID, commit=True)
    assert (info.first_offset, info.last_offset) == (6, 6)
    # The marker is written but not replicated: still unstable.
    assert log.last_stable_offset == 2
    log.high_watermark = 6
    assert log.last_stable_offset == 2
    log.high_watermark = 7
    assert log.first_unstable_offset is None
    assert log.last_stable_offset == 7
    assert log.producer_state.producers[PID].current_txn_first_offset == -1
    assert log.collect_aborted_txns(0, 7) == []


def test_lso_is_the_oldest_open_transaction(open_log, helpers) -> None:
    log = open_log()
    first, second = Producer(helpers), Producer(helpers, OTHER)
    log.append_as_leader(first.batch(2), 0)  # 0-1
    log.append_as_leader(second.batch(2), 0)  # 2-3
    _marker(log, PID, commit=False)  # 4
    _commit_all(log)
    assert log.last_stable_offset == 2
    _marker(log, OTHER, commit=True)  # 5
    _commit_all(log)
    assert log.last_stable_offset == 6


def test_abort_is_indexed_in_the_markers_segment(open_log, helpers) -> None:
    log = open_log()
    producer, other = Producer(helpers), Producer(helpers, OTHER)
    log.append_as_leader(producer.batch(2), 0)  # 0-1
    log.append_as_leader(other.batch(1), 0)  # 2: still open when 0 aborts
    log.roll()
    log.append_as_leader(producer.batch(1), 0)  # 3
    _marker(log, PID, commit=False)  # 4
    assert log.segments[0].txn_index.entries == []
    assert log.active.txn_index.entries == [AbortedTxn(PID, 0, 4, 2)]
    _marker(log, OTHER, commit=False)  # 5
    assert log.active.txn_index.entries[-1] == AbortedTxn(OTHER, 2, 5, 6)
    assert log.collect_aborted_txns(0, 6) == [AbortedTxn(PID, 0, 4, 2), AbortedTxn(OTHER, 2, 5, 6)]
    # A fetch from the second segment still learns of the abort begun in the first.
    assert [t.producer_id for t in log.collect_aborted_txns(3, 4)] == [PID, OTHER]
    assert log.collect_aborted_txns(6, 7) == []


def test_plain_batch_during_a_transaction_is_invalid_txn_state(open_log, helpers) -> None:
    log = open_log()
    producer = Producer(helpers)
    log.append_as_leader(producer.batch(1), 0)
    with pytest.raises(InvalidTxnStateError) as caught:
        log.append_as_leader(producer.batch(1, transactional=False), 0)
    assert caught.value.code == "invalid_txn_state"
    assert log.log_end_offset == 1


def test_retry_of_a_transactional_batch_is_a_duplicate(open_log, helpers) -> None:
    log = open_log()
    producer = Producer(helpers)
    raw = producer.batch(2)
    log.append_as_leader(raw, 0)
    assert log.append_as_leader(raw, 0).duplicate
    assert log.log_end_offset == 2


def test_internal_transactional_batches_skip_sequence_checks(open_log, helpers) -> None:
    log = open_log()
    options = BatchOptions(producer_id=PID, producer_epoch=0, base_sequence=-1, transactional=True)
    log.append_as_leader(helpers.make_batch(1, options=options), 0)
    log.append_as_leader(helpers.make_batch(1, options=options), 0)
    assert log.first_unstable_offset == 0
    assert list(log.producer_state.producers[PID].batches) == []
    _marker(log, PID, commit=True)
    _commit_all(log)
    assert log.last_stable_offset == 3


def test_next_transaction_after_a_commit_starts_at_its_own_offset(open_log, helpers) -> None:
    log = open_log()
    producer = Producer(helpers)
    log.append_as_leader(producer.batch(1), 0)
    _marker(log, PID, commit=True)
    log.append_as_leader(producer.batch(2), 0)  # sequences go on: 1
    _commit_all(log)
    assert log.first_unstable_offset == 2


# -- fencing ------------------------------------------------------------------------------


def test_marker_with_an_older_producer_epoch_is_fenced(open_log, helpers) -> None:
    log = open_log()
    producer = Producer(helpers, epoch=3)
    log.append_as_leader(producer.batch(1), 0)
    with pytest.raises(InvalidProducerEpochError) as caught:
        _marker(log, PID, commit=True, epoch=2)
    assert caught.value.code == "invalid_producer_epoch"
    assert log.log_end_offset == 1


def test_marker_from_an_older_coordinator_epoch_is_fenced(open_log, helpers) -> None:
    log = open_log()
    producer = Producer(helpers)
    log.append_as_leader(producer.batch(1), 0)
    _marker(log, PID, commit=True, coordinator_epoch=5)
    log.append_as_leader(producer.batch(1), 0)
    with pytest.raises(TransactionCoordinatorFencedError) as caught:
        _marker(log, PID, commit=False, coordinator_epoch=4)
    assert caught.value.code == "transaction_coordinator_fenced"
    _marker(log, PID, commit=False, coordinator_epoch=5)


def test_abort_with_a_bumped_epoch_fences_the_old_producer(open_log, helpers) -> None:
    log = open_log()
    zombie = Producer(helpers, epoch=0)
    log.append_as_leader(zombie.batch(1), 0)
    _marker(log, PID, commit=False, epoch=1)  # the coordinator's timeout abort
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(zombie.batch(1), 0)
    fresh = Producer(helpers, epoch=1)
    assert log.append_as_leader(fresh.batch(1), 0).first_offset == 2


# -- restarts -----------------------------------------------------------------------------


def _log_with_open_and_aborted(open_log, helpers) -> Log:
    log = open_log(segment_bytes=400)
    producer, other = Producer(helpers), Producer(helpers, OTHER)
    log.append_as_leader(producer.batch(2), 0)  # 0-1, aborted below
    log.append_as_leader(other.batch(1), 0)  # 2, left open
    log.roll()
    log.append_as_leader(producer.batch(1), 0)  # 3
    _marker(log, PID, commit=False)  # 4
    log.append_as_leader(helpers.make_batch(1), 0)  # 5
    _commit_all(log)
    return log


def test_clean_restart_keeps_open_transactions_from_the_snapshot(open_log, helpers) -> None:
    log = _log_with_open_and_aborted(open_log, helpers)
    log.close()
    log = open_log(segment_bytes=400, high_watermark=6)
    assert log.producer_state.producers[OTHER].current_txn_first_offset == 2
    assert log.producer_state.ongoing == {2: OTHER}
    assert log.last_stable_offset == 2
    assert log.collect_aborted_txns(0, 6) == [AbortedTxn(PID, 0, 4, 2)]
    _marker(log, OTHER, commit=True)
    log.high_watermark = log.log_end_offset
    assert log.last_stable_offset == 7


def test_crash_replays_markers_and_rebuilds_the_lost_index(open_log, helpers) -> None:
    log = _log_with_open_and_aborted(open_log, helpers)
    helpers.crash(log)
    # The crash lost the index entry that was never flushed.
    log.active.txn_index.path.unlink()
    log = open_log(segment_bytes=400, clean_shutdown=False, recovery_point=3, high_watermark=6)
    assert log.producer_state.ongoing == {2: OTHER}
    assert log.last_stable_offset == 2
    assert log.active.txn_index.entries == [AbortedTxn(PID, 0, 4, 2)]


def test_crash_that_lost_the_marker_drops_its_index_entry(open_log, helpers) -> None:
    log = _log_with_open_and_aborted(open_log, helpers)
    marker_position = next(
        location.position for location in log.active.scan(0) if location.header.is_control
    )
    path = log.active.log_path
    helpers.crash(log)
    with path.open("r+b") as file:
        file.truncate(marker_position)  # the marker never reached the disk
    log = open_log(segment_bytes=400, clean_shutdown=False, recovery_point=3)
    assert log.log_end_offset == 4
    assert log.collect_aborted_txns(0, 10) == []
    assert log.active.txn_index.entries == []
    assert log.producer_state.ongoing == {0: PID, 2: OTHER}


def test_snapshot_carries_the_open_transaction_and_coordinator_epoch(open_log, helpers) -> None:
    log = open_log()
    producer = Producer(helpers)
    log.append_as_leader(producer.batch(1), 0)
    _marker(log, PID, commit=True, coordinator_epoch=7)
    log.append_as_leader(producer.batch(1), 0)  # 2, open
    log.close()
    log = open_log(high_watermark=3)
    entry = log.producer_state.producers[PID]
    assert (entry.coordinator_epoch, entry.current_txn_first_offset) == (7, 2)
    with pytest.raises(TransactionCoordinatorFencedError):
        _marker(log, PID, commit=True, coordinator_epoch=6)


def test_a_producer_only_a_marker_touched_survives_a_restart(open_log) -> None:
    log = open_log()
    _marker(log, PID, commit=False, epoch=4, coordinator_epoch=2)
    log.close()
    log = open_log(high_watermark=1)
    entry = log.producer_state.producers[PID]
    assert (entry.epoch, entry.coordinator_epoch, len(entry.batches)) == (4, 2, 0)


def test_open_transactions_do_not_expire(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(Producer(helpers).batch(1), 0)
    assert log.producer_state.expire(NOW * 2, 1) == 0
    _marker(log, PID, commit=True)
    assert log.producer_state.expire(NOW * 2, 1) == 1


# -- truncation and replication -----------------------------------------------------------


def test_truncation_drops_index_entries_and_reopens_the_transaction(open_log, helpers) -> None:
    log = _log_with_open_and_aborted(open_log, helpers)
    log.truncate_to(4)
    assert log.active.txn_index.entries == []
    assert log.collect_aborted_txns(0, 10) == []
    assert log.producer_state.ongoing == {0: PID, 2: OTHER}
    assert log.last_stable_offset == 0


def test_truncation_below_a_segment_deletes_its_index(open_log, helpers) -> None:
    log = _log_with_open_and_aborted(open_log, helpers)
    path = log.active.txn_index.path
    assert path.exists()
    log.truncate_to(2)
    assert not path.exists()
    assert log.producer_state.ongoing == {0: PID}


def test_follower_tracks_transactions_and_indexes_aborts(open_log, helpers, tmp_path) -> None:
    leader = _log_with_open_and_aborted(open_log, helpers)
    follower = Log(tmp_path / "follower", leader.config, 0, True, leader.clock)
    data = b"".join(helpers.slice_bytes(leader.read(o, 1 << 20, 6, True)) for o in (0, 3))
    follower.append_as_follower(data)
    assert follower.producer_state.ongoing == {2: OTHER}
    assert follower.active.txn_index.entries == [AbortedTxn(PID, 0, 4, 2)]
    assert follower.last_stable_offset == 0  # nothing replicated yet
    follower.high_watermark = 6
    assert follower.last_stable_offset == 2
    follower.close()


def test_deleted_segments_take_their_index_along(open_log, helpers) -> None:
    log = _log_with_open_and_aborted(open_log, helpers)
    _marker(log, OTHER, commit=True)
    log.roll()
    _commit_all(log)
    second = log.segments[1]
    path = second.txn_index.path
    log.increment_log_start_offset(log.segments[2].base_offset)
    doomed = log.delete_segments(log.segments_below_log_start())
    assert second in doomed
    assert not path.exists()
    assert second.txn_index.path.name.endswith(".txnindex.deleted")
    for segment in doomed:
        segment.destroy()
    assert not second.txn_index.path.exists()
    assert log.collect_aborted_txns(0, log.log_end_offset) == []


def test_log_start_past_an_open_transaction_bounds_the_lso(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(Producer(helpers).batch(2), 0)
    log.append_as_leader(helpers.make_batch(2), 0)
    _commit_all(log)
    log.increment_log_start_offset(3)
    assert log.last_stable_offset == 3


# -- the partition ------------------------------------------------------------------------

ME = NodeId(1)


@pytest.fixture
def leader(open_log, clock) -> Partition:
    partition = Partition("orders", 0, uuid.uuid4(), ME, open_log(), clock)
    partition.update_state((ME,), PartitionState(ME, 3, (ME,)), 1)
    return partition


def test_partition_appends_markers_as_leader_only(open_log, clock) -> None:
    partition = Partition("orders", 0, uuid.uuid4(), ME, open_log(), clock)
    with pytest.raises(NotLeaderError):
        partition.append_marker(PID, 0, True, 0)


def test_partition_marker_needs_min_insync_replicas(open_log, clock) -> None:
    partition = Partition("orders", 0, uuid.uuid4(), ME, open_log(min_insync_replicas=2), clock)
    partition.update_state((ME,), PartitionState(ME, 3, (ME,)), 1)
    with pytest.raises(NotEnoughReplicasError):
        partition.append_marker(PID, 0, True, 0)
    assert partition.log.log_end_offset == 0


async def test_partition_marker_commits_and_moves_the_lso(leader, helpers) -> None:
    producer = Producer(helpers)
    leader.append_as_leader(producer.batch(2), -1)
    assert leader.log.last_stable_offset == 0
    info = leader.append_marker(PID, 0, True, 3)
    await leader.wait_for_commit(info.last_offset + 1, 1.0)
    assert leader.log.last_stable_offset == 3
    ((marker, _),) = helpers.split_batches(
        helpers.slice_bytes(leader.log.read(2, 1 << 20, 3, True))
    )
    assert marker.is_control
    assert marker.partition_leader_epoch == 3


def test_read_committed_stops_at_the_lso_with_the_aborted_txns(leader, helpers) -> None:
    first, second = Producer(helpers), Producer(helpers, OTHER)
    leader.append_as_leader(first.batch(2, tag="a"), 1)  # 0-1
    leader.append_marker(PID, 0, False, 3)  # 2
    leader.append_as_leader(helpers.make_batch(1, tag="p"), 1)  # 3
    leader.append_as_leader(second.batch(1, tag="o"), 1)  # 4, open
    leader.append_as_leader(helpers.make_batch(1, tag="q"), 1)  # 5
    committed = leader.read(0, 1 << 20, True, False, read_committed=True)
    assert committed.last_stable_offset == 4
    assert committed.aborted_transactions == (AbortedTxn(PID, 0, 2, 3),)
    records = [
        r.offset
        for _, raw in helpers.split_batches(helpers.slice_bytes(committed.records))
        for r in iter_records(raw)
    ]
    assert records == [0, 1, 2, 3]
    uncommitted = leader.read(0, 1 << 20, True, False)
    assert uncommitted.aborted_transactions is None
    assert uncommitted.high_watermark == 6
    assert leader.read(4, 1 << 20, True, False, read_committed=True).records is None
    empty = leader.read(3, 1 << 20, True, False, read_committed=True)
    assert empty.aborted_transactions == ()


async def test_lso_moving_with_the_high_watermark_wakes_waiters(leader, helpers) -> None:
    leader.update_state((ME, NodeId(2)), PartitionState(ME, 3, (ME, NodeId(2))), 2)
    leader.append_as_leader(Producer(helpers).batch(1), 1)
    leader.append_marker(PID, 0, True, 3)
    waiter = asyncio.get_running_loop().create_future()
    leader.add_waiter(waiter)
    leader.record_follower_fetch(NodeId(2), 2)
    assert waiter.done()
    assert leader.log.last_stable_offset == 2


# -- the cleaner --------------------------------------------------------------------------


def _compacted(open_log, **fields) -> Log:
    fields.setdefault("segment_bytes", 300)
    fields.setdefault("cleanup_policy", ("compact",))
    fields.setdefault("file_delete_delay_ms", 0)
    return open_log(**fields)


def _batches(log: Log, helpers):
    return [
        header
        for segment_data in (
            helpers.slice_bytes(log.read(s.base_offset, 1 << 30, log.log_end_offset, True))
            for s in log.segments
            if s.size
        )
        for header, _ in helpers.split_batches(segment_data)
    ]


async def _clean(log: Log) -> None:
    target = log_to_clean(log, None, log.clock())
    await Cleaner(max_map_entries=1 << 20).clean(log, target)


async def test_cleaner_removes_aborted_records_and_keeps_markers(open_log, helpers) -> None:
    log = _compacted(open_log)
    producer = Producer(helpers)
    plain = Producer(helpers, OTHER)
    log.append_as_leader(plain.keyed([("k", "committed")]), 0)  # 0
    _marker(log, OTHER, commit=True)  # 1
    log.append_as_leader(producer.keyed([("k", "aborted")]), 0)  # 2
    _marker(log, PID, commit=False)  # 3
    for i in range(6):
        log.append_as_leader(build_batch([NewRecord(f"x{i}".encode(), b"v", timestamp=NOW)]), 0)
    log.roll()
    _commit_all(log)
    await _clean(log)
    kept = [(r.offset, r.key, r.value) for r in helpers.read_all(log)]
    # The committed value of k survives: the aborted one neither hid it nor stayed.
    assert (0, b"k", b"committed") in kept
    assert not any(value == b"aborted" for _, _, value in kept)
    controls = [h.base_offset for h in _batches(log, helpers) if h.is_control]
    assert controls == [1, 3]
    # The abort is still known to read_committed consumers after the swap.
    assert log.collect_aborted_txns(0, log.log_end_offset) == [AbortedTxn(PID, 2, 3, 4)]
    assert log.segments[0].txn_index.path.exists()


async def test_cleaner_leaves_open_transactions_alone(open_log, helpers) -> None:
    log = _compacted(open_log)
    producer = Producer(helpers)
    log.append_as_leader(producer.keyed([("k", "open-1")]), 0)  # 0, open
    for i in range(8):
        log.append_as_leader(build_batch([NewRecord(b"k", f"v{i}".encode(), timestamp=NOW)]), 0)
    log.roll()
    _commit_all(log)
    assert log.last_stable_offset == 0
    target = log_to_clean(log, None, log.clock())
    assert target.first_uncleanable_offset == 0
    await _clean(log)
    assert [r.offset for r in helpers.read_all(log)] == list(range(9))


def _log_to_clean_with_an_abort(open_log, helpers, **fields) -> Log:
    log = _compacted(open_log, **fields)
    producer = Producer(helpers)
    log.append_as_leader(producer.keyed([("k", "aborted")]), 0)  # 0
    log.append_as_leader(build_batch([NewRecord(b"k", b"plain", timestamp=NOW)]), 0)  # 1
    _marker(log, PID, commit=False)  # 2
    for i in range(8):
        log.append_as_leader(build_batch([NewRecord(f"x{i}".encode(), b"v", timestamp=NOW)]), 0)
    log.roll()
    _commit_all(log)
    return log


@pytest.mark.parametrize("step", ["old_deleted_partly", "old_deleted", "index_live", "swap_live"])
async def test_a_crash_during_the_swap_keeps_the_aborted_index(open_log, helpers, step) -> None:
    log = _log_to_clean_with_an_abort(open_log, helpers)
    assert len(log.segments) > 2
    end = log.log_end_offset
    target = log_to_clean(log, None, log.clock())
    with pytest.raises(InjectedFaultError):
        await Cleaner(max_map_entries=1 << 20, faults=Faults(step, raise_=True)).clean(log, target)
    helpers.crash(log)
    log = _compacted(open_log, clean_shutdown=False, recovery_point=end, high_watermark=end)
    assert log.collect_aborted_txns(0, end) == [AbortedTxn(PID, 0, 2, 3)]
    assert not list(log.directory.glob("*.swap"))
    values = {r.key: r.value for r in helpers.read_all(log)}
    assert values[b"k"] == b"plain"


async def test_aborted_batch_that_is_its_producers_last_stays_empty(open_log, helpers) -> None:
    log = _compacted(open_log)
    producer = Producer(helpers)
    log.append_as_leader(producer.keyed([("a", "1"), ("b", "2")]), 0)  # 0-1
    _marker(log, PID, commit=False)  # 2
    for i in range(8):
        log.append_as_leader(build_batch([NewRecord(f"x{i}".encode(), b"v", timestamp=NOW)]), 0)
    log.roll()
    _commit_all(log)
    await _clean(log)
    first = _batches(log, helpers)[0]
    # Its sequence numbers must survive for the producer's next batch.
    assert (first.base_offset, first.last_offset, first.records_count) == (0, 1, 0)
    assert (
        log.append_as_leader(producer.keyed([("a", "3")]), 0).first_offset == log.log_end_offset - 1
    )


# -- the handlers ---------------------------------------------------------------------------


def _fetch_request(isolation_level: int, offset: int = 0) -> SimpleNamespace:
    partition = SimpleNamespace(
        partition=0,
        fetch_offset=offset,
        partition_max_bytes=1 << 20,
        current_leader_epoch=-1,
        log_start_offset=-1,
    )
    return SimpleNamespace(
        replica_id=-1,
        session_id=0,
        session_epoch=-1,
        forgotten_topics_data=(),
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=isolation_level,
        topics=(SimpleNamespace(topic="orders", partitions=(partition,)),),
    )


def _open_and_aborted(leader: Partition, helpers) -> None:
    leader.append_as_leader(Producer(helpers).batch(2), 1)  # 0-1
    leader.append_marker(PID, 0, False, 3)  # 2
    leader.append_as_leader(Producer(helpers, OTHER).batch(1), 1)  # 3, open
    leader.append_as_leader(helpers.make_batch(1), 1)  # 4


@pytest.mark.parametrize("isolation_level", [0, 1])
async def test_fetch_answers_the_lso_and_aborted_txns_for_read_committed(
    leader, helpers, isolation_level
) -> None:
    _open_and_aborted(leader, helpers)
    services = SimpleNamespace(
        partition=lambda name, index: leader, image=None, fetch_sessions=FetchSessionCache(0)
    )
    ctx = SimpleNamespace(version=12, api=schema(1, 12))
    answer = await handle_fetch(services, ctx, _fetch_request(isolation_level))
    (topic,) = answer.body.responses
    (data,) = topic.partitions
    assert (data.high_watermark, data.last_stable_offset) == (5, 3)
    if isolation_level:
        assert [(t.producer_id, t.first_offset) for t in data.aborted_transactions] == [(PID, 0)]
    else:
        assert data.aborted_transactions is None


def test_list_offsets_latest_is_the_lso_for_read_committed(leader, helpers) -> None:
    _open_and_aborted(leader, helpers)
    assert list_offset(leader, LATEST).offset == 5
    assert list_offset(leader, LATEST, read_committed=True).offset == 3
    assert list_offset(leader, NOW - 1, read_committed=True).offset == 0


async def test_markers_go_once_their_data_is_gone_and_the_horizon_passed(
    open_log, helpers, clock
) -> None:
    log = _compacted(open_log, segment_bytes=2000, delete_retention_ms=1000)
    producer = Producer(helpers)
    log.append_as_leader(producer.keyed([("k", "aborted")]), 0)  # 0
    _marker(log, PID, commit=False)  # 1
    log.append_as_leader(producer.keyed([("j", "committed")]), 0)  # 2
    _marker(log, PID, commit=True)  # 3
    for key in ("k", "j", "x", "y"):
        log.append_as_leader(build_batch([NewRecord(key.encode(), b"plain", timestamp=NOW)]), 0)
    log.roll()
    log.append_as_leader(build_batch([NewRecord(b"z", b"v", timestamp=NOW)]), 0)
    log.roll()
    _commit_all(log)
    log.producer_state.expire(clock() + 10**9, 1)  # the producer is long gone
    assert log.collect_aborted_txns(0, log.log_end_offset) == [AbortedTxn(PID, 0, 1, 2)]

    def markers() -> list[tuple[int, bool]]:
        return [
            (h.base_offset, bool(h.attributes & DELETE_HORIZON_BIT))
            for h in _batches(log, helpers)
            if h.is_control
        ]

    await _clean(log)  # the data goes; the markers saw it, so they stay as they are
    assert markers() == [(1, False), (3, False)]
    await _clean(log)  # no data left: each gets its delete horizon
    assert markers() == [(1, True), (3, True)]
    assert log.collect_aborted_txns(0, log.log_end_offset) == [AbortedTxn(PID, 0, 1, 2)]
    clock.advance(999)
    await _clean(log)
    assert markers() == [(1, True), (3, True)]
    clock.advance(1)
    await _clean(log)
    assert markers() == []
    # The abort's index entry went with its marker.
    assert log.collect_aborted_txns(0, log.log_end_offset) == []
    assert {r.key: r.value for r in helpers.read_all(log)} == {
        b"k": b"plain",
        b"j": b"plain",
        b"x": b"plain",
        b"y": b"plain",
        b"z": b"v",
    }


async def test_marker_of_a_transaction_with_data_left_stays(open_log, helpers, clock) -> None:
    log = _compacted(open_log, segment_bytes=2000, delete_retention_ms=0)
    producer = Producer(helpers)
    log.append_as_leader(producer.keyed([("j", "committed")]), 0)  # 0
    _marker(log, PID, commit=True)  # 1
    log.append_as_leader(build_batch([NewRecord(b"x", b"plain", timestamp=NOW)]), 0)
    log.roll()
    log.append_as_leader(build_batch([NewRecord(b"z", b"v", timestamp=NOW)]), 0)
    log.roll()
    _commit_all(log)
    log.producer_state.expire(clock() + 10**9, 1)
    for _ in range(3):
        await _clean(log)
        clock.advance(10)
    assert [h.base_offset for h in _batches(log, helpers) if h.is_control] == [1]
    assert {r.key: r.value for r in helpers.read_all(log)}[b"j"] == b"committed"
