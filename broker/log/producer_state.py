"""Idempotent producers: per producer id, the last batches' sequences in one partition.

Kafka's rules (ProducerStateManager, ProducerAppendInfo):

* A batch carries (producer id, epoch, base sequence); its last sequence is
  base + lastOffsetDelta, wrapping after 2**31 - 1.
* The last five batches of each producer are remembered. A batch equal to
  one of them is a retry: it is acknowledged with the original offsets and
  not appended again.
* Otherwise it must follow the last sequence exactly; a gap is
  OUT_OF_ORDER_SEQUENCE_NUMBER. A new epoch starts at 0; a producer the
  partition has no state for (new, or expired) may start anywhere.
* An epoch older than the producer's current one is fenced
  (INVALID_PRODUCER_EPOCH).
* A producer silent for ``producer.id.expiration.ms`` is forgotten, unless
  its transaction is still open.

Transactions (KIP-98), as Kafka's ProducerAppendInfo and ProducerStateManager:

* A transactional batch opens the producer's transaction at its first
  offset, or continues the open one. A non-transactional batch from a
  producer with an open transaction is INVALID_TXN_STATE. Transactional
  batches the broker writes itself (the group coordinator's offset commits)
  carry base sequence -1 and skip the sequence checks.
* A control batch (an end transaction marker from the coordinator) closes
  it; it is fenced when its producer epoch is older than the producer's
  (INVALID_PRODUCER_EPOCH) or its coordinator epoch older than the last one
  seen (TRANSACTION_COORDINATOR_FENCED).
* A closed transaction stays unstable until the high watermark passes its
  marker (it could still be lost with a leader change); the first unstable
  offset is the first offset of the oldest open or unstable transaction, and
  bounds what read_committed consumers see (the last stable offset).

The state survives restarts as Kafka keeps it: ``<offset>.snapshot`` files in
the partition directory, written when a segment rolls and at clean shutdown,
hold each producer's last batch; loading takes the newest snapshot at or
below the log end and replays the batch headers after it. Kafka's snapshot
format (version 1), so the files are the ones an operator knows::

    version int16, crc uint32 (CRC-32C of what follows), count int32,
    count x [producer_id int64, epoch int16, last_sequence int32,
             last_offset int64, offset_delta int32, timestamp int64,
             coordinator_epoch int32, current_txn_first_offset int64]
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from crc32c import crc32c
from shoal.broker.log.checkpoint import write_atomically_bytes

from shoal.records import BatchHeader

SNAPSHOT_SUFFIX: Final = ".snapshot"
SNAPSHOT_VERSION: Final = 1
CACHED_BATCHES: Final = 5
INT_MAX: Final = 2**31 - 1
NO_SEQUENCE: Final = -1
SNAPSHOTS_KEPT: Final = 2

_HEAD = struct.Struct(">hI")
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhiqiqiq")


class ProducerStateError(Exception):
    code = "unknown_server_error"


class OutOfOrderSequenceError(ProducerStateError):
    code = "out_of_order_sequence_number"


class InvalidProducerEpochError(ProducerStateError):
    code = "invalid_producer_epoch"


class InvalidTxnStateError(ProducerStateError):
    code = "invalid_txn_state"


class TransactionCoordinatorFencedError(ProducerStateError):
    code = "transaction_coordinator_fenced"


class SnapshotCorruptError(ValueError):
    pass


def next_sequence(sequence: int, increment: int) -> int:
    """Sequences wrap from 2**31 - 1 to 0, as Kafka's DefaultRecordBatch.incrementSequence."""
    if sequence > INT_MAX - increment:
        return increment - (INT_MAX - sequence) - 1
    return sequence + increment


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=CACHED_BATCHES))
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    """Of the last marker written for this producer: an older one is a fenced coordinator's."""
    current_txn_first_offset: int = -1
    """First offset of the producer's open transaction; -1 when none is open."""

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE

    def copy(self) -> ProducerEntry:
        return ProducerEntry(
            self.producer_id,
            self.epoch,
            deque(self.batches, maxlen=CACHED_BATCHES),
            self.last_timestamp,
            self.coordinator_epoch,
            self.current_txn_first_offset,
        )


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction its marker closed: data from ``first_offset``, marker at ``last_offset``."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offsets(directory: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in directory.glob("*" + SNAPSHOT_SUFFIX))


