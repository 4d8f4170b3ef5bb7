"""Records of ``__transaction_state``, in Kafka's format (TransactionLogKey/Value).

Kafka writes these with its generated message classes, each prefixed by an
int16 version; kio carries no schema for internal records, hence this codec::

    TransactionLogKey   v0: transactional_id string (int16 length)
    TransactionLogValue v0: producer_id int64, producer_epoch int16,
                            transaction_timeout_ms int32, transaction_status int8,
                            partitions nullable [topic string, partition_ids [int32]],
                            last_update_timestamp_ms int64, start_timestamp_ms int64
                        v1: the same fields in Kafka's flexible encoding (compact
                            strings and arrays, tagged fields), with tagged
                            previous_producer_id (0), next_producer_id (1) and
                            client_transaction_version (2)

Shoal writes v0, the version Kafka writes until ``transaction.version`` 1 is
enabled, and reads both, so a log Kafka wrote loads here. The partitions
array is null in state Empty. A null value (tombstone) means the
transactional id expired.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from shoal.wire.varint import VarintError, read_uvarint

KEY_VERSION: Final = 0
VALUE_VERSION: Final = 0
NO_PRODUCER_ID: Final = -1

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class TxnRecordFormatError(ValueError):
    """A key or value in __transaction_state that is not Kafka's format."""


@dataclass(frozen=True, slots=True)
class TxnValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    status: int
    """Kafka's TransactionState id (see :class:`~shoal.broker.txn.metadata.TxnState`)."""
    partitions: tuple[tuple[str, tuple[int, ...]], ...] | None
    last_update_timestamp: int
    start_timestamp: int
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID


def group_partitions(
    partitions: Iterable[tuple[str, int]],
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Partitions by topic, sorted: the shape of this record and of every Kafka request
    that lists partitions."""
    grouped: dict[str, list[int]] = {}
    for topic, index in sorted(partitions):
        grouped.setdefault(topic, []).append(index)
    return tuple((topic, tuple(indexes)) for topic, indexes in grouped.items())


def _string(value: str) -> bytes:
    data = value.encode()
    return _I16.pack(len(data)) + data


def txn_key(transactional_id: str) -> bytes:
    return _I16.pack(KEY_VERSION) + _string(transactional_id)


def txn_value(value: TxnValue) -> bytes:
    out = bytearray(_I16.pack(VALUE_VERSION))
    out += _I64.pack(value.producer_id)
    out += _I16.pack(value.producer_epoch)
    out += _I32.pack(value.timeout_ms)
    out += _I8.pack(value.status)
    if value.partitions is None:
        out += _I32.pack(-1)
    else:
        out += _I32.pack(len(value.partitions))
        for topic, ids in value.partitions:
            out += _string(topic)
            out += _I32.pack(len(ids))
            for partition in ids:
                out += _I32.pack(partition)
    out += _I64.pack(value.last_update_timestamp)
    out += _I64.pack(value.start_timestamp)
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise TxnRecordFormatError("record ends early")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def number(self, layout: struct.Struct) -> int:
        return int(layout.unpack(self.take(layout.size))[0])

    def uvarint(self) -> int:
        try:
            value, self.pos = read_uvarint(memoryview(self.data), self.pos, len(self.data))
        except VarintError as exc:
            raise TxnRecordFormatError(str(exc)) from exc
        return value

    def text(self, length: int) -> str:
        try:
            return self.take(length).decode()
        except UnicodeDecodeError as exc:
            raise TxnRecordFormatError("string is not UTF-8") from exc

    def string(self, flexible: bool) -> str:
        length = self.uvarint() - 1 if flexible else self.number(_I16)
        if length < 0:
            raise TxnRecordFormatError("null where a string is required")
        return self.text(length)

    def array_length(self, flexible: bool) -> int:
        """-1 for a null array."""
        return self.uvarint() - 1 if flexible else self.number(_I32)

    def tagged_fields(self) -> dict[int, bytes]:
        fields = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            fields[tag] = self.take(self.uvarint())
        return fields


def parse_txn_key(data: bytes) -> str | None:
    """The transactional id of a key; None for key versions this broker does not know."""
    r = _Reader(data)
    if r.number(_I16) != KEY_VERSION:
        return None
    return r.string(flexible=False)


def parse_txn_value(data: bytes) -> TxnValue:
    r = _Reader(data)
    version = r.number(_I16)
    if version not in (0, 1):
        raise TxnRecordFormatError(f"transaction log value version {version}")
    flexible = version >= 1
    producer_id = r.number(_I64)
    producer_epoch = r.number(_I16)
    timeout_ms = r.number(_I32)
    status = r.number(_I8)
    partitions: list[tuple[str, tuple[int, ...]]] | None = None
    count = r.array_length(flexible)
    if count >= 0:
        partitions = []
        for _ in range(count):
            topic = r.string(flexible)
            ids = tuple(r.number(_I32) for _ in range(max(r.array_length(flexible), 0)))
            if flexible:
                r.tagged_fields()
            partitions.append((topic, ids))
    last_update = r.number(_I64)
    start = r.number(_I64)
    previous = next_id = NO_PRODUCER_ID
    if flexible:
        tagged = r.tagged_fields()
        if 0 in tagged:
            previous = int(_I64.unpack(tagged[0])[0])
        if 1 in tagged:
            next_id = int(_I64.unpack(tagged[1])[0])
    return TxnValue(
        producer_id,
        producer_epoch,
        timeout_ms,
        status,
        None if partitions is None else tuple(partitions),
        last_update,
        start,
        previous,
        next_id,
    )
