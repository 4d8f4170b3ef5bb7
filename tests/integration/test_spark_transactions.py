"""Spark reads of a transactional topic: ``kafka.isolation.level=read_committed``.

A topic on three brokers (TXN_ENV, as tests/integration/test_transactions.py
runs them) is filled by confluent-kafka: plain records, committed and aborted
transactions, then a transaction left open, and after it more plain,
committed and aborted records. A read_committed reader must stop at the last
stable offset (the open transaction's first record on each partition), so it
sees the committed and plain records before it and nothing else; a
read_uncommitted reader sees every record up to the high watermark, aborted
and open ones included. Markers take offsets but are never rows.

* the ``shoal`` source, batch, straight to the brokers and through the
  gateway as a tenant, at both isolation levels;
* the ``shoal`` source, streaming (``Trigger.AvailableNow``, a checkpoint):
  a first run reads up to the LSO; once the open transaction commits, a
  second run reads its records and those behind it, each once, and never an
  aborted one;
* Spark's own source (``format("kafka")``, spark-sql-kafka, in a child
  process as tests/integration/test_spark_kafka_source.py runs it) on the
  same kind of topic: what spark-sql-kafka users see, the reference.

And the sink's ``exactlyOnce=true``, which spark-sql-kafka does not have: a
Spark write whose tasks each commit one transaction, read back by plain
confluent-kafka consumers; and a task's retry, driven through the task's own
function (``produce_transaction``) with the id Spark would give both
attempts, which fences the first attempt and leaves its records aborted.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from conftest import GatewayCluster
from harness import wait_until
from shoal.connector.writing import WriteColumns, produce_transaction, transactional_id

# Fixtures (cluster, route; jars, spark_process) and helpers of the modules that
# already run transactions and spark-sql-kafka against Shoal.
from test_spark_kafka_source import (  # noqa: F401
    _in_spark_batch_read,
    in_spark,
    jars,
    spark_process,
)
from test_transactions import (  # noqa: F401
    PARTITIONS,
    TIMEOUT_S,
    Route,
    cluster,
    direct,
    read_all,
    route,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Spark is slow on a loaded machine: a query gets this long to finish.
QUERY_TIMEOUT_S = 300
# The open transaction must outlive the test; the coordinator would abort it at its timeout.
OPEN_TRANSACTION_TIMEOUT_MS = 600_000


@dataclass
class Fill:
    """A topic as its producers left it: each record's value at its (partition, offset)."""

    topic: str
    route: Route
    open_producer: Producer
    records: dict[tuple[int, int], str] = field(default_factory=dict)

    def rows(self, *prefixes: str) -> list[tuple[str, int, int]]:
        return sorted((v, p, o) for (p, o), v in self.records.items() if v.startswith(prefixes))

    def commit_open(self) -> None:
        self.open_producer.commit_transaction(TIMEOUT_S)
        # EndTxn returns once the outcome is logged; the markers follow.
        wait_until(lambda: self.stable() == self.high(), TIMEOUT_S, f"{self.topic}: LSO at the end")

    def stable(self) -> dict[int, int]:
        return self._ends(IsolationLevel.READ_COMMITTED)

    def high(self) -> dict[int, int]:
        return self._ends(IsolationLevel.READ_UNCOMMITTED)

    def _ends(self, isolation: IsolationLevel) -> dict[int, int]:
        admin = AdminClient(self.route.settings)
        request = {
            KafkaTopicPartition(self.topic, p): OffsetSpec.latest() for p in range(PARTITIONS)
        }
        futures = admin.list_offsets(request, isolation_level=isolation)
        return {tp.partition: f.result(TIMEOUT_S).offset for tp, f in futures.items()}


# Before the open transaction (readable at read_committed: PLAIN and COMMITTED).
PLAIN, COMMITTED, ABORTED = "plain-", "committed-", "aborted-"
OPEN = "open-"
# After the open transaction's first records: behind the LSO until it ends.
LATE_PLAIN, LATE_COMMITTED, LATE_ABORTED = "late-plain-", "late-committed-", "late-aborted-"
EVERYTHING = (PLAIN, COMMITTED, ABORTED, OPEN, LATE_PLAIN, LATE_COMMITTED, LATE_ABORTED)