class ProducerStateManager:
    """Producer state of one partition. Owned by its Log; event loop thread only."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.producers: dict[int, ProducerEntry] = {}
        self.ongoing: dict[int, int] = {}
        """First offset -> producer id of every open transaction."""
        self.unreplicated: dict[int, CompletedTxn] = {}
        """First offset -> closed transactions whose marker is not yet below the high watermark."""
        self._unsynced: set[int] = set()
        """Offsets of snapshots written without fsync, until a flush takes them."""

    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """Validate a data batch with a producer id before it is appended.

        Returns the stored batch when this one is a retry of it (append
        nothing, answer with its offsets), None when it may be appended;
        raises InvalidProducerEpochError, InvalidTxnStateError or
        OutOfOrderSequenceError.
        """
        first = header.base_sequence
        last = next_sequence(first, header.last_offset_delta)
        entry = self.producers.get(header.producer_id)
        if entry is None:
            # As Kafka: no state (a new producer, or one idle past
            # producer.id.expiration.ms) means nothing to compare with.
            return None
        if header.producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than"
                f" {entry.epoch}"
            )
        if not header.is_transactional and entry.current_txn_first_offset >= 0:
            raise InvalidTxnStateError(
                f"producer {header.producer_id} sent a non-transactional batch while its"
                f" transaction from offset {entry.current_txn_first_offset} is open"
            )
        if _internal(header):
            return None
        if header.producer_epoch > entry.epoch:
            if first != 0:
                raise OutOfOrderSequenceError(
                    f"a new epoch of producer {header.producer_id} must start at sequence 0"
                )
            return None
        for batch in entry.batches:
            if batch.first_sequence == first and batch.last_sequence == last:
                return batch
        expected = next_sequence(entry.last_sequence, 1) if entry.batches else 0
        if first != expected:
            raise OutOfOrderSequenceError(
                f"producer {header.producer_id} sent sequence {first}, expected {expected}"
            )
        return None

    def check_append(self, headers: Iterable[BatchHeader]) -> list[BatchMetadata | None]:
        """:meth:`check` for the data batches of one append, in order.

        As Kafka's ProducerAppendInfo: each batch is checked against the state
        the batches before it in the same append would leave, so a producer's
        second batch must follow its first, and repeating one is not new.
        """
        staged = ProducerStateManager(self.directory)
        results: list[BatchMetadata | None] = []
        for header in headers:
            pid = header.producer_id
            stored = self.producers.get(pid)
            if pid not in staged.producers and stored is not None:
                staged.producers[pid] = stored.copy()
            found = staged.check(header)
            if found is None:
                staged.update(header)
            results.append(found)
        return results

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """May a marker with these epochs be written? Raises the fencing error if not."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"marker for producer {producer_id} has epoch {producer_epoch},"
                f" older than {entry.epoch}"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker for producer {producer_id} from coordinator epoch {coordinator_epoch},"
                f" older than {entry.coordinator_epoch}"
            )

    def _entry_for(self, producer_id: int, epoch: int) -> ProducerEntry:
        """The producer's entry, restarted (no batches) when ``epoch`` is newer; a bump
        keeps the open transaction and coordinator epoch, as Kafka's maybeUpdateProducerEpoch."""
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            fresh = ProducerEntry(producer_id, epoch)
            if entry is not None:
                fresh.last_timestamp = entry.last_timestamp
                fresh.coordinator_epoch = entry.coordinator_epoch
                fresh.current_txn_first_offset = entry.current_txn_first_offset
            self.producers[producer_id] = entry = fresh
        return entry

    def update(self, header: BatchHeader) -> None:
        """Record an appended data batch (``header`` carries its assigned offsets)."""
        if header.producer_id < 0:
            return
        entry = self._entry_for(header.producer_id, header.producer_epoch)
        if not _internal(header):
            entry.batches.append(
                BatchMetadata(
                    header.base_sequence,
                    next_sequence(header.base_sequence, header.last_offset_delta),
                    header.base_offset,
                    header.last_offset,
                    header.max_timestamp,
                )
            )
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        if header.is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = header.base_offset
            self.ongoing[header.base_offset] = header.producer_id

    def complete_txn(
        self, header: BatchHeader, commit: bool, coordinator_epoch: int
    ) -> CompletedTxn:
        """Record an appended marker (``header`` is its control batch's): the transaction it
        closed, which stays unstable until :meth:`on_high_watermark` passes the marker."""
        entry = self._entry_for(header.producer_id, header.producer_epoch)
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        first = entry.current_txn_first_offset
        if first >= 0:
            self.ongoing.pop(first, None)
        else:
            first = header.base_offset  # a marker with no data before it here
        entry.current_txn_first_offset = -1
        txn = CompletedTxn(header.producer_id, first, header.base_offset, not commit)
        self.unreplicated[first] = txn
        return txn

    def last_stable_offset_after(self, txn: CompletedTxn) -> int:
        """The LSO once ``txn`` is closed (its txn index entry's): Kafka's lastStableOffset."""
        return min(self.ongoing, default=txn.last_offset + 1)

    def on_high_watermark(self, high_watermark: int) -> None:
        """Closed transactions whose marker is below the high watermark become stable."""
        for first, txn in list(self.unreplicated.items()):
            if txn.last_offset < high_watermark:
                del self.unreplicated[first]

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest open or unreplicated transaction, None if there is none."""
        return min((*self.ongoing, *self.unreplicated), default=None)

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        doomed = [
            pid
            for pid, entry in self.producers.items()
            if now_ms - entry.last_timestamp >= expiration_ms and entry.current_txn_first_offset < 0
        ]
        for pid in doomed:
            del self.producers[pid]
        return len(doomed)

    def clear(self) -> None:
        self.producers.clear()
        self.ongoing.clear()
        self.unreplicated.clear()

    # -- snapshots ---------------------------------------------------------------

    def write_snapshot(self, offset: int, *, sync: bool = True) -> None:
        """Snapshot the producers at ``offset``. Without ``sync`` (a segment roll, on the
        event loop) the file is not fsynced; :meth:`unsynced_snapshots` hands it to the
        next flush, which fsyncs it in a thread, as Kafka flushes a roll's snapshot
        asynchronously. Until then a crash may leave it torn: :meth:`load` skips it by
        its CRC and replays the log from an older one."""
        # As Kafka, entries without batches too (a producer only a marker has
        # touched, an internal transaction): their epochs and open transactions count.
        entries = list(self.producers.values())
        body = bytearray(_COUNT.pack(len(entries)))
        for entry in entries:
            if entry.batches:
                last = entry.batches[-1]
                sequence, last_offset = last.last_sequence, last.last_offset
                delta = last.last_offset - last.first_offset
            else:
                sequence, last_offset, delta = NO_SEQUENCE, -1, 0
            body += _ENTRY.pack(
                entry.producer_id,
                entry.epoch,
                sequence,
                last_offset,
                delta,
                entry.last_timestamp,
                entry.coordinator_epoch,
                entry.current_txn_first_offset,
            )
        data = _HEAD.pack(SNAPSHOT_VERSION, crc32c(bytes(body))) + bytes(body)
        write_atomically_bytes(snapshot_path(self.directory, offset), data, sync=sync)
        if sync:
            self._unsynced.discard(offset)
        else:
            self._unsynced.add(offset)
        for old in snapshot_offsets(self.directory)[:-SNAPSHOTS_KEPT]:
            snapshot_path(self.directory, old).unlink(missing_ok=True)

    def unsynced_snapshots(self, up_to: int) -> list[Path]:
        """The snapshots written without fsync at offsets up to ``up_to``, forgotten here:
        the caller fsyncs them (:func:`~shoal.broker.log.checkpoint.fsync_files`)."""
        due = sorted(o for o in self._unsynced if o <= up_to)
        self._unsynced.difference_update(due)
        return [snapshot_path(self.directory, o) for o in due]

    def load(self, log_end_offset: int, at_most: int | None = None) -> int:
        """Load the newest usable snapshot at or below the log end (and ``at_most``);
        returns its offset (or 0).

        Snapshots past the log end (from before a truncation) and corrupt ones
        are deleted; the caller replays batches from the returned offset on.
        Open transactions come back from the entries; closed ones not yet
        replicated do not (as in Kafka: the snapshot is of a stable point).
        """
        self.clear()
        for offset in reversed(snapshot_offsets(self.directory)):
            path = snapshot_path(self.directory, offset)
            if offset > log_end_offset:
                path.unlink(missing_ok=True)
                continue
            if at_most is not None and offset > at_most:
                continue
            try:
                self.producers = _read_snapshot(path.read_bytes())
            except SnapshotCorruptError:
                path.unlink(missing_ok=True)
                continue
            self.ongoing = {
                e.current_txn_first_offset: pid
                for pid, e in self.producers.items()
                if e.current_txn_first_offset >= 0
            }
            return offset
        return 0

    def truncate_snapshots_after(self, offset: int) -> None:
        for snap in snapshot_offsets(self.directory):
            if snap > offset:
                snapshot_path(self.directory, snap).unlink(missing_ok=True)


def _internal(header: BatchHeader) -> bool:
    """A transactional batch the broker wrote itself (no sequence to check)."""
    return header.is_transactional and header.base_sequence == NO_SEQUENCE


def _read_snapshot(data: bytes) -> dict[int, ProducerEntry]:
    if len(data) < _HEAD.size + _COUNT.size:
        raise SnapshotCorruptError("snapshot is cut short")
    version, crc = _HEAD.unpack_from(data)
    body = data[_HEAD.size :]
    if version != SNAPSHOT_VERSION or crc32c(body) != crc:
        raise SnapshotCorruptError("snapshot version or CRC does not match")
    (count,) = _COUNT.unpack_from(body)
    if len(body) != _COUNT.size + count * _ENTRY.size:
        raise SnapshotCorruptError("snapshot size does not match its entry count")
    producers = {}
    for i in range(count):
        pid, epoch, last_seq, last_offset, delta, timestamp, coordinator_epoch, txn_first = (
            _ENTRY.unpack_from(body, _COUNT.size + i * _ENTRY.size)
        )
        entry = ProducerEntry(
            pid,
            epoch,
            last_timestamp=timestamp,
            coordinator_epoch=coordinator_epoch,
            current_txn_first_offset=txn_first,
        )
        if last_offset >= 0 and last_seq != NO_SEQUENCE:
            first_seq = (last_seq - delta) % (INT_MAX + 1)
            entry.batches.append(
                BatchMetadata(first_seq, last_seq, last_offset - delta, last_offset, timestamp)
            )
        producers[pid] = entry
    return producers
