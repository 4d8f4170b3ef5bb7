"""LogSegment: appending whole batches, scanning headers, index entries, truncation, deletion."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.broker.log.config import LogConfig
from shoal.broker.log.segment import LogSegment, base_offset_of, segment_name

from shoal.records import BatchHeader, iter_records, parse_header, set_base_offset

NOW = 1_700_000_000_000


def _batch(helpers, base_offset: int, count: int = 2, **kwargs) -> tuple[bytes, BatchHeader]:
    raw = bytearray(helpers.make_batch(count, **kwargs))
    set_base_offset(raw, 0, base_offset)
    return bytes(raw), parse_header(raw)


def _append(segment: LogSegment, helpers, count: int = 2, **kwargs) -> BatchHeader:
    raw, header = _batch(helpers, segment.next_offset, count, **kwargs)
    segment.append([raw], [header])
    return header


def _segment(tmp_path: Path, base: int = 0, **config) -> LogSegment:
    return LogSegment(tmp_path, base, LogConfig(**config), NOW)


def test_segment_files_are_named_by_twenty_digit_base_offset(tmp_path: Path) -> None:
    segment = _segment(tmp_path, base=42)
    assert segment.log_path.name == "00000000000000000042.log"
    assert segment_name(42) == "00000000000000000042"
    assert base_offset_of(tmp_path / "00000000000000000042.timeindex") == 42
    segment.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000042.index",
        "00000000000000000042.log",
        "00000000000000000042.timeindex",
    ]


def test_append_writes_batches_back_to_back_and_tracks_offsets(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path, base=10)
    assert segment.next_offset == 10
    first, first_header = _batch(helpers, 10, 3)
    second, second_header = _batch(helpers, 13, 2)
    assert segment.append([first], [first_header]) == 0
    assert segment.append([second[:61], second[61:]], [second_header]) == len(first)
    assert segment.size == len(first) + len(second)
    assert segment.next_offset == 15
    assert os.pread(segment.fd, segment.size, 0) == first + second
    assert [loc.position for loc in segment.scan()] == [0, len(first)]
    segment.close()


def test_append_of_several_batches_in_one_call(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path)
    a, ha = _batch(helpers, 0, 1)
    b, hb = _batch(helpers, 1, 4)
    segment.append([a, b], [ha, hb])
    assert segment.next_offset == 5
    assert [loc.header.base_offset for loc in segment.scan()] == [0, 1]
    segment.close()


def test_find_batch_returns_the_batch_holding_the_offset_or_the_next(tmp_path: Path, helpers):
    segment = _segment(tmp_path, index_interval_bytes=0)
    headers = [_append(segment, helpers, 3) for _ in range(4)]  # offsets 0..11
    for offset in range(12):
        location = segment.find_batch(offset)
        assert location is not None
        assert location.header.base_offset == headers[offset // 3].base_offset
        assert next(iter_records(segment.read_batch(location))).offset <= offset
    assert segment.find_batch(12) is None
    segment.close()


def test_find_batch_walks_from_a_sparse_index_entry_across_read_windows(
    tmp_path: Path, helpers
) -> None:
    # 300 batches of about 150 bytes: index entries every 4 KiB leave a couple of
    # dozen batches between them, and the walk reads the file in 16 KiB windows.
    segment = _segment(tmp_path, index_interval_bytes=4096)
    headers = [_append(segment, helpers, 2, value_size=50) for _ in range(300)]
    spans = [(loc.position, loc.header.size) for loc in segment.scan()]
    assert list(segment.batch_spans()) == spans
    assert list(segment.batch_spans(spans[77][0])) == spans[77:]
    for offset in range(600):
        location = segment.find_batch(offset)
        assert location is not None
        assert location.header == headers[offset // 2]
        assert location.position == spans[offset // 2][0]
    assert segment.find_batch(600) is None
    segment.close()


def test_index_entry_every_index_interval_bytes(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path, index_interval_bytes=300)
    batch_size = len(helpers.make_batch(1, value_size=100))
    assert 100 < batch_size < 300
    positions = []
    for i in range(12):
        positions.append(segment.size)
        _append(segment, helpers, 1, value_size=100, timestamp=NOW + i)
    # An entry goes in once more than index.interval.bytes were written since the last.
    per_entry = 300 // batch_size + 1
    expected = [(i, positions[i]) for i in range(per_entry, 12, per_entry)]
    entries = [segment.offset_index.lookup(offset) for offset, _ in expected]
    assert entries == expected
    assert len(segment.offset_index) == len(expected)
    assert len(segment.time_index) == len(expected)
    segment.close()


def test_index_interval_zero_indexes_every_batch_but_the_first(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path, index_interval_bytes=0)
    for _ in range(5):
        _append(segment, helpers, 2)
    assert len(segment.offset_index) == 4
    segment.close()


def test_max_timestamp_and_its_offset_follow_the_largest_timestamp(tmp_path: Path, helpers):
    segment = _segment(tmp_path)
    _append(segment, helpers, 2, timestamp=NOW - 50, step=10)  # offsets 0-1, max NOW-40
    _append(segment, helpers, 3, timestamp=NOW, step=-10)  # offsets 2-4, max NOW
    _append(segment, helpers, 1, timestamp=NOW - 5)  # offset 5
    assert segment.max_timestamp == NOW
    assert segment.offset_of_max_timestamp == 4  # the batch's last offset, as Kafka tracks it
    assert segment.first_batch_timestamp == NOW - 40
    segment.close()


def test_find_by_timestamp_uses_the_time_index_then_scans(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path, index_interval_bytes=0)
    for i in range(10):
        _append(segment, helpers, 1, timestamp=NOW + 100 * i)
    location = segment.find_by_timestamp(NOW + 450, from_offset=0)
    assert location is not None
    assert location.header.base_offset == 5
    location = segment.find_by_timestamp(NOW + 500, from_offset=0)
    assert location is not None
    assert location.header.base_offset == 5
    location = segment.find_by_timestamp(NOW, from_offset=7)
    assert location is not None
    assert location.header.base_offset == 7
    assert segment.find_by_timestamp(NOW + 901, from_offset=0) is None
    segment.close()


def test_truncate_to_cuts_at_the_batch_and_recomputes_state(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path, index_interval_bytes=0)
    _append(segment, helpers, 2, timestamp=NOW - 100)
    keep_end = segment.size
    _append(segment, helpers, 2, timestamp=NOW)
    _append(segment, helpers, 2, timestamp=NOW + 100)
    dropped = segment.truncate_to(2)
    assert dropped > 0
    assert segment.size == keep_end
    assert os.fstat(segment.fd).st_size == keep_end
    assert segment.next_offset == 2
    assert segment.max_timestamp == NOW - 100
    assert segment.offset_of_max_timestamp == 1
    assert len(segment.offset_index) == 0
    assert segment.time_index.last_entry is None
    assert segment.truncate_to(2) == 0
    # Appends continue from the cut, with index entries again.
    _append(segment, helpers, 2)
    _append(segment, helpers, 2)
    assert segment.next_offset == 6
    assert segment.offset_index.lookup(5)[0] == 5
    segment.close()


def test_recover_keeps_whole_batches_and_cuts_a_torn_tail(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path)
    _append(segment, helpers, 2)
    _append(segment, helpers, 2)
    whole = segment.size
    raw, _ = _batch(helpers, 4, 2)
    segment.append([raw[: len(raw) // 2]], [])  # a write torn halfway
    assert segment.size == whole + len(raw) // 2
    assert segment.recover() == len(raw) // 2
    assert segment.size == whole
    assert os.fstat(segment.fd).st_size == whole
    assert segment.next_offset == 4
    segment.close()


def test_recover_stops_at_offsets_that_go_backwards(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path)
    _append(segment, helpers, 2)
    whole = segment.size
    raw, header = _batch(helpers, 1, 2)  # overlaps offset 1
    segment.append([raw], [header])
    assert segment.recover() == len(raw)
    assert segment.size == whole
    assert segment.next_offset == 2
    segment.close()


def test_mark_deleted_renames_files_and_open_reads_keep_working(tmp_path: Path, helpers):
    segment = _segment(tmp_path)
    _append(segment, helpers, 2)
    segment.flush()
    before = os.pread(segment.fd, segment.size, 0)
    segment.mark_deleted()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000000.index.deleted",
        "00000000000000000000.log.deleted",
        "00000000000000000000.timeindex.deleted",
    ]
    assert os.pread(segment.fd, segment.size, 0) == before
    segment.destroy()
    assert list(tmp_path.iterdir()) == []
    assert segment.file.closed


def test_should_roll_never_for_an_empty_segment(tmp_path: Path) -> None:
    segment = _segment(tmp_path, segment_bytes=14, segment_ms=1)
    assert not segment.should_roll(10**6, NOW + 10**9, NOW + 10**9)
    segment.close()


def test_should_roll_when_the_incoming_bytes_do_not_fit(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path, segment_bytes=1000)
    _append(segment, helpers, 1)
    room = 1000 - segment.size
    assert not segment.should_roll(room, NOW, NOW)
    assert segment.should_roll(room + 1, NOW, NOW)
    segment.close()


def test_should_roll_by_message_time_since_the_first_batch(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path, segment_ms=1000)
    _append(segment, helpers, 1, timestamp=NOW)
    assert not segment.should_roll(10, NOW + 1000, NOW + 10**9)
    assert segment.should_roll(10, NOW + 1001, NOW)
    segment.close()


def test_should_roll_by_creation_time_when_batches_have_no_timestamp(tmp_path: Path, helpers):
    segment = _segment(tmp_path, segment_ms=1000)
    _append(segment, helpers, 1, timestamp=-1)
    assert not segment.should_roll(10, -1, NOW + 1000)
    assert segment.should_roll(10, -1, NOW + 1001)
    segment.close()


def test_should_roll_honours_a_random_segment_jitter(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path, segment_ms=1000, segment_jitter_ms=300)
    assert 0 <= segment.roll_jitter_ms < 300
    due = 1000 - segment.roll_jitter_ms
    _append(segment, helpers, 1, timestamp=NOW)
    assert not segment.should_roll(10, NOW + due, NOW)
    assert segment.should_roll(10, NOW + due + 1, NOW)
    segment.close()


def test_should_roll_when_an_index_is_full(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path, index_interval_bytes=0, segment_index_bytes=24)
    _append(segment, helpers, 1, timestamp=NOW)
    _append(segment, helpers, 1, timestamp=NOW + 1)
    assert not segment.should_roll(10, NOW, NOW)
    _append(segment, helpers, 1, timestamp=NOW + 2)
    assert segment.time_index.is_full  # 24 bytes: two time entries, three offset entries
    assert segment.should_roll(10, NOW, NOW)
    segment.close()


def test_on_roll_records_the_final_time_index_entry(tmp_path: Path, helpers) -> None:
    segment = _segment(tmp_path)
    _append(segment, helpers, 2, timestamp=NOW, step=5)
    assert segment.time_index.last_entry is None
    segment.on_roll()
    assert segment.time_index.last_entry == (NOW + 5, 1)
    segment.close()
