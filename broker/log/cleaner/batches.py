"""Rewriting one record batch for the cleaner: the records it keeps, byte for byte.

A RecordBatch v2 (see :mod:`shoal.records.batch`) is rewritten, as Kafka's
``MemoryRecords.filterTo`` does, only when it must change:

* A batch whose records all stay, and which needs no delete horizon, is
  copied as it is (its CRC still holds).
* A batch that loses records keeps its base offset, its last offset delta
  (so the producer's last sequence survives, as Kafka preserves it), its
  producer id, epoch, base sequence, leader epoch and codec. The kept records
  are copied from ``offsetDelta`` on untouched; only ``timestampDelta``, which
  is relative to the batch's base timestamp, is encoded again. Then the
  payload is compressed with the batch's codec and a new CRC-32C computed.
* A batch with a tombstone it keeps gets a delete horizon (KIP-534): bit 6 of
  the attributes, and ``baseTimestamp`` set to ``now + delete.retention.ms``;
  record timestamps stay right because their deltas are taken from it. A
  later clean after that time drops the tombstones.
* A batch of an aborted transaction keeps no record (``discard``).
* A marker (control batch) stays as it is while its transaction has data
  in the log; then it gets a delete horizon, and goes after it
  (:func:`filter_marker`).
* A batch that keeps no record is dropped, unless the caller asks to retain
  it (the last batch of an active producer, or the last batch of a cleaned
  group); then only its header stays, with zero records, as Kafka's
  ``writeEmptyHeader`` writes it.

Pure functions over bytes: safe in any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from shoal.records import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, InvalidBatchError
from shoal.records.batch import MAGIC, TimestampType, compute_crc
from shoal.records.compression import compress, decompress
from shoal.records.records import read_varint, write_varint

DELETE_HORIZON_BIT: Final = 0x40
_COMPRESSION_MASK: Final = 0x07
_HEADER = struct.Struct(">qiibIhiqqqhii")
_UINT32 = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    """One record of a batch, as far as the cleaner needs to see it."""

    offset: int
    timestamp: int
    """baseTimestamp + timestampDelta: the producer's time even in a LogAppendTime batch."""
    key: bytes | None
    tombstone: bool
    tail: bytes
    """The record's bytes from ``offsetDelta`` to its end, copied as they are."""


def delete_horizon(header: BatchHeader) -> int | None:
    """The batch's delete horizon (ms), if a clean has set one."""
    return header.base_timestamp if header.attributes & DELETE_HORIZON_BIT else None


def scan_records(
    batch: bytes, header: BatchHeader, max_size: int | None = None
) -> list[ScannedRecord]:
    """The records of a whole, validated batch (decompressed as its codec says)."""
    payload = decompress(header.compression, memoryview(batch)[HEADER_SIZE : header.size], max_size)
    records: list[ScannedRecord] = []
    pos = 0
    for _ in range(header.records_count):
        length, pos = read_varint(payload, pos)
        end = pos + length
        if length < 0 or end > len(payload):
            raise InvalidBatchError("record length runs past the batch")
        timestamp_delta, after_timestamp = read_varint(payload, pos + 1)
        offset_delta, field = read_varint(payload, after_timestamp)
        key_length, field = read_varint(payload, field)
        key = None
        if key_length >= 0:
            key = payload[field : field + key_length]
            field += key_length
        value_length, field = read_varint(payload, field)
        if field > end:
            raise InvalidBatchError("record fields run past the record")
        records.append(
            ScannedRecord(
                header.base_offset + offset_delta,
                header.base_timestamp + timestamp_delta,
                key,
                value_length < 0,
                payload[after_timestamp:end],
            )
        )
        pos = end
    if pos != len(payload):
        raise InvalidBatchError(f"{len(payload) - pos} bytes after the batch's last record")
    return records


def _pack(
    header: BatchHeader,
    attributes: int,
    base_timestamp: int,
    max_timestamp: int,
    count: int,
    payload: bytes,
) -> bytes:
    size = HEADER_SIZE + len(payload)
    out = bytearray(size)
    _HEADER.pack_into(
        out,
        0,
        header.base_offset,
        size - LOG_OVERHEAD,
        header.partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        header.last_offset_delta,
        base_timestamp,
        max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    )
    out[HEADER_SIZE:] = payload
    _UINT32.pack_into(out, 17, compute_crc(out, 0, size))
    return bytes(out)


