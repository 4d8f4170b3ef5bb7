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
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import IsolationLevel, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from conftest import GatewayCluster
from harness import wait_until

# Fixtures (cluster, route; jars, spark_process) and helpers of the modules that
# already run transactions and spark-sql-kafka against Shoal.
from test_spark_kafka_source import (  # noqa: F401
    _in_spark_batch_read,
    in_spark,
    jars,
    spark_process,
)
from test_transactions import PARTITIONS, TIMEOUT_S, Route, cluster, direct, route  # noqa: F401

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
