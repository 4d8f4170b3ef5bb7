"""Flushing: what flush() fsyncs, where the recovery point moves, and when a flush is due."""

from __future__ import annotations

from shoal.broker.log.config import LONG_MAX
from shoal.broker.log.segment import LogSegment


def _spy_flushes(monkeypatch) -> list[int]:
    flushed: list[int] = []
    real = LogSegment.flush

    def flush(segment: LogSegment) -> None:
        flushed.append(segment.base_offset)
        real(segment)

    monkeypatch.setattr(LogSegment, "flush", flush)
    return flushed


async def test_flush_moves_the_recovery_point_to_the_log_end(open_log, helpers, clock) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(3), 0)
    assert log.recovery_point == 0
    assert log.unflushed_messages == 3
    clock.advance(500)
    await log.flush()
    assert log.recovery_point == 3
    assert log.unflushed_messages == 0
    assert log.last_flush_ms == clock.now


async def test_flush_writes_the_indexes_to_disk(open_log, helpers, log_dir) -> None:
    log = open_log(index_interval_bytes=1)
    for i in range(4):
        log.append_as_leader(helpers.make_batch(1, timestamp=helpers.NOW + i), 0)
    await log.flush()
    assert (log_dir / "00000000000000000000.index").stat().st_size == 3 * 8
    assert (log_dir / "00000000000000000000.timeindex").stat().st_size == 3 * 12


async def test_flush_fsyncs_only_segments_from_the_recovery_point(
    open_log, helpers, monkeypatch
) -> None:
    log = open_log()
    flushed = _spy_flushes(monkeypatch)
    for _ in range(4):
        log.append_as_leader(helpers.make_batch(2), 0)
        log.roll()
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6, 8]
    await log.flush(4)
    assert flushed == [0, 2]
    assert log.recovery_point == 4
    assert log.unflushed_messages == 8  # the log end was not reached
    flushed.clear()
    await log.flush()
    assert flushed == [4, 6]  # the empty active segment holds nothing to sync
    assert log.recovery_point == 8
    assert log.unflushed_messages == 0
    flushed.clear()
    await log.flush()
    await log.flush(2)
    assert flushed == []
    assert log.recovery_point == 8


async def test_flushed_segments_are_not_recovered_after_a_crash(
    open_log, helpers, log_dir, monkeypatch
) -> None:
    log = open_log()
    for _ in range(3):
        log.append_as_leader(helpers.make_batch(2), 0)
        log.roll()
    log.append_as_leader(helpers.make_batch(2), 0)
    await log.flush(6)
    helpers.crash(log)
    recovered: list[int] = []
    real = LogSegment.recover

    def recover(segment: LogSegment) -> int:
        recovered.append(segment.base_offset)
        return real(segment)

    monkeypatch.setattr(LogSegment, "recover", recover)
    log = open_log(clean_shutdown=False, recovery_point=6)
    assert recovered == [6]
    assert log.log_end_offset == 8


def test_nothing_due_by_default(open_log, helpers, clock) -> None:
    log = open_log()
    assert log.flush_target() is None
    log.append_as_leader(helpers.make_batch(5), 0)
    clock.advance(10**9)
    assert log.config.flush_messages == LONG_MAX
    assert log.flush_target() is None


def test_flush_messages_makes_the_whole_log_due(open_log, helpers) -> None:
    log = open_log(flush_messages=5)
    log.append_as_leader(helpers.make_batch(4), 0)
    assert log.flush_target() is None
    log.append_as_leader(helpers.make_batch(1), 0)
    assert log.flush_target() == 5


async def test_flush_ms_makes_the_whole_log_due_once_writes_are_that_old(
    open_log, helpers, clock
) -> None:
    log = open_log(flush_ms=1000)
    clock.advance(5000)
    assert log.flush_target() is None  # nothing written, nothing due
    log.append_as_leader(helpers.make_batch(1), 0)
    assert log.flush_target() == 1  # as in Kafka: measured from the last flush
    await log.flush(log.flush_target())
    assert log.flush_target() is None
    log.append_as_leader(helpers.make_batch(2), 0)
    clock.advance(999)
    assert log.flush_target() is None
    clock.advance(1)
    assert log.flush_target() == 3
    await log.flush(log.flush_target())
    assert log.flush_target() is None


async def test_rolled_segments_are_due_for_a_flush(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(2), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(2), 0)
    assert log.flush_target() == 2
    await log.flush(2)
    assert log.flush_target() is None
    assert log.recovery_point == 2


def test_recovery_point_from_a_checkpoint_is_clamped_to_the_log_end(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(2), 0)
    log.close()
    log = open_log(recovery_point=100, high_watermark=100)
    assert log.recovery_point == 2
    assert log.high_watermark == 2
