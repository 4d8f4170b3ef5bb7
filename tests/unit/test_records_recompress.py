"""recompress_batch: a batch rebuilt in another codec reads back as the producer sent it.

Every source codec to every target codec, with batches from kafka-python (its
first record's timestamp as the base, negative deltas after it) and from our
own builder; checked with our reader and with kafka-python's and aiokafka's.
Offsets, producer fields, timestamps (CreateTime and LogAppendTime), keys,
values and headers survive; the header fields Kafka's leader sets are set.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder

from shoal.records import (
    HEADER_SIZE,
    BatchOptions,
    Compression,
    DecompressedTooLargeError,
    InvalidBatchError,
    NewRecord,
    RecompressTarget,
    Record,
    TimestampType,
    build_batch,
    iter_records,
    parse_header,
    recompress_batch,
    validate_batch,
)
from shoal.records.batch import compute_crc
from shoal.records.compression import compress, decompress
from shoal.records.records import read_varint, write_varint

Header = tuple[str, bytes | None]
CODECS = list(Compression)
NO_LIMIT = 1 << 30

# (key, value, headers, timestamp): null and empty keys and values, a
# tombstone, repeated and null-valued headers, timestamps out of order.
SAMPLE: list[tuple[bytes | None, bytes | None, list[Header], int]] = [
    (b"key-0", b"value-0", [], 1_700_000_000_000),
    (None, b"null key", [("trace", b"abc")], 1_700_000_000_250),
    (b"tombstone", None, [], 1_699_999_999_900),
    (None, None, [("h-null", None), ("h-empty", b"")], 1_700_000_000_010),
    (b"", b"", [], 1_700_000_000_000),
    (b"\x00\xff", bytes(range(256)), [("ключ", b"\xe2\x82\xac"), ("a", b"1"), ("a", b"2")], 5),
    (b"big", b"compress me please " * 300, [("big", b"x" * 200)], 1_700_000_100_000),
]


def _kafka_python_batch(codec: Compression, transactional: bool = False) -> bytes:
    builder = KafkaPythonBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=transactional,
        producer_id=4321,
        producer_epoch=3,
        base_sequence=17,
        batch_size=1 << 22,
    )
    for offset, (key, value, headers, timestamp) in enumerate(SAMPLE):
        assert builder.append(offset, timestamp, key, value, headers) is not None
    return bytes(builder.build())


def _expected(base_offset: int) -> list[Record]:
    return [
        Record(base_offset + i, timestamp, key, value, tuple(headers))
        for i, (key, value, headers, timestamp) in enumerate(SAMPLE)
    ]


def _recompress(batch: bytes, target: RecompressTarget, max_size: int = NO_LIMIT) -> bytes:
    return recompress_batch(batch, validate_batch(batch), target, max_size)


def _their_records(batch: Any) -> list[Record]:
    return [Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]


def _payload(batch: bytes) -> bytes:
    header = parse_header(batch)
    return decompress(header.compression, batch[HEADER_SIZE:])


def _rewrite_offset_deltas(batch: bytes, deltas: list[int]) -> bytes:
    """``batch`` (uncompressed) with its records' offsetDelta fields replaced."""
    payload = _payload(batch)
    out = bytearray()
    pos = 0
    for delta in deltas:
        length, fields = read_varint(payload, pos)
        end = fields + length
        _, after_timestamp = read_varint(payload, fields + 1)
        _, after_offset = read_varint(payload, after_timestamp)
        inner = bytearray(payload[fields:after_timestamp])
        write_varint(inner, delta)
        inner += payload[after_offset:end]
        write_varint(out, len(inner))
        out += inner
        pos = end
    raw = bytearray(batch[:HEADER_SIZE] + out)
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    struct.pack_into(">I", raw, 17, compute_crc(raw, 0, len(raw)))
    return bytes(raw)


@pytest.mark.parametrize("source", CODECS)
@pytest.mark.parametrize("target", CODECS)
def test_every_codec_pair_keeps_records_offsets_and_producer_fields(
    source: Compression, target: Compression
) -> None:
    batch = _kafka_python_batch(source, transactional=True)

    out = _recompress(
        batch, RecompressTarget(target, None, base_offset=1000, partition_leader_epoch=6)
    )

    header = validate_batch(out)  # framing and a fresh CRC-32C
    assert header.compression is target
    assert header.base_offset == 1000
    assert header.partition_leader_epoch == 6
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (4321, 3, 17)
    assert header.is_transactional
    assert not header.is_control
    assert header.timestamp_type is TimestampType.CREATE_TIME
    assert header.records_count == len(SAMPLE)
    assert header.last_offset_delta == len(SAMPLE) - 1
    assert header.base_timestamp == SAMPLE[0][3]
    assert header.max_timestamp == max(s[3] for s in SAMPLE)
    assert header.size == len(out)
    assert list(iter_records(out)) == _expected(1000)


@pytest.mark.parametrize("target", CODECS)
def test_kafka_python_and_aiokafka_read_the_recompressed_batch(target: Compression) -> None:
    batch = build_batch(
        [NewRecord(k, v, h, t) for k, v, h, t in SAMPLE],
        options=BatchOptions(compression=Compression.SNAPPY, producer_id=9, producer_epoch=1),
    )

    out = _recompress(batch, RecompressTarget(target, None, 70, 2))

    theirs = KafkaPythonBatch(out)
    assert theirs.validate_crc()
    assert theirs.compression_type == int(target)
    assert theirs.base_offset == 70
    assert (theirs.producer_id, theirs.producer_epoch) == (9, 1)
    assert _their_records(theirs) == _expected(70)
    aio = AioBatch(out)
    assert aio.validate_crc()
    assert _their_records(aio) == _expected(70)


