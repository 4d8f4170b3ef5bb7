"""Log.append_as_follower and truncate_fully_and_start_at: a replica's writes.

A follower stores the leader's batches as they are (offsets, leader epoch,
timestamps, CRC), checking only that they are whole, undamaged and continue
its log. Batches here are built with their final offsets and epoch, as a
leader's log would hold them.
"""

from __future__ import annotations

import pytest
from shoal.broker.log.log import CorruptRecordError, Log
from shoal.broker.log.producer_state import OutOfOrderSequenceError

from shoal.records import BatchOptions, NewRecord, build_batch

NOW = 1_700_000_000_000


def _leader_batch(
    base_offset: int,
    count: int = 2,
    epoch: int = 1,
    *,
    timestamp: int = NOW,
    producer_id: int = -1,
    base_sequence: int = -1,
    tag: str = "r",
) -> bytes:
    records = [
        NewRecord(f"{tag}-k{i}".encode(), f"{tag}-v{i}".encode(), (), timestamp + i)
        for i in range(count)
    ]
    options = BatchOptions(
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
        partition_leader_epoch=epoch,
    )
    return build_batch(records, base_offset, options)


def _stored(log: Log, helpers) -> bytes:
    fs = log.read(log.log_start_offset, 1 << 30, log.log_end_offset, min_one=True)
    return b"" if fs is None else helpers.slice_bytes(fs)


def _snapshot(log: Log) -> tuple:
    return (log.log_end_offset, log.size, log.epochs.entries, dict(log.producer_state.producers))


def test_batches_are_stored_byte_for_byte_at_the_leaders_offsets(open_log, helpers) -> None:
    log = open_log()
    first = _leader_batch(0, count=3, epoch=5)
    second = _leader_batch(3, count=2, epoch=5)
    assert log.append_as_follower(first) == 3
    assert log.append_as_follower(second) == 5
    assert _stored(log, helpers) == first + second
    assert [r.offset for r in helpers.read_all(log)] == [0, 1, 2, 3, 4]
    assert log.high_watermark == 0, "the partition moves the high watermark, not the log"


def test_several_batches_in_one_fetch(open_log, helpers) -> None:
    log = open_log()
    data = _leader_batch(0, 2) + _leader_batch(2, 3) + _leader_batch(5, 1)
    assert log.append_as_follower(data) == 6
    assert _stored(log, helpers) == data


def test_nothing_fetched_is_nothing_appended(open_log) -> None:
    log = open_log()
    log.append_as_follower(_leader_batch(0))
    assert log.append_as_follower(b"") == 2
    assert log.log_end_offset == 2


def test_contents_a_leader_would_refuse_are_accepted(open_log, helpers) -> None:
    # The leader validated timestamps against its clock; a replica must not second-guess.
    log = open_log(message_timestamp_before_max_ms=1000)
    old = _leader_batch(0, timestamp=NOW - 10 * 365 * 86_400_000)
    assert log.append_as_follower(old) == 2
    assert _stored(log, helpers) == old


@pytest.mark.parametrize(
    ("base_offset", "why"),
    [(1, "an overlap with the log"), (0, "a repeat")],
)
def test_batches_that_do_not_continue_the_log_are_refused(open_log, base_offset, why) -> None:
    log = open_log()
    log.append_as_follower(_leader_batch(0, epoch=1))
    before = _snapshot(log)
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(_leader_batch(base_offset, epoch=2))
    assert _snapshot(log) == before, why


def test_a_bad_batch_anywhere_refuses_the_whole_fetch(open_log) -> None:
    log = open_log()
    good = _leader_batch(0, epoch=2)
    out_of_place = _leader_batch(1, epoch=3)
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(good + out_of_place)
    assert log.log_end_offset == 0
    assert log.size == 0
    assert log.epochs.entries == []


def test_crc_damage_is_refused(open_log) -> None:
    log = open_log()
    damaged = bytearray(_leader_batch(0))
    damaged[-3] ^= 0x01  # a bit of the last record's value
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(bytes(damaged))
    assert log.log_end_offset == 0
    assert log.size == 0


def test_a_torn_trailing_batch_is_refused(open_log) -> None:
    log = open_log()
    data = _leader_batch(0) + _leader_batch(2)
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(data[:-7])
    assert log.log_end_offset == 0


