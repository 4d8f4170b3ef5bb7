"""Follower truncation after a leader change (KIP-101, KIP-279), over real logs.

Each scenario builds the logs two brokers would hold after a history of
elections: a broker that leads appends with ``append_as_leader`` under its
epoch, a broker that follows copies the leader's bytes with
``append_as_follower``. The follower then does what the replica fetcher
does: asks the leader (its epoch cache, as the OffsetForLeaderEpoch handler
answers) where its latest epoch ended, truncates, asks again while the
answer is not complete, and copies the rest. At the end both logs must hold
the same batches, byte for byte, as Kafka's replicas do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from shoal.broker.log.config import LogConfig
from shoal.broker.log.epochs import UNDEFINED
from shoal.broker.log.log import Log
from shoal.broker.replication.truncation import Truncation, truncation_offset

from shoal.records import iter_records


@pytest.fixture
def replica(tmp_path: Path, clock) -> Iterator:
    """Open the log of ``orders-0`` on broker ``name`` (its own directory)."""
    opened: list[Log] = []

    def factory(name: str) -> Log:
        log = Log(tmp_path / name / "orders-0", LogConfig(), 0, True, clock)
        opened.append(log)
        return log

    yield factory
    for log in opened:
        for segment in log.segments:
            if not segment.file.closed:
                segment.file.close()


def _write(log: Log, helpers, epoch: int, batches: int, tag: str) -> None:
    """``batches`` batches of two records each, appended by ``log``'s broker as leader."""
    for i in range(batches):
        log.append_as_leader(helpers.make_batch(2, tag=f"{tag}{i}-"), epoch)


def _batches(log: Log, helpers, start: int = 0, end: int | None = None) -> list[bytes]:
    """The stored bytes of each batch in [start, end), as a fetch would send them."""
    stop = log.log_end_offset if end is None else end
    out: list[bytes] = []
    offset = start
    while offset < stop:
        region = log.read(offset, 1 << 20, stop, min_one=True)
        assert region is not None
        for header, raw in helpers.split_batches(helpers.slice_bytes(region)):
            out.append(raw)
            offset = header.next_offset
    return out


def _copy(leader: Log, follower: Log, helpers, up_to: int | None = None) -> None:
    """The follower fetches from its log end (to ``up_to``) and appends what it gets."""
    for raw in _batches(leader, helpers, follower.log_end_offset, up_to):
        follower.append_as_follower(raw)


def _ask(leader: Log, follower: Log) -> tuple[int, int]:
    """The leader's OffsetForLeaderEpoch answer for the follower's latest epoch."""
    return leader.epochs.end_offset_for(follower.epochs.latest_epoch, leader.log_end_offset)


def _truncation(follower: Log, answer: tuple[int, int]) -> Truncation:
    return truncation_offset(
        follower.epochs, follower.log_end_offset, follower.high_watermark, *answer
    )


def _truncate_against(leader: Log, follower: Log) -> list[int]:
    """The fetcher's truncation: ask, cut, and ask again until complete; the cuts made."""
    cuts = []
    for _ in range(10):
        cut = _truncation(follower, _ask(leader, follower))
        follower.truncate_to(cut.offset)
        cuts.append(follower.log_end_offset)
        if cut.complete:
            return cuts
    raise AssertionError(f"truncation did not converge: {cuts}")


def _values(log: Log, helpers) -> list[bytes | None]:
    return [r.value for raw in _batches(log, helpers) for r in iter_records(raw)]


def _assert_identical(leader: Log, follower: Log, helpers) -> None:
    assert follower.log_end_offset == leader.log_end_offset
    assert _batches(follower, helpers) == _batches(leader, helpers)
    assert follower.epochs.entries == leader.epochs.entries


# -- KIP-101 -------------------------------------------------------------------------


def test_divergent_tail_is_cut_where_the_new_leader_ended_the_old_epoch(replica, helpers):
    # A leads epoch 1 and writes 0-5; B has copied 0-3 when A fails. B leads epoch 2
    # and writes 4-7. A's 4-5 were never committed and must not survive.
    a, b = replica("a"), replica("b")
    _write(a, helpers, epoch=1, batches=3, tag="a")
    _copy(a, b, helpers, up_to=4)
    b.epochs.assign(2, b.log_end_offset)  # as Partition does on becoming leader
    _write(b, helpers, epoch=2, batches=2, tag="b")

    answer = _ask(b, a)
    assert answer == (1, 4)
    assert _truncation(a, answer) == Truncation(4, complete=True)

    assert _truncate_against(b, a) == [4]
    _copy(b, a, helpers)
    _assert_identical(b, a, helpers)
    assert b"a2-0" not in b"".join(v or b"" for v in _values(a, helpers))


def test_records_above_the_high_watermark_the_leader_has_are_kept(replica, helpers):
    # KIP-101's first scenario: B holds 0-5 but only knows a high watermark of 4.
    # Truncating to it would lose 4-5, which A may have acknowledged.
    a, b = replica("a"), replica("b")
    _write(a, helpers, epoch=1, batches=3, tag="a")
    _copy(a, b, helpers)
    b.high_watermark = 4
    a.epochs.assign(2, a.log_end_offset)  # A leads again after B restarted

    assert _truncate_against(a, b) == [6]
    assert b.log_end_offset == 6


