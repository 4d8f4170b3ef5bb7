"""Log.read: whole batches only, the byte and offset limits, KIP-74, and the log's range."""

from __future__ import annotations

import pytest
from shoal.broker.log.log import OffsetOutOfRangeError

from shoal.records import Compression, iter_records

BIG = 1 << 30


def _fill(log, helpers, batches: int = 5, count: int = 3, **kwargs) -> list[int]:
    """Append ``batches`` batches of ``count`` records; returns the size of one batch."""
    sizes = []
    for i in range(batches):
        raw = helpers.make_batch(count, tag=f"b{i:02d}-", **kwargs)
        sizes.append(len(raw))
        log.append_as_leader(raw, 0)
    return sizes


def _read_batches(helpers, fs):
    return [h for h, _ in helpers.split_batches(helpers.slice_bytes(fs))]


def test_read_from_the_middle_of_a_batch_returns_the_whole_batch(open_log, helpers) -> None:
    log = open_log()
    _fill(log, helpers)
    fs = log.read(4, BIG, log.log_end_offset, min_one=False)
    assert fs is not None
    headers = _read_batches(helpers, fs)
    assert [h.base_offset for h in headers] == [3, 6, 9, 12]
    first = helpers.split_batches(helpers.slice_bytes(fs))[0][1]
    assert [r.offset for r in iter_records(first)] == [3, 4, 5]


def test_read_of_compressed_batches_returns_them_whole(open_log, helpers) -> None:
    log = open_log()
    _fill(log, helpers, compression=Compression.GZIP)
    fs = log.read(7, BIG, log.log_end_offset, min_one=False)
    assert fs is not None
    batches = helpers.split_batches(helpers.slice_bytes(fs))
    assert batches[0][0].compression is Compression.GZIP
    assert [r.offset for r in iter_records(batches[0][1])] == [6, 7, 8]


def test_every_offset_reads_from_the_batch_holding_it(open_log, helpers) -> None:
    log = open_log(index_interval_bytes=1)
    _fill(log, helpers, batches=8)
    for offset in range(log.log_end_offset):
        fs = log.read(offset, BIG, log.log_end_offset, min_one=False)
        assert fs is not None
        assert _read_batches(helpers, fs)[0].base_offset == offset - offset % 3


def test_max_bytes_returns_only_whole_batches(open_log, helpers) -> None:
    log = open_log()
    sizes = _fill(log, helpers)
    size = sizes[0]
    assert len(set(sizes)) == 1
    for max_bytes, expected in [
        (size, 1),
        (2 * size - 1, 1),
        (2 * size, 2),
        (3 * size + 5, 3),
        (5 * size, 5),
        (BIG, 5),
    ]:
        fs = log.read(0, max_bytes, log.log_end_offset, min_one=False)
        assert fs is not None
        assert fs.size == expected * size, max_bytes
        assert len(_read_batches(helpers, fs)) == expected


def test_max_bytes_limits_use_the_index_for_long_segments(open_log, helpers) -> None:
    log = open_log(index_interval_bytes=500)
    sizes = _fill(log, helpers, batches=60)
    size = sizes[0]
    assert set(sizes) == {size}
    assert len(log.active.offset_index) > 5
    fs = log.read(30, 17 * size + 3, log.log_end_offset, min_one=False)
    assert fs is not None
    headers = _read_batches(helpers, fs)
    assert len(headers) == 17
    assert headers[0].base_offset == 30
    assert headers[-1].base_offset == 30 + 16 * 3


def test_min_one_returns_the_first_batch_whole_even_if_larger_than_max_bytes(
    open_log, helpers
) -> None:
    log = open_log()
    sizes = _fill(log, helpers)
    fs = log.read(3, sizes[0] - 1, log.log_end_offset, min_one=True)
    assert fs is not None
    assert fs.size == sizes[1]
    assert [h.base_offset for h in _read_batches(helpers, fs)] == [3]
    fs = log.read(3, 0, log.log_end_offset, min_one=True)
    assert fs is not None
    assert fs.size == sizes[1]


