"""Re-encode one batch with another codec, as Kafka's leader does for a topic's
``compression.type`` (LogValidator's "no in-place assignment" path).

Kafka rebuilds such a batch record by record (MemoryRecordsBuilder); the
result this module writes is what a consumer reads from Kafka:

* offsets contiguous: ``offsetDelta`` 0, 1, ... whatever the producer wrote
  inside (old clients got them wrong; Kafka rewrites rather than refuses),
  and ``baseOffset`` as the caller assigns it;
* the producer's id, epoch, base sequence and transactional bit kept, so
  idempotence and its retries behave as for any batch;
* timestamps: each record's absolute timestamp (``baseTimestamp`` +
  ``timestampDelta``) kept; ``maxTimestamp`` is the largest of them, or the
  broker's clock with the LogAppendTime bit when the topic asks for it (the
  records are left as they are, as on the in-place path);
* keys, values and headers byte for byte: a record's bytes after its
  ``offsetDelta`` are copied, never decoded and re-encoded, so nothing a
  reader could tell apart (a header name that is not UTF-8) changes;
* the CRC-32C computed afresh (it covers attributes through the last record).

Records are walked, not decoded: the length, attributes, ``timestampDelta``
and ``offsetDelta`` of each are read to check the framing and the deltas. When
the deltas are already 0..n-1 (every current client) the decompressed bytes
are compressed again as they are.

The payload is decompressed with a bound (``max_size``): a few compressed
bytes can stand for gigabytes, and the broker must not hold them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from typing_extensions import Buffer

from shoal.records.batch import (
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    NO_TIMESTAMP,
    BatchHeader,
    Compression,
    InvalidBatchError,
    compute_crc,
)
from shoal.records.compression import compress, decompress
from shoal.records.records import read_varint, write_varint

_HEADER = struct.Struct(">qiibIhiqqqhii")
_UINT32 = struct.Struct(">I")
_TIMESTAMP_TYPE_BIT: Final = 0x08
_TRANSACTIONAL_BIT: Final = 0x10


@dataclass(frozen=True, slots=True)
class RecompressTarget:
    """What the new batch is: its codec and level, and where it goes in the log."""

    compression: Compression
    level: int | None
    """The codec's level (KIP-390); None for the codec's default."""
    base_offset: int
    partition_leader_epoch: int
    log_append_time: int = NO_TIMESTAMP
    """The broker's clock for a LogAppendTime topic; NO_TIMESTAMP keeps CreateTime."""


def recompress_batch(
    batch: Buffer, header: BatchHeader, target: RecompressTarget, max_size: int
) -> bytes:
    """``batch`` (validated, described by ``header``) rebuilt as ``target`` says.

    Raises :class:`~shoal.records.CompressionError` when the payload does not
    decode (:class:`~shoal.records.DecompressedTooLargeError` past
    ``max_size`` bytes) and :class:`InvalidBatchError` when the records
    inside are malformed or fewer or more than the header counts.
    """
    view = memoryview(batch)
    payload = decompress(header.compression, view[HEADER_SIZE : header.size], max_size)
    records, max_timestamp = _renumbered(payload, header.records_count, header.base_timestamp)
    body = compress(target.compression, records, target.level)
    attributes = int(target.compression) | (header.attributes & _TRANSACTIONAL_BIT)
    if target.log_append_time != NO_TIMESTAMP:
        attributes |= _TIMESTAMP_TYPE_BIT
        max_timestamp = target.log_append_time
    size = HEADER_SIZE + len(body)
    out = bytearray(size)
    _HEADER.pack_into(
        out,
        0,
        target.base_offset,
        size - LOG_OVERHEAD,
        target.partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        header.records_count - 1,
        header.base_timestamp,
        max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.records_count,
    )
    out[HEADER_SIZE:] = body
    _UINT32.pack_into(out, CRC_OFFSET, compute_crc(out, 0, size))
    return bytes(out)


def _renumbered(payload: bytes, count: int, base_timestamp: int) -> tuple[bytes, int]:
    """The records with offsetDelta 0..count-1, and their largest timestamp.

    ``payload`` itself when its deltas already run 0..count-1; otherwise each
    record is rewritten around the bytes after its offsetDelta.
    """
    spans: list[tuple[int, int, int, int]] = []
    """Per record: where its attributes start, where its timestampDelta ends,
    where its offsetDelta ends, and its end."""
    in_order = True
    max_timestamp = NO_TIMESTAMP
    pos = 0
    for index in range(count):
        length, fields = read_varint(payload, pos)
        end = fields + length
        if length < 1 or end > len(payload):
            raise InvalidBatchError(f"record {index} runs past the batch")
        timestamp_delta, after_timestamp = read_varint(payload, fields + 1)  # attributes: 1 byte
        offset_delta, after_offset = read_varint(payload, after_timestamp)
        if after_offset > end:
            raise InvalidBatchError(f"record {index} is shorter than its fields")
        max_timestamp = max(max_timestamp, base_timestamp + timestamp_delta)
        in_order = in_order and offset_delta == index
        spans.append((fields, after_timestamp, after_offset, end))
        pos = end
    if pos != len(payload):
        raise InvalidBatchError(f"{len(payload) - pos} bytes after the batch's last record")
    if in_order:
        return payload, max_timestamp
    out = bytearray()
    for index, (fields, after_timestamp, after_offset, end) in enumerate(spans):
        inner = bytearray(payload[fields:after_timestamp])
        write_varint(inner, index)
        inner += payload[after_offset:end]
        write_varint(out, len(inner))
        out += inner
    return bytes(out), max_timestamp
