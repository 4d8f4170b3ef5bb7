"""The rows of a read: spark-sql-kafka's columns, as Arrow batches Spark accepts.

Spark takes a Python source's Arrow batch only if its schema equals the
declared one exactly, so the builder's output is compared with
``arrow_schema`` including nullability and metadata.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
from shoal.connector.schema import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    BatchBuilder,
    arrow_schema,
    read_schema,
)

KAFKA_COLUMNS = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
    "timestamp:timestamp,timestampType:int"
)
HEADERS = "headers:array<struct<key:string,value:binary>>"


def test_read_schema_is_spark_sql_kafkas() -> None:
    assert read_schema(include_headers=False).simpleString() == KAFKA_COLUMNS + ">"
    assert read_schema(include_headers=True).simpleString() == f"{KAFKA_COLUMNS},{HEADERS}>"


@pytest.mark.parametrize("include_headers", [False, True])
def test_every_read_column_is_nullable_as_in_spark_sql_kafka(include_headers: bool) -> None:
    schema = read_schema(include_headers)
    assert all(f.nullable for f in schema.fields)
    assert all(f.nullable for f in arrow_schema(include_headers))


@pytest.mark.parametrize("include_headers", [False, True])
def test_arrow_schema_names_the_spark_columns_in_order(include_headers: bool) -> None:
    assert arrow_schema(include_headers).names == read_schema(include_headers).fieldNames()


def test_arrow_types_are_what_spark_expects() -> None:
    schema = arrow_schema(include_headers=True)
    assert schema.field("partition").type == pa.int32()
    assert schema.field("offset").type == pa.int64()
    assert schema.field("timestampType").type == pa.int32()
    # Spark's TimestampType: microseconds since the epoch, UTC.
    assert schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert schema.field("headers").type == pa.list_(
        pa.struct([("key", pa.string()), ("value", pa.binary())])
    )


def builder(include_headers: bool) -> BatchBuilder:
    b = BatchBuilder("events", 3, include_headers)
    b.add(b"k0", b"v0", 100, 1_700_000_000_123, CREATE_TIME, [("trace", b"1"), ("empty", None)])
    b.add(None, None, 101, 1_700_000_000_124, LOG_APPEND_TIME, None)
    b.add(b"", b"v2", 105, 0, CREATE_TIME, [])
    return b


@pytest.mark.parametrize("include_headers", [False, True])
def test_batch_schema_equals_the_declared_schema_exactly(include_headers: bool) -> None:
    batch = builder(include_headers).take()
    assert batch.schema.equals(arrow_schema(include_headers), check_metadata=True)


def test_batch_holds_the_records_in_order() -> None:
    rows = builder(include_headers=False).take().to_pylist()
    assert [(r["key"], r["value"], r["offset"], r["timestampType"]) for r in rows] == [
        (b"k0", b"v0", 100, CREATE_TIME),
        (None, None, 101, LOG_APPEND_TIME),
        (b"", b"v2", 105, CREATE_TIME),
    ]
    assert {(r["topic"], r["partition"]) for r in rows} == {("events", 3)}
    assert "headers" not in rows[0]


def test_timestamps_are_utc_microseconds_of_the_record_milliseconds() -> None:
    batch = builder(include_headers=False).take()
    column = batch.column("timestamp")
    assert column.cast(pa.int64()).to_pylist() == [
        1_700_000_000_123_000,
        1_700_000_000_124_000,
        0,
    ]
    assert column[0].as_py() == datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC)


def test_headers_are_null_for_records_without_any() -> None:
    headers = builder(include_headers=True).take().column("headers").to_pylist()
    assert headers == [
        [{"key": "trace", "value": b"1"}, {"key": "empty", "value": None}],
        None,
        None,  # an empty header list is no headers, as in spark-sql-kafka
    ]


def test_headers_are_left_out_unless_asked_for() -> None:
    b = BatchBuilder("events", 0, include_headers=False)
    b.add(b"k", b"v", 0, 1, CREATE_TIME, [("h", b"x")])
    assert b.take().schema.names[-1] == "timestampType"


def test_take_empties_the_builder() -> None:
    b = builder(include_headers=True)
    assert len(b) == 3
    assert b.take().num_rows == 3
    assert len(b) == 0
    empty = b.take()
    assert empty.num_rows == 0
    assert empty.schema.equals(arrow_schema(include_headers=True), check_metadata=True)
    b.add(b"k", b"v", 106, 5, CREATE_TIME, None)
    again = b.take()
    assert again.column("offset").to_pylist() == [106]
    assert again.column("headers").to_pylist() == [None]
