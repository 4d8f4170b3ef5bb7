"""The RecordBatch v2 header: parsing, validation, iteration and in-place patches.

The CRC is checked against the ``crc32c`` package directly, and the byte offsets
against the format table in Kafka's documentation, not against the constants of
the module under test.
"""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch

from shoal.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchOptions,
    Compression,
    CorruptBatchError,
    InvalidBatchError,
    NewRecord,
    TimestampType,
    build_batch,
    iter_batches,
    iter_records,
    parse_header,
    read_offset_and_length,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batch,
)


def _batch(
    base_offset: int = 0,
    count: int = 3,
    options: BatchOptions | None = None,
    value: bytes = b"value",
) -> bytes:
    records = [
        NewRecord(f"k{i}".encode(), value + bytes([i]), [("h", bytes([i]))], 1_000 + 100 * i)
        for i in range(count)
    ]
    return build_batch(records, base_offset=base_offset, options=options)


def _recrc(buf: bytearray, pos: int = 0) -> None:
    """Give a deliberately altered batch a valid CRC again, so other checks are reached."""
    (batch_length,) = struct.unpack_from(">i", buf, pos + 8)
    end = pos + LOG_OVERHEAD + batch_length
    struct.pack_into(">I", buf, pos + 17, crc32c(bytes(buf[pos + 21 : end])))


def _stored_crc(buf: bytes | bytearray, pos: int = 0) -> int:
    return struct.unpack_from(">I", buf, pos + 17)[0]


# -- parse_header ------------------------------------------------------------------


def test_parse_header_reads_every_field_of_the_format() -> None:
    options = BatchOptions(
        producer_id=4242,
        producer_epoch=3,
        base_sequence=17,
        transactional=True,
        partition_leader_epoch=9,
    )
    records = [
        NewRecord(b"a", b"1", timestamp=1_000),
        NewRecord(b"b", b"2", timestamp=1_500),
        NewRecord(b"c", b"3", timestamp=1_200),
    ]
    batch = build_batch(records, base_offset=100, options=options)

    header = parse_header(batch)

    assert header.base_offset == 100
    assert header.batch_length == len(batch) - 12
    assert header.partition_leader_epoch == 9
    assert header.magic == 2
    assert header.crc == crc32c(batch[21:])
    assert header.attributes == 0x10
    assert header.last_offset_delta == 2
    assert header.base_timestamp == 1_000
    assert header.max_timestamp == 1_500
    assert header.producer_id == 4242
    assert header.producer_epoch == 3
    assert header.base_sequence == 17
    assert header.records_count == 3


def test_parse_header_agrees_with_kafka_python() -> None:
    options = BatchOptions(
        compression=Compression.GZIP,
        producer_id=77,
        producer_epoch=5,
        base_sequence=1_000,
        transactional=True,
        partition_leader_epoch=12,
    )
    batch = _batch(base_offset=5_000, count=4, options=options, value=b"x" * 200)

    ours = parse_header(batch)
    theirs = KafkaPythonBatch(batch)

    assert ours.base_offset == theirs.base_offset
    assert ours.partition_leader_epoch == theirs.leader_epoch
    assert ours.magic == theirs.magic
    assert ours.crc == theirs.crc
    assert ours.attributes == theirs.attributes
    assert ours.last_offset_delta == theirs.last_offset_delta
    assert ours.base_timestamp == theirs.first_timestamp
    assert ours.max_timestamp == theirs.max_timestamp
    assert ours.producer_id == theirs.producer_id
    assert ours.producer_epoch == theirs.producer_epoch
    assert ours.base_sequence == theirs.base_sequence
    assert ours.records_count == theirs.records_count
    assert ours.size == theirs.size_in_bytes
    assert ours.next_offset == theirs.next_offset
    assert int(ours.compression) == theirs.compression_type
    assert ours.is_transactional == theirs.is_transactional
    assert ours.is_control == theirs.is_control_batch
    assert int(ours.timestamp_type) == theirs.timestamp_type


