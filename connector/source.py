"""The PySpark data source ``shoal``: Spark's side of reads and writes.

Thin by design: options are parsed in ``options``, offsets planned in
``planner``, ranges read in ``reading`` and rows produced in ``writing``.
Spark pickles readers and writers into its Python workers, so they carry only
parsed options; clients are made where they are used.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType
from shoal.connector.cluster import Cluster
from shoal.connector.offsets import OffsetRange
from shoal.connector.options import (
    Mode,
    OptionError,
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_write_options,
)
from shoal.connector.planner import StreamPlanner, plan_batch
from shoal.connector.reading import ReadTask, read_range
from shoal.connector.schema import read_schema
from shoal.connector.writing import (
    WriteColumns,
    check_write_schema,
    default_transactional_id_prefix,
    produce_batches,
    produce_transaction,
    transactional_id,
)

log = logging.getLogger("shoal.connector")


class ShoalDataSource(DataSource):
    """``spark.read.format("shoal")``: Shoal topics, with Spark's Kafka source options."""

    @classmethod
    def name(cls) -> str:
        return "shoal"

    def schema(self) -> StructType:
        return read_schema(str(self.options.get("includeheaders", "false")).lower() == "true")

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options, Mode.BATCH)
        _check_fixed_schema(schema, options)
        return ShoalBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_read_options(self.options, Mode.STREAMING)
        _check_fixed_schema(schema, options)
        return ShoalStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> ShoalBatchWriter:
        if overwrite:
            raise OptionError("mode overwrite is not supported: records are appended to topics")
        options = parse_write_options(self.options, Mode.BATCH)
        prefix = None
        if options.exactly_once:
            # Chosen here, on the driver, once per write: every task attempt
            # unpickles this writer, so attempts of one task share their id.
            prefix = options.transactional_id_prefix or default_transactional_id_prefix(
                options.topic
            )
        return ShoalBatchWriter(options, _write_columns(schema, options), prefix)

    def streamWriter(self, schema: StructType, overwrite: bool) -> ShoalStreamWriter:
        options = parse_write_options(self.options, Mode.STREAMING)
        return ShoalStreamWriter(options, _write_columns(schema, options))