def empty_batch(header: BatchHeader) -> bytes:
    """Only the header of ``header``'s batch: its offsets and producer fields, no record."""
    attributes = header.attributes & ~_COMPRESSION_MASK & ~DELETE_HORIZON_BIT
    return _pack(header, attributes, header.max_timestamp, header.max_timestamp, 0, b"")


def rebuild_batch(header: BatchHeader, kept: list[ScannedRecord], horizon: int | None) -> bytes:
    """A batch of ``kept`` (a non-empty subset of ``header``'s records, in order)."""
    attributes = header.attributes & ~DELETE_HORIZON_BIT
    if horizon is not None:
        attributes |= DELETE_HORIZON_BIT
        base_timestamp = horizon
    else:
        base_timestamp = kept[0].timestamp
    if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
        max_timestamp = header.max_timestamp
    else:
        max_timestamp = max(r.timestamp for r in kept)
    body = bytearray()
    for record in kept:
        inner = bytearray(b"\x00")
        write_varint(inner, record.timestamp - base_timestamp)
        inner += record.tail
        write_varint(body, len(inner))
        body += inner
    payload = compress(header.compression, bytes(body))
    return _pack(header, attributes, base_timestamp, max_timestamp, len(kept), payload)


@dataclass(frozen=True, slots=True)
class FilterResult:
    data: bytes | None
    """The batch to write (the original bytes when nothing changed), or None to drop it."""
    records_read: int
    records_kept: int
    horizon: int | None
    """The delete horizon of the written batch when it keeps a tombstone."""


def filter_marker(
    batch: bytes, header: BatchHeader, may_go: bool, now_ms: int, delete_retention_ms: int
) -> FilterResult:
    """Keep a control batch, stamp it with a delete horizon, or drop it (None) once the
    horizon has passed; ``may_go`` says its transaction has no data left."""
    if not may_go:
        return FilterResult(batch, 0, 0, None)
    horizon = delete_horizon(header)
    if horizon is None:
        horizon = now_ms + delete_retention_ms
        records = scan_records(batch, header)
        return FilterResult(rebuild_batch(header, records, horizon), 0, 0, horizon)
    if now_ms >= horizon:
        return FilterResult(None, 0, 0, None)
    return FilterResult(batch, 0, 0, horizon)


def filter_batch(
    batch: bytes,
    header: BatchHeader,
    offset_map: Mapping[bytes, int],
    map_end: int,
    now_ms: int,
    delete_retention_ms: int,
    retain_empty: bool,
    max_size: int | None = None,
    discard: bool = False,
) -> FilterResult:
    """Keep the records of one batch that compaction keeps (Kafka's ``shouldRetainRecord``).

    A record at or past ``map_end`` is beyond what the offset map covers and
    stays. Otherwise a record stays when its offset is the latest the map
    has for its key (or the key is not in the map: it was last written in
    the clean part), and, for a tombstone, when the batch's delete horizon
    is unset or not yet reached. A record without a key cannot be compacted
    and goes, as in Kafka (compacted topics refuse them on produce). With
    ``discard`` (an aborted transaction's batch) no record stays. Control
    batches stay as they are.
    """
    if header.is_control:
        return FilterResult(batch, 0, 0, None)
    records = scan_records(batch, header, max_size)
    if discard:
        if not retain_empty:
            return FilterResult(None, len(records), 0, None)
        return FilterResult(empty_batch(header) if records else batch, len(records), 0, None)
    horizon = delete_horizon(header)
    tombstones_expire = horizon is not None and now_ms >= horizon
    kept: list[ScannedRecord] = []
    for record in records:
        if record.offset >= map_end:
            kept.append(record)
            continue
        if record.key is None:
            continue
        if record.offset < offset_map.get(record.key, -1):
            continue
        if record.tombstone and tombstones_expire:
            continue
        kept.append(record)
    read = len(records)
    if not kept:
        if not retain_empty:
            return FilterResult(None, read, 0, None)
        return FilterResult(empty_batch(header) if records else batch, read, 0, None)
    keeps_tombstone = any(r.tombstone for r in kept)
    if keeps_tombstone and horizon is None:
        horizon = now_ms + delete_retention_ms
        return FilterResult(rebuild_batch(header, kept, horizon), read, len(kept), horizon)
    kept_horizon = horizon if keeps_tombstone else None
    if len(kept) == read:
        return FilterResult(batch, read, read, kept_horizon)
    return FilterResult(rebuild_batch(header, kept, horizon), read, len(kept), kept_horizon)
