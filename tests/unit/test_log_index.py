"""OffsetIndex and TimeIndex: Kafka's file formats, lookups, truncation, and refusing bad files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from shoal.broker.log.index import IndexCorruptError, OffsetIndex, TimeIndex

BASE = 1000


def _offset_index(tmp_path: Path, max_bytes: int = 1024) -> OffsetIndex:
    return OffsetIndex.load(tmp_path / "00000000000000001000.index", BASE, max_bytes)


def _time_index(tmp_path: Path, max_bytes: int = 1024) -> TimeIndex:
    return TimeIndex.load(tmp_path / "00000000000000001000.timeindex", BASE, max_bytes)


# -- offset index ---------------------------------------------------------------


def test_offset_index_file_is_big_endian_relative_offset_and_position(tmp_path: Path) -> None:
    index = _offset_index(tmp_path)
    index.append(1004, 300)
    index.append(1010, 900)
    index.flush()
    raw = index.path.read_bytes()
    assert raw == struct.pack(">ii", 4, 300) + struct.pack(">ii", 10, 900)


def test_offset_index_lookup_is_the_last_entry_at_or_before(tmp_path: Path) -> None:
    index = _offset_index(tmp_path)
    assert index.lookup(1500) == (BASE, 0)
    index.append(1004, 300)
    index.append(1010, 900)
    assert index.lookup(999) == (BASE, 0)
    assert index.lookup(1003) == (BASE, 0)
    assert index.lookup(1004) == (1004, 300)
    assert index.lookup(1009) == (1004, 300)
    assert index.lookup(1010) == (1010, 900)
    assert index.lookup(10**9) == (1010, 900)


def test_offset_index_floor_position(tmp_path: Path) -> None:
    index = _offset_index(tmp_path)
    assert index.floor_position(500) == 0
    assert index.last_position == 0
    index.append(1004, 300)
    index.append(1010, 900)
    assert index.floor_position(299) == 0
    assert index.floor_position(300) == 300
    assert index.floor_position(899) == 300
    assert index.floor_position(5000) == 900
    assert index.last_position == 900


def test_offset_index_refuses_entries_that_do_not_increase(tmp_path: Path) -> None:
    index = _offset_index(tmp_path)
    index.append(1004, 300)
    with pytest.raises(ValueError, match="does not follow"):
        index.append(1004, 400)
    with pytest.raises(ValueError, match="does not follow"):
        index.append(1005, 300)
    assert len(index) == 1


def test_offset_index_is_full_at_max_bytes_over_entry_size(tmp_path: Path) -> None:
    index = _offset_index(tmp_path, max_bytes=20)
    assert index.max_entries == 2
    index.append(1001, 10)
    assert not index.is_full
    index.append(1002, 20)
    assert index.is_full


def test_offset_index_round_trips_through_its_file(tmp_path: Path) -> None:
    index = _offset_index(tmp_path)
    for i in range(1, 6):
        index.append(BASE + 3 * i, 100 * i)
    index.flush()
    loaded = _offset_index(tmp_path)
    assert len(loaded) == 5
    assert loaded.lookup(BASE + 7) == (BASE + 6, 200)
    assert loaded.last_position == 500


def test_offset_index_flush_appends_only_new_entries_then_rewrites_after_truncation(
    tmp_path: Path,
) -> None:
    index = _offset_index(tmp_path)
    index.append(1001, 10)
    index.append(1002, 20)
    index.flush()
    index.append(1003, 30)
    index.flush()
    assert index.path.stat().st_size == 24
    index.truncate_to(1002)
    assert len(index) == 1
    index.flush()
    assert index.path.read_bytes() == struct.pack(">ii", 1, 10)
    index.append(1005, 50)
    index.flush()
    assert _offset_index(tmp_path).lookup(1005) == (1005, 50)


def test_offset_index_truncate_to_drops_entries_at_and_after_the_offset(tmp_path: Path) -> None:
    index = _offset_index(tmp_path)
    for offset, position in ((1002, 10), (1005, 20), (1009, 30)):
        index.append(offset, position)
    index.truncate_to(1006)
    assert index.lookup(2000) == (1005, 20)
    index.truncate_to(1005)
    assert index.lookup(2000) == (1002, 10)
    index.reset()
    assert len(index) == 0


def test_flush_of_a_new_empty_index_creates_an_empty_file(tmp_path: Path) -> None:
    index = _offset_index(tmp_path)
    assert not index.path.exists()
    index.flush()
    assert index.path.read_bytes() == b""


def test_offset_index_with_a_partial_entry_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000001000.index"
    path.write_bytes(struct.pack(">ii", 1, 10) + b"\x00\x00\x00")
    with pytest.raises(IndexCorruptError, match="not whole entries"):
        _offset_index(tmp_path)


def test_offset_index_with_entries_out_of_order_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000001000.index"
    path.write_bytes(struct.pack(">ii", 5, 10) + struct.pack(">ii", 3, 20))
    with pytest.raises(IndexCorruptError):
        _offset_index(tmp_path)


def test_offset_index_check_against_refuses_entries_past_the_log(tmp_path: Path) -> None:
    index = _offset_index(tmp_path)
    index.append(1004, 300)
    index.check_against(log_size=301)
    with pytest.raises(IndexCorruptError, match="past the log"):
        index.check_against(log_size=300)


def test_offset_index_check_against_refuses_entries_below_the_base_offset(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000001000.index"
    path.write_bytes(struct.pack(">ii", -1, 0))
    index = _offset_index(tmp_path)
    with pytest.raises(IndexCorruptError, match="below the base offset"):
        index.check_against(log_size=100)


def test_index_rename_and_delete(tmp_path: Path) -> None:
    index = _offset_index(tmp_path)
    index.append(1001, 10)
    index.flush()
    target = tmp_path / "00000000000000001000.index.deleted"
    index.rename(target)
    assert target.exists()
    assert index.path == target
    index.delete()
    assert not target.exists()
    index.delete()  # deleting twice is harmless


# -- time index -----------------------------------------------------------------


def test_time_index_file_is_big_endian_timestamp_and_relative_offset(tmp_path: Path) -> None:
    index = _time_index(tmp_path)
    index.maybe_append(1_700_000_000_000, 1004)
    index.flush()
    assert index.path.read_bytes() == struct.pack(">qi", 1_700_000_000_000, 4)


def test_time_index_keeps_only_entries_that_advance_the_timestamp(tmp_path: Path) -> None:
    index = _time_index(tmp_path)
    index.maybe_append(100, 1001)
    index.maybe_append(100, 1002)  # same timestamp: skipped
    index.maybe_append(90, 1003)  # older: skipped
    index.maybe_append(200, 1000)  # offset going backwards: skipped
    index.maybe_append(200, 1004)
    assert len(index) == 2
    assert index.last_entry == (200, 1004)


def test_time_index_lookup_is_the_offset_of_the_last_entry_at_or_before(tmp_path: Path) -> None:
    index = _time_index(tmp_path)
    assert index.lookup(500) == BASE
    assert index.last_entry is None
    index.maybe_append(100, 1002)
    index.maybe_append(300, 1007)
    assert index.lookup(99) == BASE
    assert index.lookup(100) == 1002
    assert index.lookup(299) == 1002
    assert index.lookup(300) == 1007
    assert index.lookup(10**15) == 1007


def test_time_index_truncate_to_drops_entries_naming_offsets_at_or_after(tmp_path: Path) -> None:
    index = _time_index(tmp_path)
    index.maybe_append(100, 1002)
    index.maybe_append(300, 1007)
    index.maybe_append(400, 1009)
    index.flush()
    index.truncate_to(1007)
    assert index.last_entry == (100, 1002)
    index.flush()
    assert _time_index(tmp_path).last_entry == (100, 1002)


def test_time_index_is_full_at_max_bytes_over_twelve(tmp_path: Path) -> None:
    index = _time_index(tmp_path, max_bytes=24)
    assert index.max_entries == 2
    index.maybe_append(1, 1001)
    index.maybe_append(2, 1002)
    assert index.is_full


def test_time_index_with_a_partial_entry_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "00000000000000001000.timeindex").write_bytes(b"\x00" * 13)
    with pytest.raises(IndexCorruptError):
        _time_index(tmp_path)


def test_time_index_with_timestamps_out_of_order_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "00000000000000001000.timeindex").write_bytes(
        struct.pack(">qi", 200, 1) + struct.pack(">qi", 100, 2)
    )
    with pytest.raises(IndexCorruptError):
        _time_index(tmp_path)


def test_time_index_check_against_refuses_entries_past_the_segment(tmp_path: Path) -> None:
    index = _time_index(tmp_path)
    index.maybe_append(100, 1005)
    index.check_against(next_offset=1006)
    with pytest.raises(IndexCorruptError, match="past the segment"):
        index.check_against(next_offset=1005)
