"""Spark's own Kafka source and sink (``format("kafka")``) against Shoal, through the gateway.

Not the ``shoal`` data source: the ``spark-sql-kafka-0-10`` connector Apache
Spark ships, with the tenant's API key given as Spark passes any Kafka
client setting (``kafka.security.protocol``, ``kafka.sasl.mechanism``,
``kafka.sasl.jaas.config``). ``make spark-kafka`` fetches its jars from
Maven Central, pinned in tools/spark-kafka/pom.xml at PySpark's own version
and checked by Maven, so this test never skips; the SparkSession (local[2],
no UI, as tests/conftest.py builds its own) gets them with ``spark.jars``.

* a batch read of a topic that confluent-kafka wrote returns every record
  with its key (or null), value, topic (the tenant's name), partition,
  offset, timestamp and headers (``includeHeaders``);
* a batch write (``key``, ``value``, ``partition`` and ``headers`` columns)
  is read back by confluent-kafka, record for record;
* a streaming query with a checkpoint and ``Trigger.AvailableNow``, run
  twice with records produced in between, writes each record once: the
  second run starts where the checkpoint's offsets say the first ended.

``spark.jars`` is read when a JVM starts, and the suite's session-wide
SparkSession (tests/conftest.py ``spark``) may already be running in this
process; so Spark runs here in a child process of its own (spawned, one JVM
for the module), and the functions prefixed ``_in_spark`` run there.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from gateway_env import TenantKey
from harness import SHORT_LIVED_SPARK_JVM

# A cold `make spark-kafka` downloads about 10 MB from Maven Central.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
POM = REPO / "tools" / "spark-kafka" / "pom.xml"
TENANT = "sparkkafka"
SPARK_TIMEOUT_S = 180
# What pyspark/jars lacks for format("kafka"), and so what the pom must bring: no more.
JARS = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
)

Record = tuple[bytes | None, bytes, str, int, int, int, int, tuple[tuple[str, bytes | None], ...]]
"""key, value, topic, partition, offset, timestamp (ms), timestamp type, headers."""


def pinned_version() -> str:
    match = re.search(r"<spark\.version>\s*([^<\s]+)\s*</spark\.version>", POM.read_text())
    assert match, f"no <spark.version> in {POM}"
    return match.group(1)


def version_mismatch() -> str | None:
    import pyspark

    pinned = pinned_version()
    if pinned == pyspark.__version__:
        return None
    return (
        f"PySpark {pyspark.__version__} is installed but {POM.relative_to(REPO)} pins "
        f"spark-sql-kafka-0-10 {pinned}: a connector must come from the same Spark release. "
        "Set <spark.version> to PySpark's version (if Maven Central has that release) "
        "or pin pyspark to the pom's version in pyproject.toml"
    )


# -- in the Spark process ------------------------------------------------------------------------

_SPARK: dict[str, Any] = {}  # the child's SparkSession, under "session"


def _session() -> Any:
    return _SPARK["session"]


def _in_spark_start(jars: list[str], local_dir: str) -> None:
    # Spark's Python workers must run this interpreter, which has shoal's test deps.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("shoal-spark-kafka")
        .config("spark.jars", ",".join(jars))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", local_dir)
        .config("spark.driver.extraJavaOptions", SHORT_LIVED_SPARK_JVM)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    _SPARK["session"] = session


def _in_spark_stop() -> None:
    if "session" in _SPARK:
        _SPARK.pop("session").stop()


def _in_spark_version() -> str:
    return str(_session().version)


def _in_spark_batch_read(options: dict[str, str], topic: str) -> list[Record]:
    frame = (
        _session()
        .read.format("kafka")
        .options(**options)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .load()
    )
    rows = frame.selectExpr(
        "key", "value", "topic", "partition", "offset",
        "unix_millis(timestamp) AS timestamp", "timestampType", "headers",
    ).collect()  # fmt: skip
    return [
        (
            None if row.key is None else bytes(row.key),
            bytes(row.value),
            row.topic,
            row.partition,
            row.offset,
            row.timestamp,
            row.timestampType,
            tuple((h.key, None if h.value is None else bytes(h.value)) for h in row.headers or ()),
        )
        for row in rows
    ]


def _in_spark_batch_write(options: dict[str, str], topic: str, rows: list[Any]) -> None:
    schema = (
        "key string, value string, partition int, headers array<struct<key:string,value:binary>>"
    )
    frame = _session().createDataFrame(rows, schema)
    frame.write.format("kafka").options(**options).option("topic", topic).save()


def _in_spark_stream(options: dict[str, str], topic: str, checkpoint: str, output: str) -> int:
    """One run of the query until it has read what was there (AvailableNow): input rows."""
    query = (
        _session()
        .readStream.format("kafka")
        .options(**options)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
        .writeStream.format("parquet")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = query.awaitTermination(SPARK_TIMEOUT_S - 30)
    finally:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    assert finished, "the AvailableNow query did not finish"
    return sum(int(progress["numInputRows"]) for progress in query.recentProgress)


def _in_spark_read_output(output: str) -> list[tuple[str, int, int]]:
    return [(r.value, r.partition, r.offset) for r in _session().read.parquet(output).collect()]


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jars() -> list[Path]:
    """The connector's jars, installed by `make spark-kafka` at the pinned version."""
    if (mismatch := version_mismatch()) is not None:
        pytest.fail(mismatch)
    home = Path.home() / ".cache" / "shoal" / f"spark-kafka-{pinned_version()}"
    subprocess.run(
        ["make", "spark-kafka", f"SPARK_KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=600
    )
    found = sorted((home / "jars").glob("*.jar"))
    names = sorted(re.sub(r"-[0-9][^-]*\.jar$", "", jar.name) for jar in found)
    assert names == sorted(JARS), found
    return found


@pytest.fixture(scope="module")
def spark_process(jars: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A child process holding one SparkSession with the connector on its classpath."""
    local_dir = tmp_path_factory.mktemp("spark-kafka-local")
    pool = ProcessPoolExecutor(
        1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_in_spark_start,
        initargs=([str(jar) for jar in jars], str(local_dir)),
    )
    try:
        assert pool.submit(_in_spark_version).result(SPARK_TIMEOUT_S) == pinned_version()
        yield pool
    finally:
        try:
            pool.submit(_in_spark_stop).result(60)
        finally:
            pool.shutdown()


@pytest.fixture(scope="module")
def key(gateway_cluster: Any) -> TenantKey:
    tenant: TenantKey = gateway_cluster.tenant(TENANT)
    return tenant


@pytest.fixture
def topic(key: TenantKey) -> str:
    name = f"t{uuid.uuid4().hex[:8]}"
    admin = AdminClient(key.librdkafka())
    for future in admin.create_topics([NewTopic(name, 3, 3)]).values():
        future.result(30)
    return name


def spark_options(key: TenantKey) -> dict[str, str]:
    """The tenant's key as Spark hands settings to its Kafka clients (a ``kafka.`` prefix)."""
    return {
        "kafka.bootstrap.servers": key.bootstrap(),
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{key.key_id}" password="{key.secret}";'
        ),
    }


def in_spark(spark_process: ProcessPoolExecutor, function: Any, *args: Any) -> Any:
    return spark_process.submit(function, *args).result(SPARK_TIMEOUT_S)


def produce(key: TenantKey, topic: str, records: list[dict[str, Any]]) -> list[Record]:
    """Each record as Kafka stored it: the partition, offset and timestamp of its
    acknowledgement (which carries no headers: those are the record's own)."""
    stored: list[Record] = []

    def acknowledged(record: dict[str, Any], error: Any, message: Any) -> None:
        assert error is None, error
        kind, timestamp = message.timestamp()
        assert kind == TIMESTAMP_CREATE_TIME, kind
        stored.append(
            (
                message.key(),
                message.value(),
                message.topic(),
                message.partition(),
                message.offset(),
                timestamp,
                0,  # Kafka's CreateTime, as Spark's timestampType column numbers it
                tuple(record.get("headers", ())),
            )
        )

    producer = Producer(key.librdkafka(**{"acks": "all", "linger.ms": 5}))
    for record in records:
        producer.produce(topic, on_delivery=partial(acknowledged, record), **record)
    assert producer.flush(30) == 0
    assert len(stored) == len(records)
    return stored


def consume_all(key: TenantKey, topic: str, partitions: int) -> list[Any]:
    consumer = Consumer(key.librdkafka(**{"group.id": f"reader-{topic}"}))
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in ends if ends[p]])
        messages = []
        while sum(ends.values()) > len(messages):
            message = consumer.poll(10)
            assert message is not None, f"{topic} ended early: {len(messages)} of {ends}"
            assert message.error() is None, message.error()
            messages.append(message)
        return messages
    finally:
        consumer.close()


