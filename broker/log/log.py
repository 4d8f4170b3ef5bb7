"""One partition's log: its segments, offsets, appends, reads and retention.

The log is a library: no sockets, no event loop, an injected clock. It
validates what it is given per batch (framing, CRC-32C, size, timestamps),
assigns offsets by patching each batch's header, and appends the client's
bytes otherwise untouched. The exception is a topic whose compression.type
names a codec: a batch with another codec is rebuilt with it
(:mod:`shoal.records.recompress`), as Kafka's leader does. Reads return file
regions for the socket to send.

Offsets, Kafka's vocabulary::

    log start offset   first offset still in the log (moves with retention)
    recovery point     everything below is fsynced; recovery starts here
    high watermark     consumers see offsets below it (the partition sets it)
    log end offset     the next offset to assign

Owned by the event loop thread. :meth:`flush` hands fsyncs to a worker
thread and touches shared state only before and after. The log cleaner
(:mod:`shoal.broker.log.cleaner`) reads non-active segments from its own
threads through duplicated file descriptors and changes the segment list
only on the loop, through :meth:`replace_segments`.

Transactions (KIP-98): the producer state tracks open transactions; the
coordinator closes them with :meth:`Log.append_marker`; an abort is noted in
the aborted transaction index of the segment that gets its marker
(:mod:`shoal.broker.log.txn_index`), which :meth:`Log.collect_aborted_txns`
searches for read_committed fetches. Two more offsets then::

    first unstable offset  first offset of the oldest open transaction, or of
                           a closed one whose marker is not yet replicated
    last stable offset     min(first unstable offset, high watermark): what
                           read_committed consumers may read

Offsets have gaps once a compacted log is cleaned: a batch keeps its offsets
but may lose records, and batches may go. Every lookup by offset therefore
means "the batch holding it, or the first one after it".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from crc32c import crc32c
from shoal.broker.log.checkpoint import fsync_files
from shoal.broker.log.config import LogConfig
from shoal.broker.log.epochs import LeaderEpochCache
from shoal.broker.log.markers import build_marker, read_marker
from shoal.broker.log.producer_state import BatchMetadata, CompletedTxn, ProducerStateManager
from shoal.broker.log.recovery import load_segments
from shoal.broker.log.segment import BatchLocation, LogSegment
from shoal.broker.log.txn_index import AbortedTxn
from typing_extensions import Buffer

from shoal.records import (
    HEADER_SIZE,
    BatchHeader,
    Compression,
    CompressionError,
    DecompressedTooLargeError,
    InvalidBatchError,
    RecompressTarget,
    TimestampType,
    iter_batches,
    iter_records,
    parse_header,
    recompress_batch,
)
from shoal.records.batch import CRC_START, NO_TIMESTAMP

log = logging.getLogger(__name__)

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")
_LOG_APPEND_TIME_BIT = 0x08
REPLAY_CHUNK_BYTES = 16 * 1024 * 1024
"""How much :meth:`Log.replay` reads at a time."""
RECOMPRESS_MAX_BYTES = 256 * 1024 * 1024
"""The most a batch may decompress to when the leader recompresses it: Kafka
has no such bound, but a few compressed bytes can stand for gigabytes."""


class LogError(Exception):
    """Base of the errors a log reports to its callers (each maps to a Kafka error code)."""


class OffsetOutOfRangeError(LogError):
    pass


class RecordTooLargeError(LogError):
    pass


class InvalidTimestampError(LogError):
    pass


class InvalidRecordError(LogError):
    pass


class CorruptRecordError(LogError):
    pass


class KafkaStorageError(LogError):
    """The log's directory failed a write (a full disk, an I/O error): it takes no more."""


StorageFailureListener = Callable[[OSError, Path], None]
"""Told of the first write that failed in a log's directory, and which log it was."""


@dataclass(frozen=True, slots=True)
class AppendInfo:
    first_offset: int
    last_offset: int
    log_append_time: int
    """The timestamp stamped on LogAppendTime topics, -1 otherwise."""
    record_count: int
    max_timestamp: int
    duplicate: bool = False
    """An idempotent producer's retry: nothing appended, these are the original offsets."""


