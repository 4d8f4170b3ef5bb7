"""Writing a DataFrame to topics, as Spark's Kafka sink does.

The DataFrame's columns name what each record is: ``value`` (required),
``key``, ``topic``, ``partition`` and ``headers``; other columns are ignored.
The ``topic`` option, when given, overrides the topic column. Records are
produced with acks=all and idempotence unless the ``kafka.*`` options say
otherwise, and a task fails if any of its records was not acknowledged.

With ``exactlyOnce=true`` a task produces in one Kafka transaction instead
(``produce_transaction``) and commits it before it returns: there is no
other place to commit, since Kafka lets only the producer that opened a
transaction end it (librdkafka has no KIP-939 two-phase commit, which would
let Spark's driver commit every task's transaction at once), and Spark runs
a Python writer's ``write`` to its end before its output commit coordinator
decides which attempt counts. The transactional id is the same for every
attempt of a task and differs between tasks, so an attempt's
``init_transactions`` fences the attempts before it and aborts the
transaction they left open.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from shoal.connector.options import OptionError

# How long librdkafka's transactional calls may take. init_transactions may
# wait for the coordinator to abort a failed attempt's open transaction.
TRANSACTION_CALL_TIMEOUT_S = 120.0
# commit_transaction is retried this many times when librdkafka says it may be.
_COMMIT_ATTEMPTS = 3
DEFAULT_TRANSACTIONAL_ID_PREFIX = "spark-shoal"
# Characters Kafka allows in topic names; anything else is left out of a default prefix.
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9._-]")

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


def default_transactional_id_prefix(topic_option: str | None) -> str:
    """A prefix for one write, when the user gave none: new for every write.

    Spark tells a Python data source nothing stable about a batch write (no
    query name, no job id), and a prefix made of the topic alone would make
    two concurrent writes to one topic fence each other's tasks. A random part
    chosen when the write is planned is the same for every attempt of its
    tasks (they all unpickle the one writer) and differs between writes; the
    topic is there only so that operators can tell whose transactions they see.
    """
    parts = [DEFAULT_TRANSACTIONAL_ID_PREFIX]
    if topic_option:
        parts.append(_NOT_IN_NAMES.sub("", topic_option))
    parts.append(uuid.uuid4().hex[:16])
    return "-".join(part for part in parts if part)


def transactional_id(prefix: str, partition: int) -> str:
    """The transactional id of every attempt of the task writing Spark partition ``partition``."""
    return f"{prefix}-{partition}"


def produce_batches(
    client: Mapping[str, str],
    topic_option: str | None,
    columns: WriteColumns,
    batches: Iterator[pa.RecordBatch],
) -> WriteReport:
    """Produce every row of ``batches``; raise if any was not acknowledged."""
    producer = Producer(producer_settings(client))
    return _produce_all(producer, topic_option, columns, batches)


def produce_transaction(
    client: Mapping[str, str],
    txn_id: str,
    topic_option: str | None,
    columns: WriteColumns,
    batches: Iterator[pa.RecordBatch],
) -> WriteReport:
    """Produce every row of ``batches`` in one transaction, as ``txn_id``, and commit it.

    Raises, with the transaction aborted (or left for the next attempt's
    ``init_transactions`` to abort), if any record was not acknowledged or
    the commit failed; a producer fenced by a later attempt with the same id
    fails here, at the latest when it commits.
    """
    producer = Producer({**producer_settings(client), "transactional.id": txn_id})
    # Fences every earlier producer with this id and aborts what it left open.
    producer.init_transactions(TRANSACTION_CALL_TIMEOUT_S)
    producer.begin_transaction()
    try:
        report = _produce_all(producer, topic_option, columns, batches)
        _commit(producer)
    except BaseException:
        # A fenced producer cannot abort; a later attempt's init_transactions
        # (or the transaction timeout) ends what this one leaves open.
        with suppress(KafkaException):
            producer.abort_transaction(TRANSACTION_CALL_TIMEOUT_S)
        raise
    return report


def _commit(producer: Producer) -> None:
    for attempt in range(_COMMIT_ATTEMPTS):
        try:
            producer.commit_transaction(TRANSACTION_CALL_TIMEOUT_S)
            return
        except KafkaException as error:
            kafka_error: KafkaError = error.args[0]
            if not kafka_error.retriable() or attempt == _COMMIT_ATTEMPTS - 1:
                raise


def _produce_all(
    producer: Producer,
    topic_option: str | None,
    columns: WriteColumns,
    batches: Iterator[pa.RecordBatch],
) -> WriteReport:
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
