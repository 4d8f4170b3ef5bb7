"""ProducerStateManager on its own: sequence rules, the five-batch cache, expiry, snapshots.

Kafka's ProducerStateManager / ProducerAppendInfo are the reference. Batches
are real v2 batches (built, then parsed), so the headers carry what a
producer would send; ``base_offset`` stands for the offset the log assigned.
The snapshot layout is checked with ``struct`` against Kafka's version 1
format, not through the module's own reader.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from shoal.broker.log.producer_state import (
    INT_MAX,
    BatchMetadata,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerEntry,
    ProducerStateManager,
    next_sequence,
    snapshot_offsets,
    snapshot_path,
)

from shoal.records import BatchHeader, BatchOptions, NewRecord, build_batch, parse_header

NOW = 1_700_000_000_000
PID = 4000
OTHER_PID = 4001

# Kafka's snapshot v1: version int16, crc uint32, count int32, then per producer
# id int64, epoch int16, last seq int32, last offset int64, offset delta int32,
# timestamp int64, coordinator epoch int32, current txn first offset int64.
HEAD = struct.Struct(">hI")
COUNT = struct.Struct(">i")
ENTRY = struct.Struct(">qhiqiqiq")


def header(
    seq: int,
    count: int = 1,
    *,
    pid: int = PID,
    epoch: int = 0,
    offset: int = 0,
    timestamp: int = NOW,
) -> BatchHeader:
    """The header of an idempotent batch of ``count`` records, placed at ``offset``."""
    records = [NewRecord(key=None, value=b"v", timestamp=timestamp) for _ in range(count)]
    options = BatchOptions(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    return parse_header(build_batch(records, offset, options))


class Producer:
    """Appends a producer's batches to a manager as the log would: check, then update."""

    def __init__(self, state: ProducerStateManager, pid: int = PID, epoch: int = 0) -> None:
        self.state = state
        self.pid = pid
        self.epoch = epoch
        self.seq = 0
        self.sent: list[BatchHeader] = []

    def send(self, count: int, offset: int, timestamp: int = NOW) -> BatchHeader:
        h = header(
            self.seq, count, pid=self.pid, epoch=self.epoch, offset=offset, timestamp=timestamp
        )
        assert self.state.check(h) is None
        self.state.update(h)
        self.seq = next_sequence(self.seq, count)
        self.sent.append(h)
        return h


def meta(h: BatchHeader) -> BatchMetadata:
    return BatchMetadata(
        h.base_sequence,
        next_sequence(h.base_sequence, h.last_offset_delta),
        h.base_offset,
        h.last_offset,
        h.max_timestamp,
    )


@pytest.fixture
def state(tmp_path: Path) -> ProducerStateManager:
    return ProducerStateManager(tmp_path)


# -- next_sequence -------------------------------------------------------------


def test_next_sequence_adds_normally_below_int_max() -> None:
    assert next_sequence(0, 1) == 1
    assert next_sequence(5, 10) == 15
    assert next_sequence(INT_MAX - 3, 3) == INT_MAX
    assert next_sequence(7, 0) == 7


def test_next_sequence_wraps_from_int_max_to_zero() -> None:
    assert INT_MAX == 2**31 - 1
    assert next_sequence(INT_MAX, 1) == 0
    assert next_sequence(INT_MAX, 2) == 1
    assert next_sequence(INT_MAX - 1, 3) == 1
    assert next_sequence(INT_MAX - 2, 3) == 0


# -- check / update ------------------------------------------------------------


def test_a_producer_without_state_may_start_at_any_sequence(state) -> None:
    """As Kafka's ProducerAppendInfo: no state (new, or expired) means no expectation."""
    assert state.check(header(5)) is None
    assert state.check(header(0, 3)) is None
    assert state.producers == {}


def test_consecutive_batches_are_accepted(state) -> None:
    producer = Producer(state)
    first = producer.send(3, offset=0)
    second = producer.send(1, offset=3)
    third = producer.send(5, offset=4)
    entry = state.producers[PID]
    assert entry.last_sequence == 8
    assert list(entry.batches) == [meta(first), meta(second), meta(third)]
    assert list(entry.batches)[2] == BatchMetadata(4, 8, 4, 8, NOW)
    assert state.check(header(9, 2, offset=9)) is None


