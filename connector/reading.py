"""The executor's side of a read: one offset range of one partition.

A task reads exactly its range with a confluent-kafka consumer assigned to
the partition (never subscribed: offsets belong to Spark's checkpoint, not to
a consumer group) and yields Arrow batches.
"""

from __future__ import annotations

import gc
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
)
from confluent_kafka import TopicPartition as KafkaTopicPartition
from shoal.connector.offsets import DataLossError, OffsetRange
from shoal.connector.schema import CREATE_TIME, LOG_APPEND_TIME, BatchBuilder

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 10_000
# How long one consume() may wait; stalls are judged by kafkaConsumer.pollTimeoutMs.
POLL_INTERVAL_S = 0.2
WATERMARK_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ReadTask:
    """Everything a task needs: Spark pickles it into the executor."""

    client: dict[str, str]
    range: OffsetRange
    include_headers: bool
    fail_on_data_loss: bool
    poll_timeout_ms: int


def consumer_settings(client: Mapping[str, str]) -> dict[str, object]:
    """librdkafka settings for a reader: the user's, plus what reading a range needs."""
    settings: dict[str, object] = {
        # confluent-kafka insists on a group id even for assign(); nothing is
        # ever committed under it.
        "group.id": f"shoal-spark-{uuid.uuid4().hex[:12]}",
        # Spark's Kafka source reads uncommitted records, as Java clients do by default.
        "isolation.level": "read_uncommitted",
        **client,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
    }
    return settings


def read_range(task: ReadTask) -> Iterator[pa.RecordBatch]:
    """The records of ``task.range``, in offset order, as Arrow batches."""
    consumer = Consumer(consumer_settings(task.client))
    # Every record becomes a few short-lived objects that refcounting frees;
    # the cyclic collector, triggered by their sheer number, only costs time
    # (a sixth of a read's CPU, profiled in benchmarks/spark_read.py).
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield from _RangeReader(consumer, task).batches()
    finally:
        if collecting:
            gc.enable()
        consumer.close()


class _RangeReader:
    def __init__(self, consumer: Consumer, task: ReadTask) -> None:
        self._consumer = consumer
        self._task = task
        tp = task.range.topic_partition
        self._kafka_tp = KafkaTopicPartition(tp.topic, tp.partition)
        self._name = f"{tp.topic}-{tp.partition}"
        self._builder = BatchBuilder(tp.topic, tp.partition, task.include_headers)
        self._position = task.range.start
        self._end = task.range.end

    def batches(self) -> Iterator[pa.RecordBatch]:
        self._skip_deleted()
        if self._position >= self._end:
            return
        self._consumer.assign(
            [KafkaTopicPartition(self._kafka_tp.topic, self._kafka_tp.partition, self._position)]
        )
        last_progress = time.monotonic()
        while self._position < self._end:
            # consume() returns when it has num_messages or the timeout passed;
            # the end-of-partition event does not end it early. Asking for no
            # more than the range still holds keeps a task from idling at its end.
            wanted = min(ROWS_PER_BATCH, self._end - self._position)
            messages = self._consumer.consume(num_messages=wanted, timeout=POLL_INTERVAL_S)
            before = self._position
            for message in messages:
                if self._position >= self._end:
                    break
                error = message.error()
                if error is None:
                    self._add(message)
                else:
                    self._handle(error, message.offset())
            if len(self._builder) >= ROWS_PER_BATCH:
                yield self._builder.take()
            if self._position > before:
                last_progress = time.monotonic()
            elif (time.monotonic() - last_progress) * 1000 > self._task.poll_timeout_ms:
                raise TimeoutError(
                    f"no records of {self._name} arrived for {self._task.poll_timeout_ms} ms "
                    f"at offset {self._position} (reading up to {self._end}); "
                    "raise kafkaConsumer.pollTimeoutMs if the cluster is slow"
                )
        if len(self._builder):
            yield self._builder.take()

    def _add(self, message: Message) -> None:
        offset: int = message.offset()
        if offset >= self._end:
            self._position = self._end
            return
        timestamp_type, timestamp_ms = message.timestamp()
        self._builder.add(
            message.key(),
            message.value(),
            offset,
            timestamp_ms,
            LOG_APPEND_TIME if timestamp_type == TIMESTAMP_LOG_APPEND_TIME else CREATE_TIME,
            message.headers() if self._task.include_headers else None,
        )
        self._position = offset + 1

    def _handle(self, error: KafkaError, offset: int) -> None:
        code = error.code()
        if code == KafkaError._PARTITION_EOF:
            # The end of the log: offsets up to it that never came as records
            # (compacted away, transaction markers) are skipped.
            if offset >= self._end:
                self._position = self._end
            else:
                self._position = max(self._position, offset)
                self._check_truncated()
            return
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            # Retention deleted the next records while this task was reading.
            self._skip_deleted()
            if self._position < self._end:
                self._consumer.seek(
                    KafkaTopicPartition(
                        self._kafka_tp.topic, self._kafka_tp.partition, self._position
                    )
                )
            return
        if error.fatal() or not error.retriable():
            raise KafkaException(error)
        log.warning("reading %s: %s (retrying)", self._name, error.str())

    def _skip_deleted(self) -> None:
        low, _ = self._watermarks()
        if self._position < low:
            self._lose(
                f"offsets {self._position} to {min(low, self._end) - 1} of {self._name} "
                "were deleted (retention) before they were read",
                resume_at=low,
            )

    def _check_truncated(self) -> None:
        _, high = self._watermarks()
        if high < self._end:
            self._lose(
                f"offsets {max(high, self._position)} to {self._end - 1} of {self._name} "
                "are no longer in the log",
                resume_at=self._end,
            )

    def _lose(self, what: str, resume_at: int) -> None:
        if self._task.fail_on_data_loss:
            raise DataLossError(
                f"{what}. Set failOnDataLoss=false to skip lost data with a warning."
            )
        log.warning("failOnDataLoss=false, skipping: %s", what)
        self._position = min(resume_at, self._end)

    def _watermarks(self) -> tuple[int, int]:
        low, high = self._consumer.get_watermark_offsets(
            self._kafka_tp, timeout=WATERMARK_TIMEOUT_S, cached=False
        )
        return int(low), int(high)
