"""Idempotent producers through Log: duplicates, errors, snapshots on disk, restarts, truncation.

A producer's retry sends the very same bytes again, so the tests append the
same batch twice. Restarts come in two kinds: a clean close (a snapshot at
the log end) and a crash (``helpers.crash``), after which the state is the
newest snapshot plus the batches replayed after it.
"""

from __future__ import annotations

import os
import threading

import pytest
from shoal.broker.log.log import AppendInfo, InvalidRecordError, Log
from shoal.broker.log.producer_state import (
    BatchMetadata,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    ProducerStateManager,
)

from shoal.records import BatchOptions

PID = 7000
OTHER_PID = 7001


def idem(helpers, seq: int, count: int = 1, *, pid: int = PID, epoch: int = 0, **kw) -> bytes:
    options = BatchOptions(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    return helpers.make_batch(count, options=options, **kw)


def offsets(info: AppendInfo) -> tuple[int, int]:
    return info.first_offset, info.last_offset


def snapshot_names(log: Log) -> list[str]:
    return sorted(p.name for p in log.directory.glob("*.snapshot"))


# -- duplicates and errors on append ------------------------------------------


def test_duplicate_batch_is_not_appended_and_answers_the_original_offsets(open_log, helpers):
    log = open_log()
    log.append_as_leader(helpers.make_batch(2), 0)
    batch = idem(helpers, 0, 3, tag="first")
    original = log.append_as_leader(batch, 0)
    assert offsets(original) == (2, 4)
    assert not original.duplicate
    size = log.size
    retry = log.append_as_leader(batch, 0)
    assert retry.duplicate
    assert offsets(retry) == (2, 4)
    assert retry.record_count == 3
    assert retry.max_timestamp == original.max_timestamp
    assert retry.log_append_time == -1
    assert log.log_end_offset == 5
    assert log.size == size
    assert [r.offset for r in helpers.read_all(log)] == list(range(5))


@pytest.mark.parametrize("back", [1, 2, 3, 4, 5])
def test_retry_of_any_of_the_last_five_batches_is_a_duplicate(open_log, helpers, back) -> None:
    log = open_log()
    batches = [idem(helpers, 2 * i, 2, tag=f"b{i}") for i in range(7)]
    infos = [log.append_as_leader(b, 0) for b in batches]
    retry = log.append_as_leader(batches[-back], 0)
    assert retry.duplicate
    assert offsets(retry) == offsets(infos[-back])
    assert log.log_end_offset == 14


def test_retry_older_than_the_last_five_batches_is_out_of_order(open_log, helpers) -> None:
    log = open_log()
    batches = [idem(helpers, 2 * i, 2) for i in range(6)]
    helpers.append_batches(log, batches)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batches[0], 0)
    assert log.log_end_offset == 12


def test_duplicate_on_a_log_append_time_topic_answers_the_original_time(
    open_log, helpers, clock
) -> None:
    log = open_log(message_timestamp_type="LogAppendTime")
    batch = idem(helpers, 0, 2)
    original = log.append_as_leader(batch, 0)
    assert original.log_append_time == clock.now
    clock.advance(5_000)
    retry = log.append_as_leader(batch, 0)
    assert retry.duplicate
    assert offsets(retry) == (0, 1)
    # As Kafka's duplicate LogAppendInfo: the original batch's max timestamp, no append time.
    assert retry.max_timestamp == original.log_append_time
    assert retry.log_append_time == -1
    assert log.log_end_offset == 2


def test_sequence_gap_raises_and_appends_nothing(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0, 2), 0)
    size = log.size
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(idem(helpers, 3), 0)
    assert (log.log_end_offset, log.size) == (2, size)
    assert offsets(log.append_as_leader(idem(helpers, 2), 0)) == (2, 2)


def test_a_gap_raises_and_appends_nothing(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0, 2), 0)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(idem(helpers, 4, 2), 0)
    assert log.log_end_offset == 2
    assert log.producer_state.producers[PID].last_sequence == 1


