"""Cleaning one log: Kafka's Cleaner.doClean, split between a worker thread and the loop.

One clean of a log, given its :class:`~.cleanable.LogToClean`:

1. On the loop: take a :class:`~.source.SegmentSource` of every non-active
   segment below the first uncleanable offset, the last offset of every
   producer the log still tracks, and the aborted transactions of the part
   to clean (:mod:`.transactions`).
2. In a thread: build the offset map over the dirty part (it may end early,
   at ``end_offset``, when the map is full), without aborted records.
   Markers whose transaction has no data left go after delete.retention.ms,
   with their aborted transaction index entries (:mod:`.transactions`).
3. Group the segments below ``end_offset`` into runs whose total size fits
   in ``segment.bytes`` (and whose indexes fit ``segment.index.bytes``), as
   Kafka's groupSegmentsBySize does, so small segments merge.
4. For each group, in a thread: filter every batch into a ``.cleaned``
   segment (:mod:`.batches`), fsync it and rename it to ``.swap``; then on
   the loop swap it in (:mod:`.swap`) and schedule the old segments'
   destruction after ``file.delete.delay.ms``.

The caller records ``end_offset`` as the log's new first dirty offset.
Offsets never change; the active segment is never read or written; produce
and fetch go on meanwhile. A change to the log that touches the segments
being cleaned (retention, truncation, deletion) aborts the clean at its next
swap with :class:`~.swap.CleanAbortedError`, leaving the log as it was.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shoal.broker.log.checkpoint import fsync_dir
from shoal.broker.log.cleaner.batches import filter_batch, filter_marker
from shoal.broker.log.cleaner.cleanable import LogToClean
from shoal.broker.log.cleaner.faults import Faults
from shoal.broker.log.cleaner.offset_map import OffsetMap, build_offset_map
from shoal.broker.log.cleaner.source import SegmentSource
from shoal.broker.log.cleaner.swap import discard, rename_cleaned_to_swap, swap_in
from shoal.broker.log.cleaner.throttler import UNLIMITED, Throttler
from shoal.broker.log.cleaner.transactions import TransactionPass
from shoal.broker.log.cleaner.writer import CleanedSegmentWriter
from shoal.broker.log.config import INT_MAX, LogConfig
from shoal.broker.log.log import Log
from shoal.broker.log.segment import LogSegment

from shoal.records import BatchHeader, parse_header

log = logging.getLogger(__name__)

DestroyLater = Callable[[Log, list[LogSegment]], None]
CheckDone = Callable[[], None]
"""Raises CleanAbortedError when the clean must stop (Kafka's checkDone); called per batch."""


def _never_done() -> None:
    return None


@dataclass(slots=True)
class CleanerStats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    segments_replaced: int = 0
    groups: int = 0
    earliest_delete_horizon: int | None = None
    """The soonest a kept tombstone may go: when another clean is worth running."""
    seconds: float = 0.0

    def add_horizon(self, horizon: int | None) -> None:
        if horizon is not None and (
            self.earliest_delete_horizon is None or horizon < self.earliest_delete_horizon
        ):
            self.earliest_delete_horizon = horizon


@dataclass(frozen=True, slots=True)
class CleanResult:
    end_offset: int
    """The new first dirty offset."""
    stats: CleanerStats = field(default_factory=CleanerStats)


def group_by_size(
    sources: Sequence[SegmentSource], max_size: int, max_index_size: int, first_uncleanable: int
) -> list[list[SegmentSource]]:
    """Adjacent segments merged while their logs fit ``max_size`` and indexes ``max_index_size``."""
    groups: list[list[SegmentSource]] = []
    i = 0
    while i < len(sources):
        group = [sources[i]]
        first = group[0]
        log_size, index_size, time_size = first.size, first.index_bytes, first.time_index_bytes
        i += 1
        while i < len(sources):
            candidate = sources[i]
            last_offset = (
                sources[i + 1].base_offset - 1 if i + 1 < len(sources) else first_uncleanable - 1
            )
            if (
                log_size + candidate.size > max_size
                or index_size + candidate.index_bytes > max_index_size
                or time_size + candidate.time_index_bytes > max_index_size
                or (candidate.size and last_offset - group[0].base_offset > INT_MAX)
            ):
                break
            group.append(candidate)
            log_size += candidate.size
            index_size += candidate.index_bytes
            time_size += candidate.time_index_bytes
            i += 1
        groups.append(group)
    return groups


def _with_last(
    group: Sequence[SegmentSource], throttle: Callable[[int], None] | None
) -> Iterator[tuple[BatchHeader, bytes, bool]]:
    """The group's batches, each flagged when it is the group's last one."""
    pending: tuple[BatchHeader, bytes] | None = None
    for source in group:
        for header, data in source.batches(throttle):
            if pending is not None:
                yield pending[0], pending[1], False
            pending = (header, data)
    if pending is not None:
        yield pending[0], pending[1], True


def clean_group(
    directory: Path,
    config: LogConfig,
    group: Sequence[SegmentSource],
    offset_map: OffsetMap,
    now_ms: int,
    producer_last_offsets: dict[int, int],
    throttler: Throttler,
    faults: Faults,
    stats: CleanerStats,
    check_done: CheckDone = _never_done,
    transactions: TransactionPass | None = None,
) -> None:
    """Write the group's cleaned segment and rename it to ``.swap`` (worker thread).

    The last batch of the group is kept even when it keeps no record (an
    empty batch), so the cleaned segment ends where the group did: recovery
    relies on it to know which segments a swap replaces. So is the last batch
    of each producer the log still tracks, for its sequence numbers, as in
    Kafka. With ``transactions`` (fed every batch of the clean in order),
    batches of aborted transactions lose their records and markers of
    transactions without data go after their delete horizon; the cleaned
    segment's aborted transaction index is its sources', less the aborts
    whose marker went.
    """
    base = group[0].base_offset
    throttle = throttler.maybe_throttle if throttler.limited else None
    writer = CleanedSegmentWriter(directory, base, config)
    try:
        written_any = False
        dropped_markers: set[int] = set()
        for header, data, last in _with_last(group, throttle):
            check_done()
            stats.bytes_read += header.size
            retain = last or (
                header.producer_id >= 0
                and producer_last_offsets.get(header.producer_id) == header.last_offset
            )
            if header.is_control:
                may_go = (
                    transactions is not None
                    and header.producer_id >= 0
                    and not transactions.marker_had_data(header)
                    and not last
                )
                result = filter_marker(data, header, may_go, now_ms, config.delete_retention_ms)
                if result.data is None:
                    dropped_markers.add(header.base_offset)
            else:
                result = filter_batch(
                    data,
                    header,
                    offset_map.offsets,
                    offset_map.end_offset,
                    now_ms,
                    config.delete_retention_ms,
                    retain,
                    discard=transactions is not None and transactions.is_aborted(header),
                )
            stats.records_read += result.records_read
            stats.records_kept += result.records_kept
            if result.data is None:
                continue
            kept = result.data
            kept_header = header if kept is data else parse_header(kept)
            writer.append(kept_header, kept)
            stats.bytes_written += len(kept)
            stats.add_horizon(result.horizon)
            if throttle is not None:
                throttle(len(kept))
            if not written_any:
                written_any = True
                faults.hit("cleaned_partly_written")
        mtime_ns = os.fstat(group[-1].fd).st_mtime_ns
        aborted = [
            t for source in group for t in source.aborted if t.last_offset not in dropped_markers
        ]
        writer.finish(mtime_ns, aborted)
        faults.hit("cleaned_written")
        rename_cleaned_to_swap(directory, base, faults)
    except BaseException:
        writer.abandon()
        discard(directory, base)
        raise


class Cleaner:
    """Cleans one log at a time; one per cleaner worker.

    ``destroy_later`` receives the replaced segments of a log, to destroy
    after ``file.delete.delay.ms`` (the log manager's schedule); without it
    they are destroyed by a timer on the running loop.
    """

    def __init__(
        self,
        *,
        max_map_entries: int,
        throttler: Throttler | None = None,
        faults: Faults | None = None,
        destroy_later: DestroyLater | None = None,
        check_done: CheckDone = _never_done,
    ) -> None:
        self.max_map_entries = max_map_entries
        self.throttler = throttler or Throttler(UNLIMITED)
        self.faults = faults or Faults()
        self.destroy_later = destroy_later or _destroy_on_timer
        self.check_done = check_done

    async def clean(self, target_log: Log, target: LogToClean) -> CleanResult:
        started = time.monotonic()
        stats = CleanerStats()
        now = target_log.clock()
        config = target_log.config
        upper = target.first_uncleanable_offset
        sources = [SegmentSource.of(s) for s in target_log.segments[:-1] if s.base_offset < upper]
        producer_last = {
            pid: entry.batches[-1].last_offset
            for pid, entry in target_log.producer_state.producers.items()
            if entry.batches
        }
        aborted = target_log.collect_aborted_txns(target_log.log_start_offset, upper)
        try:
            dirty = [
                s
                for i, s in enumerate(sources)
                if (sources[i + 1].base_offset if i + 1 < len(sources) else upper)
                > target.first_dirty_offset
            ]
            throttle = self.throttler.maybe_throttle if self.throttler.limited else None
            offset_map = await asyncio.to_thread(
                build_offset_map,
                dirty,
                target.first_dirty_offset,
                upper,
                self.max_map_entries,
                throttle,
                self.check_done,
                None,
                TransactionPass(aborted),
            )
            self.faults.hit("map_built")
            stats.bytes_read += offset_map.bytes_read
            end = offset_map.end_offset
            cleanable = [s for s in sources if s.base_offset < end]
            groups = group_by_size(
                cleanable, config.segment_bytes, config.segment_index_bytes, upper
            )
            transactions = TransactionPass(aborted)
            for group in groups:
                await asyncio.to_thread(
                    clean_group,
                    target_log.directory,
                    config,
                    group,
                    offset_map,
                    now,
                    producer_last,
                    self.throttler,
                    self.faults,
                    stats,
                    self.check_done,
                    transactions,
                )
                old = [s.segment for s in group]
                swap_in(target_log, old, [s.size for s in group], group[0].base_offset, self.faults)
                self.destroy_later(target_log, old)
                await asyncio.to_thread(fsync_dir, target_log.directory)
                self.faults.hit("group_done")
                stats.groups += 1
                stats.segments_replaced += len(group)
        finally:
            for source in sources:
                source.close()
        stats.seconds = time.monotonic() - started
        log.info(
            "event=log_cleaned dir=%s end_offset=%d groups=%d segments=%d bytes_read=%d"
            " bytes_written=%d records_read=%d records_kept=%d seconds=%.3f",
            target_log.directory.name,
            end,
            stats.groups,
            stats.segments_replaced,
            stats.bytes_read,
            stats.bytes_written,
            stats.records_read,
            stats.records_kept,
            stats.seconds,
        )
        return CleanResult(end, stats)


def _destroy_on_timer(target_log: Log, segments: list[LogSegment]) -> None:
    delay = target_log.config.file_delete_delay_ms / 1000

    def destroy() -> None:
        for segment in segments:
            segment.destroy()

    asyncio.get_running_loop().call_later(delay, destroy)
