"""The ``shoal`` PySpark data source against a live cluster, through the gateway,
with a tenant's key: local-mode Spark, real brokers, real gateway."""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic, OffsetSpec
from conftest import EtcdServer, GatewayCluster, start_gateway_cluster
from harness import wait_until
from shoal.connector import client_options

pytestmark = pytest.mark.slow

# Retention runs every 200 ms so a test can watch records expire.
BROKER_ENV = {"SHOAL_LOG_RETENTION_CHECK_INTERVAL_MS": "200"}


@dataclass(frozen=True)
class Produced:
    key: bytes | None
    value: bytes
    partition: int
    offset: int
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...] | None


@pytest.fixture(scope="module")
def cluster(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    root = tmp_path_factory.mktemp("spark-cluster")
    started, brokers = start_gateway_cluster(etcd, root, brokers=3, broker_env=BROKER_ENV)
    yield started
    started.gateway.stop()
    for broker in brokers:
        broker.kill()


@pytest.fixture(scope="module")
def tenant(cluster: GatewayCluster, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return cluster.tenant(f"spark{uuid.uuid4().hex[:6]}")


@pytest.fixture(scope="module")
def options(tenant: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tenant's client.properties, as the connector's kafka.* options."""
    path = tenant.properties_file(tmp_path_factory.mktemp("client") / "client.properties")
    return client_options(path)


def new_topic(tenant: Any, partitions: int = 3, **config: str) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(tenant.librdkafka())
    admin.create_topics([NewTopic(name, partitions, config=config)])[name].result(30)
    return name


def produce(tenant: Any, topic: str, count: int, start: int = 0, **fields: Any) -> list[Produced]:
    """``count`` records with distinct keys, values and headers, as acknowledged."""
    producer = Producer(tenant.librdkafka(acks="all", **{"linger.ms": 5}))
    acked: list[Produced] = []

    def on_delivery(headers: Any, error: Any, message: Any) -> None:
        assert error is None, error
        _, timestamp = message.timestamp()
        acked.append(
            Produced(
                message.key(),
                message.value(),
                message.partition(),
                message.offset(),
                timestamp,
                tuple(headers) if headers else None,
            )
        )

    for i in range(start, start + count):
        headers = [("n", b"%d" % i), ("bin", bytes([i % 256, 0, 255]))] if i % 3 else None
        producer.produce(
            topic,
            value=b"value-%d-" % i + bytes(range(i % 50)),
            key=None if i % 10 == 0 else b"key-%d" % (i % 17),
            headers=headers,
            # Delivery reports do not carry headers: remember the ones sent.
            on_delivery=functools.partial(on_delivery, headers),
            **fields,
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    return acked


def position(record: Produced) -> tuple[int, int]:
    return record.partition, record.offset


def as_produced(row: Any) -> Produced:
    headers = (
        tuple((h["key"], bytes(h["value"])) for h in row["headers"]) if row["headers"] else None
    )
    return Produced(
        bytes(row["key"]) if row["key"] is not None else None,
        bytes(row["value"]),
        row["partition"],
        row["offset"],
        int(row["timestamp"].timestamp() * 1000),
        headers,
    )


def test_a_batch_read_of_exact_ranges_returns_exactly_the_records_produced(
    spark: Any, tenant: Any, options: dict[str, str]
) -> None:
    topic = new_topic(tenant)
    produced = produce(tenant, topic, 600)
    by_partition = {p: sorted(r.offset for r in produced if r.partition == p) for p in range(3)}
    assert all(by_partition.values()), by_partition
    # Partition 0 from its third record to its last but one; partition 1 whole;
    # partition 2 up to (not including) its tenth.
    starting = {topic: {"0": by_partition[0][2], "1": -2, "2": -2}}
    ending = {topic: {"0": by_partition[0][-1], "1": -1, "2": by_partition[2][9]}}
    df = (
        spark.read.format("shoal")
        .options(**options)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("minPartitions", "7")
        .load()
    )
    assert df.rdd.getNumPartitions() >= 7
    rows = df.collect()
    assert {row["topic"] for row in rows} == {topic}
    assert {row["timestampType"] for row in rows} == {0}
    expected = sorted(
        (
            r
            for r in produced
            if (r.partition == 0 and by_partition[0][2] <= r.offset < by_partition[0][-1])
            or r.partition == 1
            or (r.partition == 2 and r.offset < by_partition[2][9])
        ),
        key=position,
    )
    assert sorted((as_produced(row) for row in rows), key=position) == expected


def test_the_schema_is_spark_kafkas(spark: Any, tenant: Any, options: dict[str, str]) -> None:
    topic = new_topic(tenant, partitions=1)
    df = spark.read.format("shoal").options(**options).option("subscribe", topic).load()
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    assert df.count() == 0


def test_a_write_then_a_read_round_trips(spark: Any, tenant: Any, options: dict[str, str]) -> None:
    topic = new_topic(tenant)
    rows = [
        (f"k{i}" if i % 4 else None, f"value {i}".encode(), i % 3, [("i", str(i).encode())])
        for i in range(500)
    ]
    frame = spark.createDataFrame(
        rows,
        "key string, value binary, partition int, headers array<struct<key:string,value:binary>>",
    )
    frame.write.mode("append").format("shoal").options(**options).option("topic", topic).save()
    read = (
        spark.read.format("shoal")
        .options(**options)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
        .collect()
    )
    got = [
        (
            None if r["key"] is None else bytes(r["key"]).decode(),
            bytes(r["value"]),
            r["partition"],
            [(h["key"], bytes(h["value"])) for h in r["headers"]],
        )
        for r in read
    ]
    assert sorted(got, key=_row_order) == sorted(rows, key=_row_order)


def _row_order(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return (row[0] is not None, row[0] or "", row[1], row[2], row[3])


def test_a_write_names_a_missing_topic_and_bad_columns(
    spark: Any, tenant: Any, options: dict[str, str]
) -> None:
    frame = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="give the topic option or a topic column"):
        frame.write.mode("append").format("shoal").options(**options).save()
    bad = spark.createDataFrame([(1,)], "value int")
    with pytest.raises(Exception, match="column value must be string or binary, not int"):
        bad.write.mode("append").format("shoal").options(**options).option("topic", "x").save()


def stream(spark: Any, options: dict[str, str], topic: str, **extra: str) -> Any:
    reader = spark.readStream.format("shoal").options(**options).option("subscribe", topic)
    for name, value in extra.items():
        reader = reader.option(name, value)
    return reader.load()


def parquet_rows(path: Path) -> list[tuple[int, int, bytes]]:
    table = pq.read_table(path)
    return sorted(
        zip(
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    )


def copy_available_now(records: Any, out: Path, checkpoint: Path) -> None:
    """Run a query that copies what is there now into Parquet, to its end."""
    query = (
        records.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None


def test_a_streaming_query_stopped_mid_way_resumes_from_its_checkpoint_exactly_once(
    spark: Any, tenant: Any, options: dict[str, str], tmp_path: Path
) -> None:
    topic = new_topic(tenant)
    produced = produce(tenant, topic, 3000)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(**trigger: Any) -> Any:
        return (
            stream(spark, options, topic, startingOffsets="earliest", maxOffsetsPerTrigger="200")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    query = start(processingTime="100 milliseconds")
    wait_until(lambda: len(query.recentProgress) >= 3, 120, "three micro-batches")
    query.stop()
    first_run = sum(p["numInputRows"] for p in query.recentProgress)
    assert 0 < first_run < 3000, first_run
    more = produce(tenant, topic, 500, start=3000)
    query = start(availableNow=True)
    query.awaitTermination(180)
    assert query.exception() is None
    expected = sorted((r.partition, r.offset, r.value) for r in produced + more)
    assert parquet_rows(out) == expected


def test_max_offsets_per_trigger_caps_every_micro_batch(
    spark: Any, tenant: Any, options: dict[str, str], tmp_path: Path
) -> None:
    topic = new_topic(tenant)
    produce(tenant, topic, 1000)
    query = (
        stream(spark, options, topic, startingOffsets="earliest", maxOffsetsPerTrigger="150")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 1000
    assert max(sizes) <= 150
    assert len(sizes) == 7, sizes


def test_a_query_from_latest_reads_only_what_comes_after_it_started(
    spark: Any, tenant: Any, options: dict[str, str], tmp_path: Path
) -> None:
    topic = new_topic(tenant, partitions=2)
    produce(tenant, topic, 100)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> None:
        copy_available_now(stream(spark, options, topic, startingOffsets="latest"), out, checkpoint)

    run()  # pins "latest" in the checkpoint: nothing read yet
    later = produce(tenant, topic, 50, start=100)
    run()
    assert parquet_rows(out) == sorted((r.partition, r.offset, r.value) for r in later)


def test_a_stream_picks_up_new_partitions(
    spark: Any, tenant: Any, options: dict[str, str], tmp_path: Path
) -> None:
    topic = new_topic(tenant, partitions=1)
    first = produce(tenant, topic, 50)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> None:
        copy_available_now(
            stream(spark, options, topic, startingOffsets="earliest"), out, checkpoint
        )

    run()
    admin = AdminClient(tenant.librdkafka())
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    second = produce(tenant, topic, 60, start=50, partition=2)
    run()
    rows = parquet_rows(out)
    assert rows == sorted((r.partition, r.offset, r.value) for r in first + second)
    assert {p for p, _, _ in rows} == {0, 2}


def test_records_deleted_by_retention_fail_the_read_or_are_skipped_on_request(
    spark: Any, tenant: Any, options: dict[str, str]
) -> None:
    # Small segments and an hour's retention; the first records are two hours old.
    topic = new_topic(tenant, partitions=1, **{"segment.bytes": "4096", "retention.ms": "3600000"})
    old = int(time.time() * 1000) - 2 * 3600_000
    produce(tenant, topic, 100, timestamp=old)
    recent = produce(tenant, topic, 20, start=100)
    admin = AdminClient(tenant.librdkafka())
    tp = TopicPartition(topic, 0)

    def log_start() -> int:
        return int(admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(30).offset)

    wait_until(lambda: log_start() > 0, 60, "retention to delete the old segments")
    start = log_start()

    def read(fail_on_data_loss: str) -> Any:
        return (
            spark.read.format("shoal")
            .options(**options)
            .option("subscribe", topic)
            .option("startingOffsets", json.dumps({topic: {"0": 0}}))
            .option("failOnDataLoss", fail_on_data_loss)
            .load()
            .collect()
        )

    with pytest.raises(Exception, match=r"were deleted \(retention\) before they were read"):
        read("true")
    rows = read("false")
    assert [r["offset"] for r in rows] == list(range(start, 120))
    assert {r.offset for r in recent} <= {r["offset"] for r in rows}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"subscribe": "a", "assign": '{"a":[0]}'}, "exactly one of subscribe, subscribePattern"),
        ({"subscribe": "a", "startingOffset": "earliest"}, "unknown option 'startingoffset'"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "can't be latest"),
        ({"subscribe": "a", "kafka.auto.offset.reset": "earliest"}, "kafka.auto.offset.reset"),
        ({"subscribe": "no-such-topic"}, "topics do not exist or are not readable"),
    ],
)
def test_bad_options_fail_naming_the_option(
    spark: Any, options: dict[str, str], extra: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        spark.read.format("shoal").options(**options).options(**extra).load().collect()


def test_another_tenants_topic_is_not_readable(
    spark: Any, cluster: GatewayCluster, tenant: Any, tmp_path: Path
) -> None:
    topic = new_topic(tenant, partitions=1)
    produce(tenant, topic, 5)
    other = cluster.tenant(f"other{uuid.uuid4().hex[:6]}")
    other_options = client_options(other.properties_file(tmp_path / "other.properties"))
    for name in (topic, f"{tenant.tenant}.{topic}"):
        with pytest.raises(Exception, match="topics do not exist or are not readable"):
            spark.read.format("shoal").options(**other_options).option(
                "subscribe", name
            ).load().collect()


def test_a_read_and_a_write_through_the_tls_listener(
    spark: Any, tenant: Any, tmp_path: Path
) -> None:
    tls_options = client_options(tenant.properties_file(tmp_path / "tls.properties", tls=True))
    assert tls_options["kafka.security.protocol"] == "SASL_SSL"
    topic = new_topic(tenant, partitions=2)
    frame = spark.createDataFrame([(f"v{i}",) for i in range(100)], "value string")
    frame.write.mode("append").format("shoal").options(**tls_options).option("topic", topic).save()
    rows = (
        spark.read.format("shoal")
        .options(**tls_options)
        .option("subscribe", topic)
        .load()
        .collect()
    )
    assert sorted(bytes(r["value"]).decode() for r in rows) == sorted(f"v{i}" for i in range(100))
