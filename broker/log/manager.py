"""All partition logs in one broker's data directory, and the chores they need.

Layout, as Kafka's ``log.dirs``::

    <data dir>/
      .lock                               held (flock) while a broker uses the dir
      meta.properties                     node.id and cluster.id this dir belongs to
      .kafka_cleanshutdown                present only after a clean shutdown
      recovery-point-offset-checkpoint    fsynced offsets, per partition
      replication-offset-checkpoint       high watermarks, per partition
      log-start-offset-checkpoint         log start offsets, per partition
      cleaner-offset-checkpoint           first dirty offsets of compacted logs
      <topic>-<partition>/                one Log (see log.py), with
          partition.metadata              the topic id the directory belongs to
      <topic>-<partition>.<uuid>-delete/  a deleted partition, removed in the background

The chores run on the event loop at Kafka's intervals: retention
(``log.retention.check.interval.ms``), flushing (rolled segments, and the
``flush.ms`` / ``flush.messages`` topic settings), and checkpoints. Their
fsyncs run in threads: segments in the flush's, the three offset checkpoints
in one thread of their own, which writes them in the order they were asked
for. An fsync waits for the file system's journal, which under another
tenant's writes took half a second, and on the event loop that half second
stopped every client of the broker (all three brokers of a benchmark at
once, since their 5 s high watermark checkpoints start together). The log
cleaner (:class:`~shoal.broker.log.cleaner.manager.LogCleaner`) compacts the
logs whose cleanup.policy says compact, with its own workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shoal.broker.log.checkpoint import fsync_dir, read_offsets, write_offsets
from shoal.broker.log.cleaner.manager import CleanerSettings, LogCleaner
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import Log
from shoal.broker.log.segment import LogSegment

from shoal.locking import DirectoryLock

log = logging.getLogger(__name__)

META_FILE: Final = "meta.properties"
CLEAN_SHUTDOWN_FILE: Final = ".kafka_cleanshutdown"
RECOVERY_CHECKPOINT: Final = "recovery-point-offset-checkpoint"
HW_CHECKPOINT: Final = "replication-offset-checkpoint"
LOG_START_CHECKPOINT: Final = "log-start-offset-checkpoint"
PARTITION_METADATA: Final = "partition.metadata"
DELETE_SUFFIX: Final = "-delete"
_DESTROY_RETRY_S: Final = 0.05
"""How soon a destroy that met a flush of its log looks again."""

TopicPartition = tuple[str, int]


class DataDirError(Exception):
    """The data directory belongs to another node or cluster."""


@dataclass(frozen=True, slots=True)
class LogManagerSettings:
    retention_check_interval_ms: int = 300_000
    flush_check_interval_ms: int = 1_000
    recovery_checkpoint_interval_ms: int = 60_000
    hw_checkpoint_interval_ms: int = 5_000
    producer_id_expiration_ms: int = 86_400_000
    producer_id_expiration_check_interval_ms: int = 600_000
    cleaner: CleanerSettings = field(default_factory=CleanerSettings)


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> TopicPartition | None:
    topic, sep, index = name.rpartition("-")
    if not sep or not topic or not index.isdigit():
        return None
    return topic, int(index)


def read_properties(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.lstrip().startswith("#"):
                values[key.strip()] = value.strip()
    return values


class LogManager:
    """Owns every Log under one data directory; one per broker process."""

    def __init__(
        self,
        data_dir: Path,
        clock: Callable[[], int],
        settings: LogManagerSettings | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.clock = clock
        self.settings = settings or LogManagerSettings()
        self._lock = DirectoryLock(data_dir)
        self.logs: dict[TopicPartition, Log] = {}
        self._topic_ids: dict[str, uuid.UUID] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._doomed: dict[int, tuple[asyncio.TimerHandle, Log, list[LogSegment]]] = {}
        self._checkpoint_writer = ThreadPoolExecutor(1, thread_name_prefix="log-checkpoints")
        """One thread, so a checkpoint file is never written twice at once and the last
        one asked for is the last one written."""
        self.clean_shutdown = (data_dir / CLEAN_SHUTDOWN_FILE).exists()
        self.offline = asyncio.Event()
        """Set by the first failed write in the data directory (KIP-112's offline log
        directory): the broker has no other directory, so it shuts down, as Kafka
        does when its last log directory fails."""
        self.cleaner = LogCleaner(
            data_dir, self.logs, clock, self.settings.cleaner, self.destroy_later
        )

    # -- identity --------------------------------------------------------------

    def check_identity(self, node_id: int, cluster_id: str) -> None:
        """Refuse a directory written by another node or cluster; stamp a new one."""
        path = self.data_dir / META_FILE
        meta = read_properties(path)
        if meta:
            if meta.get("node.id") != str(node_id):
                raise DataDirError(
                    f"{self.data_dir} belongs to node.id {meta.get('node.id')}, not {node_id}"
                )
            if meta.get("cluster.id") != cluster_id:
                raise DataDirError(
                    f"{self.data_dir} belongs to cluster {meta.get('cluster.id')},"
                    f" not {cluster_id}; is --etcd pointing at the right cluster?"
                )
            return
        path.write_text(f"version=1\nnode.id={node_id}\ncluster.id={cluster_id}\n")
        fsync_dir(self.data_dir)

    # -- loading ---------------------------------------------------------------

    def load_all(self, config_for: Callable[[str], LogConfig]) -> None:
        """Open (and if needed recover) every partition directory present."""
        recovery = read_offsets(self.data_dir / RECOVERY_CHECKPOINT)
        watermarks = read_offsets(self.data_dir / HW_CHECKPOINT)
        starts = read_offsets(self.data_dir / LOG_START_CHECKPOINT)
        for path in sorted(self.data_dir.iterdir()):
            if not path.is_dir():
                continue
            if path.name.endswith(DELETE_SUFFIX):
                shutil.rmtree(path, ignore_errors=True)
                continue
            tp = parse_partition_dir(path.name)
            if tp is None:
                continue
            topic_id = self._read_topic_id(path)
            self.logs[tp] = Log(
                path,
                config_for(tp[0]),
                recovery.get(tp, 0),
                self.clean_shutdown,
                self.clock,
                log_start_offset=starts.get(tp, 0),
                high_watermark=watermarks.get(tp, 0),
                on_storage_failure=self.storage_failed,
            )
            self.cleaner.watch(tp, self.logs[tp])
            if topic_id is not None:
                self._topic_ids[tp[0]] = topic_id
            log.info(
                "event=log_loaded topic=%s partition=%d log_end_offset=%d clean=%s",
                tp[0],
                tp[1],
                self.logs[tp].log_end_offset,
                self.clean_shutdown,
            )
        (self.data_dir / CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)

    @staticmethod
    def _read_topic_id(path: Path) -> uuid.UUID | None:
        meta = path / PARTITION_METADATA
        if not meta.exists():
            return None
        for line in meta.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "topic_id":
                with contextlib.suppress(ValueError):
                    return uuid.UUID(value.strip())
        return None

    def topic_id_on_disk(self, topic: str) -> uuid.UUID | None:
        return self._topic_ids.get(topic)

    # -- creating and deleting ---------------------------------------------------

    def get_or_create(
        self, topic: str, partition: int, topic_id: uuid.UUID, config: LogConfig
    ) -> Log:
        tp = (topic, partition)
        existing = self.logs.get(tp)
        if existing is not None:
            return existing
        path = self.data_dir / partition_dir_name(topic, partition)
        path.mkdir(parents=True, exist_ok=True)
        (path / PARTITION_METADATA).write_text(f"version: 0\ntopic_id: {topic_id}\n")
        created = Log(path, config, 0, True, self.clock, on_storage_failure=self.storage_failed)
        created.offline = self.offline.is_set()
        self.logs[tp] = created
        self.cleaner.watch(tp, created)
        self._topic_ids[topic] = topic_id
        log.info("event=log_created topic=%s partition=%d", topic, partition)
        return created

    def delete(self, topic: str, partition: int) -> None:
        """Close the log and move its directory aside; the files go in the background."""
        existing = self.logs.pop((topic, partition), None)
        if existing is None:
            return
        existing.close()
        doomed = existing.directory.with_name(
            f"{existing.directory.name}.{uuid.uuid4().hex}{DELETE_SUFFIX}"
        )
        os.replace(existing.directory, doomed)
        if not any(t == topic for t, _ in self.logs):
            self._topic_ids.pop(topic, None)
        asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, doomed, True)
        log.info("event=log_deleted topic=%s partition=%d", topic, partition)

    # -- chores ------------------------------------------------------------------

    def start(self) -> None:
        s = self.settings
        self._tasks = [
            asyncio.create_task(self._every(s.retention_check_interval_ms, self.apply_retention)),
            asyncio.create_task(self._every(s.flush_check_interval_ms, self.flush_due)),
            asyncio.create_task(
                self._every(s.recovery_checkpoint_interval_ms, self.checkpoint_recovery_later)
            ),
            asyncio.create_task(self._every(s.hw_checkpoint_interval_ms, self.checkpoint_hw_later)),
            asyncio.create_task(
                self._every(s.producer_id_expiration_check_interval_ms, self.expire_producers)
            ),
        ]
        self.cleaner.start()

    def storage_failed(self, exc: OSError, where: Path) -> None:
        """A write under the data directory failed: the directory goes offline, once."""
        if self.offline.is_set():
            return
        log.error(
            "event=log_dir_offline dir=%s path=%s error=%s action=shutdown",
            self.data_dir,
            where,
            (exc.strerror or str(exc)).replace(" ", "_"),
        )
        for log_ in self.logs.values():
            log_.offline = True
        self.offline.set()

    async def _every(self, interval_ms: int, chore: Callable[[], object]) -> None:
        name = getattr(chore, "__name__", chore)
        while True:
            await asyncio.sleep(interval_ms / 1000)
            if self.offline.is_set():
                return
            try:
                result = chore()
                if asyncio.iscoroutine(result):
                    await result
            except OSError as exc:
                self.storage_failed(exc, self.data_dir)
            except Exception:
                log.exception("event=log_chore_failed chore=%s", name)

    def apply_retention(self) -> int:
        """Delete segments past retention in every log; returns how many went.

        Segments left below a moved log start offset go first (Kafka's
        deleteLogStartOffsetBreachedSegments): normally DeleteRecords removed
        them already, but not if the broker died between its checkpoint and
        the renames.
        """
        deleted = 0
        for log_ in self.logs.values():
            doomed = log_.delete_segments(log_.segments_below_log_start())
            doomed += log_.delete_segments(log_.retention_deletable(log_.high_watermark))
            deleted += len(doomed)
            if doomed:
                self.destroy_later(log_, doomed)
        return deleted

    def advance_log_start(self, log_: Log, offset: int) -> bool:
        """Move ``log_``'s start offset up to ``offset``, persist it, drop the segments below.

        The checkpoint is fsynced before this returns and before any file is
        renamed, so a broker killed at any later point restarts with the new
        start and never serves a record below it. (Kafka leaves it to the
        next periodic checkpoint and accepts that risk.) Raises the log's
        OffsetOutOfRangeError past the high watermark; True if it moved.
        """
        if not log_.increment_log_start_offset(offset):
            return False
        self.checkpoint_log_start()
        doomed = log_.delete_segments(log_.segments_below_log_start())
        if doomed:
            self.destroy_later(log_, doomed)
        return True

    def destroy_later(self, log_: Log, segments: list[LogSegment]) -> None:
        """Destroy segments taken out of ``log_`` after its ``file.delete.delay.ms``."""
        self._destroy_in(log_.config.file_delete_delay_ms / 1000, id(segments), log_, segments)

    def _destroy_in(
        self, delay_s: float, token: int, log_: Log, segments: list[LogSegment]
    ) -> None:
        handle = asyncio.get_running_loop().call_later(delay_s, self._destroy, token)
        self._doomed[token] = (handle, log_, segments)

    def _destroy(self, token: int) -> None:
        handle, log_, segments = self._doomed.pop(token)
        handle.cancel()
        if log_.flushing:
            # The flush's thread may hold these segments: closed under it, its fsync
            # fails, and its index writes bring back files just unlinked (seen: a
            # retention run during a flush left *.index.deleted behind for good).
            self._destroy_in(_DESTROY_RETRY_S, token, log_, segments)
            return
        for segment in segments:
            segment.destroy()

    async def flush_due(self) -> None:
        for log_ in list(self.logs.values()):
            target = log_.flush_target()
            if target is not None:
                await log_.flush(target)

    def expire_producers(self) -> int:
        """Forget idempotent producers idle for ``producer.id.expiration.ms``."""
        now = self.clock()
        expiration = self.settings.producer_id_expiration_ms
        return sum(log_.producer_state.expire(now, expiration) for log_ in self.logs.values())

    # -- checkpoints -------------------------------------------------------------
    #
    # Each takes its offsets on the event loop and writes them in the checkpoint
    # thread. The plain methods return once the file is on disk (shutdown, and a
    # moved log start, which must be durable before its segments go); the
    # periodic chores await the thread instead of blocking the loop.

    def checkpoint_recovery(self) -> None:
        self._write_recovery().result()

    async def checkpoint_recovery_later(self) -> None:
        await asyncio.wrap_future(self._write_recovery())

    def _write_recovery(self) -> Future[None]:
        return self._write(
            (RECOVERY_CHECKPOINT, {tp: log_.recovery_point for tp, log_ in self.logs.items()}),
            (LOG_START_CHECKPOINT, {tp: log_.log_start_offset for tp, log_ in self.logs.items()}),
        )

    def checkpoint_log_start(self) -> None:
        self._write_log_start().result()

    def _write_log_start(self) -> Future[None]:
        return self._write(
            (LOG_START_CHECKPOINT, {tp: log_.log_start_offset for tp, log_ in self.logs.items()})
        )

    def checkpoint_hw(self) -> None:
        self._write_hw().result()

    async def checkpoint_hw_later(self) -> None:
        await asyncio.wrap_future(self._write_hw())

    def _write_hw(self) -> Future[None]:
        return self._write(
            (HW_CHECKPOINT, {tp: log_.high_watermark for tp, log_ in self.logs.items()})
        )

    def _write(self, *files: tuple[str, Mapping[TopicPartition, int]]) -> Future[None]:
        """Write each (file name, offsets) in the checkpoint thread, in order."""

        def write() -> None:
            for name, offsets in files:
                write_offsets(self.data_dir / name, offsets)

        return self._checkpoint_writer.submit(write)

    async def close(self) -> None:
        """Clean shutdown: fsync everything, checkpoint, mark clean, unlock.

        With the directory offline nothing is written: the next start recovers
        every log as after a crash, which cuts a batch a failed write tore.
        """
        await self.cleaner.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.offline.is_set():
            for log_ in self.logs.values():
                with contextlib.suppress(OSError):
                    log_.close()
            self._checkpoint_writer.shutdown()
            self._lock.release()
            return
        for log_ in self.logs.values():
            await log_.flush()
        self.checkpoint_recovery()  # after any periodic one still in the thread
        self.checkpoint_hw()
        self._checkpoint_writer.shutdown()
        for log_ in self.logs.values():
            log_.close()
        for token in list(self._doomed):
            self._destroy(token)
        (self.data_dir / CLEAN_SHUTDOWN_FILE).write_text("")
        fsync_dir(self.data_dir)
        self._lock.release()
