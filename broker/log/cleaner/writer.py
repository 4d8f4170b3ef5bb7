"""Writing a cleaned segment: ``<base>.log.cleaned`` with its indexes.

The files carry the ``.cleaned`` suffix until :mod:`.swap` renames them, so
nothing else (the log, a restart) mistakes a half-written one for a segment:
recovery deletes ``.cleaned`` files. Index entries follow the rule
:class:`~shoal.broker.log.segment.LogSegment` uses when appending (one per
``index.interval.bytes``), so the cleaned segment looks as if it had been
appended to. The aborted transaction index is the replaced segments' entries
together (always written, even empty, so that :mod:`.swap` and recovery find
it: see :mod:`shoal.broker.log.recovery`).

Used by one worker thread from creation to :meth:`CleanedSegmentWriter.finish`;
nothing else sees the object.
"""

from __future__ import annotations

import os
from pathlib import Path

from shoal.broker.log.config import LogConfig
from shoal.broker.log.index import OffsetIndex, TimeIndex
from shoal.broker.log.segment import (
    CLEANED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    segment_name,
)
from shoal.broker.log.txn_index import TXN_INDEX_SUFFIX, AbortedTxn, encode

from shoal.records import BatchHeader


def cleaned_paths(directory: Path, base_offset: int) -> tuple[Path, Path, Path]:
    """The ``.cleaned`` log, index and time index of the segment at ``base_offset``."""
    name = segment_name(base_offset)
    return (
        directory / (name + LOG_SUFFIX + CLEANED_SUFFIX),
        directory / (name + INDEX_SUFFIX + CLEANED_SUFFIX),
        directory / (name + TIME_INDEX_SUFFIX + CLEANED_SUFFIX),
    )


def cleaned_txn_index_path(directory: Path, base_offset: int) -> Path:
    return directory / (segment_name(base_offset) + TXN_INDEX_SUFFIX + CLEANED_SUFFIX)


class CleanedSegmentWriter:
    def __init__(self, directory: Path, base_offset: int, config: LogConfig) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.log_path, index_path, time_index_path = cleaned_paths(directory, base_offset)
        self.txn_index_path = cleaned_txn_index_path(directory, base_offset)
        for path in (index_path, time_index_path, self.txn_index_path):
            path.unlink(missing_ok=True)
        self.fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.offset_index = OffsetIndex(index_path, base_offset, config.segment_index_bytes)
        self.time_index = TimeIndex(time_index_path, base_offset, config.segment_index_bytes)
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self._bytes_since_index_entry = 0

    def append(self, header: BatchHeader, data: bytes) -> None:
        """Append one batch (offsets increasing) and index it as an append would."""
        written = 0
        while written < len(data):
            written += os.pwrite(self.fd, data[written:], self.size + written)
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset
        if self._bytes_since_index_entry > self.config.index_interval_bytes:
            self.offset_index.append(header.last_offset, self.size)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += len(data)
        self.size += len(data)
        self.next_offset = header.next_offset

    def finish(self, mtime_ns: int | None, aborted: list[AbortedTxn] | None = None) -> None:
        """The final time index entry (as on roll), fsync everything, keep the old mtime.

        Retention falls back to a segment's mtime when it has no timestamps;
        the cleaned segment keeps the replaced one's, as Kafka's cleaner does.
        """
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        self.offset_index.flush()
        self.time_index.flush()
        with self.txn_index_path.open("wb") as file:
            file.write(encode(aborted or []))
            os.fsync(file.fileno())
        if mtime_ns is not None:
            os.utime(self.log_path, ns=(mtime_ns, mtime_ns))

    def abandon(self) -> None:
        """Close and delete whatever was written."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        paths = (self.log_path, self.offset_index.path, self.time_index.path, self.txn_index_path)
        for path in paths:
            path.unlink(missing_ok=True)
