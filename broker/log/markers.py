"""End transaction markers: the control batches that commit or abort a transaction.

Kafka's EndTransactionMarker: a batch with the transactional and control
attributes, the producer's id and epoch, base sequence -1, and one record::

    key   = version int16 (0), type int16 (0 ABORT, 1 COMMIT)
    value = version int16 (0), coordinator_epoch int32

The transaction coordinator asks partition leaders to write them
(WriteTxnMarkers); the log reads them back when it replays producer state.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from shoal.records import BatchOptions, InvalidBatchError, NewRecord, build_batch, iter_records

ABORT: Final = 0
COMMIT: Final = 1
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


@dataclass(frozen=True, slots=True)
class Marker:
    commit: bool
    coordinator_epoch: int


def build_marker(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp: int,
    base_offset: int = 0,
    leader_epoch: int = -1,
) -> bytes:
    record = NewRecord(
        _KEY.pack(0, COMMIT if commit else ABORT),
        _VALUE.pack(0, coordinator_epoch),
        timestamp=timestamp,
    )
    options = BatchOptions(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
        partition_leader_epoch=leader_epoch,
    )
    return build_batch([record], base_offset, options)


def read_marker(batch: bytes | memoryview) -> Marker | None:
    """The marker of a control batch; None for another control record (or an empty batch,
    which a clean leaves)."""
    for record in iter_records(batch):
        key = record.key or b""
        if len(key) < _KEY.size:
            raise InvalidBatchError("control record key is too short")
        _, kind = _KEY.unpack_from(key)
        if kind not in (ABORT, COMMIT):
            return None
        value = record.value or b""
        if len(value) < _VALUE.size:
            raise InvalidBatchError("end transaction marker value is too short")
        _, coordinator_epoch = _VALUE.unpack_from(value)
        return Marker(kind == COMMIT, coordinator_epoch)
    return None