def test_old_epoch_raises_and_appends_nothing(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0, epoch=1), 0)
    log.append_as_leader(idem(helpers, 0, epoch=2), 0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(idem(helpers, 1, epoch=1), 0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(idem(helpers, 0, epoch=1), 0)
    assert log.log_end_offset == 2
    assert log.producer_state.producers[PID].epoch == 2


def test_new_epoch_starts_at_zero_and_forgets_the_old_epochs_batches(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0, 2, epoch=0), 0)
    log.append_as_leader(idem(helpers, 2, 2, epoch=0), 0)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(idem(helpers, 4, epoch=1), 0)
    bumped = log.append_as_leader(idem(helpers, 0, 2, epoch=1), 0)
    assert not bumped.duplicate
    assert offsets(bumped) == (4, 5)
    assert log.append_as_leader(idem(helpers, 2, epoch=1), 0).first_offset == 6


def test_batches_without_a_producer_id_are_not_checked(open_log, helpers) -> None:
    log = open_log()
    batch = helpers.make_batch(2)
    first = log.append_as_leader(batch, 0)
    again = log.append_as_leader(batch, 0)
    assert not again.duplicate
    assert (offsets(first), offsets(again)) == ((0, 1), (2, 3))
    assert log.producer_state.producers == {}


def test_non_idempotent_batches_pass_between_a_producers_batches(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0), 0)
    log.append_as_leader(helpers.make_batch(3), 0)
    assert log.append_as_leader(idem(helpers, 1), 0).first_offset == 4
    assert log.append_as_leader(idem(helpers, 0), 0).duplicate


def test_plain_batch_inside_an_open_transaction_raises_invalid_txn_state(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0), 0)
    options = BatchOptions(producer_id=PID, producer_epoch=0, base_sequence=1, transactional=True)
    log.append_as_leader(helpers.make_batch(1, options=options), 0)
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(idem(helpers, 2), 0)
    assert log.log_end_offset == 2
    assert log.producer_state.producers[PID].last_sequence == 1


def test_failing_batch_in_a_multi_batch_append_appends_nothing(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0), 0)
    records = helpers.make_batch(2) + idem(helpers, 3)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(records, 0)
    assert log.log_end_offset == 1
    assert log.producer_state.producers[PID].last_sequence == 0


def test_retry_bundled_with_another_batch_is_rejected(open_log, helpers) -> None:
    log = open_log()
    first = idem(helpers, 0)
    log.append_as_leader(first, 0)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(first + helpers.make_batch(1), 0)
    assert log.log_end_offset == 1


def test_consecutive_batches_of_a_producer_in_one_append_are_accepted(open_log, helpers) -> None:
    # Kafka checks each batch against the producer state as updated by the
    # batches before it in the same request (ProducerAppendInfo).
    log = open_log()
    info = log.append_as_leader(idem(helpers, 0, 2) + idem(helpers, 2, 3), 0)
    assert offsets(info) == (0, 4)
    assert log.producer_state.producers[PID].last_sequence == 4
    assert log.append_as_leader(idem(helpers, 2, 3), 0).duplicate


def test_one_append_repeating_a_batch_appends_nothing(open_log, helpers) -> None:
    # The second copy is a retry of the first, and a retry must come alone.
    # (Kafka answers OUT_OF_ORDER_SEQUENCE_NUMBER here; either way nothing is written.)
    log = open_log()
    batch = idem(helpers, 0, 2)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(batch + batch, 0)
    assert log.log_end_offset == 0
    assert log.producer_state.producers == {}


def test_batches_of_two_producers_in_one_append_are_checked_each_on_its_own(
    open_log, helpers
) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0), 0)
    records = idem(helpers, 1) + idem(helpers, 0, pid=OTHER_PID) + idem(helpers, 2)
    assert offsets(log.append_as_leader(records, 0)) == (1, 3)
    assert log.producer_state.producers[PID].last_sequence == 2
    assert log.producer_state.producers[OTHER_PID].last_sequence == 0


def test_one_append_with_a_gap_between_its_batches_appends_nothing(open_log, helpers) -> None:
    log = open_log()
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(idem(helpers, 0, 2) + idem(helpers, 3), 0)
    assert log.log_end_offset == 0
    assert log.producer_state.producers == {}


# -- snapshots on roll and close -----------------------------------------------