@dataclass(frozen=True, slots=True)
class FileSlice:
    """Whole batches of one segment, to send as they are."""

    file: BinaryIO
    position: int
    size: int
    upper_offset: int = -1
    """No record here is at or past this offset (the read's limit, or its segment's end)."""


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    timestamp: int
    offset: int
    leader_epoch: int


class Log:
    """A partition's segments, in base offset order, the last one active."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        recovery_point: int,
        clean_shutdown: bool,
        clock: Callable[[], int],
        log_start_offset: int = 0,
        high_watermark: int = 0,
        on_storage_failure: StorageFailureListener | None = None,
    ) -> None:
        self.directory = directory
        self.config = config
        self.clock = clock
        self._on_storage_failure = on_storage_failure
        self.offline = False
        """A write failed: the segment may hold a torn batch the log does not know of,
        so nothing more is written until a restart's recovery has cut it."""
        directory.mkdir(parents=True, exist_ok=True)
        loaded = load_segments(directory, config, recovery_point, clean_shutdown, clock())
        self.segments: list[LogSegment] = loaded.segments
        if self.segments and self.segments[-1].next_offset < log_start_offset:
            # Recovery cut below the checkpointed log start (its segments had
            # been deleted): nothing here is readable, so start empty there.
            log.warning(
                "event=log_behind_log_start dir=%s log_end_offset=%d log_start_offset=%d",
                directory.name,
                self.segments[-1].next_offset,
                log_start_offset,
            )
            for segment in self.segments:
                segment.mark_deleted()
                segment.destroy()
            self.segments = []
        if not self.segments:
            self.segments = [LogSegment(directory, log_start_offset, config, clock())]
        self._bases = [s.base_offset for s in self.segments]
        self.log_start_offset = max(log_start_offset, self.segments[0].base_offset)
        self.recovery_point = min(recovery_point, self.log_end_offset)
        self.producer_state = ProducerStateManager(directory)
        self._high_watermark = min(max(high_watermark, self.log_start_offset), self.log_end_offset)
        self.epochs = LeaderEpochCache(directory)
        self.epochs.truncate_from_end(self.log_end_offset)
        # After a crash, replay from the recovery point at least: the aborted
        # transaction indexes may have lost entries past it that the log kept.
        self._rebuild_producer_state(None if clean_shutdown else self.recovery_point)
        self.unflushed_messages = 0
        self.last_flush_ms = clock()
        self._flush_lock = asyncio.Lock()
        self.closed = False
        self.truncation_listeners: list[Callable[[int], None]] = []
        """Told the new log end after a truncation (the cleaner's checkpoint must not exceed it)."""

    @contextlib.contextmanager
    def _storage(self) -> Iterator[None]:
        """Around a write: refused once the log is offline, which any OSError makes it."""
        if self.offline:
            raise KafkaStorageError(f"the log directory of {self.directory.name} is offline")
        try:
            yield
        except OSError as exc:
            self.offline = True
            if self._on_storage_failure is not None:
                self._on_storage_failure(exc, self.directory)
            raise KafkaStorageError(
                f"writing {self.directory.name} failed: {exc.strerror or exc}"
            ) from exc

    def _rebuild_producer_state(self, replay_from: int | None = None) -> None:
        """Newest snapshot at or below the log end (and ``replay_from``), then the batches
        after it: data batch headers, and markers, which re-add the aborts they find to
        their segment's index."""
        loaded = self.producer_state.load(self.log_end_offset, replay_from)
        start = max(loaded, self.log_start_offset)
        for segment in self.segments:
            if segment.next_offset <= start:
                continue
            _, position = segment.offset_index.lookup(start)
            for location in segment.scan(position):
                header = location.header
                if header.base_offset < start or header.producer_id < 0:
                    continue
                if header.is_control:
                    self._replay_marker(segment, segment.read_batch(location), header)
                else:
                    self.producer_state.update(header)
        self.producer_state.on_high_watermark(self.high_watermark)

    def _replay_marker(self, segment: LogSegment, batch: Buffer, header: BatchHeader) -> None:
        marker = read_marker(memoryview(batch))
        if marker is not None:
            txn = self.producer_state.complete_txn(header, marker.commit, marker.coordinator_epoch)
            self._index_if_aborted(segment, txn)

    def _index_if_aborted(self, segment: LogSegment, txn: CompletedTxn) -> None:
        if txn.aborted:
            lso = self.producer_state.last_stable_offset_after(txn)
            segment.txn_index.append(
                AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, lso)
            )

    def update_config(self, config: LogConfig) -> None:
        """A topic config change: takes effect for the next append, read and retention check."""
        self.config = config
        for segment in self.segments:
            segment.config = config

    # -- offsets ---------------------------------------------------------------

    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, value: int) -> None:
        self._high_watermark = value
        self.producer_state.on_high_watermark(value)

    @property
    def first_unstable_offset(self) -> int | None:
        first = self.producer_state.first_unstable_offset
        # DeleteRecords may have moved the start past an open transaction's beginning.
        return None if first is None else max(first, self.log_start_offset)

    @property
    def last_stable_offset(self) -> int:
        """What read_committed consumers may read: below every unresolved transaction."""
        first = self.first_unstable_offset
        return self.high_watermark if first is None else min(first, self.high_watermark)

    def _segment_index(self, offset: int) -> int:
        return max(0, bisect_right(self._bases, offset) - 1)

    # -- appending -------------------------------------------------------------

    def append_as_leader(self, records: bytes, leader_epoch: int) -> AppendInfo:
        """Validate the batches in ``records``, give them offsets, and append them.

        Raises CorruptRecordError (bad framing or CRC), InvalidRecordError
        (not a batch a client may send, or records that do not decode when
        compression.type asks for recompression), RecordTooLargeError or
        InvalidTimestampError; nothing is appended when any batch fails.
        """
        now = self.clock()
        try:
            batches = list(iter_batches(records))
        except InvalidBatchError as exc:
            if type(exc) is InvalidBatchError:
                raise InvalidRecordError(str(exc)) from exc
            raise CorruptRecordError(str(exc)) from exc
        if not batches:
            raise InvalidRecordError("no record batch in the request")
        for _, header in batches:
            self._check_batch(header, now)
        if self.config.compacts:
            self._check_keys(records, batches)
        duplicate = self._check_producers([h for _, h in batches])
        if duplicate is not None:
            return AppendInfo(
                duplicate.first_offset,
                duplicate.last_offset,
                NO_TIMESTAMP,
                duplicate.last_offset - duplicate.first_offset + 1,
                duplicate.timestamp,
                duplicate=True,
            )
        view = memoryview(records)
        buffers: list[Buffer] = []
        headers: list[BatchHeader] = []
        offset = self.log_end_offset
        log_append_time = now if self.config.log_append_time else NO_TIMESTAMP
        for position, header in batches:
            batch = view[position : position + header.size]
            rebuilt = self.in_topic_codec(batch, header, offset, leader_epoch, log_append_time)
            if rebuilt is not None:
                buffers.append(rebuilt)
                headers.append(parse_header(rebuilt))
                offset += header.last_offset_delta + 1
                continue
            patched = bytearray(view[position : position + HEADER_SIZE])
            _INT64.pack_into(patched, 0, offset)
            _INT32.pack_into(patched, 12, leader_epoch)
            body = view[position + HEADER_SIZE : position + header.size]
            if log_append_time != NO_TIMESTAMP:
                _INT16.pack_into(patched, 21, header.attributes | _LOG_APPEND_TIME_BIT)
                _INT64.pack_into(patched, 35, log_append_time)
                crc = crc32c(body, crc32c(memoryview(patched)[CRC_START:]))
                _UINT32.pack_into(patched, 17, crc)
            buffers += (patched, body)
            headers.append(parse_header(patched))
            offset += header.last_offset_delta + 1
        first_offset = self.log_end_offset
        total = sum(h.size for h in headers)
        max_timestamp = max(h.max_timestamp for h in headers)
        with self._storage():
            if self.active.should_roll(total, max_timestamp, now):
                self.roll()
            self.active.append(buffers, headers)
        for appended in headers:
            self.producer_state.update(appended)
        self.epochs.assign(leader_epoch, first_offset)
        count = offset - first_offset
        self.unflushed_messages += count
        return AppendInfo(first_offset, offset - 1, log_append_time, count, max_timestamp)

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        leader_epoch: int,
    ) -> AppendInfo:
        """Write the marker that commits or aborts ``producer_id``'s transaction.

        Raises InvalidProducerEpochError or TransactionCoordinatorFencedError
        (a zombie producer's epoch, or a coordinator that lost its partition)
        and appends nothing then. A producer with no open transaction here
        gets its marker anyway, as from Kafka: the coordinator retries.
        """
        self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
        now = self.clock()
        offset = self.log_end_offset
        batch = build_marker(
            producer_id, producer_epoch, commit, coordinator_epoch, now, offset, leader_epoch
        )
        header = parse_header(batch)
        with self._storage():
            if self.active.should_roll(header.size, header.max_timestamp, now):
                self.roll()
            self.active.append([batch], [header])
        txn = self.producer_state.complete_txn(header, commit, coordinator_epoch)
        self._index_if_aborted(self.active, txn)
        self.epochs.assign(leader_epoch, offset)
        self.unflushed_messages += 1
        log.debug(
            "event=txn_marker_appended dir=%s producer_id=%d commit=%s offset=%d",
            self.directory.name,
            producer_id,
            commit,
            offset,
        )
        return AppendInfo(offset, offset, NO_TIMESTAMP, 1, header.max_timestamp)

    def in_topic_codec(
        self,
        batch: Buffer,
        header: BatchHeader,
        base_offset: int = 0,
        leader_epoch: int = -1,
        log_append_time: int = NO_TIMESTAMP,
    ) -> bytes | None:
        """``batch`` rebuilt in the topic's compression.type; None when it needs no rebuild.

        Raises RecordTooLargeError or InvalidRecordError as Kafka would when
        it cannot be rebuilt. Reads only the config, so a worker thread may
        call it: the produce handler does, to keep the codecs off the event
        loop, and the append finds the batch in the topic's codec.
        """
        config = self.config
        codec = config.compression
        if codec is None or header.compression is codec:
            return None
        target = RecompressTarget(
            codec, config.compression_level, base_offset, leader_epoch, log_append_time
        )
        # Rebuilt uncompressed, anything past max.message.bytes is refused anyway.
        bound = config.max_message_bytes if codec is Compression.NONE else RECOMPRESS_MAX_BYTES
        try:
            rebuilt = recompress_batch(batch, header, target, bound)
        except DecompressedTooLargeError as exc:
            raise RecordTooLargeError(
                f"batch decompresses to over {bound} bytes, more than the leader recompresses"
            ) from exc
        except (CompressionError, InvalidBatchError) as exc:
            raise InvalidRecordError(f"batch cannot be recompressed: {exc}") from exc
        if len(rebuilt) > config.max_message_bytes:
            raise RecordTooLargeError(
                f"batch of {len(rebuilt)} bytes recompressed as {config.compression_type}"
                f" exceeds max.message.bytes ({config.max_message_bytes})"
            )
        return rebuilt

    def append_as_follower(self, records: Buffer) -> int:
        """Append batches copied from the leader, offsets and epochs as the leader gave them.

        Only integrity is checked (framing, CRC-32C, offsets increasing past
        the log end; a cleaned leader's batches have gaps between them): the
        leader validated the contents. The leader epoch cache and
        producer state follow the batches, so this replica can take over as
        leader and still recognise a producer's retries. Returns the new log
        end offset; raises CorruptRecordError and appends nothing if any
        batch is damaged or out of place.
        """
        try:
            batches = list(iter_batches(records))
        except InvalidBatchError as exc:
            raise CorruptRecordError(f"replicated batch: {exc}") from exc
        if not batches:
            return self.log_end_offset
        expected = self.log_end_offset
        for _, header in batches:
            if header.base_offset < expected:
                raise CorruptRecordError(
                    f"replicated batch starts at {header.base_offset}, log ends at {expected}"
                )
            expected = header.next_offset
        view = memoryview(records)
        headers = [h for _, h in batches]
        end = batches[-1][0] + headers[-1].size
        max_timestamp = max(h.max_timestamp for h in headers)
        first_offset = self.log_end_offset
        with self._storage():
            if self.active.should_roll(end, max_timestamp, self.clock()):
                self.roll()
            segment = self.active
            segment.append([view[:end]], headers)
        for position, header in batches:
            if header.is_control:
                if header.producer_id >= 0:
                    self._replay_marker(segment, view[position : position + header.size], header)
            else:
                self.producer_state.update(header)
            self.epochs.assign(header.partition_leader_epoch, header.base_offset)
        self.unflushed_messages += self.log_end_offset - first_offset
        return self.log_end_offset

    def _check_producers(self, headers: list[BatchHeader]) -> BatchMetadata | None:
        """Idempotence: the stored batch a lone retry duplicates; raises for gaps and old epochs."""
        if any(h.is_transactional and h.producer_id < 0 for h in headers):
            raise InvalidRecordError("a transactional batch needs a producer id")
        idempotent = [h for h in headers if h.producer_id >= 0]
        if not idempotent:
            return None
        duplicates = self.producer_state.check_append(idempotent)
        found = [d for d in duplicates if d is not None]
        if found and len(headers) > 1:
            raise InvalidRecordError("a retried idempotent batch must come alone")
        return found[0] if found else None

    def _check_keys(self, records: bytes, batches: list[tuple[int, BatchHeader]]) -> None:
        """Kafka's LogValidator rule for compacted topics: every record needs a key."""
        view = memoryview(records)
        for position, header in batches:
            try:
                keys = [r.key for r in iter_records(view[position : position + header.size])]
            except InvalidBatchError as exc:
                raise CorruptRecordError(str(exc)) from exc
            if any(key is None for key in keys):
                raise InvalidRecordError(
                    "Compacted topic cannot accept message without key in topic partition"
                    f" {self.directory.name}."
                )

    def _check_batch(self, header: BatchHeader, now: int) -> None:
        if header.size > self.config.max_message_bytes:
            raise RecordTooLargeError(
                f"batch of {header.size} bytes exceeds max.message.bytes"
                f" ({self.config.max_message_bytes})"
            )
        if header.is_control:
            raise InvalidRecordError("clients may not append control batches")
        if header.records_count != header.last_offset_delta + 1 or header.records_count <= 0:
            raise InvalidRecordError(
                f"batch claims {header.records_count} records but offsets for"
                f" {header.last_offset_delta + 1}"
            )
        if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
            raise InvalidTimestampError("producers may not set the LogAppendTime timestamp type")
        if self.config.log_append_time:
            return
        # Per batch, not per record: the newest timestamp against the future
        # limit, the first record's against the past limit; -1 means "none".
        config = self.config
        if header.max_timestamp != NO_TIMESTAMP and (
            header.max_timestamp - now > config.message_timestamp_after_max_ms
        ):
            raise InvalidTimestampError(
                f"timestamp {header.max_timestamp} is more than"
                f" message.timestamp.after.max.ms={config.message_timestamp_after_max_ms}"
                " ahead of the broker's clock"
            )
        if header.base_timestamp != NO_TIMESTAMP and (
            now - header.base_timestamp > config.message_timestamp_before_max_ms
        ):
            raise InvalidTimestampError(
                f"timestamp {header.base_timestamp} is more than"
                f" message.timestamp.before.max.ms={config.message_timestamp_before_max_ms}"
                " behind the broker's clock"
            )

    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset."""
        base = self.log_end_offset
        if self.active.size == 0 and self.active.base_offset == base:
            return self.active
        self.active.on_roll()
        # Not fsynced here, on the event loop: an fsync waits for the file system's
        # journal, which beside heavy writes takes hundreds of milliseconds. The flush
        # of the rolled segment (flush_target) fsyncs it.
        self.producer_state.write_snapshot(base, sync=False)
        segment = LogSegment(self.directory, base, self.config, self.clock())
        self.segments.append(segment)
        self._bases.append(base)
        log.info("event=segment_rolled dir=%s base_offset=%d", self.directory.name, base)
        return segment

    # -- reading ---------------------------------------------------------------

    def check_offset(self, offset: int) -> None:
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside {self.log_start_offset}-{self.log_end_offset}"
            )

    def read(self, offset: int, max_bytes: int, max_offset: int, min_one: bool) -> FileSlice | None:
        """Whole batches from the one holding ``offset``, below ``max_offset``.

        At most ``max_bytes``, except that with ``min_one`` the first batch is
        returned whole even when it is larger (KIP-74), so a consumer always
        makes progress. Reads stay within one segment, as Kafka's do.
        """
        self.check_offset(offset)
        if offset >= max_offset:
            return None
        for i in range(self._segment_index(offset), len(self.segments)):
            segment = self.segments[i]
            if segment.base_offset >= max_offset:
                return None
            location = segment.find_batch(offset)
            if location is None:
                continue
            if location.header.last_offset >= max_offset:
                return None
            end = self._read_end(segment, location, max_bytes, max_offset)
            if end == location.position:
                if not min_one:
                    return None
                end = location.position + location.header.size
            upper = min(max_offset, segment.next_offset)
            return FileSlice(segment.file, location.position, end - location.position, upper)
        return None

    def replay(self, start: int, end: int) -> Iterator[tuple[bytes, BatchHeader]]:
        """Each whole batch from the one holding ``start`` up to ``end``, with its header,
        read from the files a chunk at a time.

        For the coordinators, which read their partition of an internal topic back
        when they take it over. The first batch may hold records below ``start``.
        """
        position = start
        while position < end:
            chunk = self.read(position, REPLAY_CHUNK_BYTES, end, min_one=True)
            if chunk is None:
                return
            data = os.pread(chunk.file.fileno(), chunk.size, chunk.position)
            before = position
            for at, header in iter_batches(data):
                yield data[at : at + header.size], header
                position = header.next_offset
            if position == before:
                return

    def collect_aborted_txns(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions with data in [start, end), oldest marker first.

        Their markers are at or after ``start``, so the search begins in the
        segment holding it; it ends at an entry written when every
        transaction beginning below ``end`` was resolved.
        """
        found: list[AbortedTxn] = []
        for segment in self.segments[self._segment_index(start) :]:
            entries, complete = segment.txn_index.collect(start, end)
            found += entries
            if complete:
                break
        return found

    def _read_end(
        self, segment: LogSegment, first: BatchLocation, max_bytes: int, max_offset: int
    ) -> int:
        """End position of the last whole batch to send, given both limits."""
        limit = min(first.position + max(max_bytes, 0), segment.size)
        if max_offset < segment.next_offset:
            boundary = segment.find_batch(max_offset)
            if boundary is not None:
                limit = min(limit, boundary.position)
        if limit in (segment.size, first.position):
            return limit
        start = max(first.position, segment.offset_index.floor_position(limit))
        end = start
        for position, size in segment.batch_spans(start):
            if position + size > limit:
                break
            end = position + size
        return end

    # -- offsets by time -------------------------------------------------------

    def offset_for_timestamp(self, timestamp: int) -> TimestampOffset | None:
        """The first record with a timestamp >= ``timestamp``; None if there is none."""
        for segment in self.segments:
            if segment.max_timestamp < timestamp:
                continue
            for location in segment.batches_by_timestamp(timestamp, self.log_start_offset):
                found = self._record_at_or_after(segment, location, timestamp)
                if found is not None:
                    return found
        return None

    def offset_of_max_timestamp(self) -> TimestampOffset | None:
        """The record with the largest timestamp (ListOffsets MAX_TIMESTAMP, KIP-734)."""
        best = max(self.segments, key=lambda s: s.max_timestamp)
        if best.max_timestamp < 0:
            return None
        for location in best.batches_by_timestamp(best.max_timestamp, self.log_start_offset):
            found = self._record_at_or_after(best, location, best.max_timestamp)
            if found is not None:
                return found
        return None

    def _record_at_or_after(
        self, segment: LogSegment, location: BatchLocation, timestamp: int
    ) -> TimestampOffset | None:
        header = location.header
        epoch = header.partition_leader_epoch
        for record in iter_records(segment.read_batch(location)):
            if record.offset >= self.log_start_offset and record.timestamp >= timestamp:
                return TimestampOffset(record.timestamp, record.offset, epoch)
        return None

    # -- retention -------------------------------------------------------------

    def retention_deletable(self, high_watermark: int) -> list[LogSegment]:
        """Segments that retention.ms or retention.bytes allow deleting, oldest first.

        Only segments wholly below the high watermark qualify, and never an
        empty active segment, as in Kafka.
        """
        if not self.config.deletes:
            return []
        now = self.clock()
        config = self.config
        deletable: list[LogSegment] = []
        excess = self.size - config.retention_bytes if config.retention_bytes >= 0 else -1
        for i, segment in enumerate(self.segments):
            upper = self.segments[i + 1].base_offset if i + 1 < len(self.segments) else None
            if upper is None and segment.size == 0:
                break
            if (upper if upper is not None else self.log_end_offset) > high_watermark:
                break
            too_old = config.retention_ms >= 0 and now - self._largest_timestamp(segment) > (
                config.retention_ms
            )
            too_big = excess >= 0 and excess - segment.size >= 0
            if not (too_old or too_big):
                break
            # Whichever limit deletes it, the segment stops counting against
            # retention.bytes (Kafka checks size on what time retention left).
            excess -= segment.size
            deletable.append(segment)
        return deletable

    def _largest_timestamp(self, segment: LogSegment) -> int:
        if segment.max_timestamp >= 0:
            return segment.max_timestamp
        return int(os.stat(segment.log_path).st_mtime * 1000)

    def increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up to ``offset``; True if it moved.

        DeleteRecords on a leader, and a follower following its leader's start.
        Readers lose everything below at once; the segments left wholly below
        (:meth:`segments_below_log_start`) are the caller's to delete. Beyond
        the high watermark is OffsetOutOfRangeError, as in Kafka: only
        committed records may be deleted. A lower offset changes nothing.
        """
        if offset > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"cannot move the log start offset to {offset},"
                f" past the high watermark {self.high_watermark}"
            )
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        self.epochs.truncate_from_start(offset)
        log.info(
            "event=log_start_offset_moved dir=%s log_start_offset=%d", self.directory.name, offset
        )
        return True

    def segments_below_log_start(self) -> list[LogSegment]:
        """Segments holding only offsets below the log start offset, oldest first.

        The active segment too once everything in it is below (DeleteRecords
        to the log end), so that the space is given back without waiting for
        a roll; never an empty active segment.
        """
        doomed: list[LogSegment] = []
        for i, segment in enumerate(self.segments):
            last = i + 1 == len(self.segments)
            upper = self.log_end_offset if last else self.segments[i + 1].base_offset
            if upper > self.log_start_offset or (last and segment.size == 0):
                break
            doomed.append(segment)
        return doomed

    def delete_segments(self, doomed: list[LogSegment]) -> list[LogSegment]:
        """Take ``doomed`` (oldest segments) out of the log and rename their files.

        Returns them for the caller to :meth:`LogSegment.destroy` after
        ``file.delete.delay.ms``, so that fetches already queued can still send
        from their open files.
        """
        if not doomed:
            return []
        if doomed[-1] is self.active:
            self.roll()
        for segment in doomed:
            self.segments.remove(segment)
            segment.mark_deleted()
        self._bases = [s.base_offset for s in self.segments]
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        self.recovery_point = max(self.recovery_point, self.log_start_offset)
        self.high_watermark = max(self.high_watermark, self.log_start_offset)
        self.epochs.truncate_from_start(self.log_start_offset)
        log.info(
            "event=segments_deleted dir=%s count=%d log_start_offset=%d",
            self.directory.name,
            len(doomed),
            self.log_start_offset,
        )
        return doomed

    # -- cleaning --------------------------------------------------------------

    def holds_segments(self, old: list[LogSegment], sizes: list[int]) -> bool:
        """``old`` are still adjacent non-active segments of this log, at ``sizes`` bytes."""
        if not old or any(s is self.active for s in old):
            return False
        for i, segment in enumerate(self.segments):
            if segment is old[0]:
                current = self.segments[i : i + len(old)]
                return len(current) == len(old) and all(
                    a is b and a.size == size
                    for a, b, size in zip(current, old, sizes, strict=True)
                )
        return False

    def replace_segments(self, old: list[LogSegment], new: LogSegment) -> None:
        """Put ``new`` (a cleaned segment, its files already in place) where ``old`` were.

        In memory only: the cleaner has renamed the files (see
        :mod:`shoal.broker.log.cleaner.swap`) and destroys ``old`` later.
        Offsets do not move, so nothing else in the log changes.
        """
        start = next(i for i, s in enumerate(self.segments) if s is old[0])
        self.segments[start : start + len(old)] = [new]
        self._bases = [s.base_offset for s in self.segments]

    # -- truncation (replication) ---------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove everything at and after ``offset`` (a batch boundary)."""
        if offset >= self.log_end_offset:
            return
        while len(self.segments) > 1 and self.active.base_offset >= offset:
            segment = self.segments.pop()
            segment.mark_deleted()
            segment.destroy()
        self.active.truncate_to(offset)
        self._bases = [s.base_offset for s in self.segments]
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.producer_state.truncate_snapshots_after(self.log_end_offset)
        self._rebuild_producer_state()
        self.epochs.truncate_from_end(self.log_end_offset)
        for listener in self.truncation_listeners:
            listener(self.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop everything and continue at ``offset``: a follower whose log the
        leader's retention has overtaken (its fetch was out of range)."""
        for segment in self.segments:
            segment.mark_deleted()
            segment.destroy()
        self.segments = [LogSegment(self.directory, offset, self.config, self.clock())]
        self._bases = [offset]
        self.log_start_offset = offset
        self.recovery_point = offset
        self.high_watermark = offset
        self.producer_state.clear()
        self.producer_state.truncate_snapshots_after(-1)
        self.epochs.truncate_from_end(0)
        for listener in self.truncation_listeners:
            listener(offset)

    # -- durability ------------------------------------------------------------

    def flush_target(self) -> int | None:
        """Where a scheduled flush should reach now, or None if nothing is due.

        The whole log when ``flush.messages`` or ``flush.ms`` says so; otherwise
        the segments rolled since the last flush, as Kafka flushes on roll.
        """
        config = self.config
        if self.unflushed_messages and (
            self.unflushed_messages >= config.flush_messages
            or self.clock() - self.last_flush_ms >= config.flush_ms
        ):
            return self.log_end_offset
        if self.recovery_point < self.active.base_offset:
            return self.active.base_offset
        return None

    async def flush(self, up_to: int | None = None) -> None:
        """fsync every segment holding offsets in [recovery point, ``up_to``).

        Without ``up_to``, up to the log end. The recovery point then moves to
        ``up_to``: a crash recovers from there.
        """
        async with self._flush_lock:
            target = self.log_end_offset if up_to is None else up_to
            if target <= self.recovery_point:
                return
            first = self._segment_index(self.recovery_point)
            last = self._segment_index(max(target - 1, 0))
            segments = self.segments[first : last + 1]
            pending = self.unflushed_messages
            snapshots = self.producer_state.unsynced_snapshots(target)
            await asyncio.to_thread(_flush_all, segments, snapshots)
            self.recovery_point = max(self.recovery_point, target)
            if target >= self.log_end_offset:
                self.unflushed_messages = max(0, self.unflushed_messages - pending)
            self.last_flush_ms = self.clock()

    @property
    def flushing(self) -> bool:
        """A flush is under way: its thread may be writing any of the segments it took."""
        return self._flush_lock.locked()

    def close(self) -> None:
        self.closed = True
        if not self.offline:  # an offline log is recovered on restart, without a snapshot
            self.producer_state.write_snapshot(self.log_end_offset)
        for segment in self.segments:
            segment.close()


def _flush_all(segments: list[LogSegment], snapshots: list[Path]) -> None:
    for segment in segments:
        segment.flush()
    fsync_files(snapshots)
