"""A topic's compression.type, judged by real clients: the leader recompresses.

confluent-kafka produces with one codec to a topic that names another; every
record reads back unchanged (key, value, headers, timestamp, offset) with
confluent-kafka and kcat, and a raw Fetch shows every stored batch carrying
the topic's codec. DescribeConfigs reports the value, CreateTopics refuses
a codec Kafka does not know, a change on a live topic applies to the next
batch, and in a replicated topic the followers hold the leader's bytes.
"""

from __future__ import annotations

import datetime
import itertools
import random
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from conftest import BrokerFactory
from harness import BrokerProcess, wait_until
from kafka_clients import Rec, confluent_consume, confluent_produce, create_topic, kcat_consume
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, request_class
from replicated import start_cluster
from shoal.benchmarks.apache_kafka import ApacheKafka, default_kafka_home

from shoal.records import (
    BatchHeader,
    BatchOptions,
    Compression,
    NewRecord,
    TimestampType,
    build_batch,
    iter_batches,
)
from shoal.records.batch import compute_crc

REPO = Path(__file__).resolve().parents[2]
TOPIC_CODECS = {
    "zstd": Compression.ZSTD,
    "gzip": Compression.GZIP,
    "uncompressed": Compression.NONE,
}


def make_records(count: int, seed: str) -> list[Rec]:
    """Compressible values (a client sends a batch as it is when its codec does not
    pay), keys null and not, text headers that kcat prints back, explicit timestamps."""
    rng = random.Random(seed)
    words = [rng.choice([b"alpha", b"beta", b"gamma", b"delta"]) * rng.randrange(1, 4)
             for _ in range(30)]  # fmt: skip
    base = int(time.time() * 1000) - 60_000
    records = []
    for i in range(count):
        key = None if i % 7 == 3 else f"key-{i}".encode()
        value = b" ".join(rng.choice(words) for _ in range(rng.randrange(1, 200)))
        headers = (("idx", str(i).encode()), ("run", seed.encode()))
        records.append(Rec(0, key, value, headers, base + i * 3))
    return records


