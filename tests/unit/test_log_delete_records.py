"""DeleteRecords below the wire: the log start offset moves, persists, and drops segments;
the leader's low watermark waits for its live replicas.

Log and LogManager on a temporary directory with the fake clock; a crash is
simulated as in test_log_manager (file descriptors dropped, nothing flushed
or checkpointed beyond what the code under test wrote itself).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from shoal.broker.cluster.model import NodeId, PartitionState
from shoal.broker.log.checkpoint import read_offsets
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import Log, OffsetOutOfRangeError
from shoal.broker.log.manager import LOG_START_CHECKPOINT, LogManager
from shoal.broker.partition import NotLeaderError, Partition

TOPIC_ID = uuid.UUID("0b5c3a52-2f0e-4a43-8a53-7c1f3d9e4b11")
ME, F2, F3 = NodeId(1), NodeId(2), NodeId(3)
REPLICAS = (ME, F2, F3)
ALL_ALIVE = frozenset(REPLICAS)


def _three_segments(log: Log, helpers) -> None:
    """Offsets 0-2, 3-5 and 6-8 in three segments, all committed."""
    for i in range(3):
        if i:
            log.roll()
        log.append_as_leader(helpers.make_batch(3, tag=f"s{i}-"), 0)
    log.high_watermark = log.log_end_offset


# -- the log -------------------------------------------------------------------------


def test_moving_the_log_start_hides_the_records_below_it(open_log, helpers) -> None:
    log = open_log()
    _three_segments(log, helpers)
    assert log.increment_log_start_offset(4) is True
    assert log.log_start_offset == 4
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3, 1 << 20, log.high_watermark, True)
    # The batch holding 4 starts at 3: it is sent whole, as Kafka sends it, and
    # the consumer skips what is below its position.
    assert [r.offset for r in helpers.read_all(log, 4)] == [4, 5, 6, 7, 8]


def test_the_log_start_never_passes_the_high_watermark(open_log, helpers) -> None:
    log = open_log()
    _three_segments(log, helpers)
    log.high_watermark = 6
    with pytest.raises(OffsetOutOfRangeError, match="high watermark 6"):
        log.increment_log_start_offset(7)
    assert log.log_start_offset == 0
    assert log.increment_log_start_offset(6) is True


def test_a_lower_or_equal_offset_changes_nothing(open_log, helpers) -> None:
    log = open_log()
    _three_segments(log, helpers)
    log.increment_log_start_offset(5)
    assert log.increment_log_start_offset(5) is False
    assert log.increment_log_start_offset(2) is False
    assert log.log_start_offset == 5


def test_the_epoch_cache_starts_at_the_new_log_start(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(3), 0)
    log.append_as_leader(helpers.make_batch(3), 2)
    log.high_watermark = log.log_end_offset
    log.increment_log_start_offset(4)
    assert log.epochs.entries == [(2, 4)]


def test_only_segments_wholly_below_the_log_start_are_deletable(open_log, helpers) -> None:
    log = open_log()
    _three_segments(log, helpers)
    log.increment_log_start_offset(5)
    assert [s.base_offset for s in log.segments_below_log_start()] == [0]
    log.increment_log_start_offset(6)
    assert [s.base_offset for s in log.segments_below_log_start()] == [0, 3]


def test_deleting_to_the_log_end_takes_the_active_segment_too(open_log, helpers) -> None:
    log = open_log()
    _three_segments(log, helpers)
    log.increment_log_start_offset(9)
    doomed = log.delete_segments(log.segments_below_log_start())
    assert [s.base_offset for s in doomed] == [0, 3, 6]
    assert [s.base_offset for s in log.segments] == [9]
    assert log.size == 0
    assert (log.log_start_offset, log.log_end_offset) == (9, 9)
    # An empty active segment is never deleted, however often we ask.
    assert log.segments_below_log_start() == []
    log.append_as_leader(helpers.make_batch(1), 0)
    assert log.log_end_offset == 10


# -- the log manager: persisted before anything else -----------------------------------


class _Crashable:
    """LogManagers on one directory; a crash drops descriptors and the lock only."""

    def __init__(self, data_dir: Path, clock) -> None:
        self.data_dir = data_dir
        self.clock = clock
        self.open_ones: list[LogManager] = []

    def open(self) -> LogManager:
        manager = LogManager(self.data_dir, self.clock)
        self.open_ones.append(manager)
        return manager

    def crash(self, manager: LogManager) -> None:
        self.open_ones.remove(manager)
        for handle, _, _ in manager._doomed.values():
            handle.cancel()
        for log in manager.logs.values():
            for segment in log.segments:
                if not segment.file.closed:
                    segment.file.close()
        for _, _, doomed in manager._doomed.values():
            for segment in doomed:
                if not segment.file.closed:
                    segment.file.close()
        manager._lock.release()


@pytest.fixture
def managers(tmp_path: Path, clock) -> Iterator[_Crashable]:
    harness = _Crashable(tmp_path / "data", clock)
    yield harness
    for manager in list(harness.open_ones):
        harness.crash(manager)


def _config() -> LogConfig:
    return LogConfig(file_delete_delay_ms=60_000)


async def test_advance_log_start_checkpoints_then_deletes_whole_segments(managers, helpers) -> None:
    manager = managers.open()
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    _three_segments(log, helpers)
    assert manager.advance_log_start(log, 7) is True
    assert read_offsets(manager.data_dir / LOG_START_CHECKPOINT) == {("orders", 0): 7}
    assert [s.base_offset for s in log.segments] == [6]
    assert sorted(p.name for p in log.directory.glob("*.log.deleted")) == [
        "00000000000000000000.log.deleted",
        "00000000000000000003.log.deleted",
    ]
    assert manager.advance_log_start(log, 7) is False


async def test_a_broker_killed_after_delete_records_never_serves_below_the_new_start(
    managers, helpers
) -> None:
    manager = managers.open()
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    _three_segments(log, helpers)
    manager.checkpoint_hw()
    manager.advance_log_start(log, 4)
    managers.crash(manager)

    manager = managers.open()
    manager.load_all(lambda _topic: _config())
    loaded = manager.logs[("orders", 0)]
    assert loaded.log_start_offset == 4
    with pytest.raises(OffsetOutOfRangeError):
        loaded.read(0, 1 << 20, loaded.log_end_offset, True)
    assert [r.offset for r in helpers.read_all(loaded, 4)] == [4, 5, 6, 7, 8]


async def test_segments_left_below_the_start_by_a_crash_go_at_the_next_retention_check(
    managers, helpers
) -> None:
    manager = managers.open()
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    _three_segments(log, helpers)
    # Killed between the checkpoint and the renames.
    log.increment_log_start_offset(6)
    manager.checkpoint_log_start()
    managers.crash(manager)

    manager = managers.open()
    manager.load_all(lambda _topic: _config())
    loaded = manager.logs[("orders", 0)]
    assert loaded.log_start_offset == 6
    assert [s.base_offset for s in loaded.segments] == [0, 3, 6]
    assert manager.apply_retention() == 2
    assert [s.base_offset for s in loaded.segments] == [6]


# -- the partition: the low watermark ----------------------------------------------------


@pytest.fixture
def leader(open_log, clock, helpers) -> Partition:
    log = open_log()
    p = Partition("orders", 0, uuid.uuid4(), ME, log, clock)
    p.update_state(REPLICAS, PartitionState(ME, 1, REPLICAS), 10)
    p.append_as_leader(helpers.make_batch(10), 1)
    for follower in (F2, F3):
        p.record_follower_fetch(follower, 10, 0)
    assert p.high_watermark == 10
    return p


def test_the_low_watermark_is_the_smallest_log_start_of_the_live_replicas(leader) -> None:
    leader.log.increment_log_start_offset(6)
    assert leader.low_watermark(ALL_ALIVE) == 0
    leader.record_follower_fetch(F2, 10, 6)
    assert leader.low_watermark(ALL_ALIVE) == 0
    leader.record_follower_fetch(F3, 10, 4)
    assert leader.low_watermark(ALL_ALIVE) == 4
    # A replica whose broker is not registered does not hold DeleteRecords up.
    assert leader.low_watermark(frozenset({ME, F2})) == 6


def test_a_replica_not_yet_heard_from_holds_the_low_watermark_at_minus_one(
    leader,
) -> None:
    leader.update_state(REPLICAS, PartitionState(ME, 2, REPLICAS), 11)
    assert leader.low_watermark(ALL_ALIVE) == -1


def test_only_the_leader_has_a_low_watermark(leader) -> None:
    leader.update_state(REPLICAS, PartitionState(F2, 2, REPLICAS), 11)
    with pytest.raises(NotLeaderError):
        leader.low_watermark(ALL_ALIVE)


async def test_delete_records_waits_until_every_live_replica_reports_the_new_start(
    leader,
) -> None:
    leader.log.increment_log_start_offset(6)
    waiting = asyncio.create_task(leader.wait_for_low_watermark(6, 5.0, lambda: ALL_ALIVE))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    leader.record_follower_fetch(F2, 10, 6)
    await asyncio.sleep(0.01)
    assert not waiting.done()
    leader.record_follower_fetch(F3, 10, 6)
    assert await asyncio.wait_for(waiting, 1.0) == 6


async def test_the_wait_ends_at_the_timeout_with_the_low_watermark_reached(leader) -> None:
    leader.log.increment_log_start_offset(6)
    leader.record_follower_fetch(F2, 10, 6)
    assert await leader.wait_for_low_watermark(6, 0.05, lambda: ALL_ALIVE) == 0


async def test_the_wait_fails_when_leadership_moves(leader) -> None:
    leader.log.increment_log_start_offset(6)
    waiting = asyncio.create_task(leader.wait_for_low_watermark(6, 5.0, lambda: ALL_ALIVE))
    await asyncio.sleep(0.01)
    leader.update_state(REPLICAS, PartitionState(F2, 2, REPLICAS), 11)
    with pytest.raises(NotLeaderError):
        await asyncio.wait_for(waiting, 1.0)


def test_a_follower_follows_the_leader_start_only_as_far_as_its_high_watermark(
    open_log, clock, helpers
) -> None:
    log = open_log()
    follower = Partition("orders", 0, uuid.uuid4(), ME, log, clock)
    follower.update_state(REPLICAS, PartitionState(F2, 1, REPLICAS), 10)
    follower.append_as_follower(helpers.make_batch(8), 5)
    assert follower.follower_log_start_target(3) == 3
    assert follower.follower_log_start_target(7) == 5
    log.increment_log_start_offset(5)
    assert follower.follower_log_start_target(7) is None
