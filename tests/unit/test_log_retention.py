"""Retention: which segments retention.ms and retention.bytes delete, and what deleting does."""

from __future__ import annotations

import os

import pytest
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import OffsetOutOfRangeError

HOUR = 3_600_000
DAY = 24 * HOUR


def _segments_by_age(log, helpers, clock, ages_hours: list[int], count: int = 2) -> None:
    """One segment per entry, holding records ``ages_hours[i]`` hours old (by timestamp)."""
    for i, age in enumerate(ages_hours):
        if i:
            log.roll()
        log.append_as_leader(
            helpers.make_batch(count, timestamp=clock.now - age * HOUR, tag=f"s{i}-"), 0
        )


def test_retention_ms_deletes_segments_whose_newest_record_is_too_old(open_log, helpers, clock):
    log = open_log(retention_ms=DAY)
    _segments_by_age(log, helpers, clock, [50, 30, 10, 1])
    doomed = log.retention_deletable(log.log_end_offset)
    assert [s.base_offset for s in doomed] == [0, 2]


def test_retention_ms_is_judged_by_the_largest_timestamp_not_the_first(open_log, helpers, clock):
    log = open_log(retention_ms=DAY)
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - 3 * DAY), 0)
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - HOUR), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(1), 0)
    assert log.retention_deletable(log.log_end_offset) == []


def test_retention_ms_boundary_is_exclusive(open_log, helpers, clock) -> None:
    log = open_log(retention_ms=DAY)
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now + HOUR), 0)
    clock.advance(DAY)
    assert log.retention_deletable(log.log_end_offset) == []
    clock.advance(1)
    assert [s.base_offset for s in log.retention_deletable(log.log_end_offset)] == [0]


def test_retention_stops_at_the_first_segment_to_keep(open_log, helpers, clock) -> None:
    log = open_log(retention_ms=DAY)
    _segments_by_age(log, helpers, clock, [50, 10, 40, 1])
    assert [s.base_offset for s in log.retention_deletable(log.log_end_offset)] == [0]


def test_retention_never_deletes_beyond_the_high_watermark(open_log, helpers, clock) -> None:
    log = open_log(retention_ms=DAY)
    _segments_by_age(log, helpers, clock, [50, 40, 30, 25])  # bases 0, 2, 4, 6
    assert log.retention_deletable(0) == []
    assert log.retention_deletable(3) == [log.segments[0]]
    assert [s.base_offset for s in log.retention_deletable(4)] == [0, 2]
    assert [s.base_offset for s in log.retention_deletable(7)] == [0, 2, 4]
    assert [s.base_offset for s in log.retention_deletable(8)] == [0, 2, 4, 6]


def test_retention_ms_rolls_and_deletes_an_active_segment_that_is_too_old(
    open_log, helpers, clock
) -> None:
    log = open_log(retention_ms=DAY)
    _segments_by_age(log, helpers, clock, [50, 40])
    doomed = log.retention_deletable(log.log_end_offset)
    assert doomed == log.segments
    deleted = log.delete_segments(doomed)
    assert deleted == doomed
    assert [s.base_offset for s in log.segments] == [4]
    assert log.active.size == 0
    assert log.log_start_offset == 4
    assert log.log_end_offset == 4
    assert log.append_as_leader(helpers.make_batch(1), 0).first_offset == 4
    for segment in deleted:
        segment.destroy()


def test_an_empty_active_segment_is_never_deletable(open_log, helpers, clock) -> None:
    log = open_log(retention_ms=DAY)
    clock.advance(10 * DAY)
    assert log.retention_deletable(0) == []
    _segments_by_age(log, helpers, clock, [50])
    log.roll()
    assert [s.base_offset for s in log.retention_deletable(2)] == [0]


def test_retention_ms_minus_one_keeps_everything(open_log, helpers, clock) -> None:
    log = open_log(retention_ms=-1)
    _segments_by_age(log, helpers, clock, [10**5, 10**4, 1])
    assert log.retention_deletable(log.log_end_offset) == []


def test_retention_of_segments_without_timestamps_uses_file_mtime(open_log, helpers, clock):
    log = open_log(retention_ms=DAY)
    log.append_as_leader(helpers.make_batch(1, timestamp=-1), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(1, timestamp=-1), 0)
    old = (clock.now - 2 * DAY) / 1000
    os.utime(log.segments[0].log_path, (old, old))
    recent = clock.now / 1000
    os.utime(log.segments[1].log_path, (recent, recent))
    assert [s.base_offset for s in log.retention_deletable(2)] == [0]


def test_retention_bytes_deletes_oldest_segments_while_the_rest_stays_at_or_above_it(
    open_log, helpers, clock
) -> None:
    size = len(helpers.make_batch(2, tag="s0-"))
    log = open_log(retention_bytes=2 * size + 10, retention_ms=-1)
    _segments_by_age(log, helpers, clock, [0, 0, 0, 0, 0])  # five equal segments
    assert {s.size for s in log.segments} == {size}
    # As in Kafka, a segment goes only if the log is still >= retention.bytes without
    # it: deleting two leaves 3 * size; a third would leave 2 * size < 2 * size + 10.
    assert [s.base_offset for s in log.retention_deletable(10)] == [0, 2]


