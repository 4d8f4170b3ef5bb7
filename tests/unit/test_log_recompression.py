"""Log.append_as_leader under a topic's compression.type: the leader recompresses.

A batch whose codec differs from the topic's is stored in the topic's codec,
with offsets contiguous from the log end, the producer's fields and
timestamps kept; a batch that already has it, and every batch under
``producer``, is stored byte for byte as before. Followers copy the leader's
bytes whatever their own config says.
"""

from __future__ import annotations

import os
import struct

import pytest
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import InvalidRecordError, Log, RecordTooLargeError

from shoal.records import (
    BatchOptions,
    Compression,
    TimestampType,
    iter_records,
)
from shoal.records.batch import compute_crc

TYPES = {
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


def _log_bytes(log) -> bytes:
    return b"".join(os.pread(s.fd, s.size, 0) for s in log.segments)


@pytest.mark.parametrize("source", list(Compression))
@pytest.mark.parametrize("compression_type", list(TYPES))
def test_batch_is_stored_in_the_topics_codec_with_contiguous_offsets(
    open_log, helpers, source: Compression, compression_type: str
) -> None:
    log = open_log(compression_type=compression_type)
    log.append_as_leader(helpers.make_batch(2, tag="a"), 0)
    sent = helpers.make_batch(4, compression=source, tag="b", step=5, value_size=300)

    info = log.append_as_leader(sent, 7)

    assert (info.first_offset, info.last_offset, info.record_count) == (2, 5, 4)
    assert info.max_timestamp == helpers.NOW + 15
    stored = [h for h, _ in helpers.split_batches(_log_bytes(log))]
    assert {h.compression for h in stored} == {TYPES[compression_type]}
    assert [(h.base_offset, h.last_offset) for h in stored] == [(0, 1), (2, 5)]
    assert stored[1].partition_leader_epoch == 7
    records = helpers.read_all(log)
    assert [r.offset for r in records] == list(range(6))
    sent_records = list(iter_records(sent))
    assert [(r.key, r.value, r.headers, r.timestamp) for r in records[2:]] == [
        (r.key, r.value, r.headers, r.timestamp) for r in sent_records
    ]


@pytest.mark.parametrize("codec", list(Compression))
def test_a_batch_already_in_the_topics_codec_is_stored_byte_for_byte(
    open_log, helpers, codec: Compression
) -> None:
    name = next(n for n, c in TYPES.items() if c is codec)
    log = open_log(compression_type=name)
    sent = helpers.make_batch(3, compression=codec)

    log.append_as_leader(sent, 0)

    # Bytes 0-15 (baseOffset, batchLength, partitionLeaderEpoch) are the broker's
    # to set; from the magic byte on, the batch is the producer's.
    assert _log_bytes(log)[16:] == sent[16:]


@pytest.mark.parametrize("codec", list(Compression))
def test_producer_keeps_every_codec_as_sent(open_log, helpers, codec: Compression) -> None:
    log = open_log()  # compression.type=producer, Kafka's default
    sent = helpers.make_batch(3, compression=codec)

    log.append_as_leader(sent, 0)

    assert _log_bytes(log)[16:] == sent[16:]


def test_several_batches_in_one_request_only_the_differing_one_is_rebuilt(
    open_log, helpers
) -> None:
    log = open_log(compression_type="zstd")
    kept = helpers.make_batch(2, compression=Compression.ZSTD, tag="k")
    rebuilt = helpers.make_batch(3, compression=Compression.GZIP, tag="r")

    info = log.append_as_leader(kept + rebuilt + kept, 0)

    assert (info.first_offset, info.last_offset) == (0, 6)
    stored = helpers.split_batches(_log_bytes(log))
    assert [(h.base_offset, h.compression) for h, _ in stored] == [
        (0, Compression.ZSTD),
        (2, Compression.ZSTD),
        (5, Compression.ZSTD),
    ]
    assert stored[0][1][16:] == kept[16:]
    assert [r.value[:2] for r in helpers.read_all(log)] == [
        b"k0",
        b"k1",
        b"r0",
        b"r1",
        b"r2",
        b"k0",
        b"k1",
    ]


def test_idempotent_producer_fields_survive_and_a_retry_is_recognised(open_log, helpers) -> None:
    log = open_log(compression_type="lz4")
    options = BatchOptions(
        compression=Compression.SNAPPY, producer_id=42, producer_epoch=2, base_sequence=0
    )
    first = helpers.make_batch(3, options=options)

    info = log.append_as_leader(first, 0)
    retry = log.append_as_leader(first, 0)

    header, _ = helpers.split_batches(_log_bytes(log))[0]
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 2, 0)
    assert header.compression is Compression.LZ4
    assert retry.duplicate
    assert (retry.first_offset, retry.last_offset) == (info.first_offset, info.last_offset)
    assert log.log_end_offset == 3


def test_log_append_time_is_stamped_on_the_rebuilt_batch(open_log, helpers, clock) -> None:
    log = open_log(compression_type="gzip", message_timestamp_type="LogAppendTime")
    clock.advance(1234)

    info = log.append_as_leader(helpers.make_batch(2, compression=Compression.NONE), 0)

    assert info.log_append_time == clock.now
    header, raw = helpers.split_batches(_log_bytes(log))[0]
    assert header.compression is Compression.GZIP
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.max_timestamp == clock.now
    assert {r.timestamp for r in iter_records(raw)} == {clock.now}


def test_recompressed_batch_over_max_message_bytes_is_refused(open_log, helpers) -> None:
    log = open_log(compression_type="uncompressed", max_message_bytes=20_000)
    sent = helpers.make_batch(100, compression=Compression.ZSTD, value_size=1000)
    assert len(sent) < 20_000

    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes|decompresses"):
        log.append_as_leader(sent, 0)
    assert log.log_end_offset == 0


def test_records_that_do_not_decode_are_an_invalid_record_and_nothing_is_appended(
    open_log, helpers
) -> None:
    log = open_log(compression_type="zstd")
    good = helpers.make_batch(1)
    bad = bytearray(helpers.make_batch(2))
    struct.pack_into(">i", bad, 57, 3)  # counts a record that is not there
    struct.pack_into(">i", bad, 23, 2)
    struct.pack_into(">I", bad, 17, compute_crc(bad, 0, len(bad)))

    with pytest.raises(InvalidRecordError, match="recompressed"):
        log.append_as_leader(good + bytes(bad), 0)
    assert log.log_end_offset == 0


def test_a_follower_copies_the_leaders_codec_whatever_its_own_config(
    open_log, helpers, tmp_path
) -> None:
    leader = open_log(compression_type="zstd")
    leader.append_as_leader(helpers.make_batch(3, compression=Compression.GZIP), 0)
    follower = Log(tmp_path / "follower", LogConfig(compression_type="gzip"), 0, True, lambda: 0)
    try:
        follower.append_as_follower(_log_bytes(leader))
        assert _log_bytes(follower) == _log_bytes(leader)
    finally:
        follower.close()


def test_config_change_applies_to_the_next_append(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(1, compression=Compression.GZIP), 0)
    log.update_config(LogConfig(compression_type="snappy"))
    log.append_as_leader(helpers.make_batch(1, compression=Compression.GZIP), 0)

    codecs = [h.compression for h, _ in helpers.split_batches(_log_bytes(log))]
    assert codecs == [Compression.GZIP, Compression.SNAPPY]