def fill(to: Route) -> Fill:
    """A new topic filled as the module docstring says, its LSO at the open transaction."""
    topic = to.create_topic()
    writer = to.producer(f"writer-{uuid.uuid4().hex[:6]}")
    writer.init_transactions(TIMEOUT_S)
    opener = to.producer(
        f"opener-{uuid.uuid4().hex[:6]}",
        **{"transaction.timeout.ms": OPEN_TRANSACTION_TIMEOUT_MS},
    )
    opener.init_transactions(TIMEOUT_S)
    plain = Producer({**to.settings, "acks": "all"})
    filled = Fill(topic, to, opener)

    def acknowledged(error: Any, message: Any) -> None:
        assert error is None, error
        filled.records[(message.partition(), message.offset())] = message.value().decode()

    def send(producer: Producer, prefix: str, count: int) -> None:
        for i in range(count):
            value = f"{prefix}{i}".encode()
            producer.produce(topic, value=value, partition=i % PARTITIONS, on_delivery=acknowledged)
        assert producer.flush(TIMEOUT_S) == 0

    def transaction(prefix: str, count: int, commit: bool) -> None:
        writer.begin_transaction()
        send(writer, prefix, count)
        if commit:
            writer.commit_transaction(TIMEOUT_S)
        else:
            writer.abort_transaction(TIMEOUT_S)

    send(plain, PLAIN, 6)
    transaction(f"{COMMITTED}a-", 9, commit=True)
    transaction(f"{ABORTED}a-", 7, commit=False)
    send(plain, f"{PLAIN}b-", 4)
    transaction(f"{COMMITTED}b-", 5, commit=True)
    transaction(f"{ABORTED}b-", 6, commit=False)  # the last thing below the LSO: aborted
    opener.begin_transaction()
    send(opener, OPEN, 6)  # on every partition, so every partition's LSO is here
    send(plain, LATE_PLAIN, 5)
    transaction(LATE_COMMITTED, 4, commit=True)
    transaction(LATE_ABORTED, 3, commit=False)
    # Every partition's LSO is its first open record, once the markers before it are written.
    first_open = {
        partition: min(
            o for (p, o), v in filled.records.items() if p == partition and v.startswith(OPEN)
        )
        for partition in range(PARTITIONS)
    }
    wait_until(lambda: filled.stable() == first_open, TIMEOUT_S, f"LSO of {topic} at {first_open}")
    return filled


@contextmanager
def filled_by(to: Route) -> Iterator[Fill]:
    topic = fill(to)
    try:
        yield topic
    finally:
        # Unless the test committed it, the open transaction ends with the test.
        with suppress(KafkaException):
            topic.open_producer.abort_transaction(TIMEOUT_S)


@pytest.fixture
def filled(route: Route) -> Iterator[Fill]:  # noqa: F811
    """A filled topic, straight to the brokers and through the gateway as a tenant."""
    with filled_by(route) as topic:
        yield topic


@pytest.fixture
def filled_direct(cluster: GatewayCluster) -> Iterator[Fill]:  # noqa: F811
    with filled_by(direct(cluster)) as topic:
        yield topic


def shoal_options(filled: Fill, isolation: str | None) -> dict[str, str]:
    options = {f"kafka.{k}": str(v) for k, v in filled.route.settings.items()}
    if isolation is not None:
        options["kafka.isolation.level"] = isolation
    return {**options, "subscribe": filled.topic}


