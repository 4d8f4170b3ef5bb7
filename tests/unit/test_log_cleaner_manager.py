"""The broker's log cleaner: which log it picks, its checkpoint, its budget, its workers."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from shoal.broker.log.cleaner.checkpoint import read_cleaner_checkpoint, write_cleaner_checkpoint
from shoal.broker.log.cleaner.manager import CleanerSettings, LogCleaner
from shoal.broker.log.cleaner.throttler import Throttler
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import Log
from shoal.broker.log.manager import LogManager, LogManagerSettings

from shoal.records import NewRecord, build_batch, iter_batches, iter_records

NOW = 1_700_000_000_000
TOPIC_ID = uuid.UUID("6f1b0c5e-8a52-4c1e-9d1b-2f4a7f3e9c01")
COMPACTED = LogConfig(
    segment_bytes=400, cleanup_policy=("compact",), file_delete_delay_ms=0, delete_retention_ms=0
)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


def _write(log: Log, rounds: int, keys: int = 4) -> None:
    for r in range(rounds):
        for k in range(keys):
            batch = build_batch([NewRecord(f"k{k}".encode(), f"v{r}".encode(), timestamp=NOW)])
            log.append_as_leader(batch, 0)
    log.roll()
    log.high_watermark = log.log_end_offset


def _records(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for segment in log.segments:
        data = os.pread(segment.fd, segment.size, 0)
        for position, header in iter_batches(data):
            out += [
                (r.offset, r.key, r.value)
                for r in iter_records(data[position : position + header.size])
            ]
    return out


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def manager(tmp_path: Path, clock: Clock) -> Iterator[LogManager]:
    manager = LogManager(
        tmp_path / "data", clock, LogManagerSettings(cleaner=CleanerSettings(backoff_ms=10))
    )
    yield manager
    for log in manager.logs.values():
        for segment in log.segments:
            if not segment.file.closed:
                segment.file.close()
    manager._lock.release()


async def test_the_dirtiest_compacted_log_is_cleaned_first(manager: LogManager) -> None:
    a = manager.get_or_create("a", 0, TOPIC_ID, COMPACTED)
    b = manager.get_or_create("b", 0, TOPIC_ID, COMPACTED)
    plain = manager.get_or_create("plain", 0, TOPIC_ID, LogConfig(segment_bytes=400))
    _write(a, rounds=2)
    _write(b, rounds=6)
    _write(plain, rounds=6)
    cleaner = manager.cleaner
    cleaner.checkpoints[("a", 0)] = 4  # a's first segment is clean: less dirty than b
    picked = cleaner.grab_filthiest(NOW)
    assert picked is not None and picked[0] == ("b", 0)
    cleaner.in_progress.discard(("b", 0))
    assert await cleaner.clean_one()
    assert cleaner.checkpoints[("b", 0)] == b.log_end_offset
    assert read_cleaner_checkpoint(manager.data_dir) == {("a", 0): 4, ("b", 0): b.log_end_offset}
    assert len(_records(plain)) == 24
    assert len(_records(b)) == 4
    assert cleaner.metrics.cleans == 1
    assert cleaner.metrics.bytes_recopied > 0


async def test_a_log_below_its_min_cleanable_ratio_is_left_alone(manager: LogManager) -> None:
    log = manager.get_or_create(
        "a", 0, TOPIC_ID, dataclasses.replace(COMPACTED, min_cleanable_dirty_ratio=0.9)
    )
    _write(log, rounds=3)
    write_cleaner_checkpoint(manager.data_dir, {("a", 0): 10})
    manager.cleaner.load_checkpoint()
    assert manager.cleaner.grab_filthiest(NOW) is None
    assert 0 < manager.cleaner.metrics.max_dirty_ratio < 0.9


async def test_tombstones_go_in_a_later_quiet_clean(manager: LogManager, clock: Clock) -> None:
    log = manager.get_or_create(
        "a", 0, TOPIC_ID, dataclasses.replace(COMPACTED, delete_retention_ms=1000)
    )
    _write(log, rounds=2)
    log.append_as_leader(build_batch([NewRecord(b"k0", None, timestamp=NOW)]), 0)
    log.roll()
    log.high_watermark = log.log_end_offset
    assert await manager.cleaner.clean_one()
    assert (log.log_end_offset - 1, b"k0", None) in _records(log)
    assert not await manager.cleaner.clean_one()
    clock.now += 1000
    assert await manager.cleaner.clean_one()
    assert [k for _, k, _ in _records(log)] == [b"k1", b"k2", b"k3"]


async def test_workers_clean_in_the_background_and_stop_on_close(manager: LogManager) -> None:
    log = manager.get_or_create("a", 0, TOPIC_ID, COMPACTED)
    _write(log, rounds=5)
    manager.cleaner.start()
    for _ in range(200):
        if manager.cleaner.metrics.cleans:
            break
        await asyncio.sleep(0.01)
    await manager.cleaner.close()
    assert manager.cleaner.metrics.cleans >= 1
    assert len(_records(log)) == 4


def test_the_throttler_holds_the_rate_across_threads() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    throttler = Throttler(1000, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        throttler.maybe_throttle(500)
    assert sum(slept) == pytest.approx(5.0)


def test_an_unreadable_checkpoint_restarts_from_the_log_starts(tmp_path: Path) -> None:
    (tmp_path / "cleaner-offset-checkpoint").write_text("garbage")
    cleaner = LogCleaner(tmp_path, {}, lambda: NOW)
    cleaner.load_checkpoint()
    assert cleaner.checkpoints == {}


async def test_a_truncation_below_the_checkpoint_makes_the_rest_dirty_again(
    manager: LogManager,
) -> None:
    log = manager.get_or_create("a", 0, TOPIC_ID, COMPACTED)
    _write(log, rounds=3)
    assert await manager.cleaner.clean_one()
    assert manager.cleaner.checkpoints[("a", 0)] == 12
    log.truncate_to(8)
    assert manager.cleaner.checkpoints[("a", 0)] == log.log_end_offset <= 8
