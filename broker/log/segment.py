"""One log segment: ``<base offset>.log`` with its ``.index``, ``.timeindex`` and ``.txnindex``.

The ``.log`` file is the client's record batches back to back, exactly as they
go on the wire, with the broker's offsets in their headers. Reads find a batch
through the sparse offset index and a short scan of batch headers; nothing
reads past a header except recovery, which checks every CRC.
"""

from __future__ import annotations

import mmap
import os
import random
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from shoal.broker.log.config import INT_MAX, LogConfig
from shoal.broker.log.index import IndexCorruptError, OffsetIndex, TimeIndex
from shoal.broker.log.txn_index import TXN_INDEX_SUFFIX, TransactionIndex
from typing_extensions import Buffer

from shoal.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    InvalidBatchError,
    parse_header,
    validate_batch,
)

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
TIME_INDEX_SUFFIX: Final = ".timeindex"
DELETED_SUFFIX: Final = ".deleted"
CLEANED_SUFFIX: Final = ".cleaned"
"""A segment the log cleaner is still writing; recovery discards it."""
SWAP_SUFFIX: Final = ".swap"
"""A cleaned segment ready to replace the ones it was cleaned from; recovery finishes the swap."""
_SCAN_WINDOW: Final = 16 * 1024
_BOUNDS: Final = struct.Struct(">qi11xi")
"""A batch's base offset, batch length and last offset delta (bytes 0-12 and 23-27)."""
_IOV_MAX: Final = 1024


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def base_offset_of(path: Path) -> int:
    return int(path.name.split(".", 1)[0])


@dataclass(frozen=True, slots=True)
class BatchLocation:
    position: int
    header: BatchHeader