def test_retention_bytes_exact_fit_keeps_the_rest(open_log, helpers, clock) -> None:
    size = len(helpers.make_batch(2, tag="s0-"))
    log = open_log(retention_bytes=3 * size, retention_ms=-1)
    _segments_by_age(log, helpers, clock, [0, 0, 0, 0])
    assert [s.base_offset for s in log.retention_deletable(8)] == [0]


def test_retention_bytes_minus_one_means_no_limit(open_log, helpers, clock) -> None:
    log = open_log(retention_bytes=-1, retention_ms=-1)
    _segments_by_age(log, helpers, clock, [0] * 5)
    assert log.retention_deletable(10) == []


def test_time_and_size_retention_do_not_delete_more_than_either_requires(
    open_log, helpers, clock
) -> None:
    # A big old segment, then two small recent ones. retention.ms deletes the big
    # one, which brings the log under retention.bytes: size retention must then
    # delete nothing more (Kafka runs the size check on what time retention left).
    log = open_log(retention_ms=DAY)
    log.append_as_leader(helpers.make_batch(10, timestamp=clock.now - 2 * DAY), 0)
    big = log.size
    for _ in range(2):
        log.roll()
        log.append_as_leader(helpers.make_batch(1), 0)
    small = log.segments[1].size
    assert big > 3 * small
    log.update_config(LogConfig(retention_ms=DAY, retention_bytes=log.size - big + 1))
    assert [s.base_offset for s in log.retention_deletable(log.log_end_offset)] == [0]


def test_compact_policy_deletes_nothing(open_log, helpers, clock) -> None:
    log = open_log(cleanup_policy=("compact",), retention_ms=1, retention_bytes=1)
    _segments_by_age(log, helpers, clock, [50, 40, 30])
    assert log.retention_deletable(log.log_end_offset) == []
    log.update_config(LogConfig(cleanup_policy=("compact", "delete"), retention_ms=1))
    assert len(log.retention_deletable(log.log_end_offset)) == 3


def test_deleting_moves_the_log_start_and_reads_below_it_are_out_of_range(
    open_log, helpers, clock
) -> None:
    log = open_log(retention_ms=DAY)
    _segments_by_age(log, helpers, clock, [50, 40, 1])
    log.high_watermark = log.log_end_offset
    log.recovery_point = 1
    for segment in log.delete_segments(log.retention_deletable(log.high_watermark)):
        segment.destroy()
    assert log.log_start_offset == 4
    assert log.recovery_point == 4
    for offset in (0, 3):
        with pytest.raises(OffsetOutOfRangeError):
            log.read(offset, 1 << 20, log.log_end_offset, min_one=True)
    assert [r.offset for r in helpers.read_all(log)] == [4, 5]


def test_deleted_segments_are_renamed_and_stay_readable_until_destroyed(
    open_log, helpers, clock
) -> None:
    log = open_log(retention_ms=DAY)
    _segments_by_age(log, helpers, clock, [50, 1])
    in_flight = log.read(0, 1 << 20, log.log_end_offset, min_one=True)
    assert in_flight is not None
    expected = helpers.slice_bytes(in_flight)

    deleted = log.delete_segments(log.retention_deletable(log.log_end_offset))
    assert [s.base_offset for s in deleted] == [0]
    names = sorted(p.name for p in log.directory.iterdir() if p.name.startswith("000"))
    assert "00000000000000000000.log.deleted" in names
    assert "00000000000000000000.log" not in names
    # A fetch that already holds the slice can still send it.
    assert helpers.slice_bytes(in_flight) == expected

    deleted[0].destroy()
    assert not list(log.directory.glob("*.deleted"))


def test_deleting_segments_trims_the_epoch_cache_to_the_log_start(open_log, helpers, clock):
    log = open_log(retention_ms=DAY)
    log.append_as_leader(helpers.make_batch(2, timestamp=clock.now - 3 * DAY), 1)
    log.append_as_leader(helpers.make_batch(2, timestamp=clock.now - 3 * DAY), 2)
    log.roll()
    log.append_as_leader(helpers.make_batch(2), 2)
    log.append_as_leader(helpers.make_batch(2), 3)
    assert log.epochs.entries == [(1, 0), (2, 2), (3, 6)]
    for segment in log.delete_segments(log.retention_deletable(log.log_end_offset)):
        segment.destroy()
    assert log.log_start_offset == 4
    assert log.epochs.entries == [(2, 4), (3, 6)]


def test_reopen_after_retention_keeps_the_log_start(open_log, helpers, clock) -> None:
    log = open_log(retention_ms=DAY)
    _segments_by_age(log, helpers, clock, [50, 1])
    for segment in log.delete_segments(log.retention_deletable(log.log_end_offset)):
        segment.destroy()
    log.close()
    log = open_log(retention_ms=DAY, recovery_point=4)
    assert log.log_start_offset == 2
    assert [r.offset for r in helpers.read_all(log)] == [2, 3]
