"""Loading a partition's segments from disk, and recovering them after a crash.

What a crash can leave, and what loading does about it:

* A torn tail: the process died mid-``write``, or the disk lost unflushed
  pages. Every segment that may hold offsets at or past the recovery point
  (the last offset known to be fsynced) is re-validated batch by batch (CRC,
  framing, increasing offsets); the first bad batch and everything after it
  is cut, and segments after a cut are deleted, as Kafka's LogLoader does.
* Stale or damaged indexes: indexes reach disk lazily (see
  :mod:`shoal.broker.log.index`). An index that is missing, not whole entries,
  out of order, or pointing past its segment is rebuilt by re-validating its
  segment.
* Half-done deletions: ``*.deleted`` files are removed; ``*.tmp`` files from an
  interrupted checkpoint are dropped.
* Half-done cleans (see :mod:`shoal.broker.log.cleaner.swap`): a ``.cleaned``
  segment is discarded (the segments it was cleaned from are all still
  there); a ``.log.swap`` segment replaces the segments whose base offsets
  fall inside its range, and its indexes are rebuilt, as Kafka's LogLoader
  finishes a swap. The cleaned segment's ``.txnindex`` cannot be rebuilt from
  its log, so it travels with the swap: renamed to ``.txnindex.swap`` before
  the log's commit rename and live before the old segments' files go, it
  replaces theirs (a live one without its ``.swap`` is the new one already).
* Aborted transaction indexes of segments recovered after a crash are cut
  at the recovered end here; the log re-adds what they miss while it
  replays producer state from the recovery point (:mod:`shoal.broker.log.txn_index`).

After a clean shutdown the recovery point is trusted, but the active
segment's tail is still walked header by header, so a file cut by hand
between runs is caught too.
"""

from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from shoal.broker.log.checkpoint import fsync_dir
from shoal.broker.log.config import LogConfig
from shoal.broker.log.index import IndexCorruptError
from shoal.broker.log.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    base_offset_of,
)
from shoal.broker.log.txn_index import TXN_INDEX_SUFFIX

from shoal.records import InvalidBatchError, validate_batch

log = logging.getLogger(__name__)

_LEFTOVER_SUFFIXES = (DELETED_SUFFIX, ".tmp", CLEANED_SUFFIX, SWAP_SUFFIX)
_SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


@dataclass(frozen=True, slots=True)
class LoadedSegments:
    segments: list[LogSegment]
    truncated_bytes: int
    recovered_segments: int


def _next_offset(path: Path, base_offset: int) -> int:
    """One past the last whole, valid batch of a segment file."""
    next_offset = base_offset
    size = path.stat().st_size
    if not size:
        return next_offset
    with path.open("rb") as file, mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) as data:
        position = 0
        while position < size:
            try:
                header = validate_batch(data, position)
            except InvalidBatchError:
                break
            next_offset = header.next_offset
            position += header.size
    return next_offset


def complete_swaps(directory: Path) -> int:
    """Finish the cleaner's swaps that reached ``.log.swap``; drop its ``.cleaned`` files.

    Returns how many swaps were completed.
    """
    for path in directory.glob("*" + CLEANED_SUFFIX):
        log.info("event=cleaned_segment_discarded path=%s", path)
        path.unlink(missing_ok=True)
    swaps = sorted(directory.glob("*" + LOG_SUFFIX + SWAP_SUFFIX))
    swap_bases = {base_offset_of(p) for p in swaps}
    txn_swaps: dict[int, Path] = {}
    for path in directory.glob("*" + SWAP_SUFFIX):
        if path in swaps:
            continue
        if (
            path.name.endswith(TXN_INDEX_SUFFIX + SWAP_SUFFIX)
            and base_offset_of(path) in swap_bases
        ):
            txn_swaps[base_offset_of(path)] = path
            continue
        path.unlink()  # an offset or time index: rebuilt from the log below
    for swap in swaps:
        base = base_offset_of(swap)
        end = _next_offset(swap, base)
        if end == base:
            # No batch: only a group of empty segments cleans to that (the
            # cleaner keeps every group's last batch), so nothing is lost.
            log.warning("event=empty_swap_discarded path=%s", swap)
            swap.unlink()
            continue
        for path in list(directory.iterdir()):
            if not path.name.endswith(_SEGMENT_SUFFIXES):
                continue
            offset = base_offset_of(path)
            if offset == base and path.name.endswith(TXN_INDEX_SUFFIX) and base not in txn_swaps:
                continue  # the cleaned segment's, renamed live before the crash
            if base <= offset < end or (offset == base and not path.name.endswith(LOG_SUFFIX)):
                log.info("event=cleaned_away_segment_removed path=%s", path)
                path.unlink()
        if base in txn_swaps:
            txn_swap = txn_swaps.pop(base)
            os.replace(txn_swap, txn_swap.with_name(txn_swap.name.removesuffix(SWAP_SUFFIX)))
        live = swap.with_name(swap.name.removesuffix(SWAP_SUFFIX))
        os.replace(swap, live)
        log.info("event=swap_completed path=%s next_offset=%d", live, end)
    if swaps:
        fsync_dir(directory)
    return len(swaps)


def remove_leftovers(directory: Path) -> None:
    for path in directory.iterdir():
        if path.name.endswith(_LEFTOVER_SUFFIXES):
            log.info("event=leftover_removed path=%s", path)
            path.unlink(missing_ok=True)
    logs = {base_offset_of(p) for p in directory.glob("*" + LOG_SUFFIX)}
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
        for path in directory.glob("*" + suffix):
            if base_offset_of(path) not in logs:
                log.info("event=orphan_index_removed path=%s", path)
                path.unlink()


def load_segments(
    directory: Path,
    config: LogConfig,
    recovery_point: int,
    clean_shutdown: bool,
    now_ms: int,
) -> LoadedSegments:
    """Open every segment in ``directory``, recovering those a crash may have touched."""
    complete_swaps(directory)
    remove_leftovers(directory)
    bases = sorted(base_offset_of(p) for p in directory.glob("*" + LOG_SUFFIX))
    segments = [LogSegment(directory, base, config, now_ms) for base in bases]
    kept: list[LogSegment] = []
    truncated = 0
    recovered = 0
    for i, segment in enumerate(segments):
        is_last = i == len(segments) - 1
        holds_unflushed = is_last or segments[i + 1].base_offset > recovery_point
        needs_recovery = holds_unflushed and not clean_shutdown
        if not needs_recovery:
            try:
                segment.load_clean()
            except IndexCorruptError as exc:
                log.warning("event=segment_index_rebuild path=%s reason=%s", segment.log_path, exc)
                needs_recovery = True
        cut = 0
        if needs_recovery:
            cut = segment.recover()
            recovered += 1
            if holds_unflushed and not clean_shutdown:
                segment.txn_index.truncate_to(segment.next_offset)
            if cut:
                log.warning(
                    "event=log_truncated path=%s bytes=%d next_offset=%d",
                    segment.log_path,
                    cut,
                    segment.next_offset,
                )
                truncated += cut
        if kept and segment.base_offset < kept[-1].next_offset:
            log.warning("event=overlapping_segment_removed path=%s", segment.log_path)
            segment.mark_deleted()
            segment.destroy()
            continue
        kept.append(segment)
        if cut:
            for later in segments[i + 1 :]:
                log.warning("event=segment_after_truncation_removed path=%s", later.log_path)
                later.mark_deleted()
                later.destroy()
            break
    return LoadedSegments(kept, truncated, recovered)