def test_header_properties_derive_size_and_offsets() -> None:
    batch = _batch(base_offset=40, count=5)

    header = parse_header(batch)

    assert header.size == len(batch)
    assert header.last_offset == 44
    assert header.next_offset == 45


@pytest.mark.parametrize(
    ("attributes", "compression", "timestamp_type", "transactional", "control"),
    [
        (0x00, Compression.NONE, TimestampType.CREATE_TIME, False, False),
        (0x01, Compression.GZIP, TimestampType.CREATE_TIME, False, False),
        (0x02, Compression.SNAPPY, TimestampType.CREATE_TIME, False, False),
        (0x03, Compression.LZ4, TimestampType.CREATE_TIME, False, False),
        (0x04, Compression.ZSTD, TimestampType.CREATE_TIME, False, False),
        (0x08, Compression.NONE, TimestampType.LOG_APPEND_TIME, False, False),
        (0x10, Compression.NONE, TimestampType.CREATE_TIME, True, False),
        (0x20, Compression.NONE, TimestampType.CREATE_TIME, False, True),
        (0x3C, Compression.ZSTD, TimestampType.LOG_APPEND_TIME, True, True),
        # Bit 6 (delete horizon) says nothing about the other flags.
        (0x41, Compression.GZIP, TimestampType.CREATE_TIME, False, False),
    ],
)
def test_header_reads_each_attribute_bit(
    attributes: int,
    compression: Compression,
    timestamp_type: TimestampType,
    transactional: bool,
    control: bool,
) -> None:
    raw = bytearray(_batch())
    struct.pack_into(">h", raw, 21, attributes)

    header = parse_header(raw)

    assert header.attributes == attributes
    assert header.compression is compression
    assert header.timestamp_type is timestamp_type
    assert header.is_transactional is transactional
    assert header.is_control is control


def test_parse_header_reads_at_a_position_inside_a_larger_buffer() -> None:
    first = _batch(base_offset=0, count=2)
    second = _batch(base_offset=2, count=3)

    header = parse_header(first + second, len(first))

    assert header.base_offset == 2
    assert header.records_count == 3
    assert header.size == len(second)


def test_parse_header_accepts_memoryview_and_bytearray() -> None:
    batch = _batch(base_offset=7)

    assert parse_header(memoryview(batch)) == parse_header(batch)
    assert parse_header(bytearray(batch)) == parse_header(batch)


@pytest.mark.parametrize("size", [0, 1, 12, 60])
def test_parse_header_refuses_fewer_than_61_bytes(size: int) -> None:
    batch = _batch()

    with pytest.raises(InvalidBatchError, match="shorter than a batch header"):
        parse_header(batch[:size])


def test_parse_header_refuses_a_header_cut_by_the_buffer_end_at_a_position() -> None:
    batch = _batch()
    buf = batch + batch[: HEADER_SIZE - 1]

    with pytest.raises(InvalidBatchError):
        parse_header(buf, len(batch))


def test_read_offset_and_length_reads_the_first_twelve_bytes_only() -> None:
    batch = _batch(base_offset=123_456_789_012, count=2)

    assert read_offset_and_length(batch[:12]) == (123_456_789_012, len(batch) - 12)
    assert read_offset_and_length(batch + batch, len(batch)) == (
        123_456_789_012,
        len(batch) - 12,
    )


# -- validate_batch ----------------------------------------------------------------


def test_validate_batch_returns_the_header_of_an_intact_batch() -> None:
    batch = _batch(base_offset=9, options=BatchOptions(compression=Compression.LZ4))

    assert validate_batch(batch) == parse_header(batch)


def test_validate_batch_checks_the_batch_at_its_position() -> None:
    first = _batch(base_offset=0)
    second = _batch(base_offset=3)

    header = validate_batch(first + second, len(first))

    assert header.base_offset == 3


@pytest.mark.parametrize("where", [HEADER_SIZE, HEADER_SIZE + 5, -1], ids=["first", "mid", "last"])
def test_validate_batch_detects_a_flipped_bit_in_the_records(where: int) -> None:
    raw = bytearray(_batch())
    raw[where] ^= 0x01

    with pytest.raises(CorruptBatchError, match="CRC"):
        validate_batch(raw)