def test_without_min_one_a_first_batch_larger_than_max_bytes_reads_nothing(
    open_log, helpers
) -> None:
    log = open_log()
    sizes = _fill(log, helpers)
    assert log.read(3, sizes[0] - 1, log.log_end_offset, min_one=False) is None
    assert log.read(3, 0, log.log_end_offset, min_one=False) is None


def test_max_offset_excludes_batches_at_and_after_it(open_log, helpers) -> None:
    log = open_log()
    sizes = _fill(log, helpers)
    fs = log.read(0, BIG, 9, min_one=False)
    assert fs is not None
    assert [h.base_offset for h in _read_batches(helpers, fs)] == [0, 3, 6]
    assert fs.size == sum(sizes[:3])
    fs = log.read(4, BIG, 6, min_one=True)
    assert fs is not None
    assert [h.base_offset for h in _read_batches(helpers, fs)] == [3]


def test_max_offset_inside_a_batch_excludes_that_batch(open_log, helpers) -> None:
    log = open_log()
    _fill(log, helpers)
    fs = log.read(0, BIG, 7, min_one=True)
    assert fs is not None
    assert [h.base_offset for h in _read_batches(helpers, fs)] == [0, 3]
    # The batch holding the offset reaches the limit: nothing to send yet.
    assert log.read(6, BIG, 7, min_one=True) is None


def test_reading_at_or_past_max_offset_returns_nothing(open_log, helpers) -> None:
    log = open_log()
    _fill(log, helpers)
    assert log.read(9, BIG, 9, min_one=True) is None
    assert log.read(10, BIG, 9, min_one=True) is None


def test_reading_at_the_log_end_returns_nothing(open_log, helpers) -> None:
    log = open_log()
    assert log.read(0, BIG, 0, min_one=True) is None
    assert log.read(0, BIG, BIG, min_one=True) is None
    _fill(log, helpers)
    assert log.read(15, BIG, 15, min_one=True) is None
    assert log.read(15, BIG, BIG, min_one=True) is None


def test_offsets_outside_the_log_raise_offset_out_of_range(open_log, helpers) -> None:
    log = open_log()
    _fill(log, helpers)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(16, BIG, BIG, min_one=True)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, BIG, BIG, min_one=True)


def test_reads_never_cross_segments(open_log, helpers) -> None:
    log = open_log()
    _fill(log, helpers, batches=2)
    log.roll()
    _fill(log, helpers, batches=2)
    assert [s.base_offset for s in log.segments] == [0, 6]
    fs = log.read(0, BIG, log.log_end_offset, min_one=True)
    assert fs is not None
    assert fs.file is log.segments[0].file
    assert [h.base_offset for h in _read_batches(helpers, fs)] == [0, 3]
    fs = log.read(6, BIG, log.log_end_offset, min_one=True)
    assert fs is not None
    assert fs.file is log.segments[1].file
    assert fs.position == 0
    assert [h.base_offset for h in _read_batches(helpers, fs)] == [6, 9]


def test_max_offset_at_a_segment_boundary_stops_before_the_next_segment(open_log, helpers) -> None:
    log = open_log()
    _fill(log, helpers, batches=2)
    log.roll()
    _fill(log, helpers, batches=2)
    assert log.read(6, BIG, 6, min_one=True) is None
    fs = log.read(3, BIG, 6, min_one=True)
    assert fs is not None
    assert [h.base_offset for h in _read_batches(helpers, fs)] == [3]


def test_read_returns_the_bytes_every_record_went_in_with(open_log, helpers) -> None:
    log = open_log(segment_bytes=2000)
    sent = []
    for i in range(30):
        codec = list(Compression)[i % len(Compression)]
        raw = helpers.make_batch(1 + i % 4, tag=f"m{i}-", compression=codec)
        sent.extend(r.value for r in iter_records(raw))
        log.append_as_leader(raw, 0)
    assert len(log.segments) > 1
    records = helpers.read_all(log)
    assert [r.offset for r in records] == list(range(len(sent)))
    assert [r.value for r in records] == sent