def test_snapshot_is_written_at_each_roll(open_log, helpers) -> None:
    size = len(idem(helpers, 0, 2))
    log = open_log(segment_bytes=2 * size)
    assert snapshot_names(log) == []
    for i in range(3):
        log.append_as_leader(idem(helpers, 2 * i, 2), 0)
    assert [s.base_offset for s in log.segments] == [0, 4]
    assert snapshot_names(log) == ["00000000000000000004.snapshot"]
    log.roll()
    assert [s.base_offset for s in log.segments] == [0, 4, 6]
    assert snapshot_names(log) == [
        "00000000000000000004.snapshot",
        "00000000000000000006.snapshot",
    ]


async def test_a_rolls_snapshot_is_fsynced_by_the_flush_not_by_the_roll(
    open_log, helpers, monkeypatch
) -> None:
    # The roll runs on the event loop, where an fsync would wait for the file
    # system's journal; the flush of the rolled segment, in a thread, syncs it.
    synced: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1]
        synced.append((name, threading.current_thread() is threading.main_thread()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log = open_log()
    log.append_as_leader(idem(helpers, 0, 2), 0)
    log.roll()
    snapshot = "00000000000000000002.snapshot"
    assert snapshot_names(log) == [snapshot]
    assert not [name for name, _ in synced if name.endswith(".snapshot")]
    assert log.flush_target() == 2
    await log.flush(2)
    assert (snapshot, False) in synced, synced
    synced.clear()
    await log.flush()
    assert not [name for name, _ in synced if name.endswith(".snapshot")], "synced once"


def test_after_a_crash_an_empty_unsynced_snapshot_gives_way_to_the_older_one(
    open_log, helpers
) -> None:
    # A snapshot renamed into place but never fsynced may be empty after a crash.
    log, _, after = _rolled_log_with_two_producers(open_log, helpers)
    helpers.crash(log)
    (log.directory / "00000000000000000012.snapshot").write_bytes(b"")
    log = open_log(clean_shutdown=False, recovery_point=12)
    assert snapshot_names(log) == ["00000000000000000006.snapshot"]
    for raw in after:
        assert log.append_as_leader(raw, 0).duplicate


def test_snapshot_at_a_roll_holds_the_state_before_the_new_segment(
    open_log, helpers, log_dir
) -> None:
    size = len(idem(helpers, 0, 2))
    log = open_log(segment_bytes=2 * size)
    for i in range(3):
        log.append_as_leader(idem(helpers, 2 * i, 2), 0)
    reader = ProducerStateManager(log_dir)
    assert reader.load(4) == 4
    assert list(reader.producers[PID].batches) == [BatchMetadata(2, 3, 2, 3, helpers.NOW)]


def test_clean_close_writes_a_snapshot_at_the_log_end(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0, 3), 0)
    log.close()
    assert snapshot_names(log) == ["00000000000000000003.snapshot"]


def test_after_a_clean_restart_the_last_batch_is_still_a_duplicate(open_log, helpers) -> None:
    log = open_log()
    batches = [idem(helpers, 0, 2, tag="a"), idem(helpers, 2, 3, tag="b")]
    infos = [log.append_as_leader(b, 0) for b in batches]
    log.close()
    log = open_log()
    retry = log.append_as_leader(batches[1], 0)
    assert retry.duplicate
    assert offsets(retry) == offsets(infos[1])
    assert log.log_end_offset == 5
    assert offsets(log.append_as_leader(idem(helpers, 5), 0)) == (5, 5)
    assert [r.offset for r in helpers.read_all(log)] == list(range(6))


def test_after_a_clean_restart_only_the_last_batch_is_remembered(open_log, helpers) -> None:
    # Kafka's snapshot keeps one batch per producer; older retries are out of order.
    log = open_log()
    batches = [idem(helpers, 0, 2), idem(helpers, 2, 3)]
    helpers.append_batches(log, batches)
    log.close()
    log = open_log()
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batches[0], 0)
    assert log.log_end_offset == 5


def test_after_a_clean_restart_the_epoch_still_fences(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0, epoch=3), 0)
    log.close()
    log = open_log()
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(idem(helpers, 1, epoch=2), 0)
    assert log.append_as_leader(idem(helpers, 1, epoch=3), 0).first_offset == 1


