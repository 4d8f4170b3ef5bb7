"""What a clean must know of transactions: aborted batches, and markers that may go.

Kafka's CleanedTransactionMetadata, for one pass over a log's batches in
offset order (building the offset map, or cleaning the groups of a clean,
which start at the log start):

* The aborted transactions overlapping the pass come from the log's aborted
  transaction indexes, collected on the event loop before the pass starts.
  One becomes current for its producer when the pass reaches its first
  offset, and stops being so at its marker.
* A transactional data batch of a producer whose aborted transaction is
  current belongs to it: its records are never mapped as a key's latest
  value, and the clean removes them (consumers in read_committed skip them;
  read_uncommitted ones saw them only while they were recent).
* A marker had data when the pass met a batch of its transaction (kept or
  removed by this clean). Such a marker stays: a consumer needs it to end
  the transaction. One without data may go, as Kafka's KIP-534 tombstones
  do: the first clean that finds it so stamps a delete horizon
  (now + delete.retention.ms) on it, a clean after the horizon removes it,
  and the aborted transaction index entry of a removed abort goes with it
  (a consumer given the entry would skip the producer's later batches
  until a marker that is no longer there).

Only data below the last stable offset is cleaned, so every transaction a
pass sees data of is closed, by a marker at or before the pass's end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from shoal.broker.log.txn_index import AbortedTxn

from shoal.records import BatchHeader


class TransactionPass:
    """Fed every batch of a pass in offset order: :meth:`is_aborted` for data batches,
    :meth:`marker_had_data` for control batches."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._upcoming = deque(sorted(aborted, key=lambda t: t.first_offset))
        self._current: dict[int, AbortedTxn] = {}
        self._with_data: set[int] = set()
        """Producers whose transaction, open in the pass, had a batch in it."""

    def _advance(self, header: BatchHeader) -> None:
        while self._upcoming and self._upcoming[0].first_offset <= header.last_offset:
            txn = self._upcoming.popleft()
            if txn.last_offset >= header.base_offset:
                self._current[txn.producer_id] = txn

    def is_aborted(self, header: BatchHeader) -> bool:
        """Whether ``header``'s batch is data of an aborted transaction (a control batch
        is passed on to :meth:`marker_had_data`, and is not)."""
        if header.is_control:
            self.marker_had_data(header)
            return False
        self._advance(header)
        if not header.is_transactional or header.producer_id < 0:
            return False
        self._with_data.add(header.producer_id)
        current = self._current.get(header.producer_id)
        if current is None:
            return False
        if header.base_offset >= current.last_offset:
            del self._current[header.producer_id]  # past its marker: another transaction
            return False
        return True

    def marker_had_data(self, header: BatchHeader) -> bool:
        """Whether the transaction this marker ends had a batch in the pass."""
        self._advance(header)
        pid = header.producer_id
        current = self._current.get(pid)
        if current is not None and header.base_offset >= current.last_offset:
            del self._current[pid]
        had = pid in self._with_data
        self._with_data.discard(pid)
        return had
