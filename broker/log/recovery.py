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

After a clean shutdown the recovery point is trusted, but the active
segment's tail is still walked header by header, so a file cut by hand
between runs is caught too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from shoal.broker.log.config import LogConfig
from shoal.broker.log.index import IndexCorruptError
from shoal.broker.log.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    base_offset_of,
)

log = logging.getLogger(__name__)

_LEFTOVER_SUFFIXES = (DELETED_SUFFIX, ".tmp", ".cleaned", ".swap")


@dataclass(frozen=True, slots=True)
class LoadedSegments:
    segments: list[LogSegment]
    truncated_bytes: int
    recovered_segments: int


def remove_leftovers(directory: Path) -> None:
    for path in directory.iterdir():
        if path.name.endswith(_LEFTOVER_SUFFIXES):
            log.info("event=leftover_removed path=%s", path)
            path.unlink(missing_ok=True)
    logs = {base_offset_of(p) for p in directory.glob("*" + LOG_SUFFIX)}
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
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