def raw_fetch(bootstrap: str, topic: str, version: int = 12) -> Any:
    """Partition 0 from offset 0, as a consumer's Fetch ``version`` returns it."""
    cls = request_class(1, version)
    topic_cls = request_class(1, version, "FetchTopic")
    partition_cls = request_class(1, version, "FetchPartition")
    request = cls(
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=1,
        max_bytes=8 << 20,
        topics=(
            topic_cls(
                topic=topic,
                partitions=(
                    partition_cls(partition=0, fetch_offset=0, partition_max_bytes=8 << 20),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    with RawConnection(bootstrap) as conn:
        response = conn.call(request)
    return response.responses[0].partitions[0]


def raw_fetch_batches(bootstrap: str, topic: str) -> list[BatchHeader]:
    """Every batch of partition 0 as a Fetch v12 returns it, checked by CRC-32C."""
    partition = raw_fetch(bootstrap, topic)
    assert partition.error_code == ErrorCode.none
    return [header for _, header in iter_batches(partition.records or b"")]


def assert_same(sent: list[Rec], offsets: list[int], got: list[Rec]) -> None:
    assert sorted(r.offset for r in got) == sorted(offsets)
    back = {r.offset: r for r in got}
    for rec, offset in zip(sent, offsets, strict=True):
        assert (back[offset].key, back[offset].value) == (rec.key, rec.value)
        assert back[offset].headers == rec.headers
        assert back[offset].timestamp == rec.timestamp


def stored_codecs(data_dir: Path, topic: str) -> set[Compression]:
    return {
        header.compression
        for segment in Path(data_dir, f"{topic}-0").glob("*.log")
        for _, header in iter_batches(segment.read_bytes())
    }


def describe(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("topic", topic)
    entries = admin.describe_configs([resource])[resource].result(30)
    return {name: entry.value for name, entry in entries.items()}


@pytest.mark.parametrize("topic_codec", list(TOPIC_CODECS))
@pytest.mark.parametrize("producer_codec", ["none", "lz4", "gzip"])
def test_records_read_back_unchanged_from_batches_in_the_topics_codec(
    broker: BrokerProcess, producer_codec: str, topic_codec: str
) -> None:
    topic = create_topic(broker.bootstrap, 1, **{"compression.type": topic_codec})
    records = make_records(120, f"{producer_codec}-{topic_codec}")

    offsets = confluent_produce(broker.bootstrap, topic, records, producer_codec)

    assert offsets == list(range(len(records)))
    assert_same(records, offsets, confluent_consume(broker.bootstrap, topic, {0: len(records)}))
    assert_same(records, offsets, kcat_consume(broker.bootstrap, topic, {0: len(records)}))
    batches = raw_fetch_batches(broker.bootstrap, topic)
    assert {h.compression for h in batches} == {TOPIC_CODECS[topic_codec]}
    assert batches[0].base_offset == 0
    assert all(a.next_offset == b.base_offset for a, b in itertools.pairwise(batches))
    assert batches[-1].next_offset == len(records)
    assert describe(broker.bootstrap, topic)["compression.type"] == topic_codec


def test_describe_configs_reports_the_levels_and_a_bad_codec_is_refused(
    broker: BrokerProcess,
) -> None:
    topic = create_topic(
        broker.bootstrap, 1, **{"compression.type": "zstd", "compression.zstd.level": "9"}
    )
    configs = describe(broker.bootstrap, topic)
    assert configs["compression.type"] == "zstd"
    assert configs["compression.zstd.level"] == "9"
    assert configs["compression.gzip.level"] == "-1"
    assert configs["compression.lz4.level"] == "9"

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for name, value in [("compression.type", "brotli"), ("compression.lz4.level", "18")]:
        bad = f"t-{uuid.uuid4().hex[:10]}"
        futures = admin.create_topics([NewTopic(bad, 1, 1, config={name: value})])
        with pytest.raises(KafkaException) as caught:
            futures[bad].result(30)
        assert caught.value.args[0].code() == ErrorCode.invalid_config.value, name


def test_a_compression_type_set_on_a_live_topic_applies_to_the_next_batch(
    broker: BrokerProcess,
) -> None:
    topic = create_topic(broker.bootstrap, 1)
    first = make_records(40, "before")
    confluent_produce(broker.bootstrap, topic, first, "gzip")
    assert stored_codecs(broker.data_dir, topic) == {Compression.GZIP}

    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry("compression.type", "snappy", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # alive until the answer
    admin.incremental_alter_configs([resource])[resource].result(30)
    wait_until(
        lambda: describe(broker.bootstrap, topic)["compression.type"] == "snappy",
        10,
        "the new compression.type",
    )
    second = make_records(40, "after")
    offsets = confluent_produce(broker.bootstrap, topic, second, "gzip")

    assert offsets == list(range(40, 80))
    codecs = [h.compression for h in raw_fetch_batches(broker.bootstrap, topic)]
    assert Compression.GZIP in codecs
    assert codecs[-1] is Compression.SNAPPY
    got = confluent_consume(broker.bootstrap, topic, {0: 80})
    assert_same(first + second, list(range(80)), got)


@pytest.mark.slow
def test_followers_store_the_leaders_recompressed_bytes(broker_factory: BrokerFactory) -> None:
    cluster = start_cluster(broker_factory)
    topic = cluster.create_topic(f"t-{uuid.uuid4().hex[:10]}", 1, **{"compression.type": "zstd"})
    cluster.wait_full_isr(topic)
    records = make_records(200, "replicated")

    offsets = confluent_produce(cluster.bootstrap, topic, records, "lz4")

    assert offsets == list(range(200))

    def logs() -> list[bytes]:
        return [
            b"".join(p.read_bytes() for p in sorted(Path(b.data_dir, f"{topic}-0").glob("*.log")))
            for b in cluster.brokers.values()
        ]

    wait_until(lambda: len(set(logs())) == 1, 20, "every replica to hold the same bytes")
    assert stored_codecs(cluster.brokers[0].data_dir, topic) == {Compression.ZSTD}
    assert_same(records, offsets, confluent_consume(cluster.bootstrap, topic, {0: 200}))


def raw_produce(bootstrap: str, topic: str, records: bytes, version: int = 9) -> Any:
    """One batch to partition 0 with Produce ``version``; the partition's response."""
    cls = request_class(0, version)
    topic_cls = request_class(0, version, "TopicProduceData")
    partition_cls = request_class(0, version, "PartitionProduceData")
    request = cls(
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            topic_cls(name=topic, partition_data=(partition_cls(index=0, records=records),)),
        ),
    )
    with RawConnection(bootstrap) as conn:
        response = conn.call(request)
    return response.responses[0].partition_responses[0]


def test_refusals_of_a_rebuilt_batch_come_back_as_kafkas_errors(broker: BrokerProcess) -> None:
    topic = create_topic(
        broker.bootstrap, 1, **{"compression.type": "uncompressed", "max.message.bytes": "20000"}
    )
    big = [NewRecord(b"k", b"x" * 1000, (), None) for _ in range(50)]
    batch = build_batch(big, options=BatchOptions(compression=Compression.ZSTD))
    assert len(batch) < 20_000  # fits as sent, not once rebuilt uncompressed

    too_large = raw_produce(broker.bootstrap, topic, batch)
    assert too_large.error_code == ErrorCode.message_too_large

    garbled = bytearray(build_batch(big[:2], options=BatchOptions(compression=Compression.GZIP)))
    garbled[57:61] = (3).to_bytes(4, "big")  # counts a record the payload does not hold
    garbled[23:27] = (2).to_bytes(4, "big")
    garbled[17:21] = compute_crc(garbled, 0, len(garbled)).to_bytes(4, "big")
    invalid = raw_produce(broker.bootstrap, topic, bytes(garbled))
    assert invalid.error_code == ErrorCode.invalid_record

    fine = raw_produce(broker.bootstrap, topic, build_batch(big[:5]))
    assert (fine.error_code, fine.base_offset) == (ErrorCode.none, 0)
    assert {h.compression for h in raw_fetch_batches(broker.bootstrap, topic)} == {Compression.NONE}


def test_zstd_topic_takes_older_producers_batches_and_rebuilds_them(
    broker: BrokerProcess,
) -> None:
    # Produce v3-v6 may not carry zstd; the topic may still store it (Kafka's rule
    # is on the batch the client sends, not on the one the leader writes).
    topic = create_topic(broker.bootstrap, 1, **{"compression.type": "zstd"})
    batch = build_batch(
        [NewRecord(b"k", b"v" * 500, (("h", b"1"),), 1_700_000_000_000)],
        options=BatchOptions(compression=Compression.GZIP),
    )

    answer = raw_produce(broker.bootstrap, topic, batch, version=5)

    assert answer.error_code == ErrorCode.none
    [stored] = raw_fetch_batches(broker.bootstrap, topic)
    assert stored.compression is Compression.ZSTD
    refused = raw_produce(
        broker.bootstrap,
        topic,
        build_batch([NewRecord(b"k", b"v", (), 1)], options=BatchOptions(Compression.ZSTD)),
        version=5,
    )
    assert refused.error_code == ErrorCode.unsupported_compression_type


def test_log_append_time_topic_stamps_the_rebuilt_batches(broker: BrokerProcess) -> None:
    topic = create_topic(
        broker.bootstrap,
        1,
        **{"compression.type": "lz4", "message.timestamp.type": "LogAppendTime"},
    )
    records = make_records(30, "log-append-time")
    before = int(time.time() * 1000)

    confluent_produce(broker.bootstrap, topic, records, "gzip")

    got = confluent_consume(broker.bootstrap, topic, {0: 30})
    assert [(r.key, r.value, r.headers) for r in got] == [
        (r.key, r.value, r.headers) for r in records
    ]
    assert all(r.timestamp is not None and r.timestamp >= before for r in got)
    batches = raw_fetch_batches(broker.bootstrap, topic)
    assert {h.compression for h in batches} == {Compression.LZ4}
    assert {h.timestamp_type for h in batches} == {TimestampType.LOG_APPEND_TIME}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_java_consumer_reads_the_batches_the_leader_rebuilt(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Kafka's own Java consumer decodes what the leader wrote: lz4 frames of several
    independent blocks (the Java client refuses linked ones), and every other codec."""
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=840)
    tools = ApacheKafka(tmp_path / "kafka-tools", home)
    for codec in ("lz4", "zstd", "gzip", "snappy"):
        topic = create_topic(broker.bootstrap, 1, **{"compression.type": codec})
        # Over 64 KiB per batch, so that an lz4 frame holds more than one block.
        records = [
            Rec(
                0,
                f"k{i}".encode(),
                (f"value-{i}-" + "abcdefgh" * 100).encode(),
                (("n", b"%d" % i),),
            )
            for i in range(300)
        ]
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "linger.ms": 200, "batch.size": 1_000_000}
        )
        for rec in records:
            producer.produce(topic, rec.value, rec.key, partition=0, headers=list(rec.headers))
        assert producer.flush(30) == 0
        batches = raw_fetch_batches(broker.bootstrap, topic)
        assert {h.compression for h in batches} == {Compression[codec.upper()]}
        assert max(h.records_count for h in batches) >= 100  # over 80 KB of records

        done = subprocess.run(
            tools.java_command(
                "org.apache.kafka.tools.consumer.ConsoleConsumer",
                "--bootstrap-server", broker.bootstrap, "--topic", topic, "--from-beginning",
                "--max-messages", str(len(records)), "--timeout-ms", "60000",
                "--formatter-property", "print.offset=true",
                "--formatter-property", "print.headers=true",
                "--formatter-property", "print.key=true",
            ),
            capture_output=True,
            text=True,
            timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = [line.split("\t") for line in done.stdout.splitlines()]
        assert [(o, h, k, v) for o, h, k, v in lines] == [
            (f"Offset:{i}", f"n:{i}", r.key.decode(), r.value.decode())  # type: ignore[union-attr]
            for i, r in enumerate(records)
        ], codec


def test_a_consumer_older_than_zstd_is_refused_a_zstd_topic_as_by_kafka(
    broker: BrokerProcess,
) -> None:
    zstd = create_topic(broker.bootstrap, 1, **{"compression.type": "zstd"})
    gzip = create_topic(broker.bootstrap, 1, **{"compression.type": "gzip"})
    for topic in (zstd, gzip):
        confluent_produce(broker.bootstrap, topic, make_records(5, topic), "none")

    assert raw_fetch(broker.bootstrap, zstd, 9).error_code == ErrorCode.unsupported_compression_type
    assert raw_fetch(broker.bootstrap, zstd, 10).error_code == ErrorCode.none
    old_gzip = raw_fetch(broker.bootstrap, gzip, 9)
    assert old_gzip.error_code == ErrorCode.none
    assert len(list(iter_batches(old_gzip.records))) >= 1