@pytest.mark.parametrize("offset", [21, 22], ids=["attributes-high", "attributes-low"])
def test_validate_batch_detects_a_flipped_bit_in_the_attributes(offset: int) -> None:
    raw = bytearray(_batch())
    raw[offset] ^= 0x02

    with pytest.raises(CorruptBatchError, match="CRC"):
        validate_batch(raw)


@pytest.mark.parametrize(
    "offset",
    [23, 27, 35, 43, 51, 53, 57],
    ids=[
        "last-offset-delta",
        "base-timestamp",
        "max-timestamp",
        "producer-id",
        "producer-epoch",
        "base-sequence",
        "records-count",
    ],
)
def test_validate_batch_detects_damage_to_any_header_field_the_crc_covers(offset: int) -> None:
    raw = bytearray(_batch())
    raw[offset] ^= 0x80

    with pytest.raises(CorruptBatchError, match="CRC"):
        validate_batch(raw)


def test_validate_batch_detects_a_damaged_crc_field() -> None:
    raw = bytearray(_batch())
    raw[17] ^= 0xFF

    with pytest.raises(CorruptBatchError, match="CRC"):
        validate_batch(raw)


def test_crc_does_not_cover_base_offset_or_partition_leader_epoch() -> None:
    raw = bytearray(_batch())
    raw[0:8] = b"\x11" * 8
    raw[12:16] = b"\x22" * 4

    header = validate_batch(raw)

    assert header.base_offset == 0x1111111111111111
    assert header.partition_leader_epoch == 0x22222222


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_validate_batch_refuses_another_magic_as_invalid_not_corrupt(magic: int) -> None:
    raw = bytearray(_batch())
    raw[16] = magic

    with pytest.raises(InvalidBatchError, match="magic") as caught:
        validate_batch(raw)

    assert type(caught.value) is InvalidBatchError


@pytest.mark.parametrize(
    "keep",
    [HEADER_SIZE, HEADER_SIZE + 1, -1],
    ids=["header-only", "header-plus-one", "last-byte-missing"],
)
def test_validate_batch_reports_a_truncated_batch_as_corrupt(keep: int) -> None:
    batch = _batch()

    with pytest.raises(CorruptBatchError, match="runs past"):
        validate_batch(batch[:keep])


@pytest.mark.parametrize("keep", [1, 11, 12, 17, 30, HEADER_SIZE - 1])
def test_validate_batch_reports_a_batch_cut_inside_its_header_as_corrupt(keep: int) -> None:
    batch = _batch()

    with pytest.raises(CorruptBatchError):
        validate_batch(batch[:keep])


def test_validate_batch_refuses_a_short_legacy_message_as_invalid_not_corrupt() -> None:
    """A magic-1 message is often shorter than a v2 header; its magic byte decides."""
    raw = bytearray(_batch()[:30])
    raw[16] = 1

    with pytest.raises(InvalidBatchError, match="magic") as caught:
        validate_batch(raw)

    assert type(caught.value) is InvalidBatchError


@pytest.mark.parametrize("batch_length", [0, 1, HEADER_SIZE - LOG_OVERHEAD - 1, -5])
def test_validate_batch_reports_a_batch_length_shorter_than_the_header_as_corrupt(
    batch_length: int,
) -> None:
    raw = bytearray(_batch())
    struct.pack_into(">i", raw, 8, batch_length)

    with pytest.raises(CorruptBatchError, match="shorter than its header"):
        validate_batch(raw)


def test_validate_batch_accepts_a_batch_length_of_exactly_the_header() -> None:
    """An empty batch (no record bytes) is framed correctly; only counts decide more."""
    raw = bytearray(_batch()[:HEADER_SIZE])
    struct.pack_into(">i", raw, 8, HEADER_SIZE - LOG_OVERHEAD)
    _recrc(raw)

    header = validate_batch(raw)

    assert header.size == HEADER_SIZE