def test_follower_behind_in_the_leaders_epoch_keeps_everything(replica, helpers):
    a, b = replica("a"), replica("b")
    _write(a, helpers, epoch=1, batches=3, tag="a")
    _copy(a, b, helpers, up_to=4)
    a.epochs.assign(2, a.log_end_offset)
    _write(a, helpers, epoch=2, batches=1, tag="a2")

    assert _truncation(b, _ask(a, b)) == Truncation(4, complete=True)
    _copy(a, b, helpers)
    _assert_identical(a, b, helpers)


def test_leader_answering_undefined_cuts_to_the_high_watermark(replica, helpers):
    b = replica("b")
    _write(b, helpers, epoch=1, batches=3, tag="b")
    b.high_watermark = 4
    assert _truncation(b, (UNDEFINED, UNDEFINED)) == Truncation(4, complete=True)


def test_replica_without_epochs_cuts_to_the_high_watermark(replica, helpers):
    # An empty epoch cache asks for epoch -1, which the leader cannot answer.
    a, b = replica("a"), replica("b")
    _write(a, helpers, epoch=1, batches=3, tag="a")
    _write(b, helpers, epoch=1, batches=3, tag="b")
    b.high_watermark = 2
    b.epochs.truncate_from_end(0)
    assert b.epochs.latest_epoch == UNDEFINED
    answer = _ask(a, b)
    assert answer == (UNDEFINED, UNDEFINED)
    assert _truncation(b, answer) == Truncation(2, complete=True)


def test_cut_is_never_past_the_follower_log_end(replica, helpers):
    b = replica("b")
    _write(b, helpers, epoch=3, batches=2, tag="b")
    assert _truncation(b, (3, 100)) == Truncation(4, complete=True)


# -- KIP-279 -------------------------------------------------------------------------


def test_answer_with_an_epoch_the_follower_knows_but_older_than_its_own(replica, helpers):
    # L leads epoch 1 (0-5); F copies 0-3, then leads epoch 3 (4-7); L leads epoch 4.
    # F asks about 3; L never had it and answers epoch 1, which ended at 6 in L's log
    # but at 4 in F's: F keeps only 0-3.
    leader, follower = replica("l"), replica("f")
    _write(leader, helpers, epoch=1, batches=3, tag="l1")
    _copy(leader, follower, helpers, up_to=4)
    _write(follower, helpers, epoch=3, batches=2, tag="f3")
    _write(leader, helpers, epoch=4, batches=2, tag="l4")

    answer = _ask(leader, follower)
    assert answer == (1, 6)
    assert _truncation(follower, answer) == Truncation(4, complete=True)
    assert _truncate_against(leader, follower) == [4]
    _copy(leader, follower, helpers)
    _assert_identical(leader, follower, helpers)


def test_answer_with_an_epoch_the_follower_never_had_takes_another_round(replica, helpers):
    # KIP-279's fast leader changes. F leads epoch 1 (0-5); L copies 0-3, leads
    # epoch 2 (4-7); F, never having fetched, leads epoch 3 (6-9); L leads epoch 4
    # (8-11). F asks about 3; L answers epoch 2, which F never had. F's own
    # epoch 1 ran to 6, but L's epoch 1 ended at 4: offsets 4-5 differ between them.
    leader, follower = replica("l"), replica("f")
    _write(follower, helpers, epoch=1, batches=3, tag="f1")
    _copy(follower, leader, helpers, up_to=4)
    leader.epochs.assign(2, leader.log_end_offset)
    _write(leader, helpers, epoch=2, batches=2, tag="l2")
    _write(follower, helpers, epoch=3, batches=2, tag="f3")
    _write(leader, helpers, epoch=4, batches=2, tag="l4")
    assert follower.epochs.entries == [(1, 0), (3, 6)]
    assert leader.epochs.entries == [(1, 0), (2, 4), (4, 8)]

    first = _truncation(follower, _ask(leader, follower))
    assert _ask(leader, follower) == (2, 8)
    assert first == Truncation(6, complete=False), "epoch 2 is unknown here: ask again"

    assert _truncate_against(leader, follower) == [6, 4]
    _copy(leader, follower, helpers)
    _assert_identical(leader, follower, helpers)
    values = _values(follower, helpers)
    assert values[4].startswith(b"l20-")  # offset 4 is the new leader's, not f1's


def test_repeated_failovers_converge_to_the_same_log(replica, helpers):
    # Three brokers, leadership moving A -> B -> C -> A with acks=1 writes that the
    # next leader had not copied: every follower ends with the final leader's log.
    a, b, c = replica("a"), replica("b"), replica("c")
    _write(a, helpers, epoch=1, batches=4, tag="a1")
    _copy(a, b, helpers, up_to=6)
    _copy(a, c, helpers, up_to=2)
    b.epochs.assign(2, b.log_end_offset)
    _write(b, helpers, epoch=2, batches=2, tag="b2")
    _copy(b, c, helpers, up_to=4)  # C truncation is a no-op here: it is behind
    c.epochs.assign(3, c.log_end_offset)
    _write(c, helpers, epoch=3, batches=3, tag="c3")

    for follower in (a, b):
        _truncate_against(c, follower)
        _copy(c, follower, helpers)
        _assert_identical(c, follower, helpers)
