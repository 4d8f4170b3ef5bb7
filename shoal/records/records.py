"""Records inside a v2 batch: decode them, and build batches of our own.

Each record, after the batch header (and after decompression when the batch
names a codec), is::

    length          varint   bytes after this field
    attributes      int8     unused, 0
    timestampDelta  varlong  from the batch's baseTimestamp
    offsetDelta     varint   from the batch's baseOffset
    keyLength       varint   -1 for a null key
    key             bytes
    valueLength     varint   -1 for a null value (a tombstone)
    value           bytes
    headerCount     varint
    headers         [keyLength varint, key, valueLength varint, value]

Varints are zigzag-encoded as in protobuf. kio leaves batches opaque and its
record reader drops sub-second precision, so these few loops are ours. Only
paths that need single records use them (a timestamp search, the broker's own
internal topics, the HTTP door's batches, tests); the brokers' produce and
fetch never do.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from shoal.records.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    NO_PRODUCER_ID,
    Compression,
    InvalidBatchError,
    TimestampType,
    compute_crc,
    validate_batch,
)
from shoal.records.compression import compress, decompress

_HEADER = struct.Struct(">qiibIhiqqqhii")
_UINT32 = struct.Struct(">I")

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A record to put in a batch; offsets and timestamps are relative to the batch."""

    key: bytes | None
    value: bytes | None
    headers: Sequence[Header] = ()
    timestamp: int | None = None
    """Milliseconds since the epoch; None means now."""


@dataclass(frozen=True, slots=True)
class BatchOptions:
    compression: Compression = Compression.NONE
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = -1
    transactional: bool = False
    control: bool = False
    partition_leader_epoch: int = -1


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, position after it)."""
    if pos < len(buf):
        first = buf[pos]
        if not first & 0x80:  # one byte: most lengths and deltas
            return (first >> 1) ^ -(first & 1), pos + 1
    shift = 0
    raw = 0
    while True:
        if pos >= len(buf):
            raise InvalidBatchError("varint runs past the end of the record")
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise InvalidBatchError("varint longer than 10 bytes")


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = read_varint(buf, pos)
    if length < 0:
        return None, pos
    end = pos + length
    if end > len(buf):
        raise InvalidBatchError("record field runs past the end of the record")
    return buf[pos:end], end


def write_varint(out: bytearray, value: int) -> None:
    """Append ``value`` as a zigzag varint."""
    raw = (value << 1) ^ (value >> 63)
    while raw & ~0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def _encoded_varint(value: int) -> bytes:
    out = bytearray()
    write_varint(out, value)
    return bytes(out)


_SMALL_VARINTS: Final = tuple(_encoded_varint(v) for v in range(-1, 1 << 13))
"""Every varint a small record needs (lengths, deltas, the null length -1), encoded
once: looked up, a record's six fields cost a third of encoding each (measured)."""


def _varint(value: int) -> bytes:
    if -1 <= value < 1 << 13:
        return _SMALL_VARINTS[value + 1]
    return _encoded_varint(value)


_NULL: Final = _varint(-1)


def _record(offset_delta: int, timestamp_delta: int, record: NewRecord) -> bytes:
    """One record of a batch, its length first."""
    key, value = record.key, record.value
    parts = [
        b"\x00",  # attributes
        _varint(timestamp_delta),
        _varint(offset_delta),
        _NULL if key is None else _varint(len(key)),
        key or b"",
        _NULL if value is None else _varint(len(value)),
        value or b"",
        _varint(len(record.headers)),
    ]
    for name, header_value in record.headers:
        raw = name.encode()
        parts += (_varint(len(raw)), raw)
        if header_value is None:
            parts.append(_NULL)
        else:
            parts += (_varint(len(header_value)), header_value)
    body = b"".join(parts)
    return _varint(len(body)) + body


def iter_records(
    batch: bytes | bytearray | memoryview, max_size: int | None = None
) -> Iterator[Record]:
    """Decode the records of one whole batch (validated, decompressed as needed).

    With ``max_size``, a batch whose records take more than that many bytes
    (decompressed) raises :class:`DecompressedTooLargeError` before any record,
    having held at most about ``max_size`` bytes of them.
    """
    header = validate_batch(batch)
    payload = decompress(header.compression, memoryview(batch)[HEADER_SIZE : header.size], max_size)
    log_append = header.timestamp_type is TimestampType.LOG_APPEND_TIME
    pos = 0
    for _ in range(header.records_count):
        length, pos = read_varint(payload, pos)
        end = pos + length
        if length < 0 or end > len(payload):
            raise InvalidBatchError("record length runs past the batch")
        pos += 1  # attributes
        timestamp_delta, pos = read_varint(payload, pos)
        offset_delta, pos = read_varint(payload, pos)
        key, pos = _read_bytes(payload, pos)
        value, pos = _read_bytes(payload, pos)
        header_count, pos = read_varint(payload, pos)
        headers: list[Header] = []
        for _ in range(header_count):
            name, pos = _read_bytes(payload, pos)
            header_value, pos = _read_bytes(payload, pos)
            if name is None:
                raise InvalidBatchError("record header with a null key")
            headers.append((name.decode("utf-8", errors="replace"), header_value))
        if pos != end:
            raise InvalidBatchError("record length disagrees with its fields")
        timestamp = header.max_timestamp if log_append else header.base_timestamp + timestamp_delta
        yield Record(header.base_offset + offset_delta, timestamp, key, value, tuple(headers))
    if pos != len(payload):
        raise InvalidBatchError(f"{len(payload) - pos} bytes after the batch's last record")


def build_batch(
    records: Iterable[NewRecord],
    base_offset: int = 0,
    options: BatchOptions | None = None,
) -> bytes:
    """Encode records as one v2 batch with a valid CRC."""
    opts = options or BatchOptions()
    now = int(time.time() * 1000)
    items = list(records)
    if not items:
        raise ValueError("a batch holds at least one record")
    timestamps = [now if r.timestamp is None else r.timestamp for r in items]
    base_timestamp = min(timestamps)
    body = b"".join(
        _record(offset_delta, timestamp - base_timestamp, record)
        for offset_delta, (record, timestamp) in enumerate(zip(items, timestamps, strict=True))
    )
    payload = compress(opts.compression, body)
    attributes = int(opts.compression)
    if opts.transactional:
        attributes |= 0x10
    if opts.control:
        attributes |= 0x20
    size = HEADER_SIZE + len(payload)
    out = bytearray(size)
    _HEADER.pack_into(
        out,
        0,
        base_offset,
        size - LOG_OVERHEAD,
        opts.partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        len(items) - 1,
        base_timestamp,
        max(timestamps),
        opts.producer_id,
        opts.producer_epoch,
        opts.base_sequence,
        len(items),
    )
    out[HEADER_SIZE:] = payload
    _UINT32.pack_into(out, 17, compute_crc(out, 0, size))
    return bytes(out)