def test_validate_batch_ignores_bytes_after_the_batch() -> None:
    batch = _batch()

    header = validate_batch(batch + b"\xff" * 100)

    assert header.size == len(batch)


@pytest.mark.parametrize("offset", [23, 57], ids=["last-offset-delta", "records-count"])
def test_validate_batch_refuses_negative_counts_as_invalid(offset: int) -> None:
    raw = bytearray(_batch())
    struct.pack_into(">i", raw, offset, -1)
    _recrc(raw)

    with pytest.raises(InvalidBatchError, match="negative") as caught:
        validate_batch(raw)

    assert type(caught.value) is InvalidBatchError


# -- iter_batches ------------------------------------------------------------------


def test_iter_batches_yields_each_batch_with_its_position() -> None:
    batches = [
        _batch(base_offset=0, count=1),
        _batch(base_offset=1, count=4, options=BatchOptions(compression=Compression.GZIP)),
        _batch(base_offset=5, count=2, options=BatchOptions(compression=Compression.ZSTD)),
    ]
    buf = b"".join(batches)

    found = list(iter_batches(buf))

    positions = [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    assert [pos for pos, _ in found] == positions
    assert [h.base_offset for _, h in found] == [0, 1, 5]
    assert [h.records_count for _, h in found] == [1, 4, 2]
    assert [h.size for _, h in found] == [len(b) for b in batches]
    assert [h.compression for _, h in found] == [
        Compression.NONE,
        Compression.GZIP,
        Compression.ZSTD,
    ]


def test_iter_batches_of_an_empty_buffer_yields_nothing() -> None:
    assert list(iter_batches(b"")) == []


@pytest.mark.parametrize("fragment", [HEADER_SIZE + 10, HEADER_SIZE, 20, 5, 1])
def test_iter_batches_reports_a_trailing_fragment_as_corrupt_after_the_whole_batches(
    fragment: int,
) -> None:
    whole = [_batch(base_offset=0), _batch(base_offset=3)]
    tail = _batch(base_offset=6, value=b"v" * 50)[:fragment]
    seen: list[int] = []

    with pytest.raises(CorruptBatchError):
        for _, header in iter_batches(b"".join(whole) + tail):
            seen.append(header.base_offset)

    assert seen == [0, 3]


def test_iter_batches_stops_at_a_damaged_batch_in_the_middle() -> None:
    first, second, third = _batch(base_offset=0), _batch(base_offset=3), _batch(base_offset=6)
    raw = bytearray(first + second + third)
    raw[len(first) + HEADER_SIZE + 2] ^= 0x40
    seen: list[int] = []

    with pytest.raises(CorruptBatchError, match="CRC"):
        for _, header in iter_batches(raw):
            seen.append(header.base_offset)

    assert seen == [0]


# -- in-place patches --------------------------------------------------------------


def test_set_base_offset_patches_one_batch_and_keeps_the_crc_valid() -> None:
    first = _batch(base_offset=0, count=2)
    second = _batch(base_offset=0, count=3)
    raw = bytearray(first + second)
    crc_before = _stored_crc(raw, len(first))

    set_base_offset(raw, len(first), 1_000_000_000_000)

    assert [h.base_offset for _, h in iter_batches(raw)] == [0, 1_000_000_000_000]
    assert _stored_crc(raw, len(first)) == crc_before
    assert raw[: len(first)] == first
    assert raw[len(first) + 8 :] == second[8:]
    patched = bytes(raw[len(first) :])
    assert [r.offset for r in iter_records(patched)] == [
        1_000_000_000_000,
        1_000_000_000_001,
        1_000_000_000_002,
    ]
    assert KafkaPythonBatch(patched).validate_crc()


def test_set_partition_leader_epoch_patches_one_batch_and_keeps_the_crc_valid() -> None:
    first = _batch(options=BatchOptions(partition_leader_epoch=-1))
    second = _batch(options=BatchOptions(partition_leader_epoch=-1))
    raw = bytearray(first + second)

    set_partition_leader_epoch(raw, len(first), 2_000_000)

    headers = [h for _, h in iter_batches(raw)]
    assert [h.partition_leader_epoch for h in headers] == [-1, 2_000_000]
    assert raw[: len(first)] == first
    assert raw[len(first) : len(first) + 12] == second[:12]
    assert raw[len(first) + 16 :] == second[16:]
    assert KafkaPythonBatch(bytes(raw[len(first) :])).leader_epoch == 2_000_000


@pytest.mark.parametrize("codec", list(Compression))
def test_set_log_append_time_sets_the_type_bit_max_timestamp_and_a_valid_crc(
    codec: Compression,
) -> None:
    options = BatchOptions(
        compression=codec, transactional=True, producer_id=3, producer_epoch=0, base_sequence=0
    )
    neighbour = _batch(base_offset=0, count=2)
    target = _batch(base_offset=2, count=3, options=options, value=b"z" * 300)
    raw = bytearray(neighbour + target + neighbour)
    pos = len(neighbour)
    header = validate_batch(raw, pos)
    assert header.timestamp_type is TimestampType.CREATE_TIME

    set_log_append_time(raw, pos, header, 1_700_000_000_123)

    stamped = validate_batch(raw, pos)
    assert stamped.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert stamped.max_timestamp == 1_700_000_000_123
    assert stamped.attributes == header.attributes | 0x08
    assert stamped.compression is codec
    assert stamped.is_transactional
    assert stamped.crc == crc32c(bytes(raw[pos + 21 : pos + header.size]))
    assert stamped.base_timestamp == header.base_timestamp
    assert raw[pos + HEADER_SIZE : pos + header.size] == target[HEADER_SIZE:]
    assert raw[:pos] == neighbour
    assert raw[pos + header.size :] == neighbour
    assert len(list(iter_batches(raw))) == 3

    records = list(iter_records(bytes(raw[pos : pos + header.size])))
    assert [r.timestamp for r in records] == [1_700_000_000_123] * 3
    theirs = KafkaPythonBatch(bytes(raw[pos : pos + header.size]))
    assert theirs.validate_crc()
    assert theirs.timestamp_type == 1
    assert [r.timestamp for r in theirs] == [1_700_000_000_123] * 3


def test_set_log_append_time_is_idempotent_on_an_already_stamped_batch() -> None:
    raw = bytearray(_batch())
    set_log_append_time(raw, 0, parse_header(raw), 5_000)

    set_log_append_time(raw, 0, parse_header(raw), 6_000)

    header = validate_batch(raw)
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == 6_000


def test_an_unknown_compression_codec_is_an_invalid_batch() -> None:
    from shoal.records import InvalidBatchError, NewRecord, build_batch, validate_batch
    from shoal.records.batch import CRC_OFFSET, compute_crc

    raw = bytearray(build_batch([NewRecord(b"k", b"v")]))
    raw[22] |= 0x07  # codec bits: 7, which no Kafka version defines
    struct.pack_into(">I", raw, CRC_OFFSET, compute_crc(raw, 0, len(raw)))
    with pytest.raises(InvalidBatchError, match="unknown compression codec 7"):
        validate_batch(raw)


# -- build_batch -------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 63, 64, 8191, 8192, 70_000])
def test_built_records_of_every_varint_width_read_back_alike_here_and_in_kafka_python(
    size: int,
) -> None:
    # Lengths on both sides of a varint's one-, two- and three-byte forms, null
    # keys, values and header values, and a delta past the small-varint table.
    records = [
        NewRecord(None, b"v" * size, [("h" * size, None)], 1_000),
        NewRecord(b"k" * size, None, [], 1_000 + 9_000),
        NewRecord(b"", b"", [("", b""), ("x", b"y" * size)], 1_000 + 2**40),
    ]
    batch = build_batch(records, base_offset=50)
    ours = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in iter_records(batch)]
    theirs = [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in KafkaPythonBatch(batch)
    ]
    expected = [
        (50 + i, r.timestamp, r.key, r.value, list(r.headers)) for i, r in enumerate(records)
    ]
    assert ours == theirs == expected
