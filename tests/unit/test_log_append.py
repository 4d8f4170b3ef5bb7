"""Log.append_as_leader: offsets, the client's bytes kept, LogAppendTime, and validation."""

from __future__ import annotations

import os
import struct

import pytest
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
)

from shoal.records import (
    HEADER_SIZE,
    BatchOptions,
    Compression,
    TimestampType,
    iter_records,
    validate_batch,
)
from shoal.records.batch import compute_crc


def _log_bytes(log) -> bytes:
    return b"".join(os.pread(s.fd, s.size, 0) for s in log.segments)


def _recrc(raw: bytearray) -> bytes:
    struct.pack_into(">I", raw, 17, compute_crc(raw, 0, len(raw)))
    return bytes(raw)


def test_offsets_are_contiguous_across_batches(open_log, helpers) -> None:
    log = open_log()
    infos = [log.append_as_leader(helpers.make_batch(n), 0) for n in (3, 1, 5)]
    assert [(i.first_offset, i.last_offset, i.record_count) for i in infos] == [
        (0, 2, 3),
        (3, 3, 1),
        (4, 8, 5),
    ]
    assert log.log_end_offset == 9
    assert [r.offset for r in helpers.read_all(log)] == list(range(9))


@pytest.mark.parametrize("codec", list(Compression))
def test_offsets_are_contiguous_across_compressed_batches(open_log, helpers, codec) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(2), 0)
    info = log.append_as_leader(helpers.make_batch(4, compression=codec, tag="c"), 0)
    log.append_as_leader(helpers.make_batch(1, tag="z"), 0)
    assert (info.first_offset, info.last_offset) == (2, 5)
    records = helpers.read_all(log)
    assert [r.offset for r in records] == list(range(7))
    assert [r.value[:2] for r in records[2:6]] == [b"c0", b"c1", b"c2", b"c3"]


def test_several_batches_in_one_request_get_consecutive_offsets(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(2), 0)
    request = helpers.make_batch(3, tag="a") + helpers.make_batch(
        2, tag="b", compression=Compression.ZSTD
    )
    info = log.append_as_leader(request, 0)
    assert (info.first_offset, info.last_offset, info.record_count) == (2, 6, 5)
    headers = [h for h, _ in helpers.split_batches(_log_bytes(log))]
    assert [(h.base_offset, h.last_offset) for h in headers] == [(0, 1), (2, 4), (5, 6)]


def test_stored_bytes_are_the_clients_except_base_offset_and_leader_epoch(
    open_log, helpers
) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(5), 3)
    sent = helpers.make_batch(
        4,
        compression=Compression.LZ4,
        options=BatchOptions(
            compression=Compression.LZ4,
            producer_id=77,
            producer_epoch=2,
            base_sequence=0,
            partition_leader_epoch=-1,
        ),
    )
    log.append_as_leader(sent, 7)
    stored = _log_bytes(log)[-len(sent) :]
    header = validate_batch(stored)  # the CRC still holds
    assert header.base_offset == 5
    assert header.partition_leader_epoch == 7
    # baseOffset is bytes 0-8 and partitionLeaderEpoch bytes 12-16; the rest is the client's.
    assert stored[8:12] == sent[8:12]
    assert stored[16:] == sent[16:]
    assert stored[HEADER_SIZE:] == sent[HEADER_SIZE:]


def test_append_info_reports_max_timestamp_and_no_append_time(open_log, helpers) -> None:
    log = open_log()
    info = log.append_as_leader(helpers.make_batch(3, timestamp=helpers.NOW - 30, step=10), 0)
    assert info.max_timestamp == helpers.NOW - 10
    assert info.log_append_time == -1


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.GZIP])
def test_log_append_time_stamps_max_timestamp_and_keeps_a_valid_crc(
    open_log, helpers, clock, codec
) -> None:
    log = open_log(message_timestamp_type="LogAppendTime")
    sent = helpers.make_batch(3, timestamp=12345, step=1, compression=codec)
    clock.advance(777)
    info = log.append_as_leader(sent, 0)
    assert info.log_append_time == clock.now
    assert info.max_timestamp == clock.now
    stored = _log_bytes(log)
    header = validate_batch(stored)  # raises if the CRC was not recomputed
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == clock.now
    assert header.base_timestamp == 12345
    assert stored[HEADER_SIZE:] == sent[HEADER_SIZE:]
    assert [r.timestamp for r in iter_records(stored)] == [clock.now] * 3
    assert log.active.max_timestamp == clock.now


def test_log_append_time_topic_ignores_client_timestamp_bounds(open_log, helpers) -> None:
    log = open_log(message_timestamp_type="LogAppendTime", message_timestamp_after_max_ms=0)
    info = log.append_as_leader(helpers.make_batch(1, timestamp=helpers.NOW + 10**9), 0)
    assert info.first_offset == 0


def test_crc_mismatch_is_corrupt_record(open_log, helpers) -> None:
    log = open_log()
    raw = bytearray(helpers.make_batch(2))
    raw[-1] ^= 0x01
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(bytes(raw), 0)
    assert log.log_end_offset == 0


def test_truncated_request_is_corrupt_record(open_log, helpers) -> None:
    log = open_log()
    raw = helpers.make_batch(2)
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(raw[:-3], 0)
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(raw + raw[:20], 0)


def test_wrong_magic_is_invalid_record(open_log, helpers) -> None:
    log = open_log()
    raw = bytearray(helpers.make_batch(1))
    raw[16] = 1  # magic sits outside the CRC
    with pytest.raises(InvalidRecordError, match="magic"):
        log.append_as_leader(bytes(raw), 0)


