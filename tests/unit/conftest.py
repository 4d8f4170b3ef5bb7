"""Fixtures for the log storage tests (tests/unit/test_log_*.py).

The log takes its clock as a callable, so every test drives time by hand
with :class:`FakeClock`. Batches are built with explicit timestamps relative
to that clock, so timestamp validation, rolling and retention are exact.

A "crash" is simulated by closing a log's file descriptors without flushing
anything: bytes already handed to ``pwritev`` stay in the page cache (as they
would survive a process crash), while the in-memory indexes never reach disk.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import FileSlice, Log

from shoal.records import (
    BatchHeader,
    BatchOptions,
    Compression,
    NewRecord,
    Record,
    build_batch,
    iter_batches,
    iter_records,
)

NOW = 1_700_000_000_000
"""The fake clock's starting time, in ms (November 2023)."""


@dataclass
class FakeClock:
    now: int = NOW

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def make_batch(
    count: int = 1,
    *,
    timestamp: int = NOW,
    step: int = 0,
    compression: Compression = Compression.NONE,
    value_size: int = 16,
    tag: str = "r",
    options: BatchOptions | None = None,
) -> bytes:
    """``count`` records with timestamps ``timestamp``, ``timestamp + step``, ...

    Values are ``<tag><index>`` padded to ``value_size`` bytes, so a test can
    tell records apart after a round trip through the log.
    """
    records = [
        NewRecord(
            key=f"{tag}-key-{i}".encode(),
            value=f"{tag}{i}".encode().ljust(value_size, b"."),
            headers=(("h", b"x"),),
            timestamp=timestamp + i * step,
        )
        for i in range(count)
    ]
    opts = options or BatchOptions(compression=compression)
    return build_batch(records, 0, opts)


def slice_bytes(fs: FileSlice) -> bytes:
    """The bytes a fetch would send for ``fs``."""
    data = os.pread(fs.file.fileno(), fs.size, fs.position)
    assert len(data) == fs.size
    return data


def split_batches(data: bytes) -> list[tuple[BatchHeader, bytes]]:
    """Validate ``data`` as whole batches (CRC included) and return each with its bytes."""
    return [(header, data[pos : pos + header.size]) for pos, header in iter_batches(data)]


def read_all(log: Log, start: int | None = None) -> list[Record]:
    """Every record from ``start`` (log start by default) to the log end, via Log.read."""
    offset = log.log_start_offset if start is None else start
    out: list[Record] = []
    while offset < log.log_end_offset:
        fs = log.read(offset, 1 << 30, log.log_end_offset, min_one=True)
        assert fs is not None, f"no data at {offset} below log end {log.log_end_offset}"
        batches = split_batches(slice_bytes(fs))
        assert batches
        for _, raw in batches:
            out.extend(r for r in iter_records(raw) if r.offset >= offset)
        offset = batches[-1][0].next_offset
    return out


def crash(log: Log) -> None:
    """Drop a log as a killed process would: file descriptors go, nothing is flushed."""
    for segment in log.segments:
        segment.file.close()


def segment_files(directory: Path, suffix: str = ".log") -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(suffix))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "orders-0"


OpenLog = Callable[..., Log]


@pytest.fixture
def open_log(log_dir: Path, clock: FakeClock) -> Iterator[OpenLog]:
    """Open a Log on ``log_dir``; logs still open at the end of the test are closed.

    Keyword arguments are LogConfig fields, plus ``recovery_point``,
    ``clean_shutdown``, ``log_start_offset`` and ``high_watermark`` for Log.
    """
    opened: list[Log] = []

    def factory(
        *,
        recovery_point: int = 0,
        clean_shutdown: bool = True,
        log_start_offset: int = 0,
        high_watermark: int = 0,
        config: LogConfig | None = None,
        **fields: Any,
    ) -> Log:
        cfg = config or LogConfig(**fields)
        log = Log(
            log_dir,
            cfg,
            recovery_point,
            clean_shutdown,
            clock,
            log_start_offset=log_start_offset,
            high_watermark=high_watermark,
        )
        opened.append(log)
        return log

    yield factory
    for log in opened:
        for segment in log.segments:
            if not segment.file.closed:
                segment.file.close()


def append_batches(log: Log, batches: Sequence[bytes], epoch: int = 0) -> None:
    for raw in batches:
        log.append_as_leader(raw, epoch)


@pytest.fixture
def helpers() -> type[Helpers]:
    return Helpers


class Helpers:
    """The helpers above, as one fixture (test modules do not import conftest)."""

    NOW = NOW
    make_batch = staticmethod(make_batch)
    slice_bytes = staticmethod(slice_bytes)
    split_batches = staticmethod(split_batches)
    read_all = staticmethod(read_all)
    crash = staticmethod(crash)
    segment_files = staticmethod(segment_files)
    append_batches = staticmethod(append_batches)
