"""Kafka's RecordBatch v2: the header the broker works with, and records where needed."""

from shoal.records.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    Compression,
    CorruptBatchError,
    InvalidBatchError,
    TimestampType,
    iter_batches,
    parse_header,
    read_offset_and_length,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batch,
)
from shoal.records.compression import CompressionError, DecompressedTooLargeError
from shoal.records.recompress import RecompressTarget, recompress_batch
from shoal.records.records import BatchOptions, NewRecord, Record, build_batch, iter_records

__all__ = [
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "BatchHeader",
    "BatchOptions",
    "Compression",
    "CompressionError",
    "CorruptBatchError",
    "DecompressedTooLargeError",
    "InvalidBatchError",
    "NewRecord",
    "RecompressTarget",
    "Record",
    "TimestampType",
    "build_batch",
    "iter_batches",
    "iter_records",
    "parse_header",
    "read_offset_and_length",
    "recompress_batch",
    "set_base_offset",
    "set_log_append_time",
    "set_partition_leader_epoch",
    "validate_batch",
]
