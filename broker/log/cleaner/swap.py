"""Putting a cleaned segment in place of the segments it was cleaned from, crash-safely.

Kafka's rename protocol (``LocalLog.replaceSegments``), for a cleaned segment
with base offset B replacing segments S1..Sn (S1's base is B)::

    1. B.log.cleaned, B.index.cleaned, B.timeindex.cleaned, B.txnindex.cleaned
       written and fsynced
    2. the index files -> *.swap; then B.log.cleaned -> B.log.swap (the commit
       point), directory fsynced
    3. S1..Sn -> *.deleted (readers holding them keep their open files)
    4. B.index.swap, B.timeindex.swap, B.txnindex.swap -> live; then B.log.swap -> B.log
    5. the old files are destroyed after file.delete.delay.ms

What recovery does with each crash point (:func:`shoal.broker.log.recovery.complete_swaps`):

* before 2 completes (a ``.cleaned`` log): the clean never happened; the
  ``.cleaned`` and index ``.swap`` files are deleted, S1..Sn are untouched.
* from 2 to 4 (a ``B.log.swap``): the clean happened. Every segment file
  with a base offset in [B, next offset of the swap) is one of S1..Sn and is
  deleted, the swap becomes B.log, and B's offset indexes are rebuilt from
  it (index files in the middle of a rename are never trusted); the
  aborted transaction index, which cannot be rebuilt, is B.txnindex.swap, or
  the live B.txnindex once that is gone (step 3 renamed S1's away first). The cleaner
  keeps the last batch of every group (possibly as an empty batch), so the
  swap's next offset is past the base of Sn whenever Sn holds anything; an
  Sn that holds nothing may survive, and is harmless.

Steps 1-2 run in the cleaner's worker thread (nothing in the log refers to
these files); steps 3-4 and the segment list change run on the event loop in
one go, so that nothing in the process sees a log between two states.
"""

from __future__ import annotations

import os
from pathlib import Path

from shoal.broker.log.checkpoint import fsync_dir
from shoal.broker.log.cleaner.faults import Faults
from shoal.broker.log.cleaner.writer import cleaned_paths, cleaned_txn_index_path
from shoal.broker.log.index import IndexCorruptError
from shoal.broker.log.log import Log
from shoal.broker.log.segment import (
    CLEANED_SUFFIX,
    SWAP_SUFFIX,
    LogSegment,
)


class CleanAbortedError(Exception):
    """The log changed under the clean (retention, truncation, deletion): nothing swapped."""


def _swap_path(cleaned: Path) -> Path:
    return cleaned.with_name(cleaned.name.removesuffix(CLEANED_SUFFIX) + SWAP_SUFFIX)


def _live_path(swap: Path) -> Path:
    return swap.with_name(swap.name.removesuffix(SWAP_SUFFIX))


def rename_cleaned_to_swap(directory: Path, base_offset: int, faults: Faults) -> None:
    """Step 2, in a worker thread: after this, a restart finishes the swap."""
    log_path, index_path, time_index_path = cleaned_paths(directory, base_offset)
    for path in (index_path, time_index_path, cleaned_txn_index_path(directory, base_offset)):
        if path.exists():
            os.replace(path, _swap_path(path))
    faults.hit("index_swapped")
    os.replace(log_path, _swap_path(log_path))
    fsync_dir(directory)
    faults.hit("swap_renamed")


def discard(directory: Path, base_offset: int) -> None:
    """Remove a clean's files for ``base_offset``, at whichever suffix they are."""
    txn_index_path = cleaned_txn_index_path(directory, base_offset)
    for path in (*cleaned_paths(directory, base_offset), txn_index_path):
        path.unlink(missing_ok=True)
        _swap_path(path).unlink(missing_ok=True)


def swap_in(
    log: Log, old: list[LogSegment], sizes: list[int], base_offset: int, faults: Faults
) -> LogSegment:
    """Steps 3-4 and the in-memory change, on the event loop.

    ``old`` must still be in the log, adjacent, unchanged (``sizes``) and
    not active; otherwise the swap files are removed and CleanAbortedError
    raised. Returns the new segment; the caller schedules ``old``'s
    destruction.
    """
    directory = log.directory
    if log.closed or not log.holds_segments(old, sizes):
        discard(directory, base_offset)
        raise CleanAbortedError(f"{directory.name}: segments changed during the clean")
    for i, segment in enumerate(old):
        segment.mark_deleted()
        if i == 0:
            faults.hit("old_deleted_partly")
    faults.hit("old_deleted")
    log_path, index_path, time_index_path = cleaned_paths(directory, base_offset)
    for path in (index_path, time_index_path, cleaned_txn_index_path(directory, base_offset)):
        swap = _swap_path(path)
        if swap.exists():
            os.replace(swap, _live_path(swap))
    faults.hit("index_live")
    os.replace(_swap_path(log_path), _live_path(_swap_path(log_path)))
    faults.hit("swap_live")
    segment = LogSegment(directory, base_offset, log.config, log.clock())
    try:
        segment.load_clean()
    except IndexCorruptError:
        segment.recover()
    log.replace_segments(old, segment)
    return segment
