"""The leader epoch cache: which leader epoch wrote which range of the log.

Entries are (epoch, start offset): records from ``start offset`` up to the
next entry's start were written under ``epoch``. Both columns strictly
increase. This is what OffsetForLeaderEpoch answers from, and what lets a
follower cut a divergent tail after a leader change (KIP-101, KIP-279). The
file is Kafka's ``leader-epoch-checkpoint``, rewritten atomically on every
change; changes are rare (one per leader election).
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path
from typing import Final

from shoal.broker.log.checkpoint import read_epochs, write_epochs

FILE_NAME: Final = "leader-epoch-checkpoint"
UNDEFINED: Final = -1


class LeaderEpochCache:
    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        self._entries: list[tuple[int, int]] = read_epochs(self.path)

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else UNDEFINED

    def assign(self, epoch: int, start_offset: int) -> None:
        """Note that ``epoch`` writes from ``start_offset``; epochs not newer are ignored."""
        if epoch < 0 or epoch <= self.latest_epoch:
            return
        self._entries = [(e, o) for e, o in self._entries if o < start_offset]
        self._entries.append((epoch, start_offset))
        self._save()

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch that wrote ``offset``; UNDEFINED if the cache does not reach back so far."""
        i = bisect_right([o for _, o in self._entries], offset) - 1
        return self._entries[i][0] if i >= 0 else UNDEFINED

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest epoch <= ``epoch``, the offset where it ended).

        As Kafka's LeaderEpochFileCache.endOffsetFor: the latest epoch ends at
        the log end offset; an older one where the next epoch starts; an epoch
        older than every entry ends where the first entry starts (and is
        answered as itself); an unknown (-1) or newer-than-latest epoch gets
        (UNDEFINED, UNDEFINED).
        """
        if epoch == UNDEFINED or not self._entries:
            return UNDEFINED, UNDEFINED
        if epoch == self.latest_epoch:
            return epoch, log_end_offset
        if epoch > self.latest_epoch:
            return UNDEFINED, UNDEFINED
        epochs = [e for e, _ in self._entries]
        i = bisect_right(epochs, epoch) - 1
        if i < 0:
            return epoch, self._entries[0][1]
        return self._entries[i][0], self._entries[i + 1][1]

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut at ``end_offset``: forget epochs that start at or past it."""
        kept = [(e, o) for e, o in self._entries if o < end_offset]
        if kept != self._entries:
            self._entries = kept
            self._save()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: the epoch covering it starts there."""
        before = [(e, o) for e, o in self._entries if o <= start_offset]
        after = [(e, o) for e, o in self._entries if o > start_offset]
        kept = ([(before[-1][0], start_offset)] if before else []) + after
        if kept != self._entries:
            self._entries = kept
            self._save()

    def _save(self) -> None:
        write_epochs(self.path, self._entries)
