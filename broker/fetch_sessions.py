"""Fetch sessions (KIP-227): a fetcher lists only what changed, and hears only what changed.

Without sessions every Fetch names every partition its sender follows, and
every answer carries every one of them, with or without records: a follower of
51 partitions (a topic and ``__consumer_offsets``) encodes, sends, decodes and
answers 51 entries per round trip to move one partition's bytes.

With a session the leader keeps, per fetcher, each partition's fetch state
(offset, log start, leader epoch, byte limit) and what it last told the
fetcher (high watermark, log start, last stable offset). A request then names
only the partitions whose state changed (and ``forgotten_topics_data`` the
ones to drop); the answer carries only the partitions that have records, a
changed high watermark, log start or last stable offset, or an error.

The request's (session id, epoch) pair says which kind of fetch it is, as in
Kafka:

* epoch -1 (``FINAL_EPOCH``): a full fetch without a session; a session id
  given with it is closed;
* epoch 0 (``INITIAL_EPOCH``): a full fetch that asks for a new session (one
  named by the id is closed first); the answer carries the new id, or 0 when
  the cache has no slot for it (the fetcher keeps sending full fetches);
* epoch > 0: an incremental fetch in session ``id``, which must exist
  (FETCH_SESSION_ID_NOT_FOUND), be at that epoch (INVALID_FETCH_SESSION_EPOCH)
  and name topics the same way as when it was made, by name or by id
  (FETCH_SESSION_TOPIC_ID_ERROR). Epochs count up from 1 and wrap from
  2^31 - 1 to 1.

The cache holds at most ``slots`` sessions (Kafka's
``max.incremental.fetch.session.cache.slots``). When it is full, a new
session takes the slot of one idle for longer than ``eviction_s``, else of the
least valuable session that may be evicted: followers' sessions (privileged)
are worth more than consumers', then larger sessions more than smaller ones;
a session younger than ``eviction_s`` is safe from all but privileged
newcomers, and a privileged one from those too. Otherwise the newcomer gets
no session, which costs it only efficiency.

The module is pure: the fetch handler (:mod:`shoal.broker.handlers.fetch`)
reads the partitions a :class:`FetchContext` lists and hands the results back
to it to choose what the answer carries.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeVar

from shoal.wire import FINAL_EPOCH, INITIAL_EPOCH, NO_SESSION, ErrorCode

_INT32_MAX: Final = 2**31 - 1
"""The largest epoch (the next is 1) and the largest session id."""
DEFAULT_EVICTION_S: Final = 120.0
"""Kafka's ``min.incremental.fetch.session.eviction.ms``."""


@dataclass(frozen=True, slots=True)
class WantedPartition:
    """One partition as a fetch request (or the session it updated) asks for it."""

    name: str | None
    """The topic's name; None when a topic id names no topic."""
    topic_id: uuid.UUID | None
    index: int
    offset: int
    max_bytes: int
    current_leader_epoch: int
    log_start_offset: int
    """A follower's own log start (replica fetches); -1 from consumers."""


PartitionKey = tuple[str | uuid.UUID | None, int]
"""A partition in a session: (topic id, index) in sessions that name topics by id,
(topic name, index) in the others."""


class Answered(Protocol):
    """What the handler read for one partition, as far as the session cares."""

    @property
    def wanted(self) -> WantedPartition: ...
    @property
    def code(self) -> ErrorCode: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def last_stable_offset(self) -> int: ...
    @property
    def has_records(self) -> bool: ...


R = TypeVar("R", bound=Answered)


@dataclass(slots=True)
class _Cached:
    wanted: WantedPartition
    high_watermark: int = -1
    """As last answered; -1 (never answered, or answered with an error) makes the next
    answer carry the partition."""
    log_start_offset: int = -1
    last_stable_offset: int = -1

    def must_answer(self, result: Answered) -> bool:
        """Whether an incremental answer carries ``result``; remembers what it tells."""
        changed = (
            result.has_records
            or result.code is not ErrorCode.none
            or result.high_watermark != self.high_watermark
            or result.log_start_offset != self.log_start_offset
            # Kafka compares only the two above; a read_committed consumer also learns
            # the last stable offset only from answers, and an extra entry costs little.
            or result.last_stable_offset != self.last_stable_offset
        )
        self.remember(result)
        return changed

    def remember(self, result: Answered) -> None:
        # An error's partition is answered again once it heals (as Kafka: watermark -1).
        self.high_watermark = -1 if result.code is not ErrorCode.none else result.high_watermark
        self.log_start_offset = result.log_start_offset
        self.last_stable_offset = result.last_stable_offset


@dataclass(slots=True)
class FetchSession:
    id: int
    privileged: bool
    uses_topic_ids: bool
    created: float
    last_used: float
    epoch: int = 1
    """The epoch the next incremental request must carry."""
    partitions: dict[PartitionKey, _Cached] = field(default_factory=dict)
    """In the order they are read; a partition that returned records moves to the end,
    so that one busy partition cannot take every answer's byte budget."""


def partition_key(wanted: WantedPartition, uses_topic_ids: bool) -> PartitionKey:
    return (wanted.topic_id if uses_topic_ids else wanted.name, wanted.index)


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= _INT32_MAX else epoch + 1