def test_producers_are_tracked_independently(state) -> None:
    one = Producer(state, PID)
    two = Producer(state, OTHER_PID)
    one.send(2, offset=0)
    two.send(1, offset=2)
    one.send(1, offset=3)
    assert state.producers[PID].last_sequence == 2
    assert state.producers[OTHER_PID].last_sequence == 0
    assert state.check(header(1, pid=OTHER_PID)) is None
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(1, pid=PID))


@pytest.mark.parametrize("back", [1, 2, 3, 4, 5])
def test_retry_of_one_of_the_last_five_batches_is_reported_as_that_batch(state, back) -> None:
    producer = Producer(state)
    for i in range(7):
        producer.send(2, offset=10 + 2 * i, timestamp=NOW + i)
    original = producer.sent[-back]
    retry = header(original.base_sequence, 2, offset=999, timestamp=NOW + 50)
    found = state.check(retry)
    assert found == meta(original)
    assert (found.first_offset, found.last_offset) == (original.base_offset, original.last_offset)
    assert found.timestamp == original.max_timestamp


def test_retry_older_than_the_last_five_batches_is_out_of_order(state) -> None:
    producer = Producer(state)
    for i in range(6):
        producer.send(2, offset=2 * i)
    sixth_newest = producer.sent[0]
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(sixth_newest.base_sequence, 2))
    assert len(state.producers[PID].batches) == 5


def test_retry_with_the_same_first_sequence_but_another_size_is_out_of_order(state) -> None:
    producer = Producer(state)
    producer.send(3, offset=0)
    producer.send(3, offset=3)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(3, 2))


def test_sequence_gap_is_out_of_order(state) -> None:
    producer = Producer(state)
    producer.send(3, offset=0)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(4))
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(2))
    assert state.producers[PID].last_sequence == 2


def test_older_epoch_is_fenced(state) -> None:
    producer = Producer(state, epoch=3)
    producer.send(2, offset=0)
    with pytest.raises(InvalidProducerEpochError):
        state.check(header(2, epoch=2))
    # Even a retry of a batch it has in common with the current epoch.
    with pytest.raises(InvalidProducerEpochError):
        state.check(header(0, 2, epoch=2))
    with pytest.raises(InvalidProducerEpochError):
        state.check(header(0, epoch=0))


def test_newer_epoch_must_start_at_sequence_zero(state) -> None:
    producer = Producer(state, epoch=1)
    producer.send(2, offset=0)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(2, epoch=2))
    assert state.check(header(0, epoch=2)) is None


def test_newer_epoch_resets_the_batch_cache(state) -> None:
    old = Producer(state, epoch=1)
    old.send(2, offset=0)
    old.send(2, offset=2)
    new = Producer(state, epoch=2)
    bumped = new.send(1, offset=4)
    entry = state.producers[PID]
    assert entry.epoch == 2
    assert list(entry.batches) == [meta(bumped)]
    # The old epoch's batches are no longer duplicates: that epoch is fenced.
    with pytest.raises(InvalidProducerEpochError):
        state.check(header(2, 2, epoch=1))
    # A batch of the new epoch with the old epoch's sequences is not a retry.
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(2, 2, epoch=2))
    assert state.check(header(0, epoch=2)) == meta(bumped)
    assert state.check(header(1, epoch=2)) is None


def _seed(state: ProducerStateManager, last_sequence: int, offset: int = 100) -> None:
    """A producer whose last batch (one record) ended at ``last_sequence``."""
    entry = ProducerEntry(PID, 0, last_timestamp=NOW)
    entry.batches.append(BatchMetadata(last_sequence, last_sequence, offset, offset, NOW))
    state.producers[PID] = entry


def test_batch_after_int_max_continues_at_zero(state) -> None:
    _seed(state, INT_MAX)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(1))
    h = header(0, 2, offset=101)
    assert state.check(h) is None
    state.update(h)
    assert state.producers[PID].last_sequence == 1


