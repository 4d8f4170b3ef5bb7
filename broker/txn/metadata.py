"""One transactional id's state, and the transitions between states (pure, no I/O).

Kafka's TransactionMetadata, in the same two steps: a ``prepare_*`` method
checks that the transition is legal and returns the :class:`TxnTransit` to
write to ``__transaction_state``, marking the metadata as pending (so a second
request meanwhile gets CONCURRENT_TRANSACTIONS); once the write is committed
:meth:`TransactionMetadata.complete` applies it, or :meth:`abandon` drops it if
the write failed. The states and their ids are Kafka's::

    Empty --AddPartitions--> Ongoing --EndTxn--> PrepareCommit --markers--> CompleteCommit
                                      \\-------> PrepareAbort  --markers--> CompleteAbort
    Complete* --AddPartitions--> Ongoing;  Empty/Complete* --InitProducerId--> Empty
    Ongoing --(InitProducerId, timeout: epoch fence)--> PrepareEpochFence --> PrepareAbort
    Empty/Complete* --expiry--> Dead

PrepareEpochFence is never written: the bumped epoch is written with the
PrepareAbort that follows it, as Kafka does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

from shoal.broker.txn.records import NO_PRODUCER_ID, TxnValue, group_partitions

from shoal.wire import ErrorCode

NO_PRODUCER_EPOCH: Final = -1
MAX_EPOCH: Final = 32767
E = ErrorCode

TopicPartition = tuple[str, int]


class TxnState(enum.IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use ("PrepareCommit")."""
        return "".join(word.capitalize() for word in self.name.split("_"))

    @classmethod
    def from_kafka_name(cls, name: str) -> TxnState | None:
        return next((s for s in cls if s.kafka_name == name), None)


S = TxnState

VALID_PREVIOUS: Final[dict[TxnState, frozenset[TxnState]]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}

EXPIRABLE: Final = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})


class IllegalTransitionError(Exception):
    """A transition the state machine forbids: a coordinator bug, never a client's fault."""


def epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps the last epoch for fencing: at MAX_EPOCH - 1 a new producer id is due."""
    return epoch >= MAX_EPOCH - 1


@dataclass(frozen=True, slots=True)
class TxnTransit:
    """The state a transition leads to: what is written, then applied."""

    producer_id: int
    previous_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_timestamp: int
    last_update_timestamp: int

    def value(self) -> TxnValue:
        return TxnValue(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            timeout_ms=self.timeout_ms,
            status=int(self.state),
            partitions=None if self.state is S.EMPTY else group_partitions(self.partitions),
            last_update_timestamp=self.last_update_timestamp,
            start_timestamp=self.start_timestamp,
        )


@dataclass(slots=True)
class TransactionMetadata:
    """Owned by the event loop; changed only through prepare_* then complete/abandon."""

    transactional_id: str
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    previous_producer_id: int = NO_PRODUCER_ID
    timeout_ms: int = 60_000
    state: TxnState = S.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    start_timestamp: int = -1
    last_update_timestamp: int = -1
    pending: TxnState | None = None
    has_failed_epoch_fence: bool = False
    """A fence's bumped epoch may not have been written: the next fence does not bump again."""

    @classmethod
    def from_value(cls, transactional_id: str, value: TxnValue) -> TransactionMetadata:
        state = TxnState(value.status)
        partitions = set()
        if state is not S.EMPTY:
            partitions = {(t, p) for t, ids in value.partitions or () for p in ids}
        return cls(
            transactional_id,
            value.producer_id,
            value.producer_epoch,
            NO_PRODUCER_EPOCH,
            value.previous_producer_id,
            value.timeout_ms,
            state,
            partitions,
            value.start_timestamp,
            value.last_update_timestamp,
        )

    @property
    def pending_transaction(self) -> bool:
        return self.state in (S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT)

    @property
    def epoch_exhausted(self) -> bool:
        return epoch_exhausted(self.producer_epoch)

    # -- preparing transitions ----------------------------------------------------------

    def prepare_increment_epoch(
        self, timeout_ms: int, expected_epoch: int | None, now: int
    ) -> TxnTransit | ErrorCode:
        """InitProducerId on Empty/Complete*: the next epoch, or a retry's same epoch (KIP-360).

        The caller rotates the producer id instead once the epochs are used up."""
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epoch, last = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch in (NO_PRODUCER_EPOCH, expected_epoch):
            epoch, last = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            # A retry of a bump whose answer was lost: the same epoch again.
            epoch, last = self.producer_epoch, self.last_producer_epoch
        else:
            return E.producer_fenced
        if epoch != self.producer_epoch and self.epoch_exhausted:
            raise IllegalTransitionError(f"no epochs left for producer {self.producer_id}")
        return self._prepare(
            S.EMPTY, self.producer_id, epoch, last, timeout_ms, frozenset(), -1, now
        )

    def prepare_producer_id_rotation(
        self, producer_id: int, timeout_ms: int, now: int, record_last_epoch: bool
    ) -> TxnTransit:
        """InitProducerId once the epochs of the current producer id are used up."""
        if self.pending_transaction:
            raise IllegalTransitionError("producer id rotation with a transaction in progress")
        last = self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH
        return self._prepare(S.EMPTY, producer_id, 0, last, timeout_ms, frozenset(), -1, now)

    def prepare_add_partitions(self, added: frozenset[TopicPartition], now: int) -> TxnTransit:
        start = now if self.state in EXPIRABLE else self.start_timestamp
        return self._prepare(
            S.ONGOING,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.timeout_ms,
            frozenset(self.partitions | added),
            start,
            now,
        )

    def prepare_epoch_fence(self) -> int:
        """Fence the producer of an Ongoing transaction before aborting it (an
        InitProducerId of a new instance, or the timeout); the epoch to abort with."""
        if self.state is not S.ONGOING or self.pending is not None:
            raise IllegalTransitionError(f"epoch fence in state {self.state.kafka_name}")
        if self.producer_epoch >= MAX_EPOCH:
            raise IllegalTransitionError(f"epoch of producer {self.producer_id} would overflow")
        self.pending = S.PREPARE_EPOCH_FENCE
        return self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1

    def prepare_end(self, commit: bool, now: int, fence_epoch: int | None = None) -> TxnTransit:
        """Ongoing -> PrepareCommit/PrepareAbort; after :meth:`prepare_epoch_fence`, an abort
        with ``fence_epoch``, the bumped epoch."""
        if fence_epoch is not None:
            if self.pending is not S.PREPARE_EPOCH_FENCE or commit:
                raise IllegalTransitionError("a fenced transaction can only be aborted")
            # As Kafka: the bumped epoch is the metadata's from now on, written or not,
            # so the fenced producer's requests are refused at once.
            self.pending = None
            self.producer_epoch = fence_epoch
            self.last_producer_epoch = NO_PRODUCER_EPOCH
        return self._prepare(
            S.PREPARE_COMMIT if commit else S.PREPARE_ABORT,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.timeout_ms,
            frozenset(self.partitions),
            self.start_timestamp,
            now,
        )

    def prepare_complete(self, now: int) -> TxnTransit:
        """Prepare* -> Complete*, once every partition has its marker."""
        target = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        self.has_failed_epoch_fence = False
        return self._prepare(
            target,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.timeout_ms,
            frozenset(),
            self.start_timestamp,
            now,
        )

    def prepare_dead(self) -> TxnTransit:
        return self._prepare(
            S.DEAD,
            self.producer_id,
            self.producer_epoch,
            self.last_producer_epoch,
            self.timeout_ms,
            frozenset(),
            self.start_timestamp,
            self.last_update_timestamp,
        )

    def _prepare(
        self,
        state: TxnState,
        producer_id: int,
        epoch: int,
        last_epoch: int,
        timeout_ms: int,
        partitions: frozenset[TopicPartition],
        start: int,
        now: int,
    ) -> TxnTransit:
        if self.pending is not None:
            raise IllegalTransitionError(
                f"{self.transactional_id}: transition to {state.kafka_name} while"
                f" {self.pending.kafka_name} is pending"
            )
        if producer_id < 0 or (state is not S.DEAD and epoch < 0):
            raise IllegalTransitionError(f"producer {producer_id} epoch {epoch}")
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalTransitionError(
                f"{self.transactional_id}: {self.state.kafka_name} -> {state.kafka_name}"
            )
        self.pending = state
        return TxnTransit(
            producer_id,
            self.producer_id,
            epoch,
            last_epoch,
            timeout_ms,
            state,
            partitions,
            start,
            now,
        )

    # -- completing them ------------------------------------------------------------------

    def complete(self, transit: TxnTransit) -> None:
        """Apply a transition whose record is committed to the state topic."""
        if self.pending is not transit.state:
            raise IllegalTransitionError(
                f"{self.transactional_id}: completing {transit.state.kafka_name} while"
                f" {self.pending.kafka_name if self.pending else 'nothing'} is pending"
            )
        if transit.state is S.ONGOING and not self.partitions <= transit.partitions:
            raise IllegalTransitionError("a transaction lost partitions")
        self.pending = None
        self.state = transit.state
        if transit.state is S.EMPTY:
            self.previous_producer_id = transit.previous_producer_id
        self.producer_id = transit.producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.timeout_ms = transit.timeout_ms
        self.partitions = set(transit.partitions)
        self.start_timestamp = transit.start_timestamp
        self.last_update_timestamp = transit.last_update_timestamp

    def abandon(self) -> None:
        """The transition's write failed: the metadata stays as it was."""
        self.pending = None