def batch_rows(spark: Any, options: dict[str, str]) -> list[tuple[str, int, int]]:
    frame = (
        spark.read.format("shoal")
        .options(**options)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    rows = frame.selectExpr("CAST(value AS STRING) AS value", "partition", "offset").collect()
    return sorted((row.value, row.partition, row.offset) for row in rows)


def test_a_batch_read_returns_what_its_isolation_level_allows(
    spark: Any,
    filled: Fill,
) -> None:
    rows = batch_rows(spark, shoal_options(filled, "read_committed"))
    assert rows == filled.rows(PLAIN, COMMITTED), (
        "every plain and committed record below the LSO, once; no aborted, open or later one"
    )
    # read_uncommitted is the default, as in spark-sql-kafka.
    rows = batch_rows(spark, shoal_options(filled, None))
    assert rows == filled.rows(*EVERYTHING)
    explicit = batch_rows(spark, shoal_options(filled, "read_uncommitted"))
    assert explicit == rows
    # The transactions' markers took offsets that are not rows.
    assert sum(filled.high().values()) > len(rows)


def run_stream(spark: Any, options: dict[str, str], checkpoint: Path, output: Path) -> None:
    """One AvailableNow run of a read_committed stream into parquet."""
    query = (
        spark.readStream.format("shoal")
        .options(**options)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    assert finished, f"the AvailableNow query did not finish in {QUERY_TIMEOUT_S} s"


def written(output: Path) -> list[tuple[str, int, int]]:
    if not any(output.glob("*.parquet")):
        return []
    table = pq.read_table(output)
    return sorted(
        zip(*(table.column(c).to_pylist() for c in ("value", "partition", "offset")), strict=True)
    )


def test_a_read_committed_stream_reads_the_open_transaction_once_it_commits(
    spark: Any, filled_direct: Fill, tmp_path: Path
) -> None:
    options = shoal_options(filled_direct, "read_committed")
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"
    run_stream(spark, options, checkpoint, output)
    assert written(output) == filled_direct.rows(PLAIN, COMMITTED)

    filled_direct.commit_open()
    run_stream(spark, options, checkpoint, output)
    rows = written(output)
    # Each once (a list, duplicates kept): the second run starts at the first one's end.
    assert rows == filled_direct.rows(PLAIN, COMMITTED, OPEN, LATE_PLAIN, LATE_COMMITTED)


def test_spark_kafka_source_reads_the_same_records_at_each_isolation_level(
    spark_process: ProcessPoolExecutor,  # noqa: F811
    filled_direct: Fill,
) -> None:
    """The reference: Spark's own source, with the same kafka.isolation.level option."""
    options = {"kafka.bootstrap.servers": filled_direct.route.settings["bootstrap.servers"]}

    def read(isolation: str) -> list[tuple[str, int, int]]:
        records = in_spark(
            spark_process,
            _in_spark_batch_read,
            {**options, "kafka.isolation.level": isolation},
            filled_direct.topic,
        )
        return sorted(
            (value.decode(), partition, offset) for _, value, _, partition, offset, *_ in records
        )

    assert read("read_committed") == filled_direct.rows(PLAIN, COMMITTED)
    assert read("read_uncommitted") == filled_direct.rows(*EVERYTHING)


# -- the sink's exactlyOnce option ---------------------------------------------------------

ROWS = 30
SPARK_PARTITIONS = 2


def values(prefix: str = "row-") -> list[str]:
    return [f"{prefix}{i}" for i in range(ROWS)]


def ends(to: Route, topic: str, isolation: IsolationLevel) -> dict[int, int]:
    admin = AdminClient(to.settings)
    request = {KafkaTopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)}
    futures = admin.list_offsets(request, isolation_level=isolation)
    return {tp.partition: f.result(TIMEOUT_S).offset for tp, f in futures.items()}


def write_options(to: Route, topic: str, **extra: str) -> dict[str, str]:
    return {**{f"kafka.{k}": str(v) for k, v in to.settings.items()}, "topic": topic, **extra}


def test_an_exactly_once_write_commits_every_row_once_in_transactions(
    spark: Any,
    route: Route,  # noqa: F811
) -> None:
    topic = route.create_topic()
    rows = [(value, i % PARTITIONS) for i, value in enumerate(values())]
    # Two Spark partitions, each with rows for every Kafka partition.
    frame = spark.createDataFrame(
        spark.sparkContext.parallelize(rows, SPARK_PARTITIONS), "value string, partition int"
    )
    assert frame.rdd.getNumPartitions() == SPARK_PARTITIONS
    frame.write.format("shoal").options(**write_options(route, topic, exactlyOnce="true")).mode(
        "append"
    ).save()

    committed = read_all(route.consumer("read_committed"), topic, ROWS)
    assert sorted(committed) == sorted(values()), "every row once, no marker as a record"
    # Nothing was aborted: a read_uncommitted reader sees the same rows.
    assert sorted(read_all(route.consumer("read_uncommitted"), topic, ROWS)) == sorted(values())
    # Each task's transaction ended with a commit marker on every Kafka partition it wrote to,
    # and every transaction is over (the LSO is the high watermark).
    high = ends(route, topic, IsolationLevel.READ_UNCOMMITTED)
    assert sum(high.values()) == ROWS + SPARK_PARTITIONS * PARTITIONS
    assert ends(route, topic, IsolationLevel.READ_COMMITTED) == high


def test_a_retried_task_fences_its_failed_attempt_and_its_rows_appear_once(
    route: Route,  # noqa: F811
) -> None:
    """Two attempts of one task, as Spark would run them: same rows, same transactional id.

    The first produces its rows and hangs before committing (a lost executor, a
    straggler); the retry's init_transactions fences it and aborts its
    transaction; when the first wakes up and commits it is refused.
    """
    topic = route.create_topic()
    client = {k: str(v) for k, v in route.settings.items()}
    txn_id = transactional_id(f"retry-{uuid.uuid4().hex[:8]}", 0)
    columns = WriteColumns(key=False, topic=False, partition=True, headers=False)
    batch = pa.record_batch(
        {
            "value": pa.array([v.encode() for v in values()], pa.binary()),
            "partition": pa.array([i % PARTITIONS for i in range(ROWS)], pa.int32()),
        }
    )
    woken = threading.Event()

    def first_attempt_rows() -> Iterator[pa.RecordBatch]:
        yield batch
        woken.wait(TIMEOUT_S)

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(
            produce_transaction, client, txn_id, topic, columns, first_attempt_rows()
        )
        wait_until(
            lambda: sum(ends(route, topic, IsolationLevel.READ_UNCOMMITTED).values()) >= ROWS,
            TIMEOUT_S,
            "the first attempt's records in the log",
        )
        retry = produce_transaction(client, txn_id, topic, columns, iter([batch]))
        woken.set()
        with pytest.raises(KafkaException) as refused:
            first.result(TIMEOUT_S)
    assert retry.records == ROWS
    # librdkafka reports the brokers' PRODUCER_FENCED as its fatal _FENCED, when ending the
    # transaction: the first attempt's commit fails.
    error: KafkaError = refused.value.args[0]
    assert error.fatal(), error
    assert error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), error

    assert sorted(read_all(route.consumer("read_committed"), topic, ROWS)) == sorted(values())
    # Both attempts' records are in the log; the first attempt's were aborted.
    uncommitted = read_all(route.consumer("read_uncommitted"), topic, 2 * ROWS)
    assert sorted(uncommitted) == sorted(values() * 2)
    high = ends(route, topic, IsolationLevel.READ_UNCOMMITTED)
    assert ends(route, topic, IsolationLevel.READ_COMMITTED) == high, "no transaction left open"
