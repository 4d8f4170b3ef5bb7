"""A non-active segment as the cleaner's worker thread reads it.

The event loop owns :class:`~shoal.broker.log.segment.LogSegment`; the cleaner
must not touch one from its thread. So, on the loop, :meth:`SegmentSource.of`
takes what the worker needs: a duplicate of the segment's file descriptor
(it keeps working when retention or truncation closes the segment or renames
its files), its size (fixed: only the active segment grows) and base offset.
The worker reads whole batches through it with ``pread`` and closes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from shoal.broker.log.segment import LogSegment
from shoal.broker.log.txn_index import AbortedTxn

from shoal.records import HEADER_SIZE, BatchHeader, CorruptBatchError, validate_batch
from shoal.records.batch import read_offset_and_length

_CHUNK: Final = 1 << 20


@dataclass(slots=True)
class SegmentSource:
    segment: LogSegment
    """For identity checks on the loop only; the worker reads through ``fd``."""
    fd: int
    base_offset: int
    size: int
    index_bytes: int
    time_index_bytes: int
    aborted: tuple[AbortedTxn, ...] = ()
    """The segment's aborted transaction index entries, for its cleaned replacement."""

    @classmethod
    def of(cls, segment: LogSegment) -> SegmentSource:
        """Call on the event loop."""
        return cls(
            segment,
            os.dup(segment.fd),
            segment.base_offset,
            segment.size,
            len(segment.offset_index) * 8,
            len(segment.time_index) * 12,
            tuple(segment.txn_index.entries),
        )

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def batches(
        self, throttle: Callable[[int], None] | None = None
    ) -> Iterator[tuple[BatchHeader, bytes]]:
        """Every batch, validated (CRC included), read in chunks of about a megabyte."""
        position = 0
        while position < self.size:
            chunk = os.pread(self.fd, min(_CHUNK, self.size - position), position)
            if throttle is not None:
                throttle(len(chunk))
            pos = 0
            while pos + HEADER_SIZE <= len(chunk):
                _, length = read_offset_and_length(chunk, pos)
                end = pos + length + 12
                if end > len(chunk):
                    break
                yield validate_batch(chunk, pos), chunk[pos:end]
                pos = end
            if pos == 0:
                # One batch larger than the chunk: read it whole.
                header_bytes = os.pread(self.fd, HEADER_SIZE, position)
                if len(header_bytes) < HEADER_SIZE:
                    raise CorruptBatchError(
                        f"{self.size - position} bytes at the end of segment {self.base_offset}"
                        " are not a batch"
                    )
                _, length = read_offset_and_length(header_bytes)
                whole = os.pread(self.fd, length + 12, position)
                yield validate_batch(whole), whole
                pos = len(whole)
            position += pos