def test_batch_spanning_int_max_wraps_its_last_sequence(state) -> None:
    _seed(state, INT_MAX - 2)
    spanning = header(INT_MAX - 1, 4, offset=101)
    assert state.check(spanning) is None
    state.update(spanning)
    entry = state.producers[PID]
    assert entry.last_sequence == 1
    assert entry.batches[-1] == BatchMetadata(INT_MAX - 1, 1, 101, 104, NOW)
    # Its retry is found by the wrapped range; the next batch continues at 2.
    assert state.check(header(INT_MAX - 1, 4, offset=0)) == entry.batches[-1]
    assert state.check(header(2)) is None
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(0))


def test_check_append_checks_each_batch_against_the_ones_before_it(state) -> None:
    Producer(state).send(2, offset=0)
    follows = [header(2, 2), header(4), header(0, pid=OTHER_PID), header(1, pid=OTHER_PID)]
    assert state.check_append(follows) == [None, None, None, None]
    # Checking stages nothing: the stored state is as it was.
    assert state.producers[PID].last_sequence == 1
    assert OTHER_PID not in state.producers


def test_check_append_rejects_a_gap_after_an_earlier_batch_of_the_append(state) -> None:
    with pytest.raises(OutOfOrderSequenceError):
        state.check_append([header(0, 2), header(3)])
    with pytest.raises(InvalidProducerEpochError):
        state.check_append([header(0, epoch=2), header(1, epoch=1)])
    assert state.producers == {}


def test_check_append_finds_a_retry_of_a_stored_batch(state) -> None:
    stored = Producer(state).send(2, offset=40)
    assert state.check_append([header(0, 2)]) == [meta(stored)]


def test_check_append_does_not_take_a_repeated_batch_for_new(state) -> None:
    found = state.check_append([header(0, 2), header(0, 2)])
    assert found[0] is None
    assert found[1] is not None


def test_update_ignores_batches_without_a_producer_id(state) -> None:
    plain = parse_header(build_batch([NewRecord(key=None, value=b"v", timestamp=NOW)]))
    assert plain.producer_id == -1
    state.update(plain)
    assert state.producers == {}


def test_expire_drops_producers_idle_for_the_expiration_time(state) -> None:
    Producer(state, PID).send(1, offset=0, timestamp=NOW)
    Producer(state, OTHER_PID).send(1, offset=1, timestamp=NOW + 500)
    assert state.expire(NOW + 999, 1000) == 0
    assert set(state.producers) == {PID, OTHER_PID}
    # Idle for exactly producer.id.expiration.ms: gone, as in Kafka (>=).
    assert state.expire(NOW + 1000, 1000) == 1
    assert set(state.producers) == {OTHER_PID}
    assert state.expire(NOW + 1500, 1000) == 1
    assert state.producers == {}


def test_expiry_is_measured_from_the_newest_batch(state) -> None:
    producer = Producer(state)
    producer.send(1, offset=0, timestamp=NOW)
    producer.send(1, offset=1, timestamp=NOW + 800)
    assert state.expire(NOW + 1000, 1000) == 0
    assert PID in state.producers


def test_an_expired_producer_continues_without_a_sequence_error(state) -> None:
    producer = Producer(state)
    producer.send(3, offset=0)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(header(7))
    state.expire(NOW + 10_000, 1000)
    assert state.check(header(7)) is None


# -- snapshots -----------------------------------------------------------------


def _two_producers(state: ProducerStateManager) -> tuple[Producer, Producer]:
    one = Producer(state, PID, epoch=2)
    two = Producer(state, OTHER_PID, epoch=0)
    one.send(3, offset=0, timestamp=NOW)
    two.send(2, offset=3, timestamp=NOW + 1)
    one.send(4, offset=5, timestamp=NOW + 2)
    two.send(1, offset=9, timestamp=NOW + 3)
    return one, two


def test_snapshot_round_trip_keeps_each_producers_last_batch(state, tmp_path) -> None:
    one, two = _two_producers(state)
    state.write_snapshot(10)
    loaded = ProducerStateManager(tmp_path)
    assert loaded.load(10) == 10
    assert set(loaded.producers) == {PID, OTHER_PID}
    first, second = loaded.producers[PID], loaded.producers[OTHER_PID]
    assert (first.epoch, second.epoch) == (2, 0)
    assert list(first.batches) == [BatchMetadata(3, 6, 5, 8, NOW + 2)]
    assert list(second.batches) == [BatchMetadata(2, 2, 9, 9, NOW + 3)]
    assert list(first.batches) == [meta(one.sent[-1])]
    assert list(second.batches) == [meta(two.sent[-1])]
    assert (first.last_timestamp, second.last_timestamp) == (NOW + 2, NOW + 3)


