"""What a write accepts: the Kafka sink's columns, checked before any task runs.

Columns arrive as name -> Spark type name (``DataType.simpleString()``).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from shoal.connector import writing
from shoal.connector.options import OptionError
from shoal.connector.writing import WriteColumns, check_write_schema, produce_batches

HEADERS = "array<struct<key:string,value:binary>>"


def refused(fields: dict[str, str], topic_option: str | None = "events") -> str:
    with pytest.raises(OptionError) as caught:
        check_write_schema(fields, topic_option)
    return str(caught.value)


@pytest.mark.parametrize("value", ["string", "binary"])
@pytest.mark.parametrize("key", ["string", "binary"])
def test_key_and_value_may_be_string_or_binary(key: str, value: str) -> None:
    columns = check_write_schema({"key": key, "value": value}, "events")
    assert columns == WriteColumns(key=True, topic=False, partition=False, headers=False)


def test_value_alone_is_enough_with_the_topic_option() -> None:
    columns = check_write_schema({"value": "binary"}, "events")
    assert columns == WriteColumns(key=False, topic=False, partition=False, headers=False)


def test_every_optional_column_is_recognised() -> None:
    columns = check_write_schema(
        {
            "key": "binary",
            "value": "string",
            "topic": "string",
            "partition": "int",
            "headers": HEADERS,
        },
        None,
    )
    assert columns == WriteColumns(key=True, topic=True, partition=True, headers=True)


def test_other_columns_are_ignored_whatever_their_type() -> None:
    columns = check_write_schema(
        {"value": "binary", "id": "bigint", "payload": "map<string,int>", "offset": "bigint"},
        "events",
    )
    assert columns == WriteColumns(key=False, topic=False, partition=False, headers=False)


def test_missing_value_column_fails() -> None:
    message = refused({"key": "binary", "data": "binary"})
    assert message == "the DataFrame needs a value column (string or binary) to write"


@pytest.mark.parametrize(
    ("column", "kind", "expected"),
    [
        ("value", "int", "column value must be string or binary, not int; cast it first"),
        (
            "value",
            "array<tinyint>",
            "column value must be string or binary, not array<tinyint>; cast it first",
        ),
        ("key", "bigint", "column key must be string or binary, not bigint; cast it first"),
        ("topic", "binary", "column topic must be string, not binary"),
        ("partition", "bigint", "column partition must be int, not bigint"),
        ("partition", "string", "column partition must be int, not string"),
        (
            "headers",
            "map<string,binary>",
            f"column headers must be {HEADERS}, not map<string,binary>",
        ),
        (
            "headers",
            "array<struct<key:string,value:string>>",
            f"column headers must be {HEADERS}, not array<struct<key:string,value:string>>",
        ),
    ],
)
def test_wrong_column_type_fails_naming_column_and_type(
    column: str, kind: str, expected: str
) -> None:
    fields = {"value": "binary", column: kind}
    assert refused(fields, topic_option=None if column == "topic" else "events") == expected


def test_without_topic_option_a_topic_column_is_needed() -> None:
    message = refused({"value": "binary"}, topic_option=None)
    assert message == "give the topic option or a topic column to write to"
    assert check_write_schema({"value": "binary", "topic": "string"}, None).topic


class FakeProducer:
    """Stands in for confluent_kafka.Producer: every record is acknowledged."""

    produced: list[tuple[str, bytes | None, bytes | None]]

    def __init__(self, settings: dict[str, object]) -> None:
        self.produced = []
        self._pending: list[Any] = []

    def produce(self, topic: str, value: bytes | None, key: bytes | None, **extra: Any) -> None:
        self.produced.append((topic, value, key))
        self._pending.append(extra["on_delivery"])

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        message = type("Message", (), {"value": lambda _: b"v", "key": lambda _: None})()
        for on_delivery in self._pending:
            on_delivery(None, message)
        self._pending.clear()
        return 0


def test_a_column_whose_name_differs_in_case_is_refused_or_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(writing, "Producer", FakeProducer)
    try:
        columns = check_write_schema({"Value": "binary"}, "events")
    except OptionError:
        return  # refused before any task runs, as Spark's Kafka sink does
    batch = pa.RecordBatch.from_pydict({"Value": pa.array([b"v"], pa.binary())})
    report = produce_batches({"bootstrap.servers": "gw:9092"}, "events", columns, iter([batch]))
    assert report.records == 1


def test_rows_are_produced_with_the_topic_option_over_the_topic_column(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producers: list[FakeProducer] = []

    def make(settings: dict[str, object]) -> FakeProducer:
        producers.append(FakeProducer(settings))
        return producers[-1]

    monkeypatch.setattr(writing, "Producer", make)
    columns = check_write_schema({"key": "string", "value": "string", "topic": "string"}, "events")
    batch = pa.RecordBatch.from_pydict(
        {"key": ["k", None], "value": ["v", "w"], "topic": ["ignored", None]}
    )
    report = produce_batches({"bootstrap.servers": "gw:9092"}, "events", columns, iter([batch]))
    assert producers[0].produced == [("events", b"v", b"k"), ("events", b"w", None)]
    assert report.records == 2
