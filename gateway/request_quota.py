"""Per-tenant request quotas (Kafka's KIP-124 ``request_percentage``). Pure logic, clock injected.

A tenant's ``request_percentage`` is the share of one request-handling
thread's time its requests may take, as a percentage per quota window: 50
is half a thread, 200 two whole threads (Kafka's unit, which allows values
above 100 for brokers with several handler threads). It bounds how much of
the gateway's event loop, the one thread every tenant's requests run on, a
tenant can take with requests that carry few bytes (a Metadata or ListOffsets
loop, a storm of heartbeats), which the byte-rate quotas do not see.

**What is charged** (:class:`Stopwatch`, :func:`timed`): the time the
gateway's event loop spends running a request's own code, slice by slice:
decoding it, checking and rewriting it, encoding what is forwarded, and, when
the broker's answer comes back, decoding, rewriting and encoding that. Time a
request spends suspended is not charged: waiting for a broker's answer (a
Fetch long-poll waits there for up to its ``max_wait_ms``), for its byte
quota, for a free slot or for etcd. The broker's own time is not charged
either (``docs/gateway.md`` says why). Time is wall-clock
(``time.perf_counter``) during those slices, as Kafka measures a handler
thread's time: while a slice runs, the loop serves no one else.

**The budget** is a token bucket of seconds, as Shoal's byte quotas
(:mod:`shoal.gateway.quotas`): refilled at ``percentage / 100`` seconds a
second up to one window's worth (Kafka's ``quota.window.size.seconds``, 1 s),
starting full, and charged each request's time when its answer is ready,
which may take it below zero. The answer carries the time until that debt is
paid as ``throttle_time_ms`` (at most 30 s; the debt stays), and the
connection is muted that long (KIP-219). Requests are never refused.

**Holding**: the time of a request is known only once it has run, so a
tenant flooding from many connections could run up debt faster than the
throttles mute them. While the tenant owes more than one window
(:meth:`RequestQuotas.wait_s`), none of its connections is read. Bound: over
any span of T seconds a tenant's requests take at most ``rate * T`` plus two
windows (one of burst, one of debt), plus the requests it had in flight when
it went over (at most 100 per connection), whatever the number of
connections.

Limits are per gateway: the caller passes this replica's part of the
tenant's percentage (:mod:`shoal.gateway.quota_shares`). A limit of None
keeps no state and never throttles. Nothing here is thread-safe; the
gateway's event loop calls it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Final, Generic, TypeVar

from shoal.gateway.quotas import (
    DEFAULT_MAX_THROTTLE_MS,
    DEFAULT_WINDOW_S,
    ByteBudget,
    tenant_budget,
)

LIMIT_NAME: Final = "request_percentage"
"""The quota as Kafka (and AlterClientQuotas) names it; a Tenant's ``requestPercentage``."""

T = TypeVar("T")


def seconds_per_second(percentage: float) -> float:
    """The handling time a second that ``percentage`` allows: 100% is one thread's whole second."""
    return percentage / 100


class RequestQuotas:
    """One bucket of handling time per tenant with a ``request_percentage``.

    Invariant: a tenant has a bucket only while it has a limit; a call with
    ``percentage=None`` drops it (and forgets its debt).
    """

    __slots__ = ("_buckets", "max_throttle_ms", "window_s")

    def __init__(
        self, window_s: float = DEFAULT_WINDOW_S, max_throttle_ms: int = DEFAULT_MAX_THROTTLE_MS
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"request quota window must be positive, got {window_s}")
        self.window_s = window_s
        self.max_throttle_ms = max_throttle_ms
        self._buckets: dict[str, ByteBudget] = {}

    def charge(self, tenant: str, seconds: float, percentage: float | None, now: float) -> int:
        """Charge ``seconds`` of handling time; the throttle in ms the answer carries (0: none)."""
        if seconds < 0:
            raise ValueError(f"cannot charge a negative time {seconds}")
        bucket = self._bucket(tenant, percentage, now)
        if bucket is None:
            return 0
        bucket.charge(seconds, now)
        owed_ms = math.ceil(bucket.seconds_until(0.0, now) * 1000)
        return min(owed_ms, self.max_throttle_ms)

    def wait_s(self, tenant: str, percentage: float | None, now: float) -> float:
        """Seconds before the tenant's next request may be read: until it owes at most a window."""
        bucket = self._bucket(tenant, percentage, now)
        if bucket is None:
            return 0.0
        return bucket.seconds_until(-bucket.capacity, now)

    def balance(self, tenant: str, now: float) -> float | None:
        """The tenant's seconds in hand now (negative: owed); None without a bucket."""
        bucket = self._buckets.get(tenant)
        return None if bucket is None else bucket.balance(now)

    def _bucket(self, tenant: str, percentage: float | None, now: float) -> ByteBudget | None:
        if percentage is None:
            self._buckets.pop(tenant, None)
            return None
        if not percentage > 0:
            raise ValueError(
                f"tenant {tenant!r} has a non-positive request percentage {percentage}"
            )
        rate = seconds_per_second(percentage)
        return tenant_budget(self._buckets, tenant, rate, rate * self.window_s, now)


class Stopwatch:
    """The time one request's code has run, summed over the slices it ran in.

    :meth:`start` and :meth:`stop` bracket a slice (nesting is not counted
    twice); :meth:`take` hands over what ran since the last take, the running
    slice included, so a request can be charged before its last slice ends
    (an answer's throttle is decided before the answer is encoded) and the
    rest later.
    """

    __slots__ = ("_clock", "_depth", "_since", "_taken")

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._taken = 0.0
        self._since = 0.0
        self._depth = 0

    def start(self) -> None:
        if self._depth == 0:
            self._since = self._clock()
        self._depth += 1

    def stop(self) -> None:
        if self._depth <= 0:
            raise RuntimeError("stopwatch stopped more often than started")
        self._depth -= 1
        if self._depth == 0:
            self._taken += self._clock() - self._since

    def take(self) -> float:
        """Seconds run since the last take (0.0 the first time nothing ran)."""
        seconds = self._taken
        self._taken = 0.0
        if self._depth > 0:
            now = self._clock()
            seconds += now - self._since
            self._since = now
        return seconds


class _Timed(Generic[T]):
    """Awaits ``coro`` with ``watch`` running only while ``coro`` runs (see :func:`timed`)."""

    __slots__ = ("_coro", "_watch")

    def __init__(self, coro: Coroutine[Any, Any, T], watch: Stopwatch) -> None:
        self._coro = coro
        self._watch = watch

    def __await__(self) -> Generator[Any, Any, T]:
        coro, watch = self._coro, self._watch
        value: Any = None
        thrown: BaseException | None = None
        while True:
            watch.start()
            try:
                step = coro.send(value) if thrown is None else coro.throw(thrown)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            finally:
                watch.stop()
            value, thrown = None, None
            try:
                value = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown on: the inner coroutine's to handle
                thrown = exc


async def timed(coro: Coroutine[Any, Any, T], watch: Stopwatch) -> T:
    """``await timed(coro, watch)`` is ``await coro``, with ``watch`` counting only the slices
    in which ``coro`` runs: from each resumption to its next suspension (an await that
    really waits: a broker's answer, a quota, a lock, a sleep). Awaits that need not wait
    never suspend and are counted as the code they are."""
    return await _Timed(coro, watch)
