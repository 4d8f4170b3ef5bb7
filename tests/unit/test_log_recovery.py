"""Opening a log after a clean shutdown or a crash: torn tails, bit flips, bad indexes."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from shoal.broker.log.config import LogConfig
from shoal.broker.log.recovery import LoadedSegments, load_segments
from shoal.broker.log.segment import LogSegment

from shoal.records import iter_batches

FIRST = "00000000000000000000"
NOW = 1_700_000_000_000


def _fill(log, helpers, batches: int, count: int = 2, epoch: int = 0) -> list[int]:
    """Append batches; returns each batch's start position within its segment."""
    positions = []
    for i in range(batches):
        positions.append(log.active.size)
        log.append_as_leader(
            helpers.make_batch(count, tag=f"v{i:03d}-", timestamp=helpers.NOW + i), epoch
        )
    return positions


def _values(log, helpers) -> list[bytes | None]:
    return [r.value for r in helpers.read_all(log)]


def _index_entries(segment: LogSegment) -> list[tuple[int, int]]:
    index = segment.offset_index
    return [index.lookup(offset) for offset in range(segment.base_offset, segment.next_offset)]


def _load(log_dir: Path, config: LogConfig, recovery_point: int, clean: bool) -> LoadedSegments:
    return load_segments(log_dir, config, recovery_point, clean, NOW)


def _close_segments(segments: list[LogSegment]) -> None:
    for segment in segments:
        segment.close()


def _flip_bit(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0x10]))


# -- clean shutdown ---------------------------------------------------------------


def test_reopen_after_clean_close_keeps_offsets_and_recovers_nothing(
    open_log, helpers, log_dir
) -> None:
    config = LogConfig(segment_bytes=1500, index_interval_bytes=200)
    log = open_log(config=config)
    _fill(log, helpers, 40)
    before = _values(log, helpers)
    bases = [s.base_offset for s in log.segments]
    entries = [_index_entries(s) for s in log.segments]
    end = log.log_end_offset
    log.close()
    assert len(bases) > 2

    loaded = _load(log_dir, config, recovery_point=end, clean=True)
    assert loaded.recovered_segments == 0
    assert loaded.truncated_bytes == 0
    assert [s.base_offset for s in loaded.segments] == bases
    assert [_index_entries(s) for s in loaded.segments] == entries
    _close_segments(loaded.segments)

    log = open_log(config=config, recovery_point=end)
    assert log.log_end_offset == end
    assert log.recovery_point == end
    assert _values(log, helpers) == before
    info = log.append_as_leader(helpers.make_batch(1), 0)
    assert info.first_offset == end


def test_clean_reopen_still_catches_a_log_file_cut_by_hand(open_log, helpers, log_dir) -> None:
    log = open_log(index_interval_bytes=1)
    positions = _fill(log, helpers, 5)
    log.close()
    os.truncate(log_dir / f"{FIRST}.log", positions[4] + 30)  # mid-batch 4

    log = open_log(index_interval_bytes=1, recovery_point=10)
    assert log.log_end_offset == 8
    assert log.active.size == positions[4]
    assert log.recovery_point == 8
    assert len(_values(log, helpers)) == 8
    assert log.append_as_leader(helpers.make_batch(1), 0).first_offset == 8


def test_clean_reopen_catches_a_cut_before_the_last_index_entry(open_log, helpers, log_dir) -> None:
    log = open_log(index_interval_bytes=1)
    positions = _fill(log, helpers, 6)
    log.close()
    os.truncate(log_dir / f"{FIRST}.log", positions[2] + 10)  # behind the index's entries

    log = open_log(index_interval_bytes=1, recovery_point=12)
    assert log.log_end_offset == 4
    assert len(_values(log, helpers)) == 4
    log.append_as_leader(helpers.make_batch(2), 0)
    assert [r.offset for r in helpers.read_all(log)] == list(range(6))


# -- crashes ----------------------------------------------------------------------