def test_batch_larger_than_max_message_bytes_is_record_too_large(open_log, helpers) -> None:
    raw = helpers.make_batch(3, value_size=100)
    log = open_log(max_message_bytes=len(raw) - 1)
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes"):
        log.append_as_leader(raw, 0)
    log.update_config(LogConfig(max_message_bytes=len(raw)))
    assert log.append_as_leader(raw, 0).last_offset == 2


def test_control_batch_from_a_client_is_invalid_record(open_log, helpers) -> None:
    log = open_log()
    raw = helpers.make_batch(1, options=BatchOptions(control=True))
    with pytest.raises(InvalidRecordError, match="control"):
        log.append_as_leader(raw, 0)


def test_records_count_that_disagrees_with_offsets_is_invalid_record(open_log, helpers) -> None:
    log = open_log()
    raw = bytearray(helpers.make_batch(3))
    struct.pack_into(">i", raw, 57, 2)  # recordsCount 2, lastOffsetDelta still 2
    with pytest.raises(InvalidRecordError, match="records"):
        log.append_as_leader(_recrc(raw), 0)


def test_negative_last_offset_delta_is_invalid_record(open_log, helpers) -> None:
    log = open_log()
    raw = bytearray(helpers.make_batch(1))
    struct.pack_into(">i", raw, 23, -1)
    struct.pack_into(">i", raw, 57, 0)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(_recrc(raw), 0)


def test_empty_request_is_invalid_record(open_log) -> None:
    log = open_log()
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(b"", 0)


def test_timestamp_too_far_ahead_is_invalid_timestamp(open_log, helpers, clock) -> None:
    log = open_log(message_timestamp_after_max_ms=1000)
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now + 1000), 0)
    with pytest.raises(InvalidTimestampError, match=r"after\.max\.ms"):
        log.append_as_leader(helpers.make_batch(2, timestamp=clock.now, step=1001), 0)
    assert log.log_end_offset == 1


def test_timestamp_too_far_behind_is_invalid_timestamp(open_log, helpers, clock) -> None:
    log = open_log(message_timestamp_before_max_ms=1000)
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now - 1000), 0)
    with pytest.raises(InvalidTimestampError, match=r"before\.max\.ms"):
        log.append_as_leader(helpers.make_batch(2, timestamp=clock.now - 1001, step=500), 0)
    assert log.log_end_offset == 1


@pytest.mark.parametrize("topic_type", ["CreateTime", "LogAppendTime"])
def test_a_producer_may_not_set_log_append_time(open_log, helpers, clock, topic_type) -> None:
    log = open_log(message_timestamp_type=topic_type)
    raw = bytearray(helpers.make_batch(1, timestamp=clock.now + 10**10))
    raw[22] |= 0x08  # attributes, low byte: the LogAppendTime bit
    with pytest.raises(InvalidTimestampError, match="LogAppendTime"):
        log.append_as_leader(_recrc(raw), 0)
    assert log.log_end_offset == 0


def test_records_without_timestamps_pass_the_timestamp_bounds(open_log, helpers) -> None:
    log = open_log(message_timestamp_before_max_ms=1000, message_timestamp_after_max_ms=1000)
    info = log.append_as_leader(helpers.make_batch(2, timestamp=-1), 0)
    assert (info.first_offset, info.last_offset) == (0, 1)


def test_default_after_max_is_one_hour(open_log, helpers, clock) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(1, timestamp=clock.now + 3_600_000), 0)
    with pytest.raises(InvalidTimestampError):
        log.append_as_leader(helpers.make_batch(1, timestamp=clock.now + 3_600_001), 0)


def _broken_batch(helpers, bad: str) -> bytes:
    raw = bytearray(helpers.make_batch(2, tag="bad"))
    match bad:
        case "crc":
            raw[-2] ^= 0x40
        case "magic":
            raw[16] = 0
        case "too_large":
            raw = bytearray(helpers.make_batch(2, value_size=3000))
        case "control":
            raw = bytearray(helpers.make_batch(1, options=BatchOptions(control=True)))
        case "count":
            struct.pack_into(">i", raw, 57, 5)
            _recrc(raw)
        case "timestamp":
            raw = bytearray(helpers.make_batch(1, timestamp=helpers.NOW + 5000))
    return bytes(raw)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("crc", CorruptRecordError),
        ("magic", InvalidRecordError),
        ("too_large", RecordTooLargeError),
        ("control", InvalidRecordError),
        ("count", InvalidRecordError),
        ("timestamp", InvalidTimestampError),
    ],
)
def test_nothing_is_appended_when_any_batch_of_the_request_fails(
    open_log, helpers, bad, error
) -> None:
    log = open_log(max_message_bytes=2000, message_timestamp_after_max_ms=1000)
    log.append_as_leader(helpers.make_batch(2), 0)
    before = _log_bytes(log)
    good = helpers.make_batch(3)
    with pytest.raises(error):
        log.append_as_leader(good + _broken_batch(helpers, bad) + good, 5)
    assert log.log_end_offset == 2
    assert _log_bytes(log) == before
    assert log.unflushed_messages == 2
    assert log.epochs.entries == [(0, 0)]


def test_append_records_the_leader_epoch_in_the_epoch_cache(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(2), 1)
    log.append_as_leader(helpers.make_batch(2), 1)
    log.append_as_leader(helpers.make_batch(1), 4)
    assert log.epochs.entries == [(1, 0), (4, 4)]


def test_append_counts_unflushed_messages(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(2), 0)
    log.append_as_leader(helpers.make_batch(3, compression=Compression.SNAPPY), 0)
    assert log.unflushed_messages == 5