def test_record_bytes_after_the_offset_delta_are_copied_not_reencoded() -> None:
    # A header name that is not UTF-8 would not survive a decode and re-encode.
    batch = build_batch([NewRecord(b"k", b"v", (("h", b"1"),), 10)])
    raw = bytearray(_payload(batch))
    at = raw.index(b"h\x02" + b"1")  # name "h", then the value's length and "1"
    raw[at] = 0xFF
    tampered = bytearray(batch[:HEADER_SIZE] + raw)
    struct.pack_into(">I", tampered, 17, compute_crc(tampered, 0, len(tampered)))

    out = _recompress(bytes(tampered), RecompressTarget(Compression.ZSTD, 3, 0, 0))

    assert _payload(out) == bytes(raw)


def test_offset_deltas_an_old_client_got_wrong_are_renumbered_from_zero() -> None:
    batch = build_batch(
        [NewRecord(f"k{i}".encode(), f"v{i}".encode(), (), 50 + i) for i in range(4)]
    )
    wrong = _rewrite_offset_deltas(batch, [0, 0, 7, 3])
    assert [r.offset for r in iter_records(wrong)] == [0, 0, 7, 3]

    out = _recompress(wrong, RecompressTarget(Compression.LZ4, 9, 40, 0))

    records = list(iter_records(out))
    assert [r.offset for r in records] == [40, 41, 42, 43]
    assert [(r.key, r.value, r.timestamp) for r in records] == [
        (f"k{i}".encode(), f"v{i}".encode(), 50 + i) for i in range(4)
    ]


def test_in_order_offset_deltas_keep_the_record_bytes_as_they_are() -> None:
    batch = _kafka_python_batch(Compression.GZIP)

    out = _recompress(batch, RecompressTarget(Compression.NONE, None, 0, 0))

    assert out[HEADER_SIZE:] == _payload(batch)


def test_log_append_time_stamps_max_timestamp_and_leaves_create_times_inside() -> None:
    batch = _kafka_python_batch(Compression.NONE)

    out = _recompress(
        batch, RecompressTarget(Compression.ZSTD, None, 0, 0, log_append_time=1_800_000_000_000)
    )

    header = validate_batch(out)
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == 1_800_000_000_000
    assert header.base_timestamp == SAMPLE[0][3]
    assert {r.timestamp for r in iter_records(out)} == {1_800_000_000_000}
    assert KafkaPythonBatch(out).timestamp_type == 1
    # The records' own deltas are the producer's, as on the in-place path.
    assert _payload(out) == _payload(batch)


def test_max_timestamp_comes_from_the_records_not_the_producers_header() -> None:
    batch = bytearray(
        build_batch([NewRecord(b"k", b"v", (), 1_000), NewRecord(b"k", b"v", (), 3_000)])
    )
    struct.pack_into(">q", batch, 35, 99_999)  # a producer that lied in maxTimestamp
    struct.pack_into(">I", batch, 17, compute_crc(batch, 0, len(batch)))

    out = _recompress(bytes(batch), RecompressTarget(Compression.GZIP, None, 0, 0))

    assert validate_batch(out).max_timestamp == 3_000


@pytest.mark.parametrize("level", [1, 9])
def test_level_reaches_the_codec(level: int) -> None:
    values = b"".join(b"value %d, " % (i % 613) for i in range(5_000))
    batch = build_batch([NewRecord(None, values, (), 1)])

    out = _recompress(batch, RecompressTarget(Compression.GZIP, level, 0, 0))

    assert out[HEADER_SIZE:] == compress(Compression.GZIP, _payload(batch), level)


@pytest.mark.parametrize("source", [c for c in CODECS if c is not Compression.NONE])
def test_a_payload_decompressing_past_max_size_is_refused(source: Compression) -> None:
    batch = build_batch([NewRecord(None, b"\x00" * 200_000, (), 1)], options=BatchOptions(source))

    with pytest.raises(DecompressedTooLargeError):
        _recompress(batch, RecompressTarget(Compression.NONE, None, 0, 0), max_size=100_000)


def _with_count(batch: bytes, count: int) -> bytes:
    raw = bytearray(batch)
    struct.pack_into(">i", raw, 57, count)
    struct.pack_into(">i", raw, 23, count - 1)
    struct.pack_into(">I", raw, 17, compute_crc(raw, 0, len(raw)))
    return bytes(raw)


def test_fewer_records_than_the_header_counts_is_invalid() -> None:
    batch = _with_count(build_batch([NewRecord(b"k", b"v", (), 1)] * 2), 3)

    with pytest.raises(InvalidBatchError, match="past the"):
        _recompress(batch, RecompressTarget(Compression.ZSTD, None, 0, 0))


def test_bytes_after_the_counted_records_are_invalid() -> None:
    batch = _with_count(build_batch([NewRecord(b"k", b"v", (), 1)] * 3), 2)

    with pytest.raises(InvalidBatchError, match="after the batch's last record"):
        _recompress(batch, RecompressTarget(Compression.ZSTD, None, 0, 0))


def test_a_record_shorter_than_its_own_fields_is_invalid() -> None:
    batch = build_batch([NewRecord(None, None, (), 1)], options=BatchOptions(Compression.NONE))
    raw = bytearray(batch)
    raw[HEADER_SIZE] = 2  # length varint: 1, which leaves no room for the deltas
    struct.pack_into(">I", raw, 17, compute_crc(raw, 0, len(raw)))

    with pytest.raises(InvalidBatchError, match="shorter than its fields"):
        _recompress(bytes(raw), RecompressTarget(Compression.GZIP, None, 0, 0))
