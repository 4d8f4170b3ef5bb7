"""A task's read of one offset range, against a fake librdkafka consumer.

``FakeConsumer`` serves a compacted partition as librdkafka hands it to the
application: the live records from the assigned position on, in offset order,
nothing for the offsets compaction removed (librdkafka steps over empty
batches by itself), then one partition-EOF event carrying the high
watermark. A read of ``[start, end)`` must return exactly the live records in
it and finish as soon as the consumer is past ``end - 1`` (a record at or
after ``end``, or the EOF at the high watermark), wherever the gaps fall:
a reader waiting for the record at ``end - 1`` would never finish, and the
short poll timeout turns such a wait into a test failure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError
from shoal.connector.offsets import DataLossError, OffsetRange, TopicPartition
from shoal.connector.reading import ReadTask, _RangeReader

TP = TopicPartition("compacted", 0)
# A stall longer than this fails the read with TimeoutError.
POLL_TIMEOUT_MS = 500


@dataclass
class FakeMessage:
    _offset: int
    _error: KafkaError | None = None

    def error(self) -> KafkaError | None:
        return self._error

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"key-%d" % self._offset

    def value(self) -> bytes:
        return b"value-%d" % self._offset

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + self._offset

    def headers(self) -> None:
        return None


@dataclass
class FakeConsumer:
    """A partition holding ``live`` records below ``high``; the rest are gaps."""

    live: list[int]
    high: int
    low: int = 0
    position: int | None = None
    eof_sent: bool = False
    consumed: list[int] = field(default_factory=list)

    def assign(self, partitions: list[Any]) -> None:
        (partition,) = partitions
        self.position = partition.offset

    def seek(self, partition: Any) -> None:
        self.position = partition.offset
        self.eof_sent = False

    def get_watermark_offsets(self, _: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return self.low, self.high

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        assert self.position is not None, "consume() before assign()"
        batch: list[FakeMessage] = [
            FakeMessage(offset) for offset in self.live if offset >= self.position
        ][:num_messages]
        if batch:
            self.position = batch[-1].offset() + 1
            self.consumed += [m.offset() for m in batch]
        elif not self.eof_sent:
            # librdkafka's fetch position steps over the trailing gap (empty
            # batches) to the high watermark, where it reports the EOF.
            self.position = self.high
            self.eof_sent = True
            batch = [FakeMessage(self.high, KafkaError(KafkaError._PARTITION_EOF))]
        else:
            time.sleep(0.01)
        return batch


def read(consumer: FakeConsumer, start: int, end: int, fail_on_data_loss: bool = True) -> list[int]:
    task = ReadTask(
        client={},
        range=OffsetRange(TP, start, end),
        include_headers=False,
        fail_on_data_loss=fail_on_data_loss,
        poll_timeout_ms=POLL_TIMEOUT_MS,
    )
    reader = _RangeReader(consumer, task)
    batches: list[pa.RecordBatch] = list(reader.batches())
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    keys = [k for b in batches for k in b.column("key").to_pylist()]
    assert keys == [b"key-%d" % o for o in offsets]
    return offsets


# A cleaned log: each key's latest record survived, most offsets are gaps,
# and the log ends in a gap (an empty batch kept for the last group).
LIVE = [3, 4, 9, 17, 18, 19, 30, 41]
HIGH = 50


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (0, HIGH),  # the whole log: starts and ends in a gap
        (0, 8),  # ends in a gap, the next record (9) after the end
        (5, 9),  # starts and ends in gaps, nothing in between
        (10, 17),  # wholly inside a gap, a record right at the end
        (20, 30),  # wholly inside a gap, between two records
        (19, 31),  # starts and ends on records
        (31, 41),  # ends at the last record, which it does not include
        (42, HIGH),  # wholly inside the trailing gap
        (41, HIGH),  # the last record, then the trailing gap to the end
    ],
)
def test_a_range_reads_exactly_its_live_records_wherever_the_gaps_are(start: int, end: int) -> None:
    # A wait for a record that never comes would end in TimeoutError.
    assert read(FakeConsumer(LIVE, HIGH), start, end) == [o for o in LIVE if start <= o < end]


def test_a_range_ending_in_a_gap_stops_at_the_first_record_past_its_end() -> None:
    consumer = FakeConsumer(LIVE, HIGH)
    assert read(consumer, 10, 29) == [17, 18, 19]
    assert 30 in consumer.consumed  # seen, and not returned
    assert consumer.eof_sent is False  # no need to read to the end of the log


def test_a_gap_is_not_data_loss() -> None:
    # Offsets 0 to 2 hold no record but are above the log start: compacted, not deleted.
    assert read(FakeConsumer(LIVE, HIGH), 0, 5, fail_on_data_loss=True) == [3, 4]


def test_records_deleted_by_retention_are_still_data_loss() -> None:
    consumer = FakeConsumer(LIVE, HIGH, low=10)
    with pytest.raises(DataLossError, match="deleted"):
        read(consumer, 0, 20)
    assert read(FakeConsumer(LIVE, HIGH, low=10), 0, 20, fail_on_data_loss=False) == [17, 18, 19]


def test_a_log_that_ends_before_the_range_does_is_data_loss() -> None:
    # The high watermark went back below the range's end: truncated, not compacted.
    with pytest.raises(DataLossError, match="no longer in the log"):
        read(FakeConsumer(LIVE, 45), 42, HIGH)


def test_a_consumer_that_never_gets_past_a_gap_times_out_naming_the_offset() -> None:
    # The broker answers nothing for offsets it still has below its high
    # watermark: the task fails, as Spark's does, instead of hanging.
    consumer = FakeConsumer([], HIGH)
    consumer.eof_sent = True
    with pytest.raises(TimeoutError, match="at offset 42"):
        read(consumer, 42, HIGH)
