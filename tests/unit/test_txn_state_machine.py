"""A transactional id's state machine (Kafka's TransactionMetadata), without I/O."""

from __future__ import annotations

import pytest
from shoal.broker.txn.metadata import (
    MAX_EPOCH,
    IllegalTransitionError,
    TransactionMetadata,
    TxnState,
    TxnTransit,
)

from shoal.wire import ErrorCode

S = TxnState
E = ErrorCode


def initialized(epoch: int = 0) -> TransactionMetadata:
    metadata = TransactionMetadata("tx", 100, producer_epoch=epoch, timeout_ms=1000)
    return metadata


def apply(metadata: TransactionMetadata, transit: TxnTransit | ErrorCode) -> TxnTransit:
    assert isinstance(transit, TxnTransit)
    metadata.complete(transit)
    return transit


def ongoing(partitions: frozenset[tuple[str, int]] = frozenset({("t", 0)})) -> TransactionMetadata:
    metadata = initialized()
    apply(metadata, metadata.prepare_add_partitions(partitions, now=10))
    return metadata


def test_state_ids_and_names_are_kafkas() -> None:
    assert [(s.value, s.kafka_name) for s in S] == [
        (0, "Empty"),
        (1, "Ongoing"),
        (2, "PrepareCommit"),
        (3, "PrepareAbort"),
        (4, "CompleteCommit"),
        (5, "CompleteAbort"),
        (6, "Dead"),
        (7, "PrepareEpochFence"),
    ]
    assert S.from_kafka_name("PrepareAbort") is S.PREPARE_ABORT
    assert S.from_kafka_name("Nope") is None


def test_a_new_transactional_id_gets_epoch_0() -> None:
    metadata = TransactionMetadata("tx", 100)
    transit = apply(metadata, metadata.prepare_increment_epoch(5000, None, now=1))
    assert (transit.producer_id, transit.producer_epoch, metadata.state) == (100, 0, S.EMPTY)
    assert metadata.timeout_ms == 5000


def test_a_commit_goes_ongoing_prepare_complete_and_back_to_ongoing() -> None:
    metadata = ongoing()
    assert metadata.start_timestamp == 10
    apply(metadata, metadata.prepare_add_partitions(frozenset({("u", 1)}), now=20))
    assert metadata.partitions == {("t", 0), ("u", 1)}
    assert metadata.start_timestamp == 10
    apply(metadata, metadata.prepare_end(True, now=30))
    assert metadata.state is S.PREPARE_COMMIT
    apply(metadata, metadata.prepare_complete(now=40))
    assert (metadata.state, metadata.partitions) == (S.COMPLETE_COMMIT, set())
    apply(metadata, metadata.prepare_add_partitions(frozenset({("t", 0)}), now=50))
    assert (metadata.state, metadata.start_timestamp) == (S.ONGOING, 50)


def test_an_abort_completes_as_complete_abort() -> None:
    metadata = ongoing()
    apply(metadata, metadata.prepare_end(False, now=30))
    apply(metadata, metadata.prepare_complete(now=40))
    assert metadata.state is S.COMPLETE_ABORT


def test_a_second_transition_while_one_is_pending_is_a_bug() -> None:
    metadata = ongoing()
    metadata.prepare_end(True, now=30)
    with pytest.raises(IllegalTransitionError):
        metadata.prepare_end(False, now=31)


def test_an_abandoned_transition_leaves_the_state_as_it_was() -> None:
    metadata = ongoing()
    metadata.prepare_end(True, now=30)
    metadata.abandon()
    assert (metadata.state, metadata.pending) == (S.ONGOING, None)
    apply(metadata, metadata.prepare_end(False, now=31))
    assert metadata.state is S.PREPARE_ABORT


