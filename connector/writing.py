"""Writing a DataFrame to topics, as Spark's Kafka sink does.

The DataFrame's columns name what each record is: ``value`` (required),
``key``, ``topic``, ``partition`` and ``headers``; other columns are ignored.
The ``topic`` option, when given, overrides the topic column. Records are
produced with acks=all and idempotence unless the ``kafka.*`` options say
otherwise, and a task fails if any of its records was not acknowledged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import KafkaError, Message, Producer
from shoal.connector.options import OptionError

# Spark type names (DataType.simpleString()) each column may have.
_TEXT_OR_BYTES = ("string", "binary")
_HEADERS = "array<struct<key:string,value:binary>>"
_ALLOWED = {
    "key": _TEXT_OR_BYTES,
    "value": _TEXT_OR_BYTES,
    "topic": ("string",),
    "partition": ("int",),
    "headers": (_HEADERS,),
}


@dataclass(frozen=True)
class WriteColumns:
    """Which of the record columns the DataFrame has."""

    key: bool
    topic: bool
    partition: bool
    headers: bool


def check_write_schema(fields: Mapping[str, str], topic_option: str | None) -> WriteColumns:
    """Check the DataFrame's columns (name -> Spark type name) against the sink's.

    Names match exactly, as in Spark's Kafka sink: a ``Value`` column is not
    the value.
    """
    if "value" not in fields:
        raise OptionError("the DataFrame needs a value column (string or binary) to write")
    for name, allowed in _ALLOWED.items():
        kind = fields.get(name)
        if kind is not None and kind not in allowed:
            raise OptionError(
                f"column {name} must be {' or '.join(allowed)}, not {kind}"
                + ("; cast it first" if name in ("key", "value") else "")
            )
    if topic_option is None and "topic" not in fields:
        raise OptionError("give the topic option or a topic column to write to")
    return WriteColumns(
        key="key" in fields,
        topic="topic" in fields,
        partition="partition" in fields,
        headers="headers" in fields,
    )


@dataclass
class WriteReport:
    """What one task wrote."""

    records: int = 0
    bytes: int = 0


def producer_settings(client: Mapping[str, str]) -> dict[str, object]:
    return {"acks": "all", "enable.idempotence": True, "linger.ms": 5, **client}


def produce_batches(
    client: Mapping[str, str],
    topic_option: str | None,
    columns: WriteColumns,
    batches: Iterator[pa.RecordBatch],
) -> WriteReport:
    """Produce every row of ``batches``; raise if any was not acknowledged."""
    producer = Producer(producer_settings(client))
    report = WriteReport()
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            failures.append(error)
            return
        report.records += 1
        report.bytes += len(message.value() or b"") + len(message.key() or b"")

    for batch in batches:
        rows = batch.to_pydict()
        values = rows["value"]
        keys = rows["key"] if columns.key else [None] * len(values)
        topics = [topic_option] * len(values) if topic_option is not None else rows["topic"]
        partitions = rows["partition"] if columns.partition else [None] * len(values)
        headers = rows["headers"] if columns.headers else [None] * len(values)
        for value, key, topic, partition, header in zip(
            values, keys, topics, partitions, headers, strict=True
        ):
            if topic is None:
                raise OptionError(
                    "a row has a null topic; give the topic option for a default topic"
                )
            _produce(
                producer,
                topic,
                _as_bytes(value),
                _as_bytes(key),
                partition,
                [(h["key"], h["value"]) for h in header] if header else None,
                delivered,
            )
        producer.poll(0)
    while producer.flush(1.0) > 0:
        pass
    if failures:
        raise RuntimeError(
            f"{len(failures)} records were not acknowledged (first: {failures[0].str()}); "
            f"{report.records} were"
        )
    return report


def _produce(
    producer: Producer,
    topic: str,
    value: bytes | None,
    key: bytes | None,
    partition: int | None,
    headers: list[tuple[str, bytes | None]] | None,
    on_delivery: object,
) -> None:
    extra: dict[str, object] = {}
    if partition is not None:
        extra["partition"] = partition
    if headers:
        extra["headers"] = headers
    while True:
        try:
            producer.produce(topic, value, key, on_delivery=on_delivery, **extra)
            return
        except BufferError:
            # The local queue is full: let deliveries drain it.
            producer.poll(0.1)


def _as_bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value
