"""Fetch sessions (KIP-227): what a session remembers, what an incremental answer carries,
and which session gives up its slot."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from shoal.broker.fetch_sessions import (
    FetchContext,
    FetchSessionCache,
    WantedPartition,
    next_epoch,
)

from shoal.wire import FINAL_EPOCH, INITIAL_EPOCH, NO_SESSION, ErrorCode


@dataclass(frozen=True)
class Read:
    wanted: WantedPartition
    code: ErrorCode = ErrorCode.none
    high_watermark: int = 10
    log_start_offset: int = 0
    last_stable_offset: int = 10
    has_records: bool = False


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def want(topic: str, index: int, offset: int = 0, topic_id: uuid.UUID | None = None):
    return WantedPartition(topic, topic_id, index, offset, 1 << 20, -1, -1)


def context(cache, session_id, epoch, wanted=(), forgotten=(), ids=False, privileged=False):
    found = cache.context(session_id, epoch, list(wanted), list(forgotten), ids, privileged)
    assert isinstance(found, FetchContext), found
    return found


def open_session(cache, wanted, privileged=False, **read) -> int:
    ctx = context(cache, NO_SESSION, INITIAL_EPOCH, wanted, privileged=privileged)
    answered = ctx.answer([Read(w, **read) for w in ctx.partitions])
    assert not isinstance(answered, ErrorCode)
    return answered[0]


def carried(ctx, reads) -> list[tuple[str | None, int]]:
    answered = ctx.answer(reads)
    assert not isinstance(answered, ErrorCode), answered
    return [(r.wanted.name, r.wanted.index) for r in answered[1]]


def test_a_fetch_at_the_final_epoch_has_no_session_and_hears_everything() -> None:
    cache = FetchSessionCache(slots=10)
    wanted = [want("t", 0), want("t", 1)]
    ctx = context(cache, NO_SESSION, FINAL_EPOCH, wanted)
    answered = ctx.answer([Read(w) for w in wanted])
    assert answered == (NO_SESSION, [Read(w) for w in wanted])
    assert cache.sessions == {}


def test_the_initial_epoch_opens_a_session_whose_next_epoch_is_one() -> None:
    cache = FetchSessionCache(slots=10)
    session_id = open_session(cache, [want("t", 0)])
    assert session_id != NO_SESSION
    assert cache.sessions[session_id].epoch == 1


def test_an_incremental_fetch_reads_every_session_partition_at_its_cached_offset() -> None:
    cache = FetchSessionCache(slots=10)
    session_id = open_session(cache, [want("t", 0, 5), want("t", 1, 7)])
    ctx = context(cache, session_id, 1, [want("t", 1, 9)])
    assert [(w.index, w.offset) for w in ctx.partitions] == [(0, 5), (1, 9)]


def test_an_incremental_answer_carries_only_records_news_and_errors() -> None:
    cache = FetchSessionCache(slots=10)
    names = ("quiet", "records", "watermark", "log-start", "stable", "broken")
    session_id = open_session(cache, [want(n, 0) for n in names])
    ctx = context(cache, session_id, 1)
    reads = {w.name: Read(w) for w in ctx.partitions}
    reads["records"] = Read(reads["records"].wanted, has_records=True)
    reads["watermark"] = Read(reads["watermark"].wanted, high_watermark=11)
    reads["log-start"] = Read(reads["log-start"].wanted, log_start_offset=3)
    reads["stable"] = Read(reads["stable"].wanted, last_stable_offset=8)
    reads["broken"] = Read(reads["broken"].wanted, code=ErrorCode.not_leader_or_follower)
    assert carried(ctx, list(reads.values())) == [(n, 0) for n in names[1:]]
    # What was told is remembered: the same state again is news to nobody.
    ctx = context(cache, session_id, 2)
    reads2 = [
        Read(w, high_watermark=11)
        if w.name == "watermark"
        else Read(w, log_start_offset=3)
        if w.name == "log-start"
        else Read(w, last_stable_offset=8)
        if w.name == "stable"
        else Read(w)
        for w in ctx.partitions
    ]
    assert carried(ctx, reads2) == [("broken", 0)]


def test_a_partition_healed_of_its_error_is_answered_once_more() -> None:
    cache = FetchSessionCache(slots=10)
    session_id = open_session(cache, [want("t", 0)], code=ErrorCode.not_leader_or_follower)
    ctx = context(cache, session_id, 1)
    assert carried(ctx, [Read(ctx.partitions[0])]) == [("t", 0)]
    ctx = context(cache, session_id, 2)
    assert carried(ctx, [Read(ctx.partitions[0])]) == []


def test_an_incremental_fetch_says_what_its_session_was_told_of_each_partition() -> None:
    cache = FetchSessionCache(slots=10)
    wanted = [want("t", 0), want("t", 1)]
    session_id = open_session(cache, wanted, high_watermark=12, log_start_offset=2)
    ctx = context(cache, session_id, 1)
    # The handler skips a partition whose state matches and has no records to give.
    assert ctx.told(ctx.partitions[0]) == (12, 2, 10)
    assert ctx.told(want("elsewhere", 0)) is None
    # Left out of the answer, what it was told stays as it was.
    assert carried(ctx, [Read(ctx.partitions[1], high_watermark=13, log_start_offset=2)]) == [
        ("t", 1)
    ]
    ctx = context(cache, session_id, 2)
    assert ctx.told(ctx.partitions[0]) == (12, 2, 10)
    assert ctx.told(ctx.partitions[1]) == (13, 2, 10)


def test_nothing_is_known_told_outside_a_session_or_after_an_error() -> None:
    cache = FetchSessionCache(slots=10)
    full = context(cache, NO_SESSION, FINAL_EPOCH, [want("t", 0)])
    assert full.told(want("t", 0)) is None
    session_id = open_session(cache, [want("t", 0)], code=ErrorCode.not_leader_or_follower)
    ctx = context(cache, session_id, 1)
    assert ctx.told(ctx.partitions[0]) is None  # an error's partition is answered again


def test_forgotten_partitions_leave_the_session() -> None:
    cache = FetchSessionCache(slots=10)
    session_id = open_session(cache, [want("t", 0), want("t", 1)])
    ctx = context(cache, session_id, 1, forgotten=[("t", 0)])
    assert [w.index for w in ctx.partitions] == [1]


def test_a_session_whose_every_partition_is_forgotten_ends() -> None:
    cache = FetchSessionCache(slots=10)
    session_id = open_session(cache, [want("t", 0)])
    ctx = context(cache, session_id, 1, forgotten=[("t", 0)])
    assert ctx.answer([]) == (NO_SESSION, [])
    assert cache.sessions == {}


def test_a_partition_that_returned_records_is_read_last_next_time() -> None:
    cache = FetchSessionCache(slots=10)
    session_id = open_session(cache, [want("t", 0), want("t", 1), want("t", 2)])
    ctx = context(cache, session_id, 1)
    reads = [Read(w, has_records=w.index == 0) for w in ctx.partitions]
    carried(ctx, reads)
    assert [w.index for w in context(cache, session_id, 2).partitions] == [1, 2, 0]


@pytest.mark.parametrize(
    ("session_id", "epoch", "ids", "code"),
    [
        (12345, 1, False, ErrorCode.fetch_session_id_not_found),
        (None, 2, False, ErrorCode.invalid_fetch_session_epoch),
        (None, 1, True, ErrorCode.fetch_session_topic_id_error),
        (NO_SESSION, 1, False, ErrorCode.fetch_session_id_not_found),
    ],
)
def test_an_incremental_fetch_outside_its_session_is_refused(session_id, epoch, ids, code) -> None:
    cache = FetchSessionCache(slots=10)
    opened = open_session(cache, [want("t", 0)])
    found = cache.context(opened if session_id is None else session_id, epoch, [], [], ids, False)
    assert found is code


def test_an_answer_overtaken_by_a_later_request_of_its_session_is_refused() -> None:
    cache = FetchSessionCache(slots=10)
    session_id = open_session(cache, [want("t", 0)])
    long_poll = context(cache, session_id, 1)
    context(cache, session_id, 2)
    assert long_poll.answer([Read(long_poll.partitions[0])]) is (
        ErrorCode.invalid_fetch_session_epoch
    )


def test_the_initial_or_final_epoch_closes_the_session_it_names() -> None:
    cache = FetchSessionCache(slots=10)
    first = open_session(cache, [want("t", 0)])
    context(cache, first, FINAL_EPOCH, [want("t", 0)])
    assert first not in cache.sessions
    second = open_session(cache, [want("t", 0)])
    context(cache, second, INITIAL_EPOCH, [want("t", 0)]).answer([])
    assert second not in cache.sessions


def test_sessions_by_topic_id_key_partitions_by_id() -> None:
    cache = FetchSessionCache(slots=10)
    topic_id = uuid.uuid4()
    ctx = context(cache, NO_SESSION, INITIAL_EPOCH, [want("t", 0, 0, topic_id)], ids=True)
    answered = ctx.answer([Read(ctx.partitions[0])])
    assert not isinstance(answered, ErrorCode)
    ctx = context(cache, answered[0], 1, [want("t", 0, 4, topic_id)], ids=True)
    assert [w.offset for w in ctx.partitions] == [4]
    ctx = context(cache, answered[0], 2, [want("t", 1, 0, topic_id)], [(topic_id, 0)], ids=True)
    assert [(w.index, w.offset) for w in ctx.partitions] == [(1, 0)]


def test_epochs_wrap_to_one() -> None:
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(1) == 2


def test_no_slots_no_sessions() -> None:
    assert open_session(FetchSessionCache(slots=0), [want("t", 0)]) == NO_SESSION


def test_a_full_cache_gives_a_newcomer_no_session_while_the_others_are_young() -> None:
    clock = Clock()
    cache = FetchSessionCache(slots=1, clock=clock)
    kept = open_session(cache, [want("t", 0)])
    assert open_session(cache, [want("t", 0), want("t", 1)]) == NO_SESSION
    assert list(cache.sessions) == [kept]


def test_a_follower_takes_the_slot_of_a_young_consumer_session() -> None:
    clock = Clock()
    cache = FetchSessionCache(slots=1, clock=clock)
    open_session(cache, [want("t", 0), want("t", 1)])
    follower = open_session(cache, [want("t", 0)], privileged=True)
    assert list(cache.sessions) == [follower]
    assert cache.evictions == 1
    # And a consumer cannot take a young follower's.
    assert open_session(cache, [want("t", 0), want("t", 1)]) == NO_SESSION


def test_an_idle_session_gives_up_its_slot() -> None:
    clock = Clock()
    cache = FetchSessionCache(slots=1, eviction_s=120, clock=clock)
    open_session(cache, [want("t", 0)], privileged=True)
    clock.now += 121
    newcomer = open_session(cache, [want("t", 0)])
    assert list(cache.sessions) == [newcomer]


def test_an_old_busy_session_keeps_its_slot_against_a_smaller_newcomer() -> None:
    clock = Clock()
    cache = FetchSessionCache(slots=1, eviction_s=120, clock=clock)
    kept = open_session(cache, [want("t", 0), want("t", 1)])
    for epoch in range(1, 5):  # used every 50 s: never idle, but older than 120 s
        clock.now += 50
        context(cache, kept, epoch)
    assert open_session(cache, [want("t", 0)]) == NO_SESSION
    larger = open_session(cache, [want("t", i) for i in range(3)])
    assert list(cache.sessions) == [larger]