def test_crash_reopen_keeps_the_data_and_rebuilds_indexes(open_log, helpers, log_dir) -> None:
    config = LogConfig(segment_bytes=1500, index_interval_bytes=200)
    log = open_log(config=config)
    _fill(log, helpers, 40)
    before = _values(log, helpers)
    entries = [_index_entries(s) for s in log.segments]
    max_timestamps = [(s.max_timestamp, s.offset_of_max_timestamp) for s in log.segments]
    end = log.log_end_offset
    helpers.crash(log)
    # The rolled segments' indexes never reached the disk; the active one's neither.
    assert all(
        not (log_dir / (p[:-4] + ".index")).exists()
        or (log_dir / (p[:-4] + ".index")).stat().st_size == 0
        for p in helpers.segment_files(log_dir)
    )

    loaded = _load(log_dir, config, recovery_point=0, clean=False)
    assert loaded.recovered_segments == len(entries)
    assert loaded.truncated_bytes == 0
    assert [_index_entries(s) for s in loaded.segments] == entries
    _close_segments(loaded.segments)

    log = open_log(config=config, clean_shutdown=False)
    assert log.log_end_offset == end
    assert _values(log, helpers) == before
    assert [(s.max_timestamp, s.offset_of_max_timestamp) for s in log.segments] == max_timestamps
    assert log.append_as_leader(helpers.make_batch(1), 0).first_offset == end


def test_crash_recovers_only_segments_from_the_recovery_point(open_log, helpers, log_dir):
    config = LogConfig(segment_bytes=1000)
    log = open_log(config=config)
    _fill(log, helpers, 30)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 4
    log.close()
    # The recovery point lies inside the third segment: it and the later ones are re-validated.
    loaded = _load(log_dir, config, recovery_point=bases[2] + 1, clean=False)
    assert loaded.recovered_segments == len(bases) - 2
    _close_segments(loaded.segments)
    loaded = _load(log_dir, config, recovery_point=bases[2], clean=False)
    assert loaded.recovered_segments == len(bases) - 2
    _close_segments(loaded.segments)
    loaded = _load(log_dir, config, recovery_point=bases[-1], clean=False)
    assert loaded.recovered_segments == 1
    _close_segments(loaded.segments)


def test_torn_tail_after_a_crash_is_cut_to_the_last_whole_batch(open_log, helpers, log_dir):
    log = open_log()
    positions = _fill(log, helpers, 5)
    before = _values(log, helpers)
    helpers.crash(log)
    path = log_dir / f"{FIRST}.log"
    os.truncate(path, positions[4] + 20)

    log = open_log(clean_shutdown=False)
    assert log.log_end_offset == 8
    assert os.path.getsize(path) == positions[4]
    assert _values(log, helpers) == before[:8]
    info = log.append_as_leader(helpers.make_batch(3, tag="after"), 0)
    assert (info.first_offset, info.last_offset) == (8, 10)
    assert [r.offset for r in helpers.read_all(log)] == list(range(11))


def test_torn_header_smaller_than_a_batch_header_is_cut(open_log, helpers, log_dir) -> None:
    log = open_log()
    positions = _fill(log, helpers, 3)
    helpers.crash(log)
    os.truncate(log_dir / f"{FIRST}.log", positions[2] + 7)
    log = open_log(clean_shutdown=False)
    assert log.log_end_offset == 4


def test_trailing_zeros_from_a_crash_are_cut(open_log, helpers, log_dir) -> None:
    log = open_log()
    _fill(log, helpers, 3)
    helpers.crash(log)
    path = log_dir / f"{FIRST}.log"
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"\x00" * 4096)  # a filesystem that extended the file but lost the data
    log = open_log(clean_shutdown=False)
    assert log.log_end_offset == 6
    assert os.path.getsize(path) == size


def test_bit_flip_in_a_middle_batch_cuts_it_and_everything_after(open_log, helpers, log_dir):
    log = open_log(index_interval_bytes=1)
    positions = _fill(log, helpers, 3)
    before = _values(log, helpers)
    helpers.crash(log)
    path = log_dir / f"{FIRST}.log"
    _flip_bit(path, positions[1] + 70)  # inside batch 1's records

    log = open_log(index_interval_bytes=1, clean_shutdown=False)
    assert log.log_end_offset == 2
    assert os.path.getsize(path) == positions[1]
    assert _values(log, helpers) == before[:2]
    for _, header in iter_batches(path.read_bytes()):
        assert header.last_offset < 2
    assert log.append_as_leader(helpers.make_batch(1), 0).first_offset == 2


