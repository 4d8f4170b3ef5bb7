"""Records inside batches, checked against Kafka clients we did not write.

Batches built by kafka-python and aiokafka decode with :func:`iter_records`
byte for byte, and batches from :func:`build_batch` decode with their readers,
for every codec. A hypothesis property covers what hand-picked samples miss.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBuilder
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.codec import snappy_encode
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder

from shoal.records import (
    BatchOptions,
    Compression,
    CompressionError,
    CorruptBatchError,
    InvalidBatchError,
    NewRecord,
    Record,
    TimestampType,
    build_batch,
    iter_records,
    parse_header,
    set_base_offset,
    set_log_append_time,
    validate_batch,
)

Header = tuple[str, bytes | None]

# (key, value, headers, timestamp): nulls, empties, non-ASCII header names,
# out-of-order timestamps and a value large enough that every codec pays off.
SAMPLE: list[tuple[bytes | None, bytes | None, list[Header], int]] = [
    (b"key-0", b"value-0", [], 1_700_000_000_000),
    (None, b"null key", [("trace", b"abc")], 1_700_000_000_250),
    (b"tombstone", None, [], 1_699_999_999_900),
    (None, None, [("h-null", None), ("h-empty", b"")], 1_700_000_000_010),
    (b"", b"", [], 1_700_000_000_000),
    (b"\x00\xff\x80", bytes(range(256)), [("ключ", b"\xe2\x82\xac"), ("a", b"1"), ("a", b"2")], 0),
    (b"big", b"compress me please " * 300, [("big", b"x" * 200)], 1_700_000_100_000),
]


def _kafka_python_batch(codec: Compression, sample=SAMPLE) -> bytes:
    builder = KafkaPythonBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 22,
    )
    for offset, (key, value, headers, timestamp) in enumerate(sample):
        assert builder.append(offset, timestamp, key, value, headers) is not None
    return bytes(builder.build())


def _aiokafka_batch(codec: Compression, sample=SAMPLE) -> bytes:
    builder = AioBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 22,
    )
    for offset, (key, value, headers, timestamp) in enumerate(sample):
        assert builder.append(offset, timestamp, key, value, headers) is not None
    return bytes(builder.build())


def _expected(base_offset: int = 0, sample=SAMPLE) -> list[Record]:
    return [
        Record(base_offset + i, timestamp, key, value, tuple(headers))
        for i, (key, value, headers, timestamp) in enumerate(sample)
    ]


def _new_records(sample=SAMPLE) -> list[NewRecord]:
    return [NewRecord(key, value, headers, timestamp) for key, value, headers, timestamp in sample]


def _their_records(batch: Any) -> list[Record]:
    return [Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]


# -- their batches, our reader ------------------------------------------------------


@pytest.mark.parametrize("codec", list(Compression))
def test_iter_records_reads_kafka_python_batches(codec: Compression) -> None:
    batch = _kafka_python_batch(codec)
    assert parse_header(batch).compression is codec

    assert list(iter_records(batch)) == _expected()


@pytest.mark.parametrize("codec", list(Compression))
def test_iter_records_reads_aiokafka_batches(codec: Compression) -> None:
    batch = _aiokafka_batch(codec)
    assert parse_header(batch).compression is codec

    assert list(iter_records(batch)) == _expected()


def test_kafka_python_snappy_batches_are_xerial_framed_and_read() -> None:
    batch = _kafka_python_batch(Compression.SNAPPY)

    assert batch[61:69] == b"\x82SNAPPY\x00"
    assert list(iter_records(batch)) == _expected()


def test_iter_records_reads_a_batch_with_hand_made_xerial_snappy_blocks() -> None:
    plain = _kafka_python_batch(Compression.NONE)
    payload = snappy_encode(plain[61:], xerial_compatible=True, xerial_blocksize=256)
    raw = bytearray(plain[:61] + payload)
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    struct.pack_into(">h", raw, 21, int(Compression.SNAPPY))
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))

    assert list(iter_records(bytes(raw))) == _expected()


@pytest.mark.parametrize("codec", list(Compression))
def test_iter_records_adds_the_base_offset_the_broker_assigned(codec: Compression) -> None:
    raw = bytearray(_kafka_python_batch(codec))

    set_base_offset(raw, 0, 9_000_000_000)

    assert list(iter_records(raw)) == _expected(base_offset=9_000_000_000)
    assert _their_records(KafkaPythonBatch(bytes(raw))) == _expected(base_offset=9_000_000_000)


def test_iter_records_reads_every_timestamp_as_max_timestamp_under_log_append_time() -> None:
    raw = bytearray(_kafka_python_batch(Compression.LZ4))

    set_log_append_time(raw, 0, parse_header(raw), 1_800_000_000_000)

    ours = list(iter_records(raw))
    theirs = _their_records(AioBatch(bytes(raw)))
    assert [r.timestamp for r in ours] == [1_800_000_000_000] * len(SAMPLE)
    assert ours == theirs


# -- our batches, their readers -----------------------------------------------------


@pytest.mark.parametrize("codec", list(Compression))
def test_kafka_python_reads_our_batches(codec: Compression) -> None:
    options = BatchOptions(
        compression=codec,
        producer_id=1234,
        producer_epoch=7,
        base_sequence=99,
        transactional=True,
        partition_leader_epoch=4,
    )
    batch = build_batch(_new_records(), base_offset=500, options=options)

    theirs = KafkaPythonBatch(batch)

    assert theirs.validate_crc()
    assert theirs.compression_type == int(codec)
    assert theirs.base_offset == 500
    assert theirs.leader_epoch == 4
    assert theirs.producer_id == 1234
    assert theirs.producer_epoch == 7
    assert theirs.base_sequence == 99
    assert theirs.is_transactional
    assert not theirs.is_control_batch
    assert theirs.timestamp_type == 0
    assert theirs.last_offset_delta == len(SAMPLE) - 1
    assert theirs.records_count == len(SAMPLE)
    assert theirs.size_in_bytes == len(batch)
    assert theirs.first_timestamp == min(s[3] for s in SAMPLE)
    assert theirs.max_timestamp == max(s[3] for s in SAMPLE)
    assert _their_records(theirs) == _expected(base_offset=500)


@pytest.mark.parametrize("codec", list(Compression))
def test_aiokafka_reads_our_batches(codec: Compression) -> None:
    batch = build_batch(_new_records(), base_offset=3, options=BatchOptions(compression=codec))

    theirs = AioBatch(batch)

    assert theirs.validate_crc()
    assert theirs.compression_type == int(codec)
    assert theirs.next_offset == 3 + len(SAMPLE)
    assert _their_records(theirs) == _expected(base_offset=3)


def test_control_flag_reaches_kafka_python() -> None:
    options = BatchOptions(control=True, transactional=True, producer_id=1, producer_epoch=0)
    batch = build_batch([NewRecord(b"\x00\x00\x00\x01", b"", timestamp=5)], options=options)

    theirs = KafkaPythonBatch(batch)

    assert theirs.validate_crc()
    assert theirs.is_control_batch
    assert theirs.is_transactional
    assert parse_header(batch).is_control


# -- build_batch --------------------------------------------------------------------


def test_build_batch_assigns_consecutive_offsets_from_the_base() -> None:
    batch = build_batch([NewRecord(None, bytes([i]), timestamp=10) for i in range(5)], 70)

    header = validate_batch(batch)

    assert (header.base_offset, header.last_offset_delta, header.records_count) == (70, 4, 5)
    assert [r.offset for r in iter_records(batch)] == [70, 71, 72, 73, 74]


def test_build_batch_stamps_records_without_a_timestamp_with_now() -> None:
    before = int(time.time() * 1000)
    batch = build_batch([NewRecord(b"k", b"v"), NewRecord(b"k", b"v", timestamp=before - 60_000)])
    after = int(time.time() * 1000)

    header = parse_header(batch)
    first, second = iter_records(batch)

    assert before <= first.timestamp <= after
    assert second.timestamp == before - 60_000
    assert header.base_timestamp == before - 60_000
    assert header.max_timestamp == first.timestamp
    assert header.timestamp_type is TimestampType.CREATE_TIME


def test_build_batch_refuses_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        build_batch([])


def test_build_batch_defaults_mean_no_producer_and_no_leader_epoch() -> None:
    header = parse_header(build_batch([NewRecord(None, b"v", timestamp=1)]))

    assert header.producer_id == -1
    assert header.producer_epoch == -1
    assert header.base_sequence == -1
    assert header.partition_leader_epoch == -1
    assert header.attributes == 0


def test_build_batch_accepts_records_from_a_generator() -> None:
    batch = build_batch(NewRecord(None, bytes([i]), timestamp=i) for i in range(3))

    assert [r.value for r in iter_records(batch)] == [b"\x00", b"\x01", b"\x02"]


# -- property -----------------------------------------------------------------------

_headers = st.lists(
    st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=40))), max_size=4
)
_records = st.lists(
    st.builds(
        NewRecord,
        key=st.one_of(st.none(), st.binary(max_size=300)),
        value=st.one_of(st.none(), st.binary(max_size=2_000)),
        headers=_headers,
        timestamp=st.integers(min_value=0, max_value=2**53),
    ),
    min_size=1,
    max_size=30,
)


def _timestamp(record: NewRecord) -> int:
    assert record.timestamp is not None, "the strategy always sets one"
    return record.timestamp


def _as_expected(records: list[NewRecord], base_offset: int) -> list[Record]:
    return [
        Record(base_offset + i, _timestamp(r), r.key, r.value, tuple(r.headers))
        for i, r in enumerate(records)
    ]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=_records,
    base_offset=st.integers(min_value=0, max_value=2**62),
    codec=st.sampled_from(list(Compression)),
    leader_epoch=st.integers(min_value=-1, max_value=2**31 - 1),
)
def test_build_batch_then_iter_records_gives_back_every_record(
    records: list[NewRecord], base_offset: int, codec: Compression, leader_epoch: int
) -> None:
    options = BatchOptions(compression=codec, partition_leader_epoch=leader_epoch)

    batch = build_batch(records, base_offset=base_offset, options=options)

    header = validate_batch(batch)
    assert header.records_count == len(records)
    assert header.partition_leader_epoch == leader_epoch
    assert header.base_timestamp == min(_timestamp(r) for r in records)
    assert header.max_timestamp == max(_timestamp(r) for r in records)
    assert list(iter_records(batch)) == _as_expected(records, base_offset)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=_records, codec=st.sampled_from(list(Compression)))
def test_aiokafka_reads_every_batch_we_build(records: list[NewRecord], codec: Compression) -> None:
    batch = build_batch(records, base_offset=11, options=BatchOptions(compression=codec))

    theirs = AioBatch(batch)

    assert theirs.validate_crc()
    assert _their_records(theirs) == _as_expected(records, 11)


# -- damaged records ----------------------------------------------------------------


def _varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _record(body: bytes, length: int | None = None) -> bytes:
    return _varint(len(body) if length is None else length) + body


def _batch_around(payload: bytes, count: int, codec: Compression = Compression.NONE) -> bytes:
    """A batch header with a valid CRC around hand-made record bytes."""
    header = struct.pack(
        ">qiibIhiqqqhii",
        0,
        61 - 12 + len(payload),
        -1,
        2,
        0,
        int(codec),
        count - 1,
        1_000,
        1_000,
        -1,
        -1,
        -1,
        count,
    )
    raw = bytearray(header + payload)
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    return bytes(raw)


# attributes, timestampDelta, offsetDelta, key "k", value "v", no headers
_GOOD_BODY = b"\x00" + _varint(0) + _varint(0) + _varint(1) + b"k" + _varint(1) + b"v" + _varint(0)


def test_hand_made_record_reads_as_expected() -> None:
    """The helpers below write what the format says; damage is then one change away."""
    batch = _batch_around(_record(_GOOD_BODY), 1)

    assert list(iter_records(batch)) == [Record(0, 1_000, b"k", b"v")]


def test_record_length_longer_than_its_fields_is_invalid() -> None:
    batch = _batch_around(_record(_GOOD_BODY + b"\x00"), 1)

    with pytest.raises(InvalidBatchError, match="disagrees"):
        list(iter_records(batch))


def test_record_length_shorter_than_its_fields_is_invalid() -> None:
    batch = _batch_around(_record(_GOOD_BODY, length=len(_GOOD_BODY) - 1), 1)

    with pytest.raises(InvalidBatchError):
        list(iter_records(batch))


def test_record_length_past_the_batch_is_invalid() -> None:
    batch = _batch_around(_record(_GOOD_BODY, length=len(_GOOD_BODY) + 50), 1)

    with pytest.raises(InvalidBatchError, match="runs past"):
        list(iter_records(batch))


def test_more_records_counted_than_present_is_invalid() -> None:
    batch = _batch_around(_record(_GOOD_BODY), 2)

    with pytest.raises(InvalidBatchError, match="runs past"):
        list(iter_records(batch))


def test_key_length_past_the_record_is_invalid() -> None:
    body = b"\x00" + _varint(0) + _varint(0) + _varint(100) + b"k"

    with pytest.raises(InvalidBatchError, match="runs past"):
        list(iter_records(_batch_around(_record(body), 1)))


def test_null_header_key_is_invalid() -> None:
    body = _GOOD_BODY[:-1] + _varint(1) + _varint(-1) + _varint(1) + b"v"

    with pytest.raises(InvalidBatchError, match="null key"):
        list(iter_records(_batch_around(_record(body), 1)))


def test_varint_longer_than_ten_bytes_is_invalid() -> None:
    body = b"\x00" + b"\xff" * 11 + b"\x00"

    with pytest.raises(InvalidBatchError, match="longer than 10 bytes"):
        list(iter_records(_batch_around(_record(body), 1)))


def test_varint_cut_by_the_end_of_the_records_is_invalid() -> None:
    with pytest.raises(InvalidBatchError, match="varint"):
        list(iter_records(_batch_around(b"\x80", 1)))


@pytest.mark.parametrize("codec", [c for c in Compression if c is not Compression.NONE])
def test_compressed_payload_that_does_not_decompress_is_a_compression_error(
    codec: Compression,
) -> None:
    batch = _batch_around(b"this is not compressed at all", 1, codec)

    with pytest.raises(CompressionError):
        list(iter_records(batch))


def test_iter_records_validates_the_crc_first() -> None:
    raw = bytearray(build_batch([NewRecord(b"k", b"v", timestamp=1)]))
    raw[-1] ^= 0x01

    with pytest.raises(CorruptBatchError, match="CRC"):
        list(iter_records(raw))