def test_loaded_snapshot_detects_the_last_batch_and_accepts_the_next(state, tmp_path) -> None:
    one, _ = _two_producers(state)
    state.write_snapshot(10)
    loaded = ProducerStateManager(tmp_path)
    loaded.load(10)
    assert loaded.check(header(3, 4, epoch=2)) == meta(one.sent[-1])
    assert loaded.check(header(7, epoch=2)) is None
    # Only the last batch is kept in a snapshot, as in Kafka: an older retry is out of order.
    with pytest.raises(OutOfOrderSequenceError):
        loaded.check(header(0, 3, epoch=2))
    with pytest.raises(InvalidProducerEpochError):
        loaded.check(header(7, epoch=1))


def test_snapshot_round_trip_of_a_batch_spanning_int_max(state, tmp_path) -> None:
    _seed(state, INT_MAX - 2)
    spanning = header(INT_MAX - 1, 4, offset=101)
    state.update(spanning)
    state.write_snapshot(105)
    loaded = ProducerStateManager(tmp_path)
    loaded.load(105)
    assert list(loaded.producers[PID].batches) == [BatchMetadata(INT_MAX - 1, 1, 101, 104, NOW)]
    assert loaded.check(header(INT_MAX - 1, 4)) == BatchMetadata(INT_MAX - 1, 1, 101, 104, NOW)
    assert loaded.check(header(2)) is None


def test_snapshot_file_follows_kafkas_v1_layout(state, tmp_path) -> None:
    _two_producers(state)
    state.write_snapshot(10)
    path = tmp_path / "00000000000000000010.snapshot"
    assert snapshot_path(tmp_path, 10) == path
    data = path.read_bytes()
    version, crc = HEAD.unpack_from(data)
    assert version == 1
    assert crc == crc32c(data[6:])
    (count,) = COUNT.unpack_from(data, 6)
    assert count == 2
    assert ENTRY.size == 46
    assert len(data) == 2 + 4 + 4 + 2 * 46
    entries = sorted(ENTRY.unpack_from(data, 10 + i * 46) for i in range(count))
    assert entries == [
        # id, epoch, last seq, last offset, offset delta, timestamp, coordinator epoch, txn first
        (PID, 2, 6, 8, 3, NOW + 2, -1, -1),
        (OTHER_PID, 0, 2, 9, 0, NOW + 3, -1, -1),
    ]


def test_empty_state_snapshot_is_a_header_and_zero_count(state, tmp_path) -> None:
    state.write_snapshot(0)
    data = snapshot_path(tmp_path, 0).read_bytes()
    assert data == HEAD.pack(1, crc32c(COUNT.pack(0))) + COUNT.pack(0)
    loaded = ProducerStateManager(tmp_path)
    assert loaded.load(0) == 0
    assert loaded.producers == {}


def _kafka_snapshot(entries: list[tuple[int, ...]]) -> bytes:
    body = COUNT.pack(len(entries)) + b"".join(ENTRY.pack(*e) for e in entries)
    return HEAD.pack(1, crc32c(body)) + body


def test_snapshot_written_as_kafka_writes_it_is_loaded(tmp_path) -> None:
    # A transactional producer's fields (coordinator epoch, txn first offset) are read past.
    snapshot_path(tmp_path, 50).write_bytes(
        _kafka_snapshot(
            [(PID, 7, 41, 49, 9, NOW, 3, -1), (OTHER_PID, 0, 0, 30, 0, NOW - 5, -1, -1)]
        )
    )
    state = ProducerStateManager(tmp_path)
    assert state.load(60) == 50
    assert list(state.producers[PID].batches) == [BatchMetadata(32, 41, 40, 49, NOW)]
    assert state.producers[PID].epoch == 7
    assert list(state.producers[OTHER_PID].batches) == [BatchMetadata(0, 0, 30, 30, NOW - 5)]
    assert state.check(header(42, epoch=7)) is None