# -- the tests -----------------------------------------------------------------------------------


def test_the_connector_is_the_installed_pysparks_release() -> None:
    assert version_mismatch() is None, version_mismatch()


def test_a_batch_read_returns_every_record_as_produced(
    spark_process: ProcessPoolExecutor, key: TenantKey, topic: str
) -> None:
    base = 1_700_000_000_000
    records: list[dict[str, Any]] = [
        {
            "key": None if i % 10 == 0 else f"key-{i % 7}".encode(),
            "value": f"value {i}".encode(),
            "timestamp": base + i,
        }
        for i in range(120)
    ]
    for i, record in enumerate(records):
        if i % 3:
            record["headers"] = [("n", str(i).encode()), ("empty", None)]
    # Pin some to each partition, let the partitioner place the others.
    for i, record in enumerate(records[:30]):
        record["partition"] = i % 3
    stored = produce(key, topic, records)

    read = in_spark(spark_process, _in_spark_batch_read, spark_options(key), topic)
    assert sorted(read, key=lambda r: (r[3], r[4])) == sorted(stored, key=lambda r: (r[3], r[4]))
    # Offsets 0..n-1 per partition, nothing missing or repeated.
    per_partition = Counter(r[3] for r in read)
    assert sorted(r[4] for r in read if r[3] == 0) == list(range(per_partition[0]))
    assert {r[2] for r in read} == {topic}  # the tenant's name, never the brokers'


