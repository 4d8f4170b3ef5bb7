"""Rolling the active segment: by segment.bytes, segment.ms (message time), and a full index."""

from __future__ import annotations

import os

from shoal.records import Compression

HOUR = 3_600_000


def test_rolls_when_the_next_batch_would_pass_segment_bytes(open_log, helpers) -> None:
    size = len(helpers.make_batch(2))
    log = open_log(segment_bytes=3 * size)
    for _ in range(7):
        log.append_as_leader(helpers.make_batch(2), 0)
    assert [s.base_offset for s in log.segments] == [0, 6, 12]
    assert [s.size for s in log.segments] == [3 * size, 3 * size, size]
    assert all(s.size <= log.config.segment_bytes for s in log.segments)
    assert helpers.segment_files(log.directory) == [
        "00000000000000000000.log",
        "00000000000000000006.log",
        "00000000000000000012.log",
    ]
    assert [r.offset for r in helpers.read_all(log)] == list(range(14))


def test_a_batch_larger_than_segment_bytes_gets_a_segment_of_its_own(open_log, helpers):
    log = open_log(segment_bytes=100)
    log.append_as_leader(helpers.make_batch(1), 0)
    log.append_as_leader(helpers.make_batch(5, value_size=200), 0)
    log.append_as_leader(helpers.make_batch(1), 0)
    assert [s.base_offset for s in log.segments] == [0, 1, 6]


def test_rolls_by_segment_ms_measured_in_message_timestamps(open_log, helpers, clock) -> None:
    log = open_log(segment_ms=HOUR)
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - 3 * HOUR), 0)
    # The broker's clock says hours passed since creation, but message time has not.
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - 2 * HOUR), 0)
    assert len(log.segments) == 1
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - 2 * HOUR + 1), 0)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_segment_ms_counts_from_the_first_batch_not_the_largest_timestamp(
    open_log, helpers, clock
) -> None:
    log = open_log(segment_ms=HOUR)
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - 2 * HOUR), 0)
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - HOUR), 0)
    assert len(log.segments) == 1
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - HOUR + 1), 0)
    assert len(log.segments) == 2


def test_rolls_by_creation_time_when_messages_have_no_timestamp(open_log, helpers, clock):
    log = open_log(segment_ms=HOUR)
    log.append_as_leader(helpers.make_batch(1, timestamp=-1), 0)
    clock.advance(HOUR)
    log.append_as_leader(helpers.make_batch(1, timestamp=-1), 0)
    assert len(log.segments) == 1
    clock.advance(1)
    log.append_as_leader(helpers.make_batch(1, timestamp=-1), 0)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_segment_ms_survives_a_clean_restart(open_log, helpers, clock) -> None:
    log = open_log(segment_ms=HOUR)
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - 2 * HOUR), 0)
    log.close()
    # After the restart the segment is still as old, in message time, as before.
    log = open_log(segment_ms=HOUR, recovery_point=1)
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - HOUR + 1), 0)
    assert [s.base_offset for s in log.segments] == [0, 1]


def test_rolls_when_the_index_is_full(open_log, helpers, clock) -> None:
    # 32 bytes of index: four offset entries, two time entries.
    log = open_log(segment_index_bytes=32, index_interval_bytes=1)
    for i in range(8):
        log.append_as_leader(helpers.make_batch(1, timestamp=clock.now + i), 0)
    # Batch 0 gets no entry, batches 1 and 2 fill the time index, batch 3 rolls.
    assert [s.base_offset for s in log.segments] == [0, 3, 6]
    assert [r.offset for r in helpers.read_all(log)] == list(range(8))


def test_rolls_when_the_offset_index_is_full(open_log, helpers) -> None:
    # 24 bytes: three offset entries, two time entries. With one timestamp the
    # time index keeps a single entry, so the offset index is the one that fills.
    log = open_log(segment_index_bytes=24, index_interval_bytes=1)
    for _ in range(9):
        log.append_as_leader(helpers.make_batch(1), 0)
    assert [s.base_offset for s in log.segments] == [0, 4, 8]
    assert len(log.segments[0].time_index) == 1


def test_roll_writes_the_final_time_index_entry_and_new_segment_files(open_log, helpers, clock):
    log = open_log()
    log.append_as_leader(helpers.make_batch(3, timestamp=clock.now, step=7), 0)
    old = log.active
    new = log.roll()
    assert log.active is new
    assert new.base_offset == 3
    assert old.time_index.last_entry == (clock.now + 14, 2)
    assert os.path.exists(new.log_path)


def test_roll_of_an_empty_active_segment_is_a_no_op(open_log, helpers) -> None:
    log = open_log()
    assert log.roll() is log.active
    log.append_as_leader(helpers.make_batch(1), 0)
    log.roll()
    again = log.roll()
    assert again is log.active
    assert [s.base_offset for s in log.segments] == [0, 1]


def test_offset_index_entries_and_lookups_after_many_batches(open_log, helpers) -> None:
    log = open_log(index_interval_bytes=1000)
    for i in range(100):
        log.append_as_leader(helpers.make_batch(2, tag=f"x{i:03d}", compression=Compression.LZ4), 0)
    segment = log.active
    assert len(segment.offset_index) > 5
    for offset in (0, 1, 57, 100, 199):
        location = segment.find_batch(offset)
        assert location is not None
        assert location.header.base_offset == offset - offset % 2
        indexed_offset, position = segment.offset_index.lookup(offset)
        assert indexed_offset <= offset
        assert position <= location.position