def _write_two_snapshots(state: ProducerStateManager) -> None:
    producer = Producer(state)
    producer.send(2, offset=0)
    state.write_snapshot(10)
    producer.send(3, offset=10)
    state.write_snapshot(20)


def _flip_body_byte(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[20] ^= 0x01
    return bytes(damaged)


def _flip_crc_byte(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[3] ^= 0x80
    return bytes(damaged)


def _wrong_version(data: bytes) -> bytes:
    return struct.pack(">h", 2) + data[2:]


def _count_says_more(data: bytes) -> bytes:
    # A count that disagrees with the entries, with a CRC that matches it.
    body = COUNT.pack(2) + data[10:]
    return HEAD.pack(1, crc32c(body)) + body


DAMAGE = {
    "flipped_body_byte": _flip_body_byte,
    "flipped_crc_byte": _flip_crc_byte,
    "truncated_mid_entry": lambda data: data[:-7],
    "truncated_inside_header": lambda data: data[:5],
    "empty_file": lambda data: b"",
    "wrong_version": _wrong_version,
    "count_disagrees_with_size": _count_says_more,
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_corrupt_snapshot_is_deleted_and_the_older_one_used(state, tmp_path, damage) -> None:
    _write_two_snapshots(state)
    newest = snapshot_path(tmp_path, 20)
    newest.write_bytes(damage(newest.read_bytes()))
    loaded = ProducerStateManager(tmp_path)
    assert loaded.load(30) == 10
    assert not newest.exists()
    assert snapshot_offsets(tmp_path) == [10]
    assert list(loaded.producers[PID].batches) == [BatchMetadata(0, 1, 0, 1, NOW)]


def test_no_usable_snapshot_loads_nothing_from_offset_zero(state, tmp_path) -> None:
    _write_two_snapshots(state)
    for offset in (10, 20):
        path = snapshot_path(tmp_path, offset)
        path.write_bytes(_flip_body_byte(path.read_bytes()))
    loaded = ProducerStateManager(tmp_path)
    assert loaded.load(30) == 0
    assert loaded.producers == {}
    assert snapshot_offsets(tmp_path) == []


def test_snapshots_above_the_log_end_are_deleted_on_load(state, tmp_path) -> None:
    _write_two_snapshots(state)
    loaded = ProducerStateManager(tmp_path)
    assert loaded.load(15) == 10
    assert snapshot_offsets(tmp_path) == [10]
    assert list(loaded.producers[PID].batches) == [BatchMetadata(0, 1, 0, 1, NOW)]


def test_snapshot_at_exactly_the_log_end_is_used(state, tmp_path) -> None:
    _write_two_snapshots(state)
    loaded = ProducerStateManager(tmp_path)
    assert loaded.load(20) == 20
    assert snapshot_offsets(tmp_path) == [10, 20]
    assert list(loaded.producers[PID].batches) == [BatchMetadata(2, 4, 10, 12, NOW)]


def test_load_replaces_the_state_in_memory(state, tmp_path) -> None:
    _write_two_snapshots(state)
    Producer(state, OTHER_PID).send(1, offset=13)
    assert state.load(20) == 20
    assert set(state.producers) == {PID}


def test_only_the_newest_two_snapshots_are_kept(state, tmp_path) -> None:
    producer = Producer(state)
    for i, offset in enumerate((5, 10, 15, 20)):
        producer.send(1, offset=i)
        state.write_snapshot(offset)
    assert snapshot_offsets(tmp_path) == [15, 20]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000015.snapshot",
        "00000000000000000020.snapshot",
    ]


def test_truncate_snapshots_after_keeps_those_at_or_below(state, tmp_path) -> None:
    _write_two_snapshots(state)
    state.truncate_snapshots_after(20)
    assert snapshot_offsets(tmp_path) == [10, 20]
    state.truncate_snapshots_after(19)
    assert snapshot_offsets(tmp_path) == [10]
    state.truncate_snapshots_after(9)
    assert snapshot_offsets(tmp_path) == []