def _rolled_log_with_two_producers(open_log, helpers):
    """PID writes only before the last roll; OTHER_PID mostly after it."""
    size = len(idem(helpers, 0, 2, tag="xx"))  # every batch here: 2 records, 2-letter tag
    log = open_log(segment_bytes=3 * size)
    before = [idem(helpers, 2 * i, 2, tag=f"p{i}") for i in range(3)]
    helpers.append_batches(log, before)
    log.append_as_leader(idem(helpers, 0, 2, pid=OTHER_PID, tag="o0"), 0)
    log.append_as_leader(idem(helpers, 2, 2, pid=OTHER_PID, tag="o1"), 0)
    assert [s.base_offset for s in log.segments] == [0, 6]
    after = [idem(helpers, 4 + 2 * i, 2, pid=OTHER_PID, tag=f"q{i}") for i in range(3)]
    helpers.append_batches(log, after[:1])
    log.roll()
    helpers.append_batches(log, after[1:])
    assert [s.base_offset for s in log.segments] == [0, 6, 12]
    assert snapshot_names(log) == [
        "00000000000000000006.snapshot",
        "00000000000000000012.snapshot",
    ]
    return log, before, after


def test_after_a_crash_state_is_the_newest_snapshot_plus_replayed_batches(open_log, helpers):
    log, before, after = _rolled_log_with_two_producers(open_log, helpers)
    assert log.log_end_offset == 16
    helpers.crash(log)
    # Flushed up to the last segment: recovery, and the replay, start there.
    log = open_log(clean_shutdown=False, recovery_point=12)
    assert log.log_end_offset == 16
    # OTHER_PID: its last batch before offset 12 comes from the snapshot, the
    # two after it are replayed from the log.
    other = log.producer_state.producers[OTHER_PID]
    assert [(b.first_sequence, b.first_offset) for b in other.batches] == [
        (4, 10),
        (6, 12),
        (8, 14),
    ]
    for raw, first in zip(after, (10, 12, 14), strict=True):
        retry = log.append_as_leader(raw, 0)
        assert retry.duplicate
        assert retry.first_offset == first
    assert log.append_as_leader(idem(helpers, 10, pid=OTHER_PID), 0).first_offset == 16
    # PID appears only in the snapshot: its last batch, nothing older.
    assert log.append_as_leader(before[-1], 0).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(before[-2], 0)
    assert log.append_as_leader(idem(helpers, 6, pid=PID), 0).first_offset == 17


def test_after_a_crash_without_snapshots_the_whole_log_is_replayed(open_log, helpers) -> None:
    log = open_log()
    batches = [idem(helpers, 2 * i, 2) for i in range(4)]
    helpers.append_batches(log, batches)
    assert snapshot_names(log) == []
    helpers.crash(log)
    log = open_log(clean_shutdown=False)
    for i, raw in enumerate(batches):
        retry = log.append_as_leader(raw, 0)
        assert retry.duplicate
        assert offsets(retry) == (2 * i, 2 * i + 1)
    assert log.append_as_leader(idem(helpers, 8), 0).first_offset == 8


def test_after_a_clean_restart_then_a_crash_replay_starts_mid_segment(open_log, helpers) -> None:
    # The close snapshot sits inside the active segment: only the batches
    # after it are replayed, not the ones before it in the same segment.
    log = open_log()
    batches = [idem(helpers, 2 * i, 2, tag=f"b{i}") for i in range(4)]
    helpers.append_batches(log, batches[:2])
    log.close()
    log = open_log()
    helpers.append_batches(log, batches[2:])
    helpers.crash(log)
    log = open_log(clean_shutdown=False, recovery_point=4)
    assert snapshot_names(log) == ["00000000000000000004.snapshot"]
    cached = log.producer_state.producers[PID].batches
    assert [(b.first_sequence, b.first_offset, b.last_offset) for b in cached] == [
        (2, 2, 3),
        (4, 4, 5),
        (6, 6, 7),
    ]
    assert log.append_as_leader(batches[2], 0).duplicate
    assert log.append_as_leader(idem(helpers, 8), 0).first_offset == 8


