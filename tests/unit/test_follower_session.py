"""A follower's fetch session: what each request names, forgets, and how failures start over."""

from __future__ import annotations

from shoal.broker.replication.follower_session import FollowerSession, PartitionState

from shoal.wire import INITIAL_EPOCH, NO_SESSION


def state(offset: int, leader_epoch: int = 3) -> PartitionState:
    return PartitionState(offset, 0, leader_epoch, leader_epoch)


def test_the_first_request_is_full_and_asks_for_a_session() -> None:
    session = FollowerSession()
    request = session.next_request({("t", 0): state(5), ("t", 1): state(7)})
    assert (request.session_id, request.epoch, request.full) == (NO_SESSION, INITIAL_EPOCH, True)
    assert set(request.send) == {("t", 0), ("t", 1)}


def test_once_in_a_session_only_changed_partitions_are_sent() -> None:
    session = FollowerSession()
    session.next_request({("t", 0): state(5), ("t", 1): state(7)})
    session.answered(42)
    request = session.next_request({("t", 0): state(9), ("t", 1): state(7)})
    assert (request.session_id, request.epoch) == (42, 1)
    assert request.send == {("t", 0): state(9)}
    assert request.forgotten == []
    session.answered(42)
    request = session.next_request({("t", 0): state(9), ("t", 1): state(7, leader_epoch=4)})
    assert request.epoch == 2
    assert list(request.send) == [("t", 1)]


def test_a_partition_no_longer_fetched_is_forgotten_and_sent_whole_when_back() -> None:
    session = FollowerSession()
    session.next_request({("t", 0): state(5), ("t", 1): state(7)})
    session.answered(42)
    request = session.next_request({("t", 0): state(5)})
    assert (request.send, request.forgotten) == ({}, [("t", 1)])
    session.answered(42)
    request = session.next_request({("t", 0): state(5), ("t", 1): state(7)})
    assert (request.send, request.forgotten) == ({("t", 1): state(7)}, [])


def test_without_a_slot_every_request_is_full() -> None:
    session = FollowerSession()
    session.next_request({("t", 0): state(5)})
    session.answered(NO_SESSION)
    request = session.next_request({("t", 0): state(5)})
    assert request.full
    assert request.send == {("t", 0): state(5)}


def test_a_failure_starts_over_with_a_full_request_that_closes_the_old_session() -> None:
    session = FollowerSession()
    session.next_request({("t", 0): state(5)})
    session.answered(42)
    session.next_request({("t", 0): state(9)})
    session.failed()
    request = session.next_request({("t", 0): state(9)})
    assert (request.session_id, request.epoch) == (42, INITIAL_EPOCH)
    assert request.send == {("t", 0): state(9)}
    session.answered(77)
    assert session.next_request({("t", 0): state(9)}).session_id == 77


def test_an_answer_from_another_session_is_not_applied_and_starts_over() -> None:
    session = FollowerSession()
    session.next_request({("t", 0): state(5)})
    session.answered(42)
    session.next_request({("t", 0): state(9)})
    assert not session.answered(43)
    request = session.next_request({("t", 0): state(9)})
    assert (request.session_id, request.epoch) == (42, INITIAL_EPOCH)


def test_an_incremental_answer_without_a_session_stands_and_the_next_request_is_full() -> None:
    session = FollowerSession()
    session.next_request({("t", 0): state(5)})
    session.answered(42)
    session.next_request({})
    assert session.answered(NO_SESSION)
    request = session.next_request({("t", 0): state(5)})
    assert (request.session_id, request.epoch, request.full) == (NO_SESSION, INITIAL_EPOCH, True)
