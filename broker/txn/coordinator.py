"""The transaction coordinator (KIP-98): transactional ids, their producers and outcomes.

A transactional id belongs to one partition of ``__transaction_state`` (by
the same Java-hash placement as groups), and that partition's leader
coordinates it; the coordinator epoch is the partition's leader epoch, so
a deposed coordinator's markers are recognised as stale
(TRANSACTION_COORDINATOR_FENCED). When a broker becomes the leader it reads
the partition back (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and finishes the
transactions it finds decided but not completed (PrepareCommit/PrepareAbort):
their markers are sent again, which the partitions accept as often as they
come.

Every transition of a transactional id (see :mod:`shoal.broker.txn.metadata`)
is appended to its partition and committed by the in-sync replicas before it
is acted on or answered, as Kafka's TransactionStateManager writes (acks=all).
EndTxn is answered once the decision is committed; the markers follow, sent
by a :class:`~shoal.broker.txn.markers.MarkerWriter` until every partition of
the transaction has one, and only then is Complete* written.

Two timers: transactions Ongoing longer than their timeout are aborted with
the producer's epoch bumped (so the stalled producer is fenced, as Kafka's
abortTimedOutTransactions), and transactional ids idle longer than
``transactional.id.expiration.ms`` are forgotten (a tombstone).

All methods run on the event loop; a transactional id with a transition in
flight answers CONCURRENT_TRANSACTIONS instead of waiting on a lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Final

from shoal.broker.cluster.store import StoreError
from shoal.broker.coordinator.coordinator import OFFSETS_TOPIC
from shoal.broker.coordinator.records import partition_for
from shoal.broker.log.log import LogError
from shoal.broker.partition import (
    CommitTimeoutError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
    Partition,
    PartitionError,
)
from shoal.broker.replica_manager import ReplicaManager
from shoal.broker.txn.config import TransactionConfig
from shoal.broker.txn.markers import MarkerWriter, TopicPartition, TxnMarker
from shoal.broker.txn.metadata import (
    EXPIRABLE,
    MAX_EPOCH,
    TransactionMetadata,
    TxnState,
    TxnTransit,
    epoch_exhausted,
)
from shoal.broker.txn.records import (
    TxnRecordFormatError,
    parse_txn_key,
    parse_txn_value,
    txn_key,
    txn_value,
)

from shoal.metrics import LabeledCounter, LabeledHistogram
from shoal.records import BatchOptions, NewRecord, build_batch, iter_records
from shoal.wire import ErrorCode

log = logging.getLogger(__name__)

TXN_TOPIC: Final = "__transaction_state"
E = ErrorCode
S = TxnState
_COMMIT_TIMEOUT_S: Final = 5.0
DURATION_BUCKETS_S: Final = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 900.0)
"""From a commit interval of milliseconds to transaction.max.timeout.ms."""
"""How long a state write waits for the in-sync replicas."""
_APPEND_ERRORS: Final[dict[type[PartitionError], ErrorCode]] = {
    NotLeaderError: E.not_coordinator,
    NotEnoughReplicasError: E.coordinator_not_available,
    NotEnoughReplicasAfterAppendError: E.coordinator_not_available,
    CommitTimeoutError: E.coordinator_not_available,
}


@dataclass(frozen=True, slots=True)
class InitResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


class _WriteError(Exception):
    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


class TransactionCoordinator:
    def __init__(
        self,
        replicas: ReplicaManager,
        config: TransactionConfig,
        clock: Callable[[], int],
        producer_ids: Callable[[], Awaitable[int]],
        markers: MarkerWriter,
        offsets_partition_of: Callable[[str], int],
    ) -> None:
        self.replicas = replicas
        self.config = config
        self.clock = clock
        self.producer_ids = producer_ids
        self.markers = markers
        self.offsets_partition_of = offsets_partition_of
        self.txns: dict[str, TransactionMetadata] = {}
        self.loaded: dict[int, int] = {}
        """Partition -> coordinator epoch (its leader epoch when loading began)."""
        self.loading: dict[int, tuple[int, asyncio.Task[None]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: list[asyncio.Task[None]] = []
        self.decided = LabeledCounter(
            "shoal_txn_decided",
            "Transactions this broker's coordinator decided, by result (commit, abort) and"
            " by whom (client; timeout: past transaction.timeout.ms; fenced: a new instance"
            " of the transactional id).",
            ("result", "reason"),
        )
        self.durations = LabeledHistogram(
            "shoal_txn_duration_seconds",
            "From a transaction's first partition to its decision, by result.",
            ("result",),
            DURATION_BUCKETS_S,
        )

    # -- ownership ---------------------------------------------------------------------

    @property
    def partitions(self) -> int:
        return self.config.transaction_state_log_num_partitions

    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.partitions)

    def owner_error(self, transactional_id: str) -> ErrorCode | None:
        """Why this broker cannot serve ``transactional_id`` now, or None if it can."""
        index = self.partition_of(transactional_id)
        if index in self.loaded:
            return None
        if index in self.loading:
            return E.coordinator_load_in_progress
        partition = self.replicas.get(TXN_TOPIC, index)
        if partition is None or not partition.is_leader:
            return E.not_coordinator
        return E.coordinator_load_in_progress

    def on_partitions_changed(self) -> None:
        """Load the state partitions this broker now leads (again, after a new leader
        epoch); forget those it lost."""
        led = {
            index: partition.leader_epoch
            for (topic, index), partition in self.replicas.partitions.items()
            if topic == TXN_TOPIC and partition.is_leader
        }
        for index, epoch in led.items():
            current = self.loaded.get(index, self.loading.get(index, (None,))[0])
            if current == epoch:
                continue
            if current is not None:
                self._unload(index)
            task = asyncio.get_running_loop().create_task(
                self._load(index, epoch), name=f"load-txn-state-{index}"
            )
            self.loading[index] = (epoch, task)
        for index in (set(self.loaded) | set(self.loading)) - set(led):
            self._unload(index)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._timers = [
            loop.create_task(
                self._every(
                    self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
                    self.abort_timed_out_transactions,
                ),
                name="txn-abort-timed-out",
            ),
            loop.create_task(
                self._every(
                    self.config.transaction_remove_expired_transaction_cleanup_interval_ms,
                    self.expire_transactional_ids,
                ),
                name="txn-expire-ids",
            ),
        ]

    async def close(self) -> None:
        for task in (*self._timers, *self._tasks):
            task.cancel()
        for index in set(self.loaded) | set(self.loading):
            self._unload(index)
        await asyncio.gather(*self._timers, *self._tasks, return_exceptions=True)

    async def _load(self, index: int, epoch: int) -> None:
        partition = self.replicas.get(TXN_TOPIC, index)
        try:
            txns = self._read(partition) if partition is not None else {}
            self.txns.update(txns)
            self.loaded[index] = epoch
            log.info(
                "event=txn_state_partition_loaded partition=%d coordinator_epoch=%d ids=%d",
                index,
                epoch,
                len(txns),
            )
            for metadata in txns.values():
                if metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                    self._spawn(self._complete(metadata, epoch))
        except (LogError, OSError, ValueError):
            # ValueError: a batch that does not parse (InvalidBatchError, CompressionError).
            log.exception("event=txn_state_partition_load_failed partition=%d", index)
        finally:
            if self.loading.get(index, (None,))[0] == epoch:
                del self.loading[index]

    def _read(self, partition: Partition) -> dict[str, TransactionMetadata]:
        """Replay the partition to its log end: the latest record per id wins, null deletes."""
        found: dict[str, TransactionMetadata | None] = {}
        plog = partition.log
        start = plog.log_start_offset
        for batch, _header in plog.replay(start, plog.log_end_offset):
            for record in iter_records(batch):
                if record.offset < start or record.key is None:
                    continue
                try:
                    transactional_id = parse_txn_key(record.key)
                    if transactional_id is None:
                        continue
                    found[transactional_id] = (
                        None
                        if record.value is None
                        else TransactionMetadata.from_value(
                            transactional_id, parse_txn_value(record.value)
                        )
                    )
                except (TxnRecordFormatError, ValueError) as exc:
                    log.warning(
                        "event=txn_record_skipped partition=%d offset=%d error=%s",
                        partition.index,
                        record.offset,
                        exc,
                    )
        return {tid: m for tid, m in found.items() if m is not None and m.state is not S.DEAD}

    def _unload(self, index: int) -> None:
        entry = self.loading.pop(index, None)
        if entry is not None:
            entry[1].cancel()
        self.loaded.pop(index, None)
        for transactional_id in [t for t in self.txns if self.partition_of(t) == index]:
            del self.txns[transactional_id]
        log.info("event=txn_state_partition_unloaded partition=%d", index)

    def _owns(self, metadata: TransactionMetadata, coordinator_epoch: int) -> bool:
        """Whether this broker still coordinates ``metadata`` as it did at that epoch."""
        tid = metadata.transactional_id
        return (
            self.loaded.get(self.partition_of(tid)) == coordinator_epoch
            and self.txns.get(tid) is metadata
        )

    # -- persistence -----------------------------------------------------------------------

    async def _append(
        self, transactional_id: str, coordinator_epoch: int, value: bytes | None
    ) -> None:
        """Append one record and wait for every in-sync replica (acks=all); _WriteError if not."""
        partition = self.replicas.get(TXN_TOPIC, self.partition_of(transactional_id))
        if (
            partition is None
            or not partition.is_leader
            or partition.leader_epoch != coordinator_epoch
        ):
            raise _WriteError(E.not_coordinator)
        batch = build_batch([NewRecord(txn_key(transactional_id), value)], options=BatchOptions())
        try:
            info = partition.append_as_leader(batch, -1)
            await partition.wait_for_commit(info.last_offset + 1, _COMMIT_TIMEOUT_S)
        except PartitionError as exc:
            log.info("event=txn_state_append_failed id=%s error=%s", transactional_id, exc)
            raise _WriteError(
                _APPEND_ERRORS.get(type(exc), E.coordinator_not_available), str(exc)
            ) from exc
        except (LogError, OSError) as exc:
            log.warning("event=txn_state_append_failed id=%s error=%s", transactional_id, exc)
            raise _WriteError(E.unknown_server_error, str(exc)) from exc

    async def _persist(
        self, metadata: TransactionMetadata, coordinator_epoch: int, transit: TxnTransit
    ) -> ErrorCode:
        """Write a prepared transition; apply it once committed, drop it otherwise."""
        tid = metadata.transactional_id
        value = None if transit.state is S.DEAD else txn_value(transit.value())
        try:
            await self._append(tid, coordinator_epoch, value)
        except _WriteError as exc:
            metadata.abandon()
            return exc.code
        if not self._owns(metadata, coordinator_epoch):
            return E.not_coordinator
        metadata.complete(transit)
        log.debug(
            "event=txn_transition id=%s state=%s producer_id=%d epoch=%d",
            tid,
            transit.state.kafka_name,
            transit.producer_id,
            transit.producer_epoch,
        )
        return E.none

    def _epoch_of(self, transactional_id: str) -> int:
        return self.loaded[self.partition_of(transactional_id)]

    # -- the client's requests ------------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None = None
    ) -> InitResult:
        """InitProducerId with a transactional id: a producer id and a new epoch for it.

        ``expected`` is the (producer id, epoch) a KIP-360 client already has.
        An Ongoing transaction of the id is aborted with its producer fenced,
        and the answer is CONCURRENT_TRANSACTIONS until that is done.
        """
        if not transactional_id:
            return InitResult(E.invalid_request)
        if not 0 < timeout_ms <= self.config.transaction_max_timeout_ms:
            return InitResult(E.invalid_transaction_timeout)
        error = self.owner_error(transactional_id)
        if error is not None:
            return InitResult(error)
        coordinator_epoch = self._epoch_of(transactional_id)
        metadata = self.txns.get(transactional_id)
        if metadata is None:
            try:
                producer_id = await self.producer_ids()
            except StoreError as exc:
                log.warning("event=producer_id_unavailable error=%s", exc)
                return InitResult(E.coordinator_not_available)
            if self.loaded.get(self.partition_of(transactional_id)) != coordinator_epoch:
                return InitResult(E.not_coordinator)
            metadata = self.txns.setdefault(
                transactional_id,
                TransactionMetadata(
                    transactional_id,
                    producer_id,
                    timeout_ms=timeout_ms,
                    last_update_timestamp=self.clock(),
                ),
            )
        refusal = self._init_refusal(metadata, expected)
        if refusal is not None:
            return InitResult(refusal)
        if metadata.state is S.ONGOING:
            code = await self._end(metadata, coordinator_epoch, False, reason="fenced")
            return InitResult(E.concurrent_transactions if code is E.none else code)
        result = await self._new_epoch(metadata, coordinator_epoch, timeout_ms, expected)
        if result.error is E.none:
            log.info(
                "event=transactional_producer_initialized id=%s producer_id=%d epoch=%d",
                transactional_id,
                result.producer_id,
                result.producer_epoch,
            )
        return result

    async def _new_epoch(
        self,
        metadata: TransactionMetadata,
        coordinator_epoch: int,
        timeout_ms: int,
        expected: tuple[int, int] | None,
    ) -> InitResult:
        """Empty/Complete*: the next epoch, or a new producer id once epochs run out."""
        transit: TxnTransit | ErrorCode
        exhausted = metadata.epoch_exhausted
        if exhausted and (expected is None or expected[1] == metadata.producer_epoch):
            try:
                producer_id = await self.producer_ids()
            except StoreError as exc:
                log.warning("event=producer_id_unavailable error=%s", exc)
                return InitResult(E.coordinator_not_available)
            if not self._owns(metadata, coordinator_epoch):
                return InitResult(E.not_coordinator)
            refusal = self._init_refusal(metadata, expected)
            if refusal is not None or metadata.state is S.ONGOING:
                return InitResult(refusal or E.concurrent_transactions)
            transit = metadata.prepare_producer_id_rotation(
                producer_id, timeout_ms, self.clock(), expected is not None
            )
        else:
            transit = metadata.prepare_increment_epoch(
                timeout_ms, None if expected is None else expected[1], self.clock()
            )
            if isinstance(transit, ErrorCode):
                return InitResult(transit)
        code = await self._persist(metadata, coordinator_epoch, transit)
        if code is not E.none:
            return InitResult(code)
        return InitResult(E.none, transit.producer_id, transit.producer_epoch)

    @staticmethod
    def _init_refusal(
        metadata: TransactionMetadata, expected: tuple[int, int] | None
    ) -> ErrorCode | None:
        if metadata.pending is not None or metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return E.concurrent_transactions
        if expected is not None and not (
            metadata.producer_epoch < 0
            or expected[0] == metadata.producer_id
            or (expected[0] == metadata.previous_producer_id and epoch_exhausted(expected[1]))
        ):
            return E.producer_fenced
        if metadata.state not in (S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            return E.concurrent_transactions
        return None

    def _producer_error(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> ErrorCode | TransactionMetadata:
        """The transactional id's metadata, or why this producer may not act on it."""
        if not transactional_id:
            return E.invalid_request
        error = self.owner_error(transactional_id)
        if error is not None:
            return error
        metadata = self.txns.get(transactional_id)
        if metadata is None or metadata.producer_id != producer_id:
            return E.invalid_producer_id_mapping
        if metadata.producer_epoch != producer_epoch:
            return E.producer_fenced
        if metadata.pending is not None:
            return E.concurrent_transactions
        return metadata

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> ErrorCode:
        """AddPartitionsToTxn (v0-v3): the partitions join the transaction, which begins
        (Ongoing) with the first of them."""
        checked = self._producer_error(transactional_id, producer_id, producer_epoch)
        if isinstance(checked, ErrorCode):
            return checked
        metadata = checked
        added = frozenset(partitions)
        if metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return E.concurrent_transactions
        if metadata.state is S.ONGOING and added <= metadata.partitions:
            return E.none
        coordinator_epoch = self._epoch_of(transactional_id)
        transit = metadata.prepare_add_partitions(added, self.clock())
        return await self._persist(metadata, coordinator_epoch, transit)

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn v4+ ``verify_only`` (KIP-890): a broker asks, before it
        appends a transactional batch, whether its partition is in the transaction;
        TRANSACTION_ABORTABLE for one that is not (a hanging transaction averted)."""
        wanted = list(partitions)
        error = E.invalid_request if not transactional_id else self.owner_error(transactional_id)
        if error is None:
            metadata = self.txns.get(transactional_id)
            if metadata is None or metadata.producer_id != producer_id:
                error = E.invalid_producer_id_mapping
            elif metadata.producer_epoch != producer_epoch:
                error = E.producer_fenced
            elif metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                error = E.concurrent_transactions
            else:
                return {
                    tp: E.none if tp in metadata.partitions else E.transaction_abortable
                    for tp in wanted
                }
        return dict.fromkeys(wanted, error)

    async def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> ErrorCode:
        """AddOffsetsToTxn: the group's __consumer_offsets partition joins the transaction,
        so the offsets a TxnOffsetCommit stages there get the transaction's marker."""
        return await self.add_partitions(
            transactional_id,
            producer_id,
            producer_epoch,
            [(OFFSETS_TOPIC, self.offsets_partition_of(group_id))],
        )

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> ErrorCode:
        """EndTxn: decide the transaction; answered once the decision is committed."""
        checked = self._producer_error(transactional_id, producer_id, producer_epoch)
        if isinstance(checked, ErrorCode):
            return checked
        metadata = checked
        state = metadata.state
        if state is S.ONGOING:
            return await self._end(metadata, self._epoch_of(transactional_id), commit)
        return _end_answer(state, commit)

    async def _end(
        self,
        metadata: TransactionMetadata,
        coordinator_epoch: int,
        commit: bool,
        reason: str = "client",
    ) -> ErrorCode:
        """Write PrepareCommit/PrepareAbort, then send the markers in the background.

        Unless the client asked (``reason`` "timeout" or "fenced"), the producer is fenced
        first: its epoch is bumped, so it can neither commit nor write to the aborted
        transaction."""
        fence_epoch = None
        if reason != "client" and metadata.producer_epoch < MAX_EPOCH:
            fence_epoch = metadata.prepare_epoch_fence()
        transit = metadata.prepare_end(commit, self.clock(), fence_epoch)
        code = await self._persist(metadata, coordinator_epoch, transit)
        if code is not E.none:
            if fence_epoch is not None and self._owns(metadata, coordinator_epoch):
                metadata.has_failed_epoch_fence = True
            return code
        result = "commit" if commit else "abort"
        self.decided.inc((result, reason))
        if metadata.start_timestamp >= 0:
            self.durations.observe((result,), (self.clock() - metadata.start_timestamp) / 1000)
        log.debug(
            "event=transaction_decided id=%s producer_id=%d epoch=%d result=%s partitions=%d",
            metadata.transactional_id,
            metadata.producer_id,
            metadata.producer_epoch,
            result,
            len(metadata.partitions),
        )
        self._spawn(self._complete(metadata, coordinator_epoch))
        return E.none

    async def _complete(self, metadata: TransactionMetadata, coordinator_epoch: int) -> None:
        """Send the decided transaction's markers, then write Complete*."""
        marker = TxnMarker(
            metadata.producer_id,
            metadata.producer_epoch,
            metadata.state is S.PREPARE_COMMIT,
            coordinator_epoch,
            frozenset(metadata.partitions),
        )
        if marker.partitions and not await self.markers.write(
            marker, lambda: self._owns(metadata, coordinator_epoch)
        ):
            return
        backoff = self.config.marker_retry_backoff_ms / 1000
        while self._owns(metadata, coordinator_epoch):
            if metadata.pending is not None:
                # Only expiry or a client's request could be in flight; neither
                # touches a Prepare* transaction, so this is a brief race.
                await asyncio.sleep(backoff)
                continue
            if metadata.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                return
            code = await self._persist(
                metadata, coordinator_epoch, metadata.prepare_complete(self.clock())
            )
            if code is E.none:
                log.debug(
                    "event=transaction_completed id=%s producer_id=%d state=%s",
                    metadata.transactional_id,
                    metadata.producer_id,
                    metadata.state.kafka_name,
                )
                return
            if code is not E.coordinator_not_available:
                return
            await asyncio.sleep(backoff)

    # -- timers ----------------------------------------------------------------------------

    async def _every(self, interval_ms: int, job: Callable[[], Awaitable[int]]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await job()
            except Exception:
                log.exception("event=txn_timer_failed")

    async def abort_timed_out_transactions(self) -> int:
        """Abort, fencing their producers, transactions Ongoing past their timeout."""
        now = self.clock()
        due = [
            m
            for m in self.txns.values()
            if m.state is S.ONGOING
            and m.pending is None
            and m.start_timestamp + m.timeout_ms < now
            and self.partition_of(m.transactional_id) in self.loaded
        ]
        for metadata in due:
            log.info(
                "event=transaction_timed_out id=%s producer_id=%d epoch=%d timeout_ms=%d",
                metadata.transactional_id,
                metadata.producer_id,
                metadata.producer_epoch,
                metadata.timeout_ms,
            )
        await asyncio.gather(*(self._abort_timed_out(m) for m in due))
        return len(due)

    async def _abort_timed_out(self, metadata: TransactionMetadata) -> None:
        # Requests may have run since the candidates were picked: check again.
        if metadata.state is not S.ONGOING or metadata.pending is not None:
            return
        epoch = self.loaded.get(self.partition_of(metadata.transactional_id))
        if epoch is not None and self._owns(metadata, epoch):
            await self._end(metadata, epoch, False, reason="timeout")

    async def expire_transactional_ids(self) -> int:
        """Forget ids idle past transactional.id.expiration.ms (Kafka's tombstones)."""
        now = self.clock()
        due = [
            m
            for m in self.txns.values()
            if m.state in EXPIRABLE
            and m.pending is None
            and m.last_update_timestamp + self.config.transactional_id_expiration_ms <= now
            and self.partition_of(m.transactional_id) in self.loaded
        ]
        expired = 0
        for metadata in due:
            epoch = self._epoch_of(metadata.transactional_id)
            if await self._persist(metadata, epoch, metadata.prepare_dead()) is E.none:
                self.txns.pop(metadata.transactional_id, None)
                expired += 1
        if expired:
            log.info("event=transactional_ids_expired count=%d", expired)
        return expired

    # -- admin -----------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> tuple[ErrorCode, TransactionMetadata | None]:
        if not transactional_id:
            return E.invalid_request, None
        error = self.owner_error(transactional_id)
        if error is not None:
            return error, None
        metadata = self.txns.get(transactional_id)
        if metadata is None or metadata.state is S.DEAD:
            return E.transactional_id_not_found, None
        return E.none, metadata

    def list_transactions(
        self, states: set[TxnState], producer_ids: set[int], min_duration_ms: int
    ) -> tuple[ErrorCode, list[TransactionMetadata]]:
        """The ids this broker coordinates, filtered as ListTransactions asks (empty = all)."""
        if self.loading:
            return E.coordinator_load_in_progress, []
        now = self.clock()
        found = [
            m
            for m in self.txns.values()
            if m.state is not S.DEAD
            and (not states or m.state in states)
            and (not producer_ids or m.producer_id in producer_ids)
            and (
                min_duration_ms < 0
                or (m.state is S.ONGOING and now - m.start_timestamp >= min_duration_ms)
            )
        ]
        return E.none, found

    # -- tasks -----------------------------------------------------------------------------

    def _spawn(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("event=txn_task_failed error=%r", task.exception())


def _end_answer(state: TxnState, commit: bool) -> ErrorCode:
    """EndTxn on a transaction that is not Ongoing: a retry of the same decision is
    answered (CONCURRENT_TRANSACTIONS while its markers are still being written, as
    Kafka answers), the other decision is INVALID_TXN_STATE."""
    if state is (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT):
        return E.none
    if state is (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT):
        return E.concurrent_transactions
    if state is S.EMPTY and not commit:
        # Nothing was added, so nothing to abort (Kafka 4 allows it too).
        return E.none
    return E.invalid_txn_state
