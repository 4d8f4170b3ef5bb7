"""LogManager: the data directory's lock and identity, loading, deleting, chores, clean shutdown."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from shoal.broker.log import log as log_module
from shoal.broker.log import manager as manager_module
from shoal.broker.log.checkpoint import read_offsets, write_offsets
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import KafkaStorageError
from shoal.broker.log.manager import (
    CLEAN_SHUTDOWN_FILE,
    HW_CHECKPOINT,
    LOG_START_CHECKPOINT,
    META_FILE,
    RECOVERY_CHECKPOINT,
    DataDirError,
    LogManager,
    LogManagerSettings,
    parse_partition_dir,
)

from shoal.locking import DirectoryLockedError

HOUR = 3_600_000
TOPIC_ID = uuid.UUID("6f1b0c5e-8a52-4c1e-9d1b-2f4a7f3e9c01")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


class Managers:
    """Opens LogManagers on one data directory; whatever a test leaves open is crashed."""

    def __init__(self, data_dir: Path, clock: Callable[[], int]) -> None:
        self.data_dir = data_dir
        self.clock = clock
        self._running: list[LogManager] = []

    def open(self, **settings: int) -> LogManager:
        manager = LogManager(self.data_dir, self.clock, LogManagerSettings(**settings))
        self._running.append(manager)
        return manager

    async def close(self, manager: LogManager) -> None:
        self._running.remove(manager)
        await manager.close()

    def crash(self, manager: LogManager) -> None:
        """What a killed broker leaves: no flush, checkpoint or marker; the lock is dropped."""
        self._running.remove(manager)
        for task in manager._tasks:
            task.cancel()
        segments = [s for log in manager.logs.values() for s in log.segments]
        for handle, _, doomed in manager._doomed.values():
            handle.cancel()  # segments waiting for file.delete.delay.ms
            segments.extend(doomed)
        for segment in segments:
            if not segment.file.closed:
                segment.file.close()
        manager._lock.release()

    def crash_all(self) -> None:
        for manager in list(self._running):
            self.crash(manager)


@pytest.fixture
def managers(data_dir: Path, clock) -> Iterator[Managers]:
    harness = Managers(data_dir, clock)
    yield harness
    harness.crash_all()


def _config(**fields) -> LogConfig:
    return LogConfig(**fields)


# -- lock and identity -------------------------------------------------------------


def test_a_second_manager_on_the_same_directory_is_refused(managers, data_dir) -> None:
    managers.open()
    with pytest.raises(DirectoryLockedError, match=str(os.getpid())):
        LogManager(data_dir, lambda: 0)


async def test_the_lock_is_released_by_close(managers) -> None:
    first = managers.open()
    await managers.close(first)
    managers.open()


def test_identity_is_stamped_on_a_new_directory(managers, data_dir) -> None:
    manager = managers.open()
    manager.check_identity(3, "cluster-a")
    text = (data_dir / META_FILE).read_text()
    assert "node.id=3\n" in text
    assert "cluster.id=cluster-a\n" in text
    manager.check_identity(3, "cluster-a")  # the same node again is fine


def test_identity_refuses_another_node(managers) -> None:
    manager = managers.open()
    manager.check_identity(3, "cluster-a")
    with pytest.raises(DataDirError, match=r"node\.id 3"):
        manager.check_identity(4, "cluster-a")


def test_identity_refuses_another_cluster(managers) -> None:
    manager = managers.open()
    manager.check_identity(3, "cluster-a")
    with pytest.raises(DataDirError, match="cluster-a"):
        manager.check_identity(3, "cluster-b")


def test_partition_directory_names() -> None:
    assert parse_partition_dir("orders-0") == ("orders", 0)
    assert parse_partition_dir("my-topic.v2-17") == ("my-topic.v2", 17)
    assert parse_partition_dir("orders") is None
    assert parse_partition_dir("orders-x") is None
    assert parse_partition_dir("-3") is None


# -- creating, loading, deleting -------------------------------------------------------


def test_get_or_create_makes_the_partition_directory_once(managers, data_dir) -> None:
    manager = managers.open()
    log = manager.get_or_create("orders", 2, TOPIC_ID, _config())
    assert log.directory == data_dir / "orders-2"
    assert (data_dir / "orders-2" / "partition.metadata").read_text() == (
        f"version: 0\ntopic_id: {TOPIC_ID}\n"
    )
    assert manager.get_or_create("orders", 2, uuid.uuid4(), _config()) is log
    assert manager.topic_id_on_disk("orders") == TOPIC_ID


async def test_close_writes_checkpoints_and_the_clean_shutdown_marker(
    managers, data_dir, helpers
) -> None:
    manager = managers.open()
    a = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    b = manager.get_or_create("orders", 1, TOPIC_ID, _config())
    a.append_as_leader(helpers.make_batch(3), 0)
    b.append_as_leader(helpers.make_batch(5), 0)
    a.high_watermark = 2
    b.high_watermark = 5
    await managers.close(manager)
    assert (data_dir / CLEAN_SHUTDOWN_FILE).exists()
    assert read_offsets(data_dir / RECOVERY_CHECKPOINT) == {("orders", 0): 3, ("orders", 1): 5}
    assert read_offsets(data_dir / HW_CHECKPOINT) == {("orders", 0): 2, ("orders", 1): 5}
    assert read_offsets(data_dir / LOG_START_CHECKPOINT) == {("orders", 0): 0, ("orders", 1): 0}
    assert all(s.file.closed for log in (a, b) for s in log.segments)


async def test_reopen_after_close_is_clean_and_loads_every_partition(
    managers, data_dir, helpers
) -> None:
    manager = managers.open()
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    log.append_as_leader(helpers.make_batch(3), 0)
    log.high_watermark = 3
    other = manager.get_or_create("audit.events", 4, uuid.uuid4(), _config())
    other.append_as_leader(helpers.make_batch(1), 0)
    await managers.close(manager)
    (data_dir / "not-a-partition").mkdir()
    (data_dir / "stray-file-0").write_text("")

    manager = managers.open()
    assert manager.clean_shutdown
    manager.load_all(lambda topic: _config())
    assert set(manager.logs) == {("orders", 0), ("audit.events", 4)}
    loaded = manager.logs[("orders", 0)]
    assert loaded.log_end_offset == 3
    assert loaded.recovery_point == 3
    assert loaded.high_watermark == 3
    assert [r.offset for r in helpers.read_all(loaded)] == [0, 1, 2]
    assert manager.topic_id_on_disk("orders") == TOPIC_ID
    # The marker is consumed: a crash from here on must not look clean.
    assert not (data_dir / CLEAN_SHUTDOWN_FILE).exists()


async def test_load_all_after_a_crash_recovers_from_the_recovery_checkpoint(
    managers, data_dir, helpers
) -> None:
    manager = managers.open()
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    log.append_as_leader(helpers.make_batch(2), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(2), 0)
    torn_at = log.active.size
    log.append_as_leader(helpers.make_batch(2), 0)
    await log.flush(2)
    manager.checkpoint_recovery()
    manager.checkpoint_hw()
    managers.crash(manager)
    os.truncate(data_dir / "orders-0" / "00000000000000000002.log", torn_at + 10)

    manager = managers.open()
    assert not manager.clean_shutdown
    manager.load_all(lambda topic: _config())
    loaded = manager.logs[("orders", 0)]
    assert loaded.log_end_offset == 4
    assert loaded.recovery_point == 2
    assert [r.offset for r in helpers.read_all(loaded)] == [0, 1, 2, 3]


def test_load_all_uses_the_log_start_checkpoint(managers, data_dir, helpers) -> None:
    manager = managers.open()
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    log.append_as_leader(helpers.make_batch(4), 0)
    log.close()
    write_offsets(data_dir / LOG_START_CHECKPOINT, {("orders", 0): 2})
    write_offsets(data_dir / RECOVERY_CHECKPOINT, {("orders", 0): 4})
    managers.crash(manager)

    manager = managers.open()
    manager.load_all(lambda topic: _config())
    assert manager.logs[("orders", 0)].log_start_offset == 2


def test_load_all_uses_each_topics_config(managers, data_dir) -> None:
    manager = managers.open()
    manager.get_or_create("orders", 0, TOPIC_ID, _config())
    manager.get_or_create("audit", 0, uuid.uuid4(), _config())
    managers.crash(manager)
    manager = managers.open()
    manager.load_all(lambda topic: _config(retention_ms=1 if topic == "audit" else 2))
    assert manager.logs[("audit", 0)].config.retention_ms == 1
    assert manager.logs[("orders", 0)].config.retention_ms == 2


def test_load_all_removes_directories_left_by_a_deletion(managers, data_dir) -> None:
    manager = managers.open()
    doomed = data_dir / f"orders-0.{uuid.uuid4().hex}-delete"
    doomed.mkdir(parents=True)
    (doomed / "00000000000000000000.log").write_bytes(b"x")
    manager.load_all(lambda topic: _config())
    assert not doomed.exists()
    assert manager.logs == {}


async def _wait_until(condition: Callable[[], bool], within_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_delete_moves_the_directory_aside_and_it_disappears(
    managers, data_dir, helpers
) -> None:
    manager = managers.open()
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    log.append_as_leader(helpers.make_batch(2), 0)
    manager.get_or_create("orders", 1, TOPIC_ID, _config())
    manager.delete("orders", 0)
    assert ("orders", 0) not in manager.logs
    assert not (data_dir / "orders-0").exists()
    assert all(s.file.closed for s in log.segments)
    assert manager.topic_id_on_disk("orders") == TOPIC_ID  # partition 1 is still here
    await _wait_until(lambda: not list(data_dir.glob("orders-0.*-delete")))
    manager.delete("orders", 1)
    assert manager.topic_id_on_disk("orders") is None
    manager.delete("orders", 9)  # unknown partition: nothing to do
    await _wait_until(lambda: not list(data_dir.glob("*-delete")))
    assert sorted(p.name for p in data_dir.iterdir()) == [".lock"]


# -- chores ----------------------------------------------------------------------------


async def test_apply_retention_renames_now_and_removes_files_after_the_delay(
    managers, data_dir, helpers, clock
) -> None:
    manager = managers.open()
    log = manager.get_or_create(
        "orders", 0, TOPIC_ID, _config(retention_ms=HOUR, file_delete_delay_ms=50)
    )
    log.append_as_leader(helpers.make_batch(2, timestamp=clock.now - 2 * HOUR), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(2), 0)
    log.high_watermark = 4
    in_flight = log.read(0, 1 << 20, 4, min_one=True)
    assert in_flight is not None

    assert manager.apply_retention() == 1
    part = data_dir / "orders-0"
    assert (part / "00000000000000000000.log.deleted").exists()
    assert log.log_start_offset == 2
    assert len(helpers.slice_bytes(in_flight)) == in_flight.size
    await _wait_until(lambda: not list(part.glob("*.deleted")))
    assert in_flight.file.closed
    assert manager.apply_retention() == 0


async def test_segments_doomed_during_a_flush_are_destroyed_after_it(
    managers, data_dir, helpers, clock, monkeypatch
) -> None:
    """A flush's thread may hold a segment that retention dooms meanwhile: destroyed
    under it, the flush's fsync failed on the closed file and its index writes brought
    back files just unlinked (seen under load in make test). The destroy waits."""
    manager = managers.open()
    log = manager.get_or_create(
        "orders", 0, TOPIC_ID, _config(retention_ms=HOUR, file_delete_delay_ms=0)
    )
    log.append_as_leader(helpers.make_batch(2, timestamp=clock.now - 2 * HOUR), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(2), 0)
    log.high_watermark = 4
    flush_all = log_module._flush_all
    started, release = threading.Event(), threading.Event()

    def held_flush(segments: list, snapshots: list) -> None:
        started.set()
        release.wait(10)
        flush_all(segments, snapshots)

    monkeypatch.setattr(log_module, "_flush_all", held_flush)
    flushing = asyncio.create_task(log.flush())
    await asyncio.to_thread(started.wait, 10)

    assert manager.apply_retention() == 1
    part = data_dir / "orders-0"
    await asyncio.sleep(0.2)
    assert (part / "00000000000000000000.log.deleted").exists(), "destroyed under the flush"
    release.set()
    await flushing  # no fsync of a closed file
    await _wait_until(lambda: not list(part.glob("*.deleted")))
    await asyncio.sleep(0.1)
    assert not list(part.glob("*.deleted")), "a flush brought deleted files back"


async def test_apply_retention_respects_the_high_watermark(managers, helpers, clock) -> None:
    manager = managers.open()
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config(retention_ms=HOUR))
    log.append_as_leader(helpers.make_batch(2, timestamp=clock.now - 2 * HOUR), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(2), 0)
    log.high_watermark = 1
    assert manager.apply_retention() == 0
    log.high_watermark = 2
    assert manager.apply_retention() == 1


async def test_close_removes_segments_still_waiting_for_their_delete_delay(
    managers, data_dir, helpers, clock
) -> None:
    manager = managers.open()
    log = manager.get_or_create(
        "orders", 0, TOPIC_ID, _config(retention_ms=HOUR, file_delete_delay_ms=HOUR)
    )
    log.append_as_leader(helpers.make_batch(2, timestamp=clock.now - 2 * HOUR), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(2), 0)
    log.high_watermark = 4
    assert manager.apply_retention() == 1
    await managers.close(manager)
    assert not list((data_dir / "orders-0").glob("*.deleted"))


async def test_flush_due_flushes_only_logs_that_are_due(managers, helpers) -> None:
    manager = managers.open()
    eager = manager.get_or_create("eager", 0, TOPIC_ID, _config(flush_messages=1))
    lazy = manager.get_or_create("lazy", 0, uuid.uuid4(), _config())
    eager.append_as_leader(helpers.make_batch(2), 0)
    lazy.append_as_leader(helpers.make_batch(2), 0)
    await manager.flush_due()
    assert eager.recovery_point == 2
    assert lazy.recovery_point == 0
    lazy.roll()
    await manager.flush_due()
    assert lazy.recovery_point == 2


async def test_checkpoints_record_every_log(managers, data_dir, helpers) -> None:
    manager = managers.open()
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    log.append_as_leader(helpers.make_batch(3), 0)
    await log.flush()
    log.high_watermark = 3
    manager.checkpoint_recovery()
    manager.checkpoint_hw()
    assert read_offsets(data_dir / RECOVERY_CHECKPOINT) == {("orders", 0): 3}
    assert read_offsets(data_dir / LOG_START_CHECKPOINT) == {("orders", 0): 0}
    assert read_offsets(data_dir / HW_CHECKPOINT) == {("orders", 0): 3}


async def test_started_chores_run_on_their_intervals_and_survive_failures(
    managers, helpers, clock, monkeypatch
) -> None:
    manager = managers.open(
        retention_check_interval_ms=10,
        flush_check_interval_ms=10,
        recovery_checkpoint_interval_ms=10,
        hw_checkpoint_interval_ms=10,
    )
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config(retention_ms=HOUR))
    log.append_as_leader(helpers.make_batch(2, timestamp=clock.now - 2 * HOUR), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(2), 0)
    log.high_watermark = 4
    calls = 0
    real = manager.checkpoint_hw_later

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in one round")
        await real()

    monkeypatch.setattr(manager, "checkpoint_hw_later", flaky)
    manager.start()
    await _wait_until(lambda: log.log_start_offset == 2 and log.recovery_point == 2 and calls >= 2)
    await managers.close(manager)
    assert all(task.done() for task in manager._tasks)


async def test_a_slow_checkpoint_fsync_does_not_stop_the_event_loop(
    managers, data_dir, monkeypatch
) -> None:
    # An fsync waits for the file system's journal: under another tenant's writes it
    # took half a second, which on the event loop stopped every client of the broker.
    manager = managers.open(hw_checkpoint_interval_ms=10, recovery_checkpoint_interval_ms=10)
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    log.high_watermark = 0
    writing, release = threading.Event(), threading.Event()
    outcomes: list[tuple[str, bool]] = []

    def slow(path: Path, offsets) -> None:  # type: ignore[no-untyped-def]
        writing.set()
        released = release.wait(2)
        outcomes.append((path.name, released))
        write_offsets(path, offsets)

    monkeypatch.setattr(manager_module, "write_offsets", slow)
    manager.start()
    await _wait_until(writing.is_set)
    for _ in range(5):
        await asyncio.sleep(0.01)
    assert not outcomes, "the loop ran only once the write was over"
    release.set()
    await _wait_until(lambda: {HW_CHECKPOINT, RECOVERY_CHECKPOINT} <= {n for n, _ in outcomes})
    await managers.close(manager)
    assert all(released for _, released in outcomes)
    assert read_offsets(data_dir / HW_CHECKPOINT) == {("orders", 0): 0}


async def test_a_failed_write_takes_the_directory_offline_and_it_shuts_down_unclean(
    managers, helpers, data_dir, monkeypatch
) -> None:
    manager = managers.open(hw_checkpoint_interval_ms=10)
    log = manager.get_or_create("orders", 0, TOPIC_ID, _config())
    log.append_as_leader(helpers.make_batch(2), 0)

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(log.active, "append", full)
    with pytest.raises(KafkaStorageError, match="No space left on device"):
        log.append_as_leader(helpers.make_batch(1), 0)
    assert manager.offline.is_set()
    other = manager.get_or_create("orders", 1, TOPIC_ID, _config())
    assert log.offline and log.log_end_offset == 2
    # Nothing more is written to the directory, through any log.
    with pytest.raises(KafkaStorageError, match="offline"):
        log.append_as_leader(helpers.make_batch(1), 0)
    assert other.offline, "a log made after the failure is offline too"
    await managers.close(manager)
    # No clean-shutdown marker: the next start recovers every log, cutting a torn batch.
    assert not (data_dir / CLEAN_SHUTDOWN_FILE).exists()


async def test_a_chore_whose_write_fails_takes_the_directory_offline(managers, monkeypatch) -> None:
    manager = managers.open(hw_checkpoint_interval_ms=10)

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    # The write fails in the checkpoint thread; the chore on the loop hears of it.
    monkeypatch.setattr(manager_module, "write_offsets", full)
    manager.start()
    await asyncio.wait_for(manager.offline.wait(), 5)
    await managers.close(manager)
