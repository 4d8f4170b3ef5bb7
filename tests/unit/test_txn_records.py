"""__transaction_state records: Kafka's TransactionLogKey/Value bytes, both ways."""

from __future__ import annotations

import struct

import pytest
from shoal.broker.txn.metadata import TransactionMetadata, TxnState, TxnTransit
from shoal.broker.txn.records import (
    TxnRecordFormatError,
    TxnValue,
    parse_txn_key,
    parse_txn_value,
    txn_key,
    txn_value,
)


def test_the_key_is_version_0_then_the_transactional_id() -> None:
    assert txn_key("tx-1") == b"\x00\x00\x00\x04tx-1"
    assert parse_txn_key(txn_key("tx-1")) == "tx-1"


def test_a_key_of_an_unknown_version_is_skipped() -> None:
    assert parse_txn_key(b"\x00\x01\x00\x01a") is None


def test_a_value_is_written_in_kafkas_version_0_layout() -> None:
    value = TxnValue(42, 3, 60_000, 1, (("t", (0, 2)),), 1_700_000_000_123, 1_700_000_000_000)
    expected = (
        struct.pack(">hqhib", 0, 42, 3, 60_000, 1)
        + struct.pack(">i", 1)
        + struct.pack(">h", 1)
        + b"t"
        + struct.pack(">iii", 2, 0, 2)
        + struct.pack(">qq", 1_700_000_000_123, 1_700_000_000_000)
    )
    assert txn_value(value) == expected
    assert parse_txn_value(expected) == value


def test_an_empty_transaction_has_a_null_partition_array() -> None:
    value = TxnValue(42, 0, 60_000, 0, None, 5, -1)
    data = txn_value(value)
    assert data[17:21] == b"\xff\xff\xff\xff"
    assert parse_txn_value(data) == value


def test_a_flexible_version_1_value_reads_with_its_tagged_producer_ids() -> None:
    # What Kafka writes once transaction.version 1 is enabled: compact strings and
    # arrays (length + 1), empty tagged fields per struct, then the value's tags.
    data = (
        struct.pack(">hqhib", 1, 42, 3, 60_000, 2)
        + bytes([2])  # one partition entry
        + bytes([2])
        + b"t"
        + bytes([3])
        + struct.pack(">ii", 0, 1)
        + bytes([0])
        + struct.pack(">qq", 20, 10)
        + bytes([2, 0, 8])
        + struct.pack(">q", 41)
        + bytes([1, 8])
        + struct.pack(">q", 43)
    )
    value = parse_txn_value(data)
    assert value == TxnValue(42, 3, 60_000, 2, (("t", (0, 1)),), 20, 10, 41, 43)


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00\x07" + bytes(30), txn_value(TxnValue(1, 0, 1, 1, (), 0, 0))[:-3]],
    ids=["empty", "unknown-version", "truncated"],
)
def test_a_malformed_value_is_refused(data: bytes) -> None:
    with pytest.raises(TxnRecordFormatError):
        parse_txn_value(data)


def test_metadata_survives_the_round_trip_through_a_record() -> None:
    transit = TxnTransit(
        7, 7, 2, -1, 30_000, TxnState.ONGOING, frozenset({("a", 1), ("a", 0), ("b", 3)}), 100, 150
    )
    loaded = TransactionMetadata.from_value("tx", parse_txn_value(txn_value(transit.value())))
    assert (loaded.producer_id, loaded.producer_epoch, loaded.timeout_ms) == (7, 2, 30_000)
    assert loaded.state is TxnState.ONGOING
    assert loaded.partitions == {("a", 0), ("a", 1), ("b", 3)}
    assert (loaded.start_timestamp, loaded.last_update_timestamp) == (100, 150)
