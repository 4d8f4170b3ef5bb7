"""Four Kafka clients we did not write produce to a real broker and read back byte-exact.

For every client and every codec it supports: keyed records with headers,
spread over three partitions, come back with the same keys, values, headers,
timestamps and the offsets the producer was acknowledged with. The broker
stores each client's batches as they were compressed, which the segment
files show. A second reader (librdkafka) checks every producer's output too.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness import BrokerProcess
from kafka_clients import (
    CONSUMERS,
    PRODUCERS,
    Rec,
    by_partition,
    confluent_consume,
    create_topic,
    offsets_in_order,
)

from shoal.records import Compression, iter_batches

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 3
# Debian's kcat links librdkafka 2.0.2, whose feature detection enables gzip,
# snappy and lz4 only if a broker serves Produce v2: it sends those batches
# uncompressed to any Kafka-4-baseline broker, Apache Kafka 4.0 included
# (confluentinc/librdkafka#4956, fixed in later librdkafka). confluent-kafka's
# bundled librdkafka compresses all five.
KCAT_UNCOMPRESSED = {"gzip", "snappy", "lz4"}


def make_records(client: str, count: int = 60) -> list[Rec]:
    rng = random.Random(f"{client}-{count}")
    words = [rng.randbytes(rng.randrange(3, 12)) for _ in range(40)]
    base = int(time.time() * 1000) - 60_000
    records = []
    for i in range(count):
        if client == "kcat":
            # kcat reads lines: no tabs or newlines inside, and it sets timestamps itself.
            alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789 -_.:/"
            value = bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 800)))
            key = f"key-{i}".encode()
            headers: tuple[tuple[str, bytes], ...] = (("source", b"kcat"), ("run", b"1"))
            timestamp = None
        else:
            # Binary but compressible by every codec (repeated words): a client
            # sends a batch uncompressed when its codec would make it larger.
            value = b"".join(rng.choice(words) for _ in range(rng.randrange(0, 300)))
            key = rng.randbytes(rng.randrange(1, 40))
            headers = (("idx", str(i).encode()), ("bin", rng.randbytes(8)))
            timestamp = base + i * 7
        records.append(Rec(i % PARTITIONS, key, value, headers, timestamp))
    return records


def assert_same(sent: list[Rec], offsets: list[int], got: list[Rec], client: str) -> None:
    assert len(got) == len(sent)
    received = {(r.partition, r.offset): r for r in got}
    started = time.time() * 1000 - 600_000
    for rec, offset in zip(sent, offsets, strict=True):
        back = received[(rec.partition, offset)]
        assert back.key == rec.key
        assert back.value == rec.value
        assert back.headers == rec.headers
        if rec.timestamp is not None:
            assert back.timestamp == rec.timestamp
        else:
            assert back.timestamp is not None and back.timestamp > started, client


def stored_codecs(broker: BrokerProcess, topic: str) -> set[Compression]:
    codecs = set()
    for partition in range(PARTITIONS):
        for segment in Path(broker.data_dir, f"{topic}-{partition}").glob("*.log"):
            codecs |= {h.compression for _, h in iter_batches(segment.read_bytes())}
    return codecs


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", list(PRODUCERS))
def test_client_reads_back_what_it_produced(broker: BrokerProcess, client: str, codec: str) -> None:
    topic = create_topic(broker.bootstrap, PARTITIONS)
    records = make_records(client)
    offsets = PRODUCERS[client](broker.bootstrap, topic, records, codec)
    assert offsets == offsets_in_order(records)

    counts = {p: len(recs) for p, recs in by_partition(records).items()}
    assert_same(records, offsets, CONSUMERS[client](broker.bootstrap, topic, counts), client)
    if client != "confluent-kafka":
        assert_same(records, offsets, confluent_consume(broker.bootstrap, topic, counts), client)
    sent_as = "none" if client == "kcat" and codec in KCAT_UNCOMPRESSED else codec
    assert stored_codecs(broker, topic) == {Compression[sent_as.upper()]}


def test_a_produce_request_near_the_batch_size_limit_is_stored_whole(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 1)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 500, "batch.size": 1_000_000}
    )
    values = [bytes([i % 251]) * 1000 for i in range(950)]
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0
    sizes = [
        h.size
        for _, h in iter_batches(
            next(Path(broker.data_dir, f"{topic}-0").glob("*.log")).read_bytes()
        )
    ]
    assert max(sizes) > 512 * 1024, "the test needs a request larger than the receive buffer"
    got = confluent_consume(broker.bootstrap, topic, {0: len(values)})
    assert [r.value for r in sorted(got, key=lambda r: r.offset or 0)] == values
