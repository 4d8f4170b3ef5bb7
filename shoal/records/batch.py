"""The RecordBatch v2 header: parse, validate and patch it in place.

The format (https://kafka.apache.org/documentation/#recordbatch), big-endian::

    offset  size  field
         0     8  baseOffset
         8     4  batchLength            bytes after this field
        12     4  partitionLeaderEpoch
        16     1  magic                  2
        17     4  crc                    CRC-32C of bytes [21, end)
        21     2  attributes             bits 0-2 codec, 3 timestamp type,
                                         4 transactional, 5 control,
                                         6 delete horizon set
        23     4  lastOffsetDelta
        27     8  baseTimestamp
        35     8  maxTimestamp
        43     8  producerId
        51     2  producerEpoch
        53     4  baseSequence
        57     4  recordsCount
        61     .  records                compressed as a whole when codec != 0

The CRC covers attributes through the last record, so the broker can assign
offsets (baseOffset) and stamp its leader epoch (partitionLeaderEpoch) without
touching the CRC. Only LogAppendTime, which rewrites attributes and
maxTimestamp, needs a new CRC. Everything here works on the 61-byte header;
nothing looks at individual records, which keeps the produce and fetch paths
per batch.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from crc32c import crc32c
from typing_extensions import Buffer

MAGIC: Final = 2
HEADER_SIZE: Final = 61
LOG_OVERHEAD: Final = 12
"""baseOffset and batchLength: the bytes a batch has before batchLength starts counting."""
CRC_START: Final = 21

BATCH_LENGTH_OFFSET: Final = 8
PARTITION_LEADER_EPOCH_OFFSET: Final = 12
MAGIC_OFFSET: Final = 16
CRC_OFFSET: Final = 17
ATTRIBUTES_OFFSET: Final = 21
MAX_TIMESTAMP_OFFSET: Final = 35

NO_TIMESTAMP: Final = -1
NO_PRODUCER_ID: Final = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")
_INT8 = struct.Struct(">b")
_OFFSET_AND_LENGTH = struct.Struct(">qi")

_COMPRESSION_MASK: Final = 0x07
_TIMESTAMP_TYPE_BIT: Final = 0x08
_TRANSACTIONAL_BIT: Final = 0x10
_CONTROL_BIT: Final = 0x20


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(enum.IntEnum):
    """As Kafka numbers them on the wire (Fetch, ListOffsets) and in the attributes bit."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class InvalidBatchError(ValueError):
    """The bytes are not a well-formed batch; Kafka answers INVALID_RECORD."""


class CorruptBatchError(InvalidBatchError):
    """The batch is framed but its bytes are damaged; Kafka answers CORRUPT_MESSAGE."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed 61 bytes in front of a batch's records."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch takes, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        codec = self.attributes & _COMPRESSION_MASK
        if codec > Compression.ZSTD:
            raise InvalidBatchError(f"unknown compression codec {codec}")
        return Compression(codec)

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & _TIMESTAMP_TYPE_BIT:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)


def parse_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Read the header at ``pos``; raises InvalidBatchError if fewer than 61 bytes remain."""
    available = len(memoryview(buf)) - pos
    if available < HEADER_SIZE:
        raise InvalidBatchError(f"{available} bytes is shorter than a batch header")
    return BatchHeader(*_HEADER.unpack_from(buf, pos))


def read_offset_and_length(buf: Buffer, pos: int = 0) -> tuple[int, int]:
    """baseOffset and batchLength: all a log scan needs to step to the next batch."""
    base_offset, batch_length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
    return base_offset, batch_length


def compute_crc(buf: Buffer, pos: int, size: int) -> int:
    return int(crc32c(memoryview(buf)[pos + CRC_START : pos + size]))


def validate_batch(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Check one batch at ``pos``: framing, magic and CRC-32C.

    Raises CorruptBatchError when the bytes are damaged (a CRC mismatch, a
    header or length that runs past the buffer) and InvalidBatchError when
    they are intact but not a batch we accept (another magic, nonsense
    counts). The magic byte is judged first, so a legacy message shorter
    than a v2 header is invalid, not corrupt.
    """
    available = len(memoryview(buf)) - pos
    if available > MAGIC_OFFSET:
        (magic,) = _INT8.unpack_from(buf, pos + MAGIC_OFFSET)
        if magic != MAGIC:
            raise InvalidBatchError(f"record batch magic {magic}, only magic 2 is supported")
    if available < HEADER_SIZE:
        raise CorruptBatchError(f"{available} bytes is shorter than a batch header")
    header = parse_header(buf, pos)
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptBatchError(f"batch length {header.batch_length} is shorter than its header")
    if header.size > available:
        raise CorruptBatchError(
            f"batch of {header.size} bytes runs past the {available} bytes received"
        )
    actual = compute_crc(buf, pos, header.size)
    if actual != header.crc:
        raise CorruptBatchError(f"batch CRC {header.crc:#010x} != computed {actual:#010x}")
    if header.last_offset_delta < 0 or header.records_count < 0:
        raise InvalidBatchError("negative record count in batch header")
    header.compression  # noqa: B018 - raises InvalidBatchError for an unknown codec
    return header


def iter_batches(buf: Buffer) -> Iterator[tuple[int, BatchHeader]]:
    """Validate and yield (position, header) for each batch in ``buf``.

    The buffer must hold whole batches only; a trailing fragment is corruption.
    """
    pos = 0
    end = len(memoryview(buf))
    while pos < end:
        header = validate_batch(buf, pos)
        yield pos, header
        pos += header.size


def set_base_offset(buf: bytearray, pos: int, base_offset: int) -> None:
    """Assign offsets: outside the CRC, so nothing else changes."""
    _INT64.pack_into(buf, pos, base_offset)


def set_partition_leader_epoch(buf: bytearray, pos: int, epoch: int) -> None:
    _INT32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(buf: bytearray, pos: int, header: BatchHeader, timestamp_ms: int) -> None:
    """Stamp a LogAppendTime topic's batch: type bit, maxTimestamp, and a new CRC.

    As in Kafka, consumers read maxTimestamp as every record's timestamp when
    the type bit says LogAppendTime; the records themselves are untouched.
    """
    _INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, header.attributes | _TIMESTAMP_TYPE_BIT)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    _UINT32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos, header.size))
