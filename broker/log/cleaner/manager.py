"""The broker's log cleaner: ``log.cleaner.threads`` workers over every compacted log.

As Kafka's LogCleaner and LogCleanerManager: each worker, in turn, takes the
filthiest compacted log not being cleaned (highest dirty ratio above its
``min.cleanable.dirty.ratio``, or overdue by ``max.compaction.lag.ms``; when
none is, a log whose earliest kept tombstone has passed its delete horizon),
cleans it (:class:`~.cleaner.Cleaner`) and records the new first dirty
offset in ``cleaner-offset-checkpoint``. With nothing to clean a worker
sleeps ``log.cleaner.backoff.ms``. A log whose clean fails is left alone for
a while (Kafka marks it uncleanable) and counted in the error metric.

The workers are tasks on the broker's event loop: selection, swaps and
bookkeeping run there, reading and writing segments in threads, with all
workers sharing one I/O budget (``log.cleaner.io.max.bytes.per.second``).
Produce and fetch never wait for the cleaner.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shoal.broker.log.checkpoint import CheckpointError
from shoal.broker.log.cleaner.checkpoint import (
    TopicPartition,
    read_cleaner_checkpoint,
    write_cleaner_checkpoint,
)
from shoal.broker.log.cleaner.cleanable import LogToClean, is_cleanable, log_to_clean
from shoal.broker.log.cleaner.cleaner import Cleaner, DestroyLater
from shoal.broker.log.cleaner.faults import Faults
from shoal.broker.log.cleaner.offset_map import max_entries
from shoal.broker.log.cleaner.swap import CleanAbortedError
from shoal.broker.log.cleaner.throttler import UNLIMITED, Throttler
from shoal.broker.log.log import Log

log = logging.getLogger(__name__)

UNCLEANABLE_RETRY_MS: Final = 600_000
"""How long a log whose clean failed is left alone before it is tried again."""


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """Kafka's broker settings of the log cleaner, with Kafka's defaults."""

    enable: bool = True
    """log.cleaner.enable"""
    threads: int = 1
    """log.cleaner.threads"""
    io_max_bytes_per_second: float = UNLIMITED
    """log.cleaner.io.max.bytes.per.second"""
    dedupe_buffer_size: int = 134_217_728
    """log.cleaner.dedupe.buffer.size"""
    backoff_ms: int = 15_000
    """log.cleaner.backoff.ms"""


@dataclass(slots=True)
class CleanerMetrics:
    """What /metrics reports; read on the event loop."""

    max_dirty_ratio: float = 0.0
    """Of the compacted logs at the last selection (Kafka's max-dirty-percent, as a ratio)."""
    max_compaction_delay_ms: int = 0
    bytes_read: int = 0
    bytes_recopied: int = 0
    cleans: int = 0
    errors: int = 0
    last_clean_monotonic: float | None = None
    uncleanable_partitions: int = 0


class LogCleaner:
    def __init__(
        self,
        data_dir: Path,
        logs: Mapping[TopicPartition, Log],
        clock: Callable[[], int],
        settings: CleanerSettings | None = None,
        destroy_later: DestroyLater | None = None,
        faults: Faults | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.logs = logs
        self.clock = clock
        self.settings = settings or CleanerSettings()
        self.metrics = CleanerMetrics()
        self.throttler = Throttler(self.settings.io_max_bytes_per_second)
        self._faults = faults if faults is not None else Faults.from_env()
        self._destroy_later = destroy_later
        self._abort = threading.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._checkpoint_lock = asyncio.Lock()
        self.checkpoints: dict[TopicPartition, int] = {}
        self.in_progress: set[TopicPartition] = set()
        self.uncleanable_until: dict[TopicPartition, int] = {}
        self.delete_horizons: dict[TopicPartition, int] = {}
        self._map_entries = max_entries(self.settings.dedupe_buffer_size, self.settings.threads)

    def load_checkpoint(self) -> None:
        try:
            self.checkpoints = read_cleaner_checkpoint(self.data_dir)
        except CheckpointError as exc:
            # Losing it costs a full re-clean, never data: start from the log starts.
            log.warning("event=cleaner_checkpoint_unreadable reason=%s", exc)
            self.checkpoints = {}

    def start(self) -> None:
        if not self.settings.enable:
            return
        self.load_checkpoint()
        self._tasks = [
            asyncio.create_task(self._work(i), name=f"log-cleaner-{i}")
            for i in range(self.settings.threads)
        ]

    async def close(self) -> None:
        """Stop the workers; a clean under way stops at its next batch, its files discarded."""
        self._abort.set()
        self._stopping.set()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def maybe_truncate_checkpoint(self, tp: TopicPartition, log_end_offset: int) -> None:
        """A truncated log: what is re-appended past its new end is dirty again (Kafka's
        maybeTruncateCheckpoint). The file follows at the next checkpoint write."""
        if self.checkpoints.get(tp, -1) > log_end_offset:
            self.checkpoints[tp] = log_end_offset

    def watch(self, tp: TopicPartition, log_: Log) -> None:
        """Follow ``log_``'s truncations; the log manager calls it for every log it opens."""
        log_.truncation_listeners.append(functools.partial(self.maybe_truncate_checkpoint, tp))

    # -- choosing ----------------------------------------------------------------

    def grab_filthiest(self, now_ms: int) -> tuple[TopicPartition, Log, LogToClean] | None:
        """The log to clean next, marked in progress; None when none needs it."""
        candidates = []
        max_ratio = 0.0
        max_delay = 0
        uncleanable = 0
        for tp, log_ in self.logs.items():
            if not log_.config.compacts or log_.closed:
                continue
            if self.uncleanable_until.get(tp, 0) > now_ms:
                uncleanable += 1
                continue
            target = log_to_clean(log_, self.checkpoints.get(tp), now_ms)
            max_ratio = max(max_ratio, target.cleanable_ratio)
            max_delay = max(max_delay, target.max_compaction_delay_ms)
            if tp in self.in_progress or target.total_bytes == 0:
                continue
            candidates.append((tp, log_, target))
        self.metrics.max_dirty_ratio = max_ratio
        self.metrics.max_compaction_delay_ms = max_delay
        self.metrics.uncleanable_partitions = uncleanable
        cleanable = [
            c for c in candidates if is_cleanable(c[2], c[1].config.min_cleanable_dirty_ratio)
        ]
        if not cleanable:
            # A quiet log still sheds its tombstones once their horizon passes.
            cleanable = [
                c for c in candidates if self.delete_horizons.get(c[0], now_ms + 1) <= now_ms
            ]
        if not cleanable:
            return None
        chosen = max(cleanable, key=lambda c: c[2].cleanable_ratio)
        self.in_progress.add(chosen[0])
        return chosen

    # -- cleaning ----------------------------------------------------------------

    async def clean_one(self) -> bool:
        """Clean the filthiest log, if any; returns whether one was cleaned."""
        picked = self.grab_filthiest(self.clock())
        if picked is None:
            return False
        tp, log_, target = picked
        try:
            result = await self._cleaner().clean(log_, target)
        except CleanAbortedError as exc:
            log.info("event=log_clean_aborted topic=%s partition=%d reason=%s", *tp, exc)
            return False
        except Exception:
            if log_.closed or self._abort.is_set():
                return False
            self.metrics.errors += 1
            self.uncleanable_until[tp] = self.clock() + UNCLEANABLE_RETRY_MS
            log.exception("event=log_clean_failed topic=%s partition=%d", *tp)
            return False
        finally:
            self.in_progress.discard(tp)
        stats = result.stats
        self.metrics.cleans += 1
        self.metrics.bytes_read += stats.bytes_read
        self.metrics.bytes_recopied += stats.bytes_written
        self.metrics.last_clean_monotonic = time.monotonic()
        if stats.earliest_delete_horizon is None:
            self.delete_horizons.pop(tp, None)
        else:
            self.delete_horizons[tp] = stats.earliest_delete_horizon
        if self.logs.get(tp) is log_:
            self.checkpoints[tp] = result.end_offset
            await self._write_checkpoint()
        return True

    def _cleaner(self) -> Cleaner:
        return Cleaner(
            max_map_entries=self._map_entries,
            throttler=self.throttler,
            faults=self._faults,
            destroy_later=self._destroy_later,
            check_done=self._check_done,
        )

    def _check_done(self) -> None:
        if self._abort.is_set():
            raise CleanAbortedError("the cleaner is stopping")

    async def _write_checkpoint(self) -> None:
        async with self._checkpoint_lock:
            live = {tp: offset for tp, offset in self.checkpoints.items() if tp in self.logs}
            self.checkpoints = live
            await asyncio.to_thread(write_cleaner_checkpoint, self.data_dir, dict(live))
        self._faults.hit("checkpoint_written")

    async def _work(self, index: int) -> None:
        backoff = self.settings.backoff_ms / 1000
        while not self._stopping.is_set():
            try:
                cleaned = await self.clean_one()
            except Exception:
                log.exception("event=log_cleaner_worker_failed worker=%d", index)
                cleaned = False
            if not cleaned:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), backoff)