class RangePartition(InputPartition):
    """One Spark task: one offset range of one partition."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task.range)
        self.task = task


def _partitions(options: ReadOptions, ranges: Sequence[OffsetRange]) -> list[RangePartition]:
    return [
        RangePartition(
            ReadTask(
                client=options.client,
                range=r,
                include_headers=options.include_headers,
                fail_on_data_loss=options.fail_on_data_loss,
                poll_timeout_ms=options.poll_timeout_ms,
            )
        )
        for r in ranges
    ]


def _read(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    # With nothing to read, Spark still runs one task, with a plain InputPartition.
    if isinstance(partition, RangePartition):
        yield from read_range(partition.task)


class ShoalBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(self._options, plan_batch(self._options, Cluster(self._options.client)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class ShoalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read; offsets are spark-sql-kafka's JSON, kept in the checkpoint."""

    def __init__(self, options: ReadOptions) -> None:
        self._options = options
        self._planner: StreamPlanner | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The planner holds a client, which cannot travel to executors.
        return {**self.__dict__, "_planner": None}

    @property
    def planner(self) -> StreamPlanner:
        if self._planner is None:
            self._planner = StreamPlanner(self._options, Cluster(self._options.client))
        return self._planner

    def initialOffset(self) -> dict[str, object]:
        return self.planner.initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict[str, object], limit: ReadLimit) -> dict[str, object]:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return self.planner.latest_offset(start, max_rows)

    def reportLatestOffset(self) -> dict[str, object] | None:
        return self.planner.last_seen_latest()

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.prepare_available_now()

    def partitions(
        self, start: dict[str, object], end: dict[str, object]
    ) -> Sequence[InputPartition]:
        return _partitions(self._options, self.planner.plan(start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def commit(self, end: dict[str, object]) -> None:
        """Nothing to do: Spark's checkpoint is the only record of progress."""


@dataclass
class WriteCommitMessage(WriterCommitMessage):
    """A task's report: how many records (and key and value bytes) were acknowledged."""

    records: int
    bytes: int


class ShoalBatchWriter(DataSourceArrowWriter):
    """A batch write; with ``transactional_id_prefix``, one transaction per task.

    Each task commits its own transaction before it returns (``writing``
    says why there), so ``commit`` and ``abort`` on the driver only log: a
    failed write leaves the partitions whose tasks committed visible.
    """

    def __init__(
        self,
        options: WriteOptions,
        columns: WriteColumns,
        transactional_id_prefix: str | None = None,
    ) -> None:
        self._options = options
        self._columns = columns
        self.transactional_id_prefix = transactional_id_prefix

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommitMessage:
        if self.transactional_id_prefix is None:
            return _write(self._options, self._columns, iterator)
        return _write_transaction(
            self._options, self._columns, self.transactional_id_prefix, iterator
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_commit(messages, "write")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.transactional_id_prefix is None:
            _log_abort(messages, "write")
            return
        committed = sum(m.records for m in messages if isinstance(m, WriteCommitMessage))
        log.warning(
            "exactly-once write aborted; %d records of tasks that committed their "
            "transactions stay visible; other tasks' transactions are aborted, at the "
            "latest at their transaction timeout",
            committed,
        )


class ShoalStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions, columns: WriteColumns) -> None:
        self._options = options
        self._columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommitMessage:
        return _write(self._options, self._columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_commit(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_abort(messages, f"micro-batch {batchId}")


def _write(
    options: WriteOptions, columns: WriteColumns, batches: Iterator[pa.RecordBatch]
) -> WriteCommitMessage:
    report = produce_batches(options.client, options.topic, columns, batches)
    log.info("task wrote %d records (%d bytes)", report.records, report.bytes)
    return WriteCommitMessage(report.records, report.bytes)


def _write_transaction(
    options: WriteOptions,
    columns: WriteColumns,
    prefix: str,
    batches: Iterator[pa.RecordBatch],
) -> WriteCommitMessage:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("an exactly-once write runs in a Spark task, which has a TaskContext")
    # The partition, not the attempt: a retry must fence the attempt it replaces.
    txn_id = transactional_id(prefix, context.partitionId())
    report = produce_transaction(options.client, txn_id, options.topic, columns, batches)
    log.info(
        "task %s (attempt %d) committed %d records (%d bytes) in transaction %s",
        context.partitionId(),
        context.attemptNumber(),
        report.records,
        report.bytes,
        txn_id,
    )
    return WriteCommitMessage(report.records, report.bytes)


def _log_commit(messages: list[WriterCommitMessage | None], what: str) -> None:
    reports = [m for m in messages if isinstance(m, WriteCommitMessage)]
    log.info(
        "%s: %d records (%d bytes) acknowledged by %d tasks: %s",
        what,
        sum(r.records for r in reports),
        sum(r.bytes for r in reports),
        len(reports),
        ", ".join(str(r.records) for r in reports),
    )


def _log_abort(messages: list[WriterCommitMessage | None], what: str) -> None:
    acknowledged = sum(m.records for m in messages if isinstance(m, WriteCommitMessage))
    # Kafka has no rollback outside transactions: what was acknowledged stays.
    log.warning(
        "%s aborted; %d records were already acknowledged and stay in their topics",
        what,
        acknowledged,
    )


def _check_fixed_schema(schema: StructType, options: ReadOptions) -> None:
    expected = read_schema(options.include_headers)
    if schema.simpleString() != expected.simpleString():
        raise OptionError(
            f"the shoal source has a fixed schema ({expected.simpleString()}); "
            "it cannot be read with another one"
        )


def _write_columns(schema: StructType, options: WriteOptions) -> WriteColumns:
    return check_write_schema(
        {field.name: field.dataType.simpleString() for field in schema.fields}, options.topic
    )
