"""Thin drivers for the Kafka clients we did not write: kcat, confluent-kafka,
kafka-python and aiokafka. Each produces a list of records to given partitions
and reads partitions back, so tests can compare what went in with what came out.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

Header = tuple[str, bytes]


@dataclass(frozen=True)
class Rec:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp: int | None = None
    offset: int | None = None


@dataclass
class Topic:
    name: str
    partitions: int
    records: list[Rec] = field(default_factory=list)


def create_topic(bootstrap: str, partitions: int = 3, **config: str) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=config)])
    futures[name].result(30)
    return name


def offsets_in_order(records: list[Rec]) -> list[int]:
    """The offsets records get when appended in order to empty partitions."""
    seen: dict[int, int] = {}
    offsets = []
    for rec in records:
        offsets.append(seen.get(rec.partition, 0))
        seen[rec.partition] = offsets[-1] + 1
    return offsets


def by_partition(records: list[Rec]) -> dict[int, list[Rec]]:
    out: dict[int, list[Rec]] = {}
    for record in records:
        out.setdefault(record.partition, []).append(record)
    return out


# -- confluent-kafka (librdkafka) ------------------------------------------------


def confluent_produce(bootstrap: str, topic: str, records: list[Rec], codec: str) -> list[int]:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20, "acks": "all"}
    )
    offsets: dict[int, int] = {}
    errors: list[str] = []

    def delivered(err: KafkaError | None, msg: object, i: int) -> None:
        if err is not None:
            errors.append(err.str())
        else:
            offsets[i] = msg.offset()  # type: ignore[attr-defined]

    for i, rec in enumerate(records):
        producer.produce(
            topic,
            key=rec.key,
            value=rec.value,
            partition=rec.partition,
            headers=list(rec.headers),
            timestamp=rec.timestamp or 0,
            on_delivery=lambda err, msg, i=i: delivered(err, msg, i),
        )
    assert producer.flush(30) == 0
    assert not errors, errors
    return [offsets[i] for i in range(len(records))]


def confluent_consume(bootstrap: str, topic: str, counts: dict[int, int]) -> list[Rec]:
    # librdkafka needs a group id even for assign(); nothing is committed.
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([CTopicPartition(topic, p, OFFSET_BEGINNING) for p in counts])
    out: list[Rec] = []
    deadline = time.monotonic() + 30
    try:
        while len(out) < sum(counts.values()) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append(
                Rec(
                    msg.partition(),
                    msg.key(),
                    msg.value(),
                    tuple(msg.headers() or ()),
                    msg.timestamp()[1],
                    msg.offset(),
                )
            )
    finally:
        consumer.close()
    return out


def _python_client_rec(m: Any) -> Rec:
    """A kafka-python or aiokafka ConsumerRecord (the two share their fields)."""
    return Rec(m.partition, m.key, m.value, tuple(m.headers), m.timestamp, m.offset)


# -- kafka-python -------------------------------------------------------------------


def kafka_python_produce(bootstrap: str, topic: str, records: list[Rec], codec: str) -> list[int]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if codec == "none" else codec,
        acks="all",
        linger_ms=20,
    )
    futures = [
        producer.send(
            topic,
            key=rec.key,
            value=rec.value,
            partition=rec.partition,
            headers=list(rec.headers),
            timestamp_ms=rec.timestamp,
        )
        for rec in records
    ]
    producer.flush(30)
    offsets = [f.get(30).offset for f in futures]
    producer.close()
    return offsets


def kafka_python_consume(bootstrap: str, topic: str, counts: dict[int, int]) -> list[Rec]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    consumer.assign([TopicPartition(topic, p) for p in counts])
    consumer.seek_to_beginning()
    out: list[Rec] = []
    deadline = time.monotonic() + 30
    while len(out) < sum(counts.values()) and time.monotonic() < deadline:
        for messages in consumer.poll(timeout_ms=500).values():
            out.extend(map(_python_client_rec, messages))
    consumer.close()
    return out


# -- aiokafka ------------------------------------------------------------------------


async def _aiokafka_produce(
    bootstrap: str, topic: str, records: list[Rec], codec: str
) -> list[int]:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if codec == "none" else codec,
        acks="all",
        linger_ms=20,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                key=rec.key,
                value=rec.value,
                partition=rec.partition,
                headers=list(rec.headers),
                timestamp_ms=rec.timestamp,
            )
            for rec in records
        ]
        return [(await f).offset for f in futures]
    finally:
        await producer.stop()


async def _aiokafka_consume(bootstrap: str, topic: str, counts: dict[int, int]) -> list[Rec]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    out: list[Rec] = []
    try:
        consumer.assign([TopicPartition(topic, p) for p in counts])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + 30
        while len(out) < sum(counts.values()) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                out.extend(map(_python_client_rec, messages))
    finally:
        await consumer.stop()
    return out


def aiokafka_produce(bootstrap: str, topic: str, records: list[Rec], codec: str) -> list[int]:
    return asyncio.run(_aiokafka_produce(bootstrap, topic, records, codec))


def aiokafka_consume(bootstrap: str, topic: str, counts: dict[int, int]) -> list[Rec]:
    return asyncio.run(_aiokafka_consume(bootstrap, topic, counts))


# -- kcat ------------------------------------------------------------------------------

KCAT_FORMAT = "%p\t%o\t%T\t%K\t%k\t%S\t%s\t%h\n"


def kcat_produce(bootstrap: str, topic: str, records: list[Rec], codec: str) -> list[int]:
    """One kcat per partition and header set: -K splits key from value, -H adds headers.

    kcat cannot set timestamps or report offsets; offsets are the order per partition.
    """
    groups: dict[tuple[int, tuple[Header, ...]], list[Rec]] = {}
    for rec in records:
        groups.setdefault((rec.partition, rec.headers), []).append(rec)
    for (partition, headers), recs in groups.items():
        lines = b"".join((r.key or b"") + b"\t" + (r.value or b"") + b"\n" for r in recs)
        header_args = [arg for k, v in headers for arg in ("-H", f"{k}={v.decode()}")]
        subprocess.run(
            ["kcat", "-b", bootstrap, "-P", "-t", topic, "-p", str(partition), "-z", codec,
             "-K", "\t", "-X", "linger.ms=20", *header_args],
            input=lines,
            check=True,
            timeout=60,
        )  # fmt: skip
    return offsets_in_order(records)


def kcat_consume(bootstrap: str, topic: str, counts: dict[int, int]) -> list[Rec]:
    out: list[Rec] = []
    for partition, count in counts.items():
        result = subprocess.run(
            ["kcat", "-b", bootstrap, "-C", "-t", topic, "-p", str(partition), "-o", "beginning",
             "-c", str(count), "-e", "-f", KCAT_FORMAT],
            capture_output=True,
            check=True,
            timeout=60,
        )  # fmt: skip
        out.extend(_parse_kcat(result.stdout))
    return out


def _parse_kcat(output: bytes) -> list[Rec]:
    """Parse KCAT_FORMAT using the key and value lengths, so any bytes survive."""
    out = []
    pos = 0
    while pos < len(output):
        fields = []
        for _ in range(4):
            end = output.index(b"\t", pos)
            fields.append(output[pos:end])
            pos = end + 1
        partition, offset, timestamp, key_len = (int(f) for f in fields)
        key = output[pos : pos + max(key_len, 0)] if key_len >= 0 else None
        pos += max(key_len, 0) + 1
        end = output.index(b"\t", pos)
        value_len = int(output[pos:end])
        pos = end + 1
        value = output[pos : pos + max(value_len, 0)] if value_len >= 0 else None
        pos += max(value_len, 0) + 1
        end = output.index(b"\n", pos)
        raw_headers = output[pos:end]
        pos = end + 1
        headers = tuple(
            (name.decode(), val)
            for name, _, val in (h.partition(b"=") for h in raw_headers.split(b",") if h)
        )
        out.append(Rec(partition, key, value, headers, timestamp, offset))
    return out


PRODUCERS = {
    "kcat": kcat_produce,
    "confluent-kafka": confluent_produce,
    "kafka-python": kafka_python_produce,
    "aiokafka": aiokafka_produce,
}
CONSUMERS = {
    "kcat": kcat_consume,
    "confluent-kafka": confluent_consume,
    "kafka-python": kafka_python_consume,
    "aiokafka": aiokafka_consume,
}