class LogSegment:
    """A segment of one partition's log.

    Invariants: ``base_offset`` <= every offset in this segment, and every
    offset here is below the next segment's base offset; the file holds whole
    batches from position 0 to ``size`` in increasing offset order (after a
    crash, recovery restores this before anything reads); ``next_offset`` is
    one past the segment's last offset (``base_offset`` when empty).

    Owned by the event loop thread. Only :meth:`flush` may run in a worker
    thread, concurrently with appends: it fsyncs what was written before it
    started and writes the index entries that existed then. Truncation must
    not overlap a flush (replication will serialise them through the log).
    """

    def __init__(self, directory: Path, base_offset: int, config: LogConfig, now_ms: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        name = segment_name(base_offset)
        self.log_path = directory / (name + LOG_SUFFIX)
        index_path = directory / (name + INDEX_SUFFIX)
        time_index_path = directory / (name + TIME_INDEX_SUFFIX)
        self.index_problem: str | None = None
        """Why the index files cannot be trusted; load_clean refuses the segment then."""
        if not index_path.exists() or not time_index_path.exists():
            self.index_problem = "index files are missing"
        fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.file: BinaryIO = open(fd, "r+b", buffering=0)  # noqa: SIM115 - lives as long as the segment
        self.size = os.fstat(fd).st_size
        try:
            self.offset_index = OffsetIndex.load(
                index_path, base_offset, config.segment_index_bytes
            )
            self.time_index = TimeIndex.load(
                time_index_path, base_offset, config.segment_index_bytes
            )
        except IndexCorruptError as exc:
            # Start from empty files: recover() rebuilds both from the log, and a
            # crash before it finishes leaves them missing, which is rebuilt too.
            self.index_problem = str(exc)
            index_path.unlink(missing_ok=True)
            time_index_path.unlink(missing_ok=True)
            self.offset_index = OffsetIndex(index_path, base_offset, config.segment_index_bytes)
            self.time_index = TimeIndex(time_index_path, base_offset, config.segment_index_bytes)
        self.txn_index = TransactionIndex(directory / (name + TXN_INDEX_SUFFIX))
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.created_ms = now_ms
        jitter = min(config.segment_jitter_ms, config.segment_ms)
        # Kafka draws each segment's jitter at random, so that segments of many
        # partitions created together do not all roll at the same moment.
        self.roll_jitter_ms = random.randrange(jitter) if jitter > 0 else 0  # noqa: S311
        self.first_batch_timestamp: int | None = None
        self._bytes_since_index_entry = 0

    @property
    def fd(self) -> int:
        return self.file.fileno()

    # -- loading -------------------------------------------------------------

    def load_clean(self) -> None:
        """Trust a cleanly closed segment, after checking its indexes and its tail.

        The indexes must point inside the file and the batch headers from the
        last index entry must tile the file exactly; otherwise IndexCorruptError
        asks the loader to :meth:`recover` this segment.
        """
        if self.index_problem is not None:
            raise IndexCorruptError(f"{self.log_path}: {self.index_problem}")
        self.offset_index.check_against(self.size)
        # The time index covers every batch up to the last offset index entry
        # (both get their entries together); the batches after it are scanned.
        entry = self.time_index.last_entry
        if entry is not None:
            self.max_timestamp, self.offset_of_max_timestamp = entry
        last: BatchLocation | None = None
        for location in self.scan(self.offset_index.last_position):
            last = location
            if location.header.max_timestamp > self.max_timestamp:
                self.max_timestamp = location.header.max_timestamp
                self.offset_of_max_timestamp = location.header.last_offset
        end = last.position + last.header.size if last else self.offset_index.last_position
        if end != self.size:
            raise IndexCorruptError(f"{self.log_path}: batches end at {end}, file at {self.size}")
        if last is not None:
            self.next_offset = last.header.next_offset
        self.time_index.check_against(self.next_offset)
        first = next(self.scan(0), None)
        if first is not None:
            self.first_batch_timestamp = first.header.max_timestamp
        self._bytes_since_index_entry = self.size - self.offset_index.last_position

    def recover(self) -> int:
        """Re-validate every batch, rebuild both indexes, cut a torn or corrupt tail.

        Returns how many bytes were cut. A batch is kept when it is whole, its
        CRC matches and its offsets follow the previous batch's; the first
        batch that fails ends the segment.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_timestamp = None
        self._bytes_since_index_entry = 0
        valid_end = 0
        if self.size:
            with mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ) as mapped:
                while valid_end < self.size:
                    try:
                        header = validate_batch(mapped, valid_end)
                    except InvalidBatchError:
                        break
                    if header.base_offset < self.next_offset:
                        break
                    self._track(valid_end, header)
                    valid_end += header.size
        cut = self.size - valid_end
        if cut:
            os.ftruncate(self.fd, valid_end)
            self.size = valid_end
        return cut

    # -- appending -----------------------------------------------------------

    def append(self, buffers: Sequence[Buffer], headers: Sequence[BatchHeader]) -> int:
        """Append whole batches (already given their offsets); returns their position.

        ``buffers`` are written back to back with one ``pwritev``: the log
        patches a batch's header in a 61-byte copy and writes the client's
        bytes after it untouched.
        """
        position = self.size
        total = sum(len(memoryview(b)) for b in buffers)
        try:
            written = os.pwritev(self.fd, buffers, position) if len(buffers) <= _IOV_MAX else 0
            if written < total:
                # A short write, or more buffers than one call takes: finish from one copy.
                joined = memoryview(b"".join(buffers))
                while written < total:
                    written += os.pwrite(self.fd, joined[written:], position + written)
        except OSError:
            os.ftruncate(self.fd, position)
            raise
        batch_position = position
        for header in headers:
            self._track(batch_position, header)
            batch_position += header.size
        self.size = position + total
        return position

    def _track(self, position: int, header: BatchHeader) -> None:
        """Account for a batch at ``position``: offsets, timestamps, index entries."""
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = header.max_timestamp
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset
        if self._bytes_since_index_entry > self.config.index_interval_bytes:
            self.offset_index.append(header.last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += header.size
        self.next_offset = header.next_offset

    def should_roll(self, incoming_bytes: int, incoming_max_timestamp: int, now_ms: int) -> bool:
        """Kafka's roll rule: size, age (by message time), a full index, or offset overflow."""
        if self.size == 0:
            return False
        if self.size > self.config.segment_bytes - incoming_bytes:
            return True
        if self.offset_index.is_full or self.time_index.is_full:
            return True
        if self.next_offset - self.base_offset > INT_MAX - 2**20:
            return True
        if self.first_batch_timestamp is not None and self.first_batch_timestamp >= 0:
            waited = incoming_max_timestamp - self.first_batch_timestamp
        else:
            waited = now_ms - self.created_ms
        return waited > self.config.max_segment_ms - self.roll_jitter_ms

    def on_roll(self) -> None:
        """The segment stops being active: its final time index entry, as Kafka writes it."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)

    # -- reading -------------------------------------------------------------

    def _walk(self, position: int) -> Iterator[tuple[int, bytes, int, int, int]]:
        """Each whole batch from ``position`` to the end, read in windows of the file:
        (position, window, its offset in the window, size, last offset).

        Only the three fields that locate a batch are unpacked: a fetch walks
        every batch from the sparse index's entry to the one it wants (a dozen
        small ones), and a full header per step was a fifth of a small fetch's cost.
        """
        fd = self.fd
        end = self.size
        window = b""
        window_start = position
        while position + HEADER_SIZE <= end:
            offset = position - window_start
            if offset + HEADER_SIZE > len(window):
                window = os.pread(fd, min(_SCAN_WINDOW, end - position), position)
                window_start, offset = position, 0
                if len(window) < HEADER_SIZE:
                    return
            base_offset, batch_length, last_offset_delta = _BOUNDS.unpack_from(window, offset)
            size = batch_length + LOG_OVERHEAD
            if size < HEADER_SIZE or position + size > end:
                return
            yield position, window, offset, size, base_offset + last_offset_delta
            position += size

    def scan(self, position: int = 0) -> Iterator[BatchLocation]:
        """Batch headers from ``position`` to the end."""
        for at, window, offset, _, _ in self._walk(position):
            yield BatchLocation(at, parse_header(window, offset))

    def batch_spans(self, position: int = 0) -> Iterator[tuple[int, int]]:
        """(position, size) of each batch from ``position`` to the end."""
        for at, _, _, size, _ in self._walk(position):
            yield at, size

    def find_batch(self, offset: int) -> BatchLocation | None:
        """The batch holding ``offset``, or the first one after it; None past the end."""
        _, start = self.offset_index.lookup(offset)
        for at, window, window_offset, _, last_offset in self._walk(start):
            if last_offset >= offset:
                return BatchLocation(at, parse_header(window, window_offset))
        return None

    def read_batch(self, location: BatchLocation) -> bytes:
        return os.pread(self.fd, location.header.size, location.position)

    def batches_by_timestamp(self, timestamp: int, from_offset: int) -> Iterator[BatchLocation]:
        """Batches at or after ``from_offset`` whose max timestamp >= ``timestamp``, in order.

        The time index says where to start; the first batch is the candidate,
        later ones matter when the first holds no such record at or after
        ``from_offset`` (a log start inside it).
        """
        start_offset = max(self.time_index.lookup(timestamp), from_offset)
        _, position = self.offset_index.lookup(start_offset)
        for location in self.scan(position):
            header = location.header
            if header.last_offset >= from_offset and header.max_timestamp >= timestamp:
                yield location

    def find_by_timestamp(self, timestamp: int, from_offset: int) -> BatchLocation | None:
        """The first batch at or after ``from_offset`` whose max timestamp >= ``timestamp``."""
        return next(self.batches_by_timestamp(timestamp, from_offset), None)

    # -- lifecycle -----------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Drop batches at and after ``offset`` (a batch boundary); returns bytes dropped."""
        location = self.find_batch(offset)
        if location is None:
            return 0
        dropped = self.size - location.position
        os.ftruncate(self.fd, location.position)
        self.size = location.position
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_timestamp = None
        self._bytes_since_index_entry = self.size - self.offset_index.last_position
        for kept in self.scan(0):
            header = kept.header
            if self.first_batch_timestamp is None:
                self.first_batch_timestamp = header.max_timestamp
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.offset_of_max_timestamp = header.last_offset
            self.next_offset = header.next_offset
        return dropped

    def flush(self) -> None:
        os.fsync(self.fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def close(self) -> None:
        self.offset_index.flush()
        self.time_index.flush()
        self.file.close()

    def mark_deleted(self) -> None:
        """Rename the files to ``*.deleted``; open readers keep working until :meth:`destroy`."""
        deleted = self.log_path.with_name(self.log_path.name + DELETED_SUFFIX)
        os.replace(self.log_path, deleted)
        self.log_path = deleted
        for index in (self.offset_index, self.time_index):
            index.rename(index.path.with_name(index.path.name + DELETED_SUFFIX))
        txn = self.txn_index
        txn.rename(txn.path.with_name(txn.path.name + DELETED_SUFFIX))

    def destroy(self) -> None:
        """Close and remove the files for good."""
        self.file.close()
        self.log_path.unlink(missing_ok=True)
        self.offset_index.delete()
        self.time_index.delete()
        self.txn_index.delete()
