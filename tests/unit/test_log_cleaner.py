"""The log cleaner on one log: what a clean keeps, where it may clean, and the files it leaves.

Logs roll on every few batches (small ``segment.bytes``) so that data
becomes cleanable; the high watermark is set by hand, as the partition
would. Cleans run on the test's event loop, their file work in threads.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from shoal.broker.log.cleaner.batches import DELETE_HORIZON_BIT
from shoal.broker.log.cleaner.checkpoint import read_cleaner_checkpoint, write_cleaner_checkpoint
from shoal.broker.log.cleaner.cleanable import is_cleanable, log_to_clean
from shoal.broker.log.cleaner.cleaner import Cleaner, CleanResult
from shoal.broker.log.cleaner.faults import Faults, InjectedFaultError
from shoal.broker.log.cleaner.swap import CleanAbortedError
from shoal.broker.log.log import InvalidRecordError, Log

from shoal.records import (
    BatchOptions,
    Compression,
    NewRecord,
    build_batch,
    iter_batches,
    iter_records,
)

NOW = 1_700_000_000_000


def keyed(
    pairs: list[tuple[str, str | None]],
    timestamp: int = NOW,
    compression: Compression = Compression.NONE,
    options: BatchOptions | None = None,
) -> bytes:
    records = [
        NewRecord(key.encode(), None if value is None else value.encode(), timestamp=timestamp)
        for key, value in pairs
    ]
    return build_batch(records, 0, options or BatchOptions(compression=compression))


def compacted(open_log, **fields) -> Log:
    fields.setdefault("segment_bytes", 300)
    fields.setdefault("cleanup_policy", ("compact",))
    fields.setdefault("file_delete_delay_ms", 0)
    return open_log(**fields)


def live(log: Log, helpers) -> dict[str, tuple[int, str | None]]:
    """key -> (offset, value) of the last record of each key, read as a consumer would."""
    latest: dict[str, tuple[int, str | None]] = {}
    for record in helpers.read_all(log):
        assert record.key is not None
        latest[record.key.decode()] = (
            record.offset,
            None if record.value is None else record.value.decode(),
        )
    return latest


async def clean(log: Log, checkpoint: int | None = None, **kwargs) -> CleanResult:
    log.high_watermark = log.log_end_offset
    target = log_to_clean(log, checkpoint, log.clock())
    return await Cleaner(max_map_entries=kwargs.pop("max_map_entries", 1 << 20), **kwargs).clean(
        log, target
    )


def fill(log: Log, rounds: int, keys: int, timestamp: int = NOW) -> dict[str, str]:
    """Every key written ``rounds`` times, a batch of two records at a time."""
    expected: dict[str, str] = {}
    for r in range(rounds):
        for k in range(0, keys, 2):
            pairs = [(f"k{k + j}", f"v{r}-{k + j}") for j in range(2) if k + j < keys]
            log.append_as_leader(keyed(pairs, timestamp), 0)
            expected.update(pairs)
    return expected


async def test_clean_keeps_the_latest_value_of_every_key_at_its_offset(open_log, helpers) -> None:
    log = compacted(open_log)
    fill(log, rounds=6, keys=8)
    before = live(log, helpers)
    end = log.log_end_offset
    log.roll()
    result = await clean(log)
    assert result.end_offset == end
    after = live(log, helpers)
    assert after == before
    offsets = [r.offset for r in helpers.read_all(log)]
    assert offsets == sorted(offsets)
    assert len(offsets) == 8
    assert log.log_end_offset == end


async def test_the_active_segment_is_never_cleaned(open_log, helpers) -> None:
    log = compacted(open_log, segment_bytes=1 << 20)
    fill(log, rounds=4, keys=4)
    size = log.active.size
    result = await clean(log)
    assert result.stats.groups == 0
    assert log.active.size == size
    assert len(helpers.read_all(log)) == 16


async def test_small_segments_are_merged_into_one_cleaned_segment(open_log, helpers) -> None:
    log = compacted(open_log, segment_bytes=300)
    fill(log, rounds=8, keys=4)
    log.roll()
    assert len(log.segments) > 4
    await clean(log)
    # Groups are sized by the segments before cleaning: merged once they shrank.
    log.update_config(dataclasses.replace(log.config, segment_bytes=1000))
    log.append_as_leader(keyed([("k0", "last")]), 0)
    log.roll()
    await clean(log)
    assert len(log.segments) == 2
    assert live(log, helpers)["k0"][1] == "last"
    assert sorted(live(log, helpers)) == ["k0", "k1", "k2", "k3"]


async def test_offsets_have_gaps_and_every_offset_reads_the_next_batch(open_log, helpers) -> None:
    log = compacted(open_log, index_interval_bytes=1)
    fill(log, rounds=5, keys=6)
    log.roll()
    await clean(log)
    kept = [r.offset for r in helpers.read_all(log)]
    for offset in range(log.log_start_offset, log.log_end_offset):
        fs = log.read(offset, 1 << 20, log.log_end_offset, min_one=True)
        if offset > kept[-1]:
            assert fs is None
            continue
        assert fs is not None
        first = next(iter_batches(helpers.slice_bytes(fs)))[1]
        assert first.last_offset >= offset
        assert first.base_offset <= min(o for o in kept if o >= offset)


async def test_a_rewritten_batch_keeps_its_offsets_codec_and_producer_fields(
    open_log, helpers
) -> None:
    log = compacted(open_log)
    options = BatchOptions(compression=Compression.ZSTD)
    log.append_as_leader(keyed([("a", "1"), ("b", "1"), ("c", "1")], options=options), 0)
    log.append_as_leader(keyed([("a", "2")], options=options), 0)
    log.roll()
    await clean(log)
    data = helpers.slice_bytes(log.read(0, 1 << 20, log.log_end_offset, min_one=True))
    headers = [h for _, h in iter_batches(data)]  # CRC checked
    assert headers[0].base_offset == 0
    assert headers[0].last_offset_delta == 2
    assert headers[0].compression is Compression.ZSTD
    assert headers[0].records_count == 2
    records = [r for _, raw in helpers.split_batches(data) for r in iter_records(raw)]
    assert [(r.offset, r.key, r.value) for r in records] == [
        (1, b"b", b"1"),
        (2, b"c", b"1"),
        (3, b"a", b"2"),
    ]


async def test_timestamps_and_headers_survive_a_rewrite(open_log, helpers) -> None:
    log = compacted(open_log)
    records = [
        NewRecord(b"a", b"old", (("h", b"1"),), NOW),
        NewRecord(b"b", b"keep", (("h", b"2"), ("n", None)), NOW + 5),
    ]
    log.append_as_leader(build_batch(records), 0)
    log.append_as_leader(keyed([("a", "new")], NOW + 9), 0)
    log.roll()
    await clean(log)
    got = helpers.read_all(log)
    assert [(r.offset, r.timestamp, r.headers) for r in got] == [
        (1, NOW + 5, (("h", b"2"), ("n", None))),
        (2, NOW + 9, ()),
    ]


async def test_tombstones_stay_until_delete_retention_after_the_first_clean(
    open_log, helpers, clock
) -> None:
    log = compacted(open_log, delete_retention_ms=1000)
    log.append_as_leader(keyed([("a", "1"), ("b", "1")]), 0)
    log.append_as_leader(keyed([("a", None)]), 0)
    log.roll()
    first = await clean(log)
    assert live(log, helpers) == {"a": (2, None), "b": (1, "1")}
    assert first.stats.earliest_delete_horizon == clock.now + 1000
    tombstone_batch = helpers.split_batches(
        helpers.slice_bytes(log.read(2, 1 << 20, log.log_end_offset, min_one=True))
    )[0][0]
    assert tombstone_batch.attributes & DELETE_HORIZON_BIT
    clock.advance(999)
    await clean(log, first.end_offset)
    assert "a" in live(log, helpers)
    clock.advance(1)
    await clean(log, first.end_offset)
    assert live(log, helpers) == {"b": (1, "1")}


async def test_min_compaction_lag_keeps_recent_segments_dirty(open_log, helpers, clock) -> None:
    log = compacted(open_log, min_compaction_lag_ms=60_000)
    fill(log, rounds=3, keys=2, timestamp=clock.now - 120_000)
    old_end = log.log_end_offset
    log.roll()
    fill(log, rounds=3, keys=2, timestamp=clock.now)
    log.roll()
    log.high_watermark = log.log_end_offset
    target = log_to_clean(log, None, clock.now)
    assert target.first_uncleanable_offset == old_end
    result = await clean(log)
    assert result.end_offset == old_end
    assert len(helpers.read_all(log)) == 2 + 6


async def test_max_compaction_lag_makes_a_log_cleanable_whatever_its_ratio(open_log, clock) -> None:
    log = compacted(open_log, max_compaction_lag_ms=60_000, min_cleanable_dirty_ratio=0.99)
    log.append_as_leader(keyed([("a", "1")]), 0)
    log.roll()
    log.append_as_leader(keyed([("b", "1")], clock.now - 30_000), 0)
    log.roll()
    log.high_watermark = log.log_end_offset
    checkpoint = 1
    target = log_to_clean(log, checkpoint, clock.now)
    assert not is_cleanable(target, 0.99)
    clock.advance(40_000)
    target = log_to_clean(log, checkpoint, clock.now)
    assert target.needs_compaction_now
    assert is_cleanable(target, 0.99)


async def test_dirty_ratio_counts_the_segments_after_the_checkpoint(open_log) -> None:
    log = compacted(open_log, segment_bytes=1 << 20)
    log.append_as_leader(keyed([("a", "1")]), 0)
    first_size = log.active.size
    log.roll()
    log.append_as_leader(keyed([("a", "2")]), 0)
    log.append_as_leader(keyed([("a", "3")]), 0)
    log.roll()
    log.high_watermark = log.log_end_offset
    target = log_to_clean(log, 1, log.clock())
    assert target.first_dirty_offset == 1
    assert target.first_uncleanable_offset == 3
    assert target.clean_bytes == first_size
    assert target.cleanable_bytes == 2 * first_size
    assert target.cleanable_ratio == pytest.approx(2 / 3)
    assert log_to_clean(log, 99, log.clock()).first_dirty_offset == 0


async def test_nothing_above_the_high_watermark_is_cleaned(open_log, helpers) -> None:
    log = compacted(open_log)
    fill(log, rounds=4, keys=2)
    log.roll()
    log.high_watermark = 2
    target = log_to_clean(log, None, log.clock())
    assert target.first_uncleanable_offset == 2
    result = await Cleaner(max_map_entries=100).clean(log, target)
    assert result.end_offset == 2
    assert len(helpers.read_all(log)) == 8


async def test_a_full_offset_map_ends_the_clean_early(open_log, helpers) -> None:
    log = compacted(open_log)
    fill(log, rounds=2, keys=8)
    log.roll()
    result = await clean(log, max_map_entries=4)
    assert 0 < result.end_offset < log.log_end_offset
    again = await clean(log, result.end_offset)
    assert again.end_offset == log.log_end_offset
    assert len(live(log, helpers)) == 8


async def test_the_last_batch_of_an_active_producer_stays_as_an_empty_batch(
    open_log, helpers
) -> None:
    log = compacted(open_log, segment_bytes=1 << 20)
    options = BatchOptions(producer_id=7, producer_epoch=0, base_sequence=0)
    log.append_as_leader(keyed([("a", "1"), ("b", "1")], options=options), 0)
    log.append_as_leader(keyed([("a", "2"), ("b", "2")]), 0)
    log.append_as_leader(keyed([("c", "1")]), 0)
    log.roll()
    await clean(log)
    batches = helpers.split_batches(
        helpers.slice_bytes(log.read(0, 1 << 20, log.log_end_offset, min_one=True))
    )
    first = batches[0][0]
    assert (first.base_offset, first.last_offset, first.records_count) == (0, 1, 0)
    assert (first.producer_id, first.base_sequence) == (7, 0)
    reopened_state = log.producer_state.producers[7].batches[-1]
    assert reopened_state.last_sequence == 1


async def test_a_reader_holding_a_replaced_segment_keeps_reading_it(open_log, helpers) -> None:
    log = compacted(open_log, file_delete_delay_ms=60_000)
    fill(log, rounds=4, keys=2)
    log.roll()
    held = log.read(0, 1 << 20, log.log_end_offset, min_one=True)
    assert held is not None
    before = helpers.slice_bytes(held)
    await clean(log)
    assert helpers.slice_bytes(held) == before
    assert any(n.endswith(".deleted") for n in os.listdir(log.directory))


async def test_recovery_discards_a_cleaned_segment_and_keeps_the_old_ones(
    open_log, helpers, log_dir: Path
) -> None:
    log = compacted(open_log)
    fill(log, rounds=4, keys=4)
    log.roll()
    before = helpers.read_all(log)
    with pytest.raises(InjectedFaultError):
        await clean(log, faults=Faults("cleaned_written", raise_=True))
    assert not [n for n in os.listdir(log_dir) if n.endswith((".cleaned", ".swap"))]
    (log_dir / "00000000000000000000.log.cleaned").write_bytes(b"half a segment")
    log.close()
    reopened = compacted(open_log)
    assert helpers.read_all(reopened) == before


async def test_recovery_finishes_a_swap_that_reached_the_swap_file(
    open_log, helpers, log_dir: Path
) -> None:
    log = compacted(open_log)
    fill(log, rounds=4, keys=4)
    log.roll()
    expected = live(log, helpers)
    with pytest.raises(InjectedFaultError):
        await clean(log, faults=Faults("old_deleted_partly", raise_=True))
    assert any(n.endswith(".log.swap") for n in os.listdir(log_dir))
    helpers.crash(log)
    reopened = compacted(open_log, clean_shutdown=False)
    assert live(reopened, helpers) == expected
    assert len(helpers.read_all(reopened)) < 16
    assert not [n for n in os.listdir(log_dir) if n.endswith((".swap", ".cleaned"))]


async def test_a_clean_aborts_when_retention_took_its_segments(open_log, helpers) -> None:
    log = compacted(open_log, cleanup_policy=("compact", "delete"))
    fill(log, rounds=4, keys=4)
    log.roll()
    log.high_watermark = log.log_end_offset
    target = log_to_clean(log, None, log.clock())

    class RetentionMeanwhile(Faults):
        def hit(self, step: str) -> None:
            if step == "map_built":  # on the loop, between the clean's threads
                log.delete_segments(log.segments[:1])

    with pytest.raises(CleanAbortedError):
        await Cleaner(max_map_entries=100, faults=RetentionMeanwhile()).clean(log, target)
    assert not [n for n in os.listdir(log.directory) if n.endswith((".swap", ".cleaned"))]
    assert len(live(log, helpers)) == 4


def test_a_record_without_a_key_is_refused_by_a_compacted_log(open_log) -> None:
    log = compacted(open_log)
    batch = build_batch([NewRecord(None, b"v", timestamp=NOW)])
    with pytest.raises(
        InvalidRecordError, match="Compacted topic cannot accept message without key"
    ):
        log.append_as_leader(batch, 0)
    assert log.log_end_offset == 0


def test_a_follower_appends_a_cleaned_leaders_batches_across_gaps(open_log, helpers) -> None:
    log = open_log()
    first = bytearray(keyed([("a", "1")]))
    second = bytearray(keyed([("b", "1")]))
    second[0:8] = (5).to_bytes(8, "big")
    log.append_as_follower(bytes(first) + bytes(second))
    assert log.log_end_offset == 6
    assert [r.offset for r in helpers.read_all(log)] == [0, 5]


def test_the_cleaner_checkpoint_uses_kafkas_file(tmp_path: Path) -> None:
    write_cleaner_checkpoint(tmp_path, {("orders", 0): 42})
    assert (tmp_path / "cleaner-offset-checkpoint").read_text() == "0\n1\norders 0 42\n"
    assert read_cleaner_checkpoint(tmp_path) == {("orders", 0): 42}


async def test_an_unchanged_log_is_copied_byte_for_byte(open_log, helpers) -> None:
    log = compacted(open_log, segment_bytes=1 << 20)
    for i in range(5):
        log.append_as_leader(keyed([(f"k{i}", "v")], compression=Compression.GZIP), 0)
    log.roll()
    before = [os.pread(s.fd, s.size, 0) for s in log.segments[:-1]]
    await clean(log)
    after = [os.pread(s.fd, s.size, 0) for s in log.segments[:-1]]
    assert after == before


async def test_timestamp_lookups_step_over_removed_records(open_log, helpers) -> None:
    log = compacted(open_log)
    log.append_as_leader(keyed([("a", "1")], NOW), 0)
    log.append_as_leader(keyed([("b", "1")], NOW + 10), 0)
    log.append_as_leader(keyed([("a", "2")], NOW + 20), 0)
    log.roll()
    await clean(log)
    found = log.offset_for_timestamp(NOW)
    assert found is not None
    assert (found.offset, found.timestamp) == (1, NOW + 10)
    latest = log.offset_of_max_timestamp()
    assert latest is not None and latest.offset == 2


def test_max_compaction_lag_rolls_the_active_segment_sooner(open_log, clock) -> None:
    log = compacted(open_log, segment_bytes=1 << 20, max_compaction_lag_ms=1000)
    log.append_as_leader(keyed([("a", "1")], clock.now), 0)
    clock.advance(1001)
    log.append_as_leader(keyed([("a", "2")], clock.now), 0)
    assert len(log.segments) == 2


async def test_a_batch_larger_than_the_read_chunk_is_cleaned_whole(open_log, helpers) -> None:
    log = compacted(open_log, segment_bytes=1 << 20, max_message_bytes=4 << 20)
    big = "x" * ((3 << 20) // 2)
    log.append_as_leader(keyed([("a", big), ("b", big)]), 0)
    log.append_as_leader(keyed([("a", "small")]), 0)
    log.roll()
    await clean(log)
    assert live(log, helpers) == {"b": (1, big), "a": (2, "small")}
