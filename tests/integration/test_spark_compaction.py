"""The ``shoal`` PySpark data source reading a compacted topic (issue 20).

A compacted topic with small, quickly rolling segments gets every key
updated many times and some keys deleted; once the cleaner has been over it
(tombstones gone too), its offsets have gaps: most of the old offsets hold no
record, and the last batch of each cleaned segment group is kept empty. Then
the cleaner is held off (``min.compaction.lag.ms``) and an uncleaned tail is
written, updates and a tombstone included, so that what a confluent-kafka
consumer reads from the beginning stays the reference for every read below:
a whole batch read, one whose ranges start and end inside gaps, one split by
minPartitions so that pieces end in gaps (or hold nothing at all), and a
Trigger.AvailableNow stream capped by maxOffsetsPerTrigger, run twice. A last
test reads a log whose final offsets hold no record, to its end.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from conftest import BrokerFactory
from harness import wait_until
from kafka_clients import create_topic
from shoal.connector.offsets import OffsetRange, TopicPartition, split_ranges

pytestmark = pytest.mark.slow

CLEANER = {"SHOAL_LOG_CLEANER_BACKOFF_MS": "100"}
PARTITIONS = 2
KEYS = 24
ROUNDS = 12
DELETED = {f"key-{i:02d}" for i in range(0, KEYS, 5)}
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": "4000",
    "segment.ms": "1000",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "2000",
    "file.delete.delay.ms": "0",
}
# A stalled task fails well before the test's own timeouts.
POLL_TIMEOUT = {"kafkaConsumer.pollTimeoutMs": "20000"}

# (partition, offset, key, value)
Row = tuple[int, int, str, str | None]


def _partition_of(key: str) -> int:
    return int(key.rsplit("-", 1)[1]) % PARTITIONS


def _produce(bootstrap: str, topic: str, values: list[tuple[str, str | None]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, _: Any) -> None:
        if error is not None:
            errors.append(error)

    for key, value in values:
        producer.produce(
            topic, key=key, value=value, partition=_partition_of(key), on_delivery=on_delivery
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == []


def _reference(bootstrap: str, topic: str) -> list[Row]:
    """Every partition read from the beginning to its high watermark by confluent-kafka."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    rows: list[Row] = []
    try:
        highs = {
            p: consumer.get_watermark_offsets(CTopicPartition(topic, p), timeout=30)[1]
            for p in range(PARTITIONS)
        }
        consumer.assign([CTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        done: set[int] = set()
        deadline = time.monotonic() + 30
        while len(done) < PARTITIONS:
            assert time.monotonic() < deadline, "the reference read timed out"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                if msg.offset() >= highs[msg.partition()]:
                    done.add(msg.partition())
                continue
            value = msg.value()
            rows.append(
                (msg.partition(), msg.offset(), msg.key().decode(), value and value.decode())
            )
    finally:
        consumer.close()
    return sorted(rows)


def _compacted(rows: list[Row]) -> bool:
    """Each key once, the deleted ones gone, and a gap in every partition."""
    keys = [key for _, _, key, _ in rows if not key.startswith("roller")]
    return (
        len(keys) == len(set(keys)) == KEYS - len(DELETED)
        and not set(keys) & DELETED
        and all(
            len(offsets := [o for p, o, _, _ in rows if p == partition])
            < offsets[-1] - offsets[0] + 1
            for partition in range(PARTITIONS)
        )
    )


def _hold_off_the_cleaner(bootstrap: str, topic: str) -> None:
    """Nothing written from now on becomes cleanable, so the reference stays true."""
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry(
                "min.compaction.lag.ms", "3600000", incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(30)


def _tail(round_: int) -> list[tuple[str, str | None]]:
    """Updates of some live keys, a new key and a tombstone: the uncleaned tail."""
    live = sorted(f"key-{k:02d}" for k in range(KEYS) if f"key-{k:02d}" not in DELETED)
    updates: list[tuple[str, str | None]] = [
        (key, f"tail-{round_}-{key}") for key in live[round_ % 3 :: 3]
    ]
    tombstone: list[tuple[str, str | None]] = [(live[round_], None)]
    fresh = [(f"new-{round_}-{p}", f"fresh-{round_}") for p in range(PARTITIONS)]
    return updates + tombstone + fresh


@pytest.fixture
def compacted(broker_factory: BrokerFactory) -> tuple[str, str, list[Row]]:
    """A cleaned compacted topic with an uncleaned tail: (bootstrap, topic, reference rows)."""
    broker = broker_factory(env=CLEANER)
    topic = create_topic(broker.bootstrap, PARTITIONS, **TOPIC_CONFIG)
    history: list[tuple[str, str | None]] = [
        (f"key-{k:02d}", f"value-{r:02d}-{k:02d}") for r in range(ROUNDS) for k in range(KEYS)
    ]
    _produce(broker.bootstrap, topic, history)
    _produce(broker.bootstrap, topic, [(key, None) for key in sorted(DELETED)])
    # Wait out segment.ms, then append: everything before becomes cleanable.
    time.sleep(1.2)
    _produce(broker.bootstrap, topic, [(f"roller-{p}", "x") for p in range(PARTITIONS)])
    wait_until(
        lambda: _compacted(_reference(broker.bootstrap, topic)),
        60,
        "the cleaner to compact the topic and drop its tombstones",
        interval=0.5,
    )
    _hold_off_the_cleaner(broker.bootstrap, topic)
    _produce(broker.bootstrap, topic, _tail(0))
    return broker.bootstrap, topic, _reference(broker.bootstrap, topic)


def _options(bootstrap: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, **POLL_TIMEOUT}


def _rows(records: list[Any]) -> list[Row]:
    return sorted(
        (
            r["partition"],
            r["offset"],
            bytes(r["key"]).decode(),
            None if r["value"] is None else bytes(r["value"]).decode(),
        )
        for r in records
    )


def _gaps(rows: list[Row], partition: int) -> list[int]:
    """Offsets of ``partition`` below its last record that hold no record."""
    offsets = {o for p, o, _, _ in rows if p == partition}
    return [o for o in range(max(offsets)) if o not in offsets]


def _read(spark: Any, bootstrap: str, topic: str, **extra: str) -> list[Row]:
    reader = spark.read.format("shoal").options(**_options(bootstrap)).option("subscribe", topic)
    for name, value in extra.items():
        reader = reader.option(name, value)
    return _rows(reader.load().collect())


def test_a_batch_read_of_a_compacted_topic_returns_what_a_consumer_reads(
    spark: Any, compacted: tuple[str, str, list[Row]]
) -> None:
    bootstrap, topic, reference = compacted
    assert any(value is None for _, _, _, value in reference)  # the tail's tombstone
    assert _read(spark, bootstrap, topic) == reference

    # Ranges that start and end inside gaps: partition 0 from a gap to just
    # after another gap (its last offset holds no record), partition 1 to the
    # end of a run of two or more missing offsets.
    gaps = {p: _gaps(reference, p) for p in range(PARTITIONS)}
    start0 = gaps[0][0]
    end0 = next(g for g in gaps[0] if g > start0 + 1) + 1
    end1 = next(g for g in gaps[1] if g - 1 in gaps[1] and g > 10) + 1
    starting = {topic: {"0": start0, "1": -2}}
    ending = {topic: {"0": end0, "1": end1}}
    rows = _read(
        spark,
        bootstrap,
        topic,
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
    )
    assert rows == [
        r for r in reference if (r[0] == 0 and start0 <= r[1] < end0) or (r[0] == 1 and r[1] < end1)
    ]


def test_min_partitions_splits_a_compacted_partition_at_gaps(
    spark: Any, compacted: tuple[str, str, list[Row]]
) -> None:
    bootstrap, topic, reference = compacted
    min_partitions = 16
    ends = {p: max(o for q, o, _, _ in reference if q == p) + 1 for p in range(PARTITIONS)}
    pieces = split_ranges(
        [OffsetRange(TopicPartition(topic, p), 0, ends[p]) for p in range(PARTITIONS)],
        min_partitions,
    )
    live = {(p, o) for p, o, _, _ in reference}
    # Pieces that end in a gap, and pieces with no record at all: the cases
    # a reader waiting for the record at end - 1 would hang on.
    assert any((r.topic_partition.partition, r.end - 1) not in live for r in pieces)
    assert any(
        not any((r.topic_partition.partition, o) in live for o in range(r.start, r.end))
        for r in pieces
    )
    reader = (
        spark.read.format("shoal")
        .options(**_options(bootstrap))
        .option("subscribe", topic)
        .option("minPartitions", str(min_partitions))
        .load()
    )
    assert reader.rdd.getNumPartitions() == len(pieces)
    assert _rows(reader.collect()) == reference


def _parquet_rows(path: Path) -> list[Row]:
    table = pq.read_table(path)
    return sorted(
        (p, o, k.decode(), None if v is None else v.decode())
        for p, o, k, v in zip(
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("key").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    )


def _batch_ends(checkpoint: Path) -> list[dict[int, int]]:
    """Each micro-batch's end offsets by partition, as Spark logged them."""
    ends = []
    for path in sorted((checkpoint / "offsets").glob("[0-9]*"), key=lambda p: int(p.name)):
        (offsets,) = json.loads(path.read_text().splitlines()[-1]).values()
        ends.append({int(p): int(o) for p, o in offsets.items()})
    return ends


def test_an_available_now_stream_reads_a_compacted_topic_then_just_what_is_new(
    spark: Any, compacted: tuple[str, str, list[Row]], tmp_path: Path
) -> None:
    bootstrap, topic, reference = compacted
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> list[int]:
        query = (
            spark.readStream.format("shoal")
            .options(**_options(bootstrap))
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            # Micro-batches of 40 offsets: many fall wholly in a gap, many end in one.
            .option("maxOffsetsPerTrigger", "40")
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(240), "the AvailableNow query did not finish"
        assert query.exception() is None
        return [p["numInputRows"] for p in query.recentProgress]

    first = run()
    assert _parquet_rows(out) == reference
    assert sum(first) == len(reference)
    # Micro-batches that end in a gap, and ones that hold no record at all.
    live = {(p, o) for p, o, _, _ in reference}
    ends = _batch_ends(checkpoint)
    assert len(ends) == len(first) > 2
    assert any((p, end - 1) not in live for batch in ends for p, end in batch.items())
    starts = [dict.fromkeys(ends[0], 0), *ends[:-1]]
    assert any(
        not any((p, o) in live for p in end for o in range(start[p], end[p]))
        for start, end in zip(starts, ends, strict=True)
    )

    _produce(bootstrap, topic, _tail(1))
    again = _reference(bootstrap, topic)
    new = [row for row in again if row not in reference]
    assert len(new) == len(_tail(1))
    second = run()
    assert sum(second) == len(new)
    assert _parquet_rows(out) == sorted(reference + new)


def test_a_read_to_a_log_end_inside_a_gap_finishes(
    spark: Any, broker_factory: BrokerFactory
) -> None:
    # A log whose last offsets hold no record: the tombstones written last
    # are cleaned away, their batch kept empty, and the active segment after
    # it (the roller's) removed while the broker is down, as when a replica
    # holding only the cleaned segments becomes the leader. A task reading to
    # the high watermark gets no record for its last offsets and must stop on
    # the partition EOF, not wait for them.
    broker = broker_factory(env=CLEANER)
    topic = create_topic(broker.bootstrap, PARTITIONS, **TOPIC_CONFIG)
    history: list[tuple[str, str | None]] = [
        (f"key-{k:02d}", f"value-{r:02d}-{k:02d}") for r in range(ROUNDS) for k in range(KEYS)
    ]
    _produce(broker.bootstrap, topic, history)
    _produce(broker.bootstrap, topic, [(key, None) for key in sorted(DELETED)])
    time.sleep(1.2)
    _produce(broker.bootstrap, topic, [(f"roller-{p}", "x") for p in range(PARTITIONS)])
    before = wait_until(
        lambda: (r := _reference(broker.bootstrap, topic)) and _compacted(r) and r,
        60,
        "the cleaner to compact the topic and drop its tombstones",
        interval=0.5,
    )
    broker.stop()
    for p in range(PARTITIONS):
        (roller,) = [o for q, o, k, _ in before if q == p and k.startswith("roller")]
        for path in Path(broker.data_dir, f"{topic}-{p}").glob(f"{roller:020d}.*"):
            path.unlink()
    broker.start()

    reference = _reference(broker.bootstrap, topic)
    assert reference == [r for r in before if not r[2].startswith("roller")]
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watermarks"})
    try:
        highs = [
            consumer.get_watermark_offsets(CTopicPartition(topic, p), timeout=30)[1]
            for p in range(PARTITIONS)
        ]
    finally:
        consumer.close()
    for p in range(PARTITIONS):
        assert max(o for q, o, _, _ in reference if q == p) < highs[p] - 1  # ends in a gap
    assert _read(spark, bootstrap=broker.bootstrap, topic=topic) == reference
    assert _read(spark, broker.bootstrap, topic, minPartitions="9") == reference