def test_a_batch_write_is_read_back_by_confluent_kafka(
    spark_process: ProcessPoolExecutor, key: TenantKey, topic: str
) -> None:
    rows = [
        (
            f"key-{i}" if i % 4 else None,
            f"written by spark {i}",
            i % 3,
            [("source", b"spark"), ("i", str(i).encode())],
        )
        for i in range(90)
    ]
    in_spark(spark_process, _in_spark_batch_write, spark_options(key), topic, rows)

    messages = consume_all(key, topic, 3)
    got = Counter(
        (
            None if m.key() is None else m.key().decode(),
            m.value().decode(),
            m.partition(),
            tuple(m.headers() or ()),
        )
        for m in messages
    )
    want = Counter((k, v, p, tuple(h)) for k, v, p, h in rows)
    assert got == want


def test_an_available_now_stream_sees_each_record_once_across_runs(
    spark_process: ProcessPoolExecutor, key: TenantKey, topic: str, tmp_path: Path
) -> None:
    checkpoint, output = str(tmp_path / "checkpoint"), str(tmp_path / "output")
    options = spark_options(key)
    first = produce(key, topic, [{"value": f"first {i}".encode()} for i in range(150)])

    run = (_in_spark_stream, options, topic, checkpoint, output)
    assert in_spark(spark_process, *run) == len(first)
    seen = in_spark(spark_process, _in_spark_read_output, output)
    assert Counter(seen) == Counter((r[1].decode(), r[3], r[4]) for r in first)

    # The query is gone; more records come; the same checkpoint reads only those.
    second = produce(key, topic, [{"value": f"second {i}".encode()} for i in range(100)])
    assert in_spark(spark_process, *run) == len(second)
    seen = in_spark(spark_process, _in_spark_read_output, output)
    assert Counter(seen) == Counter((r[1].decode(), r[3], r[4]) for r in first + second)
    assert max(Counter(seen).values()) == 1
