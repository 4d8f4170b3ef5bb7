"""The rows a read returns: spark-sql-kafka's columns, built as Arrow batches.

Spark takes ``pyarrow.RecordBatch`` from a Python data source only when its
schema equals the declared one exactly (types, order and names), and Arrow
batches carry about three times the rows per second of Python tuples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# Kafka's TimestampType ids, as spark-sql-kafka's timestampType column has them.
CREATE_TIME = 0
LOG_APPEND_TIME = 1

# Built from types rather than parsed from DDL: parsing needs a SparkContext,
# which the Python workers that plan reads do not have.
_SPARK_COLUMNS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
_SPARK_HEADERS = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)

_HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
_COLUMNS = [
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    # Spark's TimestampType is microseconds since the epoch, in UTC.
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
]
_ARROW_SCHEMA = pa.schema(_COLUMNS)
_ARROW_SCHEMA_WITH_HEADERS = pa.schema([*_COLUMNS, ("headers", pa.list_(_HEADER))])


def read_schema(include_headers: bool) -> StructType:
    """The Spark schema of a read."""
    return StructType([*_SPARK_COLUMNS, _SPARK_HEADERS] if include_headers else _SPARK_COLUMNS)


def arrow_schema(include_headers: bool) -> pa.Schema:
    return _ARROW_SCHEMA_WITH_HEADERS if include_headers else _ARROW_SCHEMA


Headers = list[tuple[str, bytes | None]]


@dataclass
class BatchBuilder:
    """Collects records of one partition and turns them into an Arrow batch."""

    topic: str
    partition: int
    include_headers: bool
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    timestamps_ms: list[int] = field(default_factory=list)
    timestamp_types: list[int] = field(default_factory=list)
    headers: list[Headers | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def add(
        self,
        key: bytes | None,
        value: bytes | None,
        offset: int,
        timestamp_ms: int,
        timestamp_type: int,
        headers: Headers | None,
    ) -> None:
        self.keys.append(key)
        self.values.append(value)
        self.offsets.append(offset)
        self.timestamps_ms.append(timestamp_ms)
        self.timestamp_types.append(timestamp_type)
        if self.include_headers:
            # Like spark-sql-kafka: a record without headers has null, not [].
            self.headers.append(headers or None)

    def take(self) -> pa.RecordBatch:
        """The records added so far, as one batch; the builder starts empty again."""
        count = len(self.offsets)
        columns = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array([self.topic] * count, pa.string()),
            pa.array([self.partition] * count, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps_ms, pa.int64())
            .cast(pa.timestamp("ms", tz="UTC"))
            .cast(pa.timestamp("us", tz="UTC")),
            pa.array(self.timestamp_types, pa.int32()),
        ]
        if self.include_headers:
            columns.append(pa.array(self.headers, pa.list_(_HEADER)))
        batch = pa.RecordBatch.from_arrays(columns, schema=arrow_schema(self.include_headers))
        for column in (
            self.keys,
            self.values,
            self.offsets,
            self.timestamps_ms,
            self.timestamp_types,
            self.headers,
        ):
            column.clear()
        return batch