def test_the_epoch_cache_follows_the_batches(open_log) -> None:
    log = open_log()
    log.append_as_follower(_leader_batch(0, epoch=1) + _leader_batch(2, epoch=1))
    log.append_as_follower(_leader_batch(4, epoch=3) + _leader_batch(6, epoch=4))
    assert log.epochs.entries == [(1, 0), (3, 4), (4, 6)]
    assert log.epochs.end_offset_for(3, log.log_end_offset) == (3, 6)
    assert log.epochs.end_offset_for(2, log.log_end_offset) == (1, 4)


def test_producer_state_follows_so_a_new_leader_recognises_retries(open_log) -> None:
    log = open_log()
    first = _leader_batch(0, count=3, producer_id=7, base_sequence=0)
    log.append_as_follower(first)
    log.append_as_follower(_leader_batch(3, count=2, producer_id=7, base_sequence=3))
    # This replica becomes leader; the producer retries its second batch.
    retry = log.append_as_leader(
        _leader_batch(0, count=2, producer_id=7, base_sequence=3, epoch=-1), 2
    )
    assert retry.duplicate
    assert (retry.first_offset, retry.last_offset) == (3, 4)
    assert log.log_end_offset == 5
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(_leader_batch(0, producer_id=7, base_sequence=9, epoch=-1), 2)
    info = log.append_as_leader(_leader_batch(0, producer_id=7, base_sequence=5, epoch=-1), 2)
    assert (info.first_offset, info.duplicate) == (5, False)


def test_follower_appends_roll_segments(open_log, helpers) -> None:
    batch = _leader_batch(0)
    log = open_log(segment_bytes=2 * len(batch))
    for base in range(0, 12, 2):
        log.append_as_follower(_leader_batch(base))
    assert [s.base_offset for s in log.segments] == [0, 4, 8]
    assert [r.offset for r in helpers.read_all(log)] == list(range(12))


def test_follower_state_survives_a_restart(open_log, log_dir, helpers) -> None:
    log = open_log()
    data = _leader_batch(0, epoch=2) + _leader_batch(2, epoch=4, producer_id=9, base_sequence=0)
    log.append_as_follower(data)
    log.close()
    reopened = open_log()
    assert reopened.log_end_offset == 4
    assert reopened.epochs.entries == [(2, 0), (4, 2)]
    assert 9 in reopened.producer_state.producers
    assert _stored(reopened, helpers) == data


# -- starting over at the leader's log start ---------------------------------------------


def test_truncate_fully_and_start_at_drops_everything(open_log, log_dir, helpers) -> None:
    log = open_log(segment_bytes=2 * len(_leader_batch(0)))
    for base in range(0, 8, 2):
        log.append_as_follower(_leader_batch(base, producer_id=3, base_sequence=base))
    log.high_watermark = 6
    assert len(log.segments) > 1

    log.truncate_fully_and_start_at(100)
    assert log.log_start_offset == log.log_end_offset == 100
    assert log.high_watermark == 100
    assert log.recovery_point == 100
    assert log.epochs.entries == []
    assert log.producer_state.producers == {}
    assert helpers.segment_files(log_dir) == ["00000000000000000100.log"]
    assert not list(log_dir.glob("*.deleted"))
    assert not list(log_dir.glob("*.snapshot"))

    with pytest.raises(CorruptRecordError):
        log.append_as_follower(_leader_batch(8))
    assert log.append_as_follower(_leader_batch(100, epoch=6)) == 102
    assert [r.offset for r in helpers.read_all(log)] == [100, 101]
    assert log.epochs.entries == [(6, 100)]


def test_truncate_fully_at_an_offset_inside_the_old_log(open_log, log_dir, helpers) -> None:
    # The old segment at the same base offset must not be reused or left behind.
    log = open_log()
    log.append_as_follower(_leader_batch(0) + _leader_batch(2))
    log.truncate_fully_and_start_at(0)
    assert log.log_end_offset == 0
    assert log.size == 0
    assert helpers.segment_files(log_dir) == ["00000000000000000000.log"]
    fresh = _leader_batch(0, tag="new")
    log.append_as_follower(fresh)
    assert _stored(log, helpers) == fresh
