"""Which part of a log the cleaner may clean, and how dirty the log is.

Kafka's vocabulary (LogCleanerManager)::

    log start ........ first dirty offset ........ first uncleanable offset ... log end
    |   clean part    |        dirty part        |  active segment, recent, above HW |

* The first dirty offset comes from the cleaner checkpoint; an entry below
  the log start or past the log end (retention, truncation) restarts at the
  log start.
* The first uncleanable offset is the lowest of: the last stable offset
  (nothing a follower may still lose is rewritten, nor any transaction
  still open or not yet replicated), the active segment's base offset (the active segment is never
  cleaned), and the base of the first dirty segment holding a record newer
  than ``min.compaction.lag.ms``.
* The dirty ratio is cleanable bytes / (clean bytes + cleanable bytes),
  counted in whole segments.
* ``max.compaction.lag.ms``: when the oldest first-batch timestamp of the
  dirty non-active segments is older than now minus the lag, the log must be
  cleaned whatever its ratio.

Pure functions of a :class:`~shoal.broker.log.log.Log`'s state; call them on
the event loop that owns the log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shoal.broker.log.log import Log
from shoal.broker.log.segment import LogSegment


@dataclass(frozen=True, slots=True)
class LogToClean:
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    max_compaction_delay_ms: int
    """How far past max.compaction.lag.ms the oldest dirty record is; 0 if it is not."""

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def needs_compaction_now(self) -> bool:
        return self.max_compaction_delay_ms > 0


def _largest_timestamp(segment: LogSegment) -> int:
    if segment.max_timestamp >= 0:
        return segment.max_timestamp
    return int(os.stat(segment.log_path).st_mtime * 1000)


def _overlapping(log: Log, start: int, end: int) -> list[LogSegment]:
    """The segments holding offsets in [start, end); none for an empty range, as in Kafka."""
    if start >= end:
        return []
    segments = log.segments
    found = []
    for i, segment in enumerate(segments):
        upper = segments[i + 1].base_offset if i + 1 < len(segments) else None
        if segment.base_offset >= end:
            break
        if upper is None or upper > start:
            found.append(segment)
    return found


def first_dirty_offset(log: Log, checkpointed: int | None) -> int:
    if checkpointed is None or not log.log_start_offset <= checkpointed <= log.log_end_offset:
        return log.log_start_offset
    return checkpointed


def log_to_clean(log: Log, checkpointed: int | None, now_ms: int) -> LogToClean:
    config = log.config
    dirty = first_dirty_offset(log, checkpointed)
    non_active_dirty = _overlapping(log, dirty, log.active.base_offset)
    uncleanable = min(log.last_stable_offset, log.active.base_offset)
    if config.min_compaction_lag_ms > 0:
        for segment in non_active_dirty:
            if _largest_timestamp(segment) > now_ms - config.min_compaction_lag_ms:
                uncleanable = min(uncleanable, segment.base_offset)
                break
    uncleanable = max(uncleanable, dirty)
    clean_bytes = sum(s.size for s in _overlapping(log, log.log_start_offset, dirty))
    cleanable_bytes = sum(s.size for s in _overlapping(log, dirty, uncleanable))
    first_timestamps = [
        s.first_batch_timestamp
        for s in non_active_dirty
        if s.first_batch_timestamp is not None and s.first_batch_timestamp > 0
    ]
    delay = 0
    if first_timestamps:
        clean_until = now_ms - max(config.max_compaction_lag_ms, 0)
        delay = max(0, clean_until - min(first_timestamps))
    return LogToClean(dirty, uncleanable, clean_bytes, cleanable_bytes, delay)


def is_cleanable(target: LogToClean, min_cleanable_ratio: float) -> bool:
    """Kafka's grabFilthiestCompactedLog filter: overdue and not empty, or dirty enough."""
    if target.needs_compaction_now and target.cleanable_bytes > 0:
        return True
    return target.cleanable_bytes > 0 and target.cleanable_ratio > min_cleanable_ratio