def test_after_a_crash_with_a_corrupt_newest_snapshot_the_older_one_is_used(
    open_log, helpers
) -> None:
    log, _, after = _rolled_log_with_two_producers(open_log, helpers)
    helpers.crash(log)
    newest = log.directory / "00000000000000000012.snapshot"
    damaged = bytearray(newest.read_bytes())
    damaged[-1] ^= 0xFF
    newest.write_bytes(bytes(damaged))
    log = open_log(clean_shutdown=False, recovery_point=12)
    assert snapshot_names(log) == ["00000000000000000006.snapshot"]
    # Replayed from offset 6: OTHER_PID's batches after it are all known.
    for raw in after:
        assert log.append_as_leader(raw, 0).duplicate
    assert log.append_as_leader(idem(helpers, 10, pid=OTHER_PID), 0).first_offset == 16


def test_snapshot_past_a_lost_tail_is_dropped_and_the_lost_batch_is_new(open_log, helpers) -> None:
    log = open_log()
    kept, lost = idem(helpers, 0, 2), idem(helpers, 2, 3)
    log.append_as_leader(kept, 0)
    log.append_as_leader(lost, 0)
    log.close()
    assert snapshot_names(log) == ["00000000000000000005.snapshot"]
    # The tail never reached the disk: the segment file holds only the first batch.
    segment = log.directory / "00000000000000000000.log"
    with segment.open("r+b") as f:
        f.truncate(len(kept))
    log = open_log(clean_shutdown=False)
    assert log.log_end_offset == 2
    assert snapshot_names(log) == []
    info = log.append_as_leader(lost, 0)
    assert not info.duplicate
    assert offsets(info) == (2, 4)


# -- truncation ------------------------------------------------------------------


def test_truncate_forgets_the_removed_batches(open_log, helpers) -> None:
    log = open_log()
    batches = [idem(helpers, 2 * i, 2, tag=f"b{i}") for i in range(3)]
    helpers.append_batches(log, batches)
    log.truncate_to(4)
    assert log.producer_state.producers[PID].last_sequence == 3
    again = log.append_as_leader(batches[2], 1)
    assert not again.duplicate
    assert offsets(again) == (4, 5)
    assert log.append_as_leader(batches[1], 1).duplicate


def test_truncate_to_the_log_start_forgets_the_producer(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(idem(helpers, 0, 2), 0)
    log.append_as_leader(idem(helpers, 2, 2), 0)
    log.truncate_to(0)
    assert log.producer_state.producers == {}
    assert offsets(log.append_as_leader(idem(helpers, 0, 2), 0)) == (0, 1)


def test_truncate_deletes_snapshots_past_the_new_end_and_rebuilds(open_log, helpers) -> None:
    log, before, after = _rolled_log_with_two_producers(open_log, helpers)
    log.truncate_to(10)
    assert log.log_end_offset == 10
    assert [s.base_offset for s in log.segments] == [0, 6]
    assert snapshot_names(log) == ["00000000000000000006.snapshot"]
    # OTHER_PID's batches from offset 10 on are gone; its two earlier ones remain.
    assert log.producer_state.producers[OTHER_PID].last_sequence == 3
    info = log.append_as_leader(after[0], 1)
    assert not info.duplicate
    assert offsets(info) == (10, 11)
    assert log.append_as_leader(before[-1], 1).duplicate


def test_truncate_at_a_segment_base_keeps_that_offsets_snapshot(open_log, helpers) -> None:
    log, _, after = _rolled_log_with_two_producers(open_log, helpers)
    log.truncate_to(12)
    assert snapshot_names(log) == [
        "00000000000000000006.snapshot",
        "00000000000000000012.snapshot",
    ]
    assert log.append_as_leader(after[0], 1).duplicate
    assert offsets(log.append_as_leader(after[1], 1)) == (12, 13)


def test_truncated_log_reopens_with_the_truncated_state(open_log, helpers) -> None:
    log, _, after = _rolled_log_with_two_producers(open_log, helpers)
    log.truncate_to(10)
    log.close()
    log = open_log()
    assert log.producer_state.producers[OTHER_PID].last_sequence == 3
    assert offsets(log.append_as_leader(after[0], 1)) == (10, 11)