class FetchSessionCache:
    """The sessions of one broker. Not thread-safe: the broker's event loop owns it."""

    def __init__(
        self,
        slots: int,
        eviction_s: float = DEFAULT_EVICTION_S,
        clock: Callable[[], float] = time.monotonic,
        new_id: Callable[[], int] = lambda: random.randint(1, _INT32_MAX),  # noqa: S311 - not a secret: a session is only as good as its epoch
    ) -> None:
        self.slots = slots
        self.eviction_s = eviction_s
        self.clock = clock
        self.new_id = new_id
        self.sessions: dict[int, FetchSession] = {}
        self.evictions = 0

    def context(
        self,
        session_id: int,
        epoch: int,
        wanted: Sequence[WantedPartition],
        forgotten: Iterable[PartitionKey],
        uses_topic_ids: bool,
        privileged: bool,
    ) -> FetchContext | ErrorCode:
        """What a request with this (session id, epoch) reads; an ErrorCode to refuse it."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            self.sessions.pop(session_id, None)
            return FetchContext(
                self, list(wanted), uses_topic_ids, privileged, create=epoch == INITIAL_EPOCH
            )
        session = self.sessions.get(session_id)
        if session is None:
            return ErrorCode.fetch_session_id_not_found
        if session.epoch != epoch:
            return ErrorCode.invalid_fetch_session_epoch
        if session.uses_topic_ids != uses_topic_ids:
            return ErrorCode.fetch_session_topic_id_error
        for want in wanted:
            key = partition_key(want, uses_topic_ids)
            cached = session.partitions.get(key)
            if cached is None:
                session.partitions[key] = _Cached(want)
            else:
                cached.wanted = want
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:
            # Everything forgotten: the session ends, and this answer (of nothing) has
            # session id 0, as Kafka's, so the fetcher asks anew when it has partitions.
            del self.sessions[session_id]
            return FetchContext(self, [], uses_topic_ids, privileged)
        session.epoch = next_epoch(epoch)
        session.last_used = self.clock()
        return FetchContext(
            self,
            [cached.wanted for cached in session.partitions.values()],
            uses_topic_ids,
            privileged,
            session=session,
            epoch=session.epoch,
        )

    def create_session(
        self, partitions: dict[PartitionKey, _Cached], uses_topic_ids: bool, privileged: bool
    ) -> int:
        """A new session's id, or NO_SESSION when no slot can be had."""
        if self.slots <= 0:
            return NO_SESSION
        now = self.clock()
        if len(self.sessions) >= self.slots and not self._evict_for(
            privileged, len(partitions), now
        ):
            return NO_SESSION
        session_id = self.new_id()
        while session_id in self.sessions or session_id == NO_SESSION:
            session_id = self.new_id()
        self.sessions[session_id] = FetchSession(
            session_id, privileged, uses_topic_ids, now, now, partitions=partitions
        )
        return session_id

    def _evict_for(self, privileged: bool, size: int, now: float) -> bool:
        stale = min(self.sessions.values(), key=lambda s: s.last_used)
        if now - stale.last_used > self.eviction_s:
            return self._evict(stale)
        old_enough = [
            s
            for s in self.sessions.values()
            if now - s.created > self.eviction_s or (privileged and not s.privileged)
        ]
        if not old_enough:
            return False
        cheapest = min(old_enough, key=lambda s: (s.privileged, len(s.partitions), s.id))
        if (cheapest.privileged, len(cheapest.partitions)) > (privileged, size):
            return False
        return self._evict(cheapest)

    def _evict(self, session: FetchSession) -> bool:
        del self.sessions[session.id]
        self.evictions += 1
        return True


@dataclass(slots=True)
class FetchContext:
    """One request's view: the partitions to read, in order, and what the answer carries."""

    cache: FetchSessionCache
    partitions: list[WantedPartition]
    uses_topic_ids: bool
    privileged: bool
    create: bool = False
    """A full fetch that asked for a session: made when the answer is."""
    session: FetchSession | None = None
    """The session of an incremental fetch."""
    epoch: int = 0
    """The session's epoch after this request; another request since then wins."""

    def told(self, want: WantedPartition) -> tuple[int, int, int] | None:
        """(high watermark, log start, last stable offset) as this session last told
        them for ``want``, or None when an answer must carry the partition whatever
        it holds (no session, never answered, or answered with an error).

        A partition with no records to give and these three unchanged is left out
        of an incremental answer: the fetch handler need not read it at all.
        """
        if self.session is None:
            return None
        cached = self.session.partitions.get(partition_key(want, self.uses_topic_ids))
        if cached is None or cached.high_watermark < 0:
            return None
        return cached.high_watermark, cached.log_start_offset, cached.last_stable_offset

    def answer(self, results: Sequence[R]) -> tuple[int, list[R]] | ErrorCode:
        """(the answer's session id, the results it carries), or an ErrorCode to refuse.

        Called once, after the reads (and any long poll): a full fetch that asked for
        a session gets one here, cached with what this answer tells; an incremental
        one keeps only what changed.
        """
        if self.session is None:
            if not self.create:
                return NO_SESSION, list(results)
            cached = {}
            for result in results:
                entry = _Cached(result.wanted)
                entry.remember(result)
                cached[partition_key(result.wanted, self.uses_topic_ids)] = entry
            session_id = self.cache.create_session(cached, self.uses_topic_ids, self.privileged)
            return session_id, list(results)
        session = self.session
        if session.epoch != self.epoch:
            # Another request of this session was read while this one long-polled.
            return ErrorCode.invalid_fetch_session_epoch
        carried = []
        # Only what was read: a partition the handler found quiet is left out, as
        # must_answer would leave it (and what it was told stays remembered).
        for result in results:
            key = partition_key(result.wanted, self.uses_topic_ids)
            if session.partitions[key].must_answer(result):
                carried.append(result)
                if result.has_records:
                    session.partitions[key] = session.partitions.pop(key)
        return session.id, carried