def test_bit_flip_in_an_earlier_segment_deletes_the_segments_after_it(
    open_log, helpers, log_dir
) -> None:
    log = open_log()
    _fill(log, helpers, 2)
    log.roll()
    positions = _fill(log, helpers, 3)  # offsets 4-9
    log.roll()
    _fill(log, helpers, 2)  # offsets 10-13
    log.roll()
    _fill(log, helpers, 1)  # offsets 14-15
    assert [s.base_offset for s in log.segments] == [0, 4, 10, 14]
    helpers.crash(log)
    _flip_bit(log_dir / "00000000000000000004.log", positions[2] + 65)

    loaded = _load(log_dir, LogConfig(), recovery_point=0, clean=False)
    assert [s.base_offset for s in loaded.segments] == [0, 4]
    assert loaded.segments[-1].next_offset == 8
    assert loaded.truncated_bytes > 0
    _close_segments(loaded.segments)
    assert helpers.segment_files(log_dir) == [f"{FIRST}.log", "00000000000000000004.log"]
    assert not list(log_dir.glob("*.deleted"))

    log = open_log()
    assert log.log_end_offset == 8
    assert [r.offset for r in helpers.read_all(log)] == list(range(8))


def test_corrupt_batch_header_length_is_cut(open_log, helpers, log_dir) -> None:
    log = open_log()
    positions = _fill(log, helpers, 3)
    helpers.crash(log)
    path = log_dir / f"{FIRST}.log"
    with open(path, "r+b") as f:
        f.seek(positions[2] + 8)
        f.write(struct.pack(">i", 10**6))  # batchLength runs past the file
    log = open_log(clean_shutdown=False)
    assert log.log_end_offset == 4


def test_recovery_after_a_cut_clamps_high_watermark_and_epochs(open_log, helpers, log_dir):
    log = open_log()
    _fill(log, helpers, 2, epoch=1)
    positions = _fill(log, helpers, 2, epoch=2)
    assert log.epochs.entries == [(1, 0), (2, 4)]
    helpers.crash(log)
    os.truncate(log_dir / f"{FIRST}.log", positions[0] + 5)
    log = open_log(clean_shutdown=False, recovery_point=8, high_watermark=8)
    assert log.log_end_offset == 4
    assert log.high_watermark == 4
    assert log.recovery_point == 4
    assert log.epochs.entries == [(1, 0)]


# -- indexes ----------------------------------------------------------------------


@pytest.mark.parametrize("missing", [".index", ".timeindex"])
def test_missing_index_files_are_rebuilt(open_log, helpers, log_dir, missing) -> None:
    config = LogConfig(index_interval_bytes=1)
    log = open_log(config=config)
    _fill(log, helpers, 6)
    entries = _index_entries(log.active)
    log.close()
    (log_dir / (FIRST + missing)).unlink()

    loaded = _load(log_dir, config, recovery_point=12, clean=True)
    assert loaded.recovered_segments == 1
    assert _index_entries(loaded.segments[0]) == entries
    _close_segments(loaded.segments)
    assert (log_dir / (FIRST + missing)).exists()

    log = open_log(config=config, recovery_point=12)
    assert log.log_end_offset == 12
    assert len(_values(log, helpers)) == 12


def _corrupt_index(path: Path, how: str) -> None:
    raw = path.read_bytes()
    entry = 12 if path.suffix == ".timeindex" else 8
    assert len(raw) >= 3 * entry
    match how:
        case "partial_entry":
            path.write_bytes(raw + b"\x00\x01\x02")
        case "out_of_order":
            path.write_bytes(raw[entry : 2 * entry] + raw[:entry] + raw[2 * entry :])
        case "past_the_end":
            if entry == 8:
                path.write_bytes(raw[:-entry] + struct.pack(">ii", 200, 10**6))
            else:
                path.write_bytes(raw[:-entry] + struct.pack(">qi", 2**50, 200))
        case "garbage":
            path.write_bytes(os.urandom(len(raw)))


@pytest.mark.parametrize("how", ["partial_entry", "out_of_order", "past_the_end"])
@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_corrupt_index_is_rebuilt(open_log, helpers, log_dir, suffix, how) -> None:
    config = LogConfig(index_interval_bytes=1)
    log = open_log(config=config)
    _fill(log, helpers, 6)
    entries = _index_entries(log.active)
    time_entry = log.active.time_index.last_entry
    before = _values(log, helpers)
    log.close()
    _corrupt_index(log_dir / (FIRST + suffix), how)

    log = open_log(config=config, recovery_point=12)
    assert log.log_end_offset == 12
    assert _index_entries(log.active) == entries
    assert log.active.time_index.last_entry == time_entry
    assert _values(log, helpers) == before
    log.close()
    # The rebuilt files are sane: the next clean start trusts them.
    loaded = _load(log_dir, config, recovery_point=12, clean=True)
    assert loaded.recovered_segments == 0
    _close_segments(loaded.segments)


