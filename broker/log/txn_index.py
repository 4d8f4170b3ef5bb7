"""The aborted transaction index of one segment: Kafka's ``<base offset>.txnindex``.

A read_committed consumer drops the records of aborted transactions itself;
the broker tells it which ones, as (producer id, first offset) pairs, with
every fetch. This index is where the broker finds them: one entry per abort
marker, in the segment that holds the marker, appended when the marker is
(Kafka's TransactionIndex). Entries are in marker order, so in last offset
order. The file format is Kafka's, 34 bytes an entry::

    version int16 (0), producer_id int64, first_offset int64,
    last_offset int64, last_stable_offset int64

``last_stable_offset`` is the log's LSO once the abort was written: the first
offset of the oldest transaction still open then, else one past the marker.
A search for the aborts overlapping [start, end) can stop at the first entry
whose LSO reaches ``end``: every transaction starting below ``end`` was
resolved by then, so no later marker can abort one of them.

Unlike the offset indexes this one cannot be rebuilt from its segment alone
(a transaction may start in an earlier segment); the log rebuilds entries
while it replays producer state after a crash, and the segment truncates
the index with the log. Appends are written at once and fsynced with the
segment. Owned by the event loop thread; only :meth:`TransactionIndex.flush`
runs in the log's flush thread.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

TXN_INDEX_SUFFIX: Final = ".txnindex"
VERSION: Final = 0
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE: Final = _ENTRY.size

log = logging.getLogger(__name__)


class TxnIndexCorruptError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    """The abort marker's offset."""
    last_stable_offset: int


def encode(entries: list[AbortedTxn]) -> bytes:
    return b"".join(
        _ENTRY.pack(VERSION, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
        for e in entries
    )


def decode(data: bytes) -> list[AbortedTxn]:
    """Whole entries; a torn last entry (a crash mid-append) is dropped."""
    entries = []
    for position in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        version, pid, first, last, lso = _ENTRY.unpack_from(data, position)
        if version != VERSION:
            raise TxnIndexCorruptError(f"txn index entry version {version} at {position}")
        entries.append(AbortedTxn(pid, first, last, lso))
    return entries


class TransactionIndex:
    """One segment's aborted transactions, in memory and in its file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[AbortedTxn] = []
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            # Segments from before transactions have no file: nothing was aborted there.
            data = b""
        try:
            self.entries = decode(data)
        except TxnIndexCorruptError as exc:
            # Read_committed consumers may then see records of those aborts.
            log.warning("event=txn_index_corrupt path=%s reason=%s", path, exc)
            self.entries = []
        if len(data) != len(self.entries) * ENTRY_SIZE:
            self._rewrite()
        self._dirty = False

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def last_offset(self) -> int:
        return self.entries[-1].last_offset if self.entries else -1

    def append(self, entry: AbortedTxn) -> None:
        """Add an abort whose marker is past every entry's; an equal or older one is
        already here (a replay after a crash writes what it finds again)."""
        if entry.last_offset <= self.last_offset:
            return
        self.entries.append(entry)
        with self.path.open("ab") as file:
            file.write(encode([entry]))
        self._dirty = True

    def collect(self, start: int, end: int) -> tuple[list[AbortedTxn], bool]:
        """Aborts overlapping [start, end), and whether the search may stop here."""
        found = []
        first = bisect.bisect_left([e.last_offset for e in self.entries], start)
        for entry in self.entries[first:]:
            if entry.first_offset < end:
                found.append(entry)
            if entry.last_stable_offset >= end:
                return found, True
        return found, False

    def truncate_to(self, offset: int) -> None:
        """Drop the aborts whose marker is at or after ``offset``."""
        kept = [e for e in self.entries if e.last_offset < offset]
        if len(kept) != len(self.entries):
            self.entries = kept
            self._rewrite()

    def reset(self) -> None:
        if self.entries or self.path.exists():
            self.entries = []
            self._rewrite()

    def _rewrite(self) -> None:
        with self.path.open("wb") as file:
            file.write(encode(self.entries))
        self._dirty = True

    def flush(self) -> None:
        """fsync the file; may run in a flush thread while the loop renames or deletes it."""
        if not self._dirty:
            return
        # Cleared first: an append while this runs marks the index dirty again.
        self._dirty = False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, path: Path) -> None:
        if self.path.exists():
            os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)