@pytest.mark.parametrize(
    ("start", "target"),
    [
        (S.EMPTY, S.PREPARE_COMMIT),
        (S.EMPTY, S.COMPLETE_COMMIT),
        (S.PREPARE_COMMIT, S.ONGOING),
        (S.PREPARE_ABORT, S.EMPTY),
        (S.COMPLETE_ABORT, S.PREPARE_ABORT),
    ],
)
def test_transitions_kafka_forbids_are_refused(start: TxnState, target: TxnState) -> None:
    metadata = initialized()
    metadata.state = start
    prepare = {
        S.PREPARE_COMMIT: lambda: metadata.prepare_end(True, 1),
        S.PREPARE_ABORT: lambda: metadata.prepare_end(False, 1),
        S.COMPLETE_COMMIT: lambda: metadata.prepare_complete(1),
        S.ONGOING: lambda: metadata.prepare_add_partitions(frozenset({("t", 0)}), 1),
        S.EMPTY: lambda: metadata.prepare_increment_epoch(1000, None, 1),
    }[target]
    with pytest.raises(IllegalTransitionError):
        prepare()


def test_init_with_the_current_epoch_bumps_it_and_remembers_the_last() -> None:
    metadata = initialized(epoch=4)
    transit = apply(metadata, metadata.prepare_increment_epoch(1000, 4, now=1))
    assert (transit.producer_epoch, transit.last_producer_epoch) == (5, 4)


def test_a_retried_init_whose_answer_was_lost_gets_the_same_epoch() -> None:
    metadata = initialized(epoch=4)
    apply(metadata, metadata.prepare_increment_epoch(1000, 4, now=1))
    transit = apply(metadata, metadata.prepare_increment_epoch(1000, 4, now=2))
    assert transit.producer_epoch == 5


def test_init_with_an_older_epoch_is_fenced() -> None:
    metadata = initialized(epoch=4)
    assert metadata.prepare_increment_epoch(1000, 2, now=1) is E.producer_fenced
    assert metadata.pending is None


def test_an_epoch_fence_aborts_with_the_next_epoch() -> None:
    metadata = ongoing()
    epoch = metadata.prepare_epoch_fence()
    assert metadata.pending is S.PREPARE_EPOCH_FENCE
    transit = apply(metadata, metadata.prepare_end(False, now=30, fence_epoch=epoch))
    assert (transit.state, transit.producer_epoch) == (S.PREPARE_ABORT, 1)
    assert metadata.producer_epoch == 1


def test_a_fence_whose_write_failed_does_not_bump_the_epoch_twice() -> None:
    metadata = ongoing()
    metadata.prepare_end(False, now=30, fence_epoch=metadata.prepare_epoch_fence())
    metadata.abandon()
    metadata.has_failed_epoch_fence = True
    assert metadata.producer_epoch == 1
    assert metadata.prepare_epoch_fence() == 1


def test_a_fenced_transaction_cannot_be_committed() -> None:
    metadata = ongoing()
    epoch = metadata.prepare_epoch_fence()
    with pytest.raises(IllegalTransitionError):
        metadata.prepare_end(True, now=30, fence_epoch=epoch)


def test_the_last_epochs_are_kept_for_fencing_so_a_new_producer_id_is_due() -> None:
    assert not initialized(MAX_EPOCH - 2).epoch_exhausted
    metadata = initialized(MAX_EPOCH - 1)
    assert metadata.epoch_exhausted
    with pytest.raises(IllegalTransitionError):
        metadata.prepare_increment_epoch(1000, None, now=1)
    transit = apply(metadata, metadata.prepare_producer_id_rotation(200, 1000, 1, True))
    assert (transit.producer_id, transit.producer_epoch) == (200, 0)
    assert (metadata.previous_producer_id, metadata.last_producer_epoch) == (100, MAX_EPOCH - 1)


def test_only_finished_ids_can_expire() -> None:
    metadata = ongoing()
    with pytest.raises(IllegalTransitionError):
        metadata.prepare_dead()
    apply(metadata, metadata.prepare_end(True, now=30))
    apply(metadata, metadata.prepare_complete(now=40))
    assert apply(metadata, metadata.prepare_dead()).state is S.DEAD


def test_a_retried_init_is_answered_even_with_the_epochs_used_up() -> None:
    metadata = initialized(MAX_EPOCH - 2)
    apply(metadata, metadata.prepare_increment_epoch(1000, MAX_EPOCH - 2, now=1))
    assert metadata.epoch_exhausted
    transit = apply(metadata, metadata.prepare_increment_epoch(1000, MAX_EPOCH - 2, now=2))
    assert transit.producer_epoch == MAX_EPOCH - 1
    assert metadata.prepare_increment_epoch(1000, 3, now=3) is E.producer_fenced