def test_index_with_positions_out_of_order_is_rebuilt(open_log, helpers, log_dir) -> None:
    config = LogConfig(index_interval_bytes=1)
    log = open_log(config=config)
    _fill(log, helpers, 6)
    entries = _index_entries(log.active)
    log.close()
    path = log_dir / f"{FIRST}.index"
    raw = bytearray(path.read_bytes())
    # Keep the offsets increasing, but swap the first two entries' positions.
    first, second = struct.unpack_from(">i", raw, 4)[0], struct.unpack_from(">i", raw, 12)[0]
    struct.pack_into(">i", raw, 4, second)
    struct.pack_into(">i", raw, 12, first)
    path.write_bytes(bytes(raw))

    log = open_log(config=config, recovery_point=12)
    assert _index_entries(log.active) == entries
    assert len(_values(log, helpers)) == 12


def test_corrupt_index_of_an_older_segment_is_rebuilt(open_log, helpers, log_dir) -> None:
    config = LogConfig(index_interval_bytes=1)
    log = open_log(config=config)
    _fill(log, helpers, 5)
    entries = _index_entries(log.active)
    log.roll()
    _fill(log, helpers, 2)
    log.close()
    _corrupt_index(log_dir / f"{FIRST}.index", "partial_entry")
    log = open_log(config=config, recovery_point=log.log_end_offset)
    assert _index_entries(log.segments[0]) == entries
    assert len(_values(log, helpers)) == 14


# -- leftovers ----------------------------------------------------------------------


def test_leftover_deleted_and_temporary_files_are_removed(open_log, helpers, log_dir) -> None:
    log = open_log()
    _fill(log, helpers, 2)
    log.close()
    leftovers = [
        "00000000000000000100.log.deleted",
        "00000000000000000100.index.deleted",
        "00000000000000000100.timeindex.deleted",
        "leader-epoch-checkpoint.tmp",
        "00000000000000000000.log.cleaned",
        "00000000000000000000.log.swap",
        "00000000000000000200.index",  # an index without its log
        "00000000000000000200.timeindex",
    ]
    for name in leftovers:
        (log_dir / name).write_bytes(b"junk")
    log = open_log(recovery_point=4)
    names = {p.name for p in log_dir.iterdir()}
    assert not names & set(leftovers)
    assert f"{FIRST}.log" in names
    assert log.log_end_offset == 4


def test_segment_overlapping_the_previous_one_is_removed(open_log, helpers, log_dir) -> None:
    log = open_log()
    _fill(log, helpers, 3)  # offsets 0-5
    log.roll()
    _fill(log, helpers, 1)  # offsets 6-7
    log.close()
    # A stray segment file whose base offset lies inside the first segment.
    for suffix in (".log", ".index", ".timeindex"):
        os.replace(
            log_dir / f"00000000000000000006{suffix}", log_dir / f"00000000000000000004{suffix}"
        )
    loaded = _load(log_dir, LogConfig(), recovery_point=0, clean=False)
    assert [s.base_offset for s in loaded.segments] == [0]
    _close_segments(loaded.segments)
    assert helpers.segment_files(log_dir) == [f"{FIRST}.log"]


def test_empty_directory_loads_as_an_empty_log_at_the_log_start(open_log, log_dir) -> None:
    log = open_log(log_start_offset=50, clean_shutdown=False)
    assert log.log_end_offset == 50
    assert log.log_start_offset == 50
    assert [s.base_offset for s in log.segments] == [50]


def test_a_log_recovered_below_its_checkpointed_log_start_restarts_empty_there(
    open_log, helpers, log_dir
) -> None:
    log = open_log()
    for _ in range(3):
        log.append_as_leader(helpers.make_batch(2), 0)
    helpers.crash(log)
    segment = sorted(log_dir.glob("*.log"))[0]
    with open(segment, "r+b") as f:
        f.truncate(10)
    reopened = open_log(clean_shutdown=False, log_start_offset=4)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (4, 4)
    assert reopened.append_as_leader(helpers.make_batch(1), 0).first_offset == 4
