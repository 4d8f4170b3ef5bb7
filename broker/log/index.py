"""The sparse indexes beside each segment: ``.index`` and ``.timeindex``.

File formats are Kafka's, big-endian, relative to the segment's base offset::

    .index       8 bytes an entry: relative offset int32, position int32
    .timeindex  12 bytes an entry: timestamp int64, relative offset int32

Keys strictly increase in both. An offset index entry names the last offset
of a batch and the position where that batch starts, written once every
``index.interval.bytes`` of log; a time index entry names the largest
timestamp seen so far in the segment and the offset that carries it.

Kafka keeps its indexes in mmapped, preallocated files. Here the entries live
in memory (compact ``array``\\ s) and reach the file on :meth:`flush`, which
the log calls when it flushes, rolls or closes a segment. An index on disk can
therefore be behind its segment after a crash; recovery rebuilds the index of
every segment it re-validates, and :meth:`load` refuses a file that is not
sane, so a stale or damaged index is never trusted.

Not thread-safe: one event loop owns each index.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_right
from pathlib import Path
from typing import ClassVar


class IndexCorruptError(ValueError):
    pass


class _SparseIndex:
    """Entries (key, value) with strictly increasing keys, kept in memory and appended to a file."""

    ENTRY: ClassVar[struct.Struct]

    def __init__(self, path: Path, base_offset: int, max_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_bytes // self.ENTRY.size)
        self._keys = array("q")
        self._values = array("q")
        self._on_disk = 0
        self._rewrite = not path.exists()

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def is_full(self) -> bool:
        return len(self._keys) >= self.max_entries

    def _encode(self, key: int, value: int) -> bytes:
        raise NotImplementedError

    def _decode(self, raw: bytes, pos: int) -> tuple[int, int]:
        raise NotImplementedError

    def _add(self, key: int, value: int) -> None:
        if self._keys and key <= self._keys[-1]:
            raise ValueError(f"index key {key} does not follow {self._keys[-1]} in {self.path}")
        self._keys.append(key)
        self._values.append(value)

    def _floor(self, key: int) -> int:
        """Index of the largest entry with a key <= ``key``, or -1."""
        return bisect_right(self._keys, key) - 1

    def _load(self) -> None:
        raw = self.path.read_bytes()
        size = self.ENTRY.size
        if len(raw) % size:
            raise IndexCorruptError(f"{self.path}: {len(raw)} bytes is not whole entries")
        try:
            for pos in range(0, len(raw), size):
                self._add(*self._decode(raw, pos))
        except ValueError as exc:
            raise IndexCorruptError(str(exc)) from exc
        self._on_disk = len(self._keys)
        self._rewrite = False

    def _truncate_entries(self, keep: int) -> None:
        if keep >= len(self._keys):
            return
        del self._keys[keep:]
        del self._values[keep:]
        if keep < self._on_disk:
            self._on_disk = keep
            self._rewrite = True

    def reset(self) -> None:
        self._truncate_entries(0)

    def flush(self) -> None:
        """Write the entries the file does not have yet."""
        if not self._rewrite and self._on_disk == len(self._keys):
            return
        start = 0 if self._rewrite else self._on_disk
        end = len(self._keys)
        data = b"".join(self._encode(self._keys[i], self._values[i]) for i in range(start, end))
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, start * self.ENTRY.size)
            os.ftruncate(fd, end * self.ENTRY.size)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._on_disk = end
        self._rewrite = False

    def rename(self, path: Path) -> None:
        if self.path.exists():
            os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)


class OffsetIndex(_SparseIndex):
    ENTRY = struct.Struct(">ii")

    @classmethod
    def load(cls, path: Path, base_offset: int, max_bytes: int) -> OffsetIndex:
        index = cls(path, base_offset, max_bytes)
        if path.exists():
            index._load()
        return index

    def _encode(self, key: int, value: int) -> bytes:
        return self.ENTRY.pack(key - self.base_offset, value)

    def _decode(self, raw: bytes, pos: int) -> tuple[int, int]:
        relative, position = self.ENTRY.unpack_from(raw, pos)
        return self.base_offset + relative, position

    def _add(self, key: int, value: int) -> None:
        # Positions must increase too: lookups and check_against rely on it.
        if self._values and value <= self._values[-1]:
            raise ValueError(f"index position {value} does not follow {self._values[-1]}")
        super()._add(key, value)

    def append(self, offset: int, position: int) -> None:
        self._add(offset, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry at or before ``offset``; (base, 0) if none."""
        i = self._floor(offset)
        if i < 0:
            return self.base_offset, 0
        return self._keys[i], self._values[i]

    def floor_position(self, position: int) -> int:
        """Position of the last entry at or before ``position``; 0 if none."""
        i = bisect_right(self._values, position) - 1
        return self._values[i] if i >= 0 else 0

    @property
    def last_position(self) -> int:
        return self._values[-1] if self._values else 0

    def truncate_to(self, offset: int) -> None:
        """Drop the entries for offsets >= ``offset``."""
        self._truncate_entries(bisect_right(self._keys, offset - 1))

    def check_against(self, log_size: int) -> None:
        """Kafka's sanity check: every entry points inside the segment."""
        if self._keys and self._keys[0] < self.base_offset:
            raise IndexCorruptError(f"{self.path}: entry below the base offset")
        if self._values and self._values[-1] >= log_size:
            raise IndexCorruptError(
                f"{self.path}: entry at position {self._values[-1]} past the log's {log_size} bytes"
            )


class TimeIndex(_SparseIndex):
    ENTRY = struct.Struct(">qi")

    @classmethod
    def load(cls, path: Path, base_offset: int, max_bytes: int) -> TimeIndex:
        index = cls(path, base_offset, max_bytes)
        if path.exists():
            index._load()
        return index

    def _encode(self, key: int, value: int) -> bytes:
        return self.ENTRY.pack(key, value - self.base_offset)

    def _decode(self, raw: bytes, pos: int) -> tuple[int, int]:
        timestamp, relative = self.ENTRY.unpack_from(raw, pos)
        return timestamp, self.base_offset + relative

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Record a new largest timestamp; an entry that does not advance it is skipped."""
        if self._keys and timestamp <= self._keys[-1]:
            return
        if self._values and offset < self._values[-1]:
            return
        self._add(timestamp, offset)

    def lookup(self, timestamp: int) -> int:
        """Offset of the last entry with a timestamp <= ``timestamp``; the base offset if none."""
        i = self._floor(timestamp)
        return self.base_offset if i < 0 else self._values[i]

    @property
    def last_entry(self) -> tuple[int, int] | None:
        return (self._keys[-1], self._values[-1]) if self._keys else None

    def truncate_to(self, offset: int) -> None:
        """Drop the entries that name offsets >= ``offset``."""
        keep = len(self._values)
        while keep and self._values[keep - 1] >= offset:
            keep -= 1
        self._truncate_entries(keep)

    def check_against(self, next_offset: int) -> None:
        if self._values and self._values[-1] >= next_offset:
            raise IndexCorruptError(f"{self.path}: entry past the segment's last offset")
