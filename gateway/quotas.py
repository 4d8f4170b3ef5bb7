"""Per-tenant byte-rate quotas: one budget per tenant and direction. Pure logic, no I/O, no clock.

Every connection of a tenant, through either door (Kafka and HTTP), draws on
the same produce budget and the same consume budget in this gateway, so a
tenant that opens more connections gets no more bytes. The gateway asks this
module two questions per request: how long must this request wait before it
is forwarded, and what throttle does its answer carry (``throttle_time_ms``,
KIP-219). The waiting itself is :mod:`shoal.gateway.admission`'s.

**The budget** is a bucket of bytes (:class:`ByteBudget`) filled at the
limit's rate up to one window's worth (``window_s`` seconds of the limit,
Kafka's ``quota.window.size.seconds``), which a tenant that was quiet may
spend at once. Requests are charged their size, and the balance may go below
zero: that is debt, which every later request of the tenant waits out.

**Produce** (:meth:`QuotaManager.produce_wait_s`, :meth:`QuotaManager.charge_produce`):
a request of ``n`` bytes is forwarded once the balance is at least
``min(n, 2 * capacity) - capacity``, so that after its charge the debt is at
most one window (a request larger than two windows waits for a full bucket).
Its answer's throttle is the time until the debt is paid. Bound: over any span
of ``T`` seconds the bytes forwarded are at most ``limit * T + 2 * capacity``,
or ``limit * T + capacity + n`` for a request of ``n > 2 * capacity`` bytes;
whatever the number of connections, since one request's charge is seen by the
next before it is admitted.

**Fetch** (:meth:`QuotaManager.fetch_admission`, :meth:`QuotaManager.settle_fetch`):
the size of an answer is known only when it comes back, so a fetch reserves
bytes before it is forwarded: it waits until the balance holds at least
:data:`MIN_FETCH_CAP_BYTES`, asks the broker for no more than the balance
(at most one window), and is charged that much at once; the answer's actual
size then replaces the reservation. Concurrent fetches thus split the balance
rather than each taking a window's worth. A broker returns a partition's first
batch whole even when it is larger than asked (KIP-74), so an answer can
exceed its reservation; the excess is debt like any other.

Why not Kafka's sampled rate (``Rate`` over ``quota.window.num`` samples, and
muting only the connection that went over): bytes older than the samples are
forgotten, so a throttle can never be longer than ``samples * window`` (11 s),
while one produce request may carry a megabyte per partition; and the
tenant's other connections send on meanwhile. A tenant opening eight connections stored 17.9 times a
100 KiB/s quota that way. A bucket with debt forgets nothing and is one per
tenant; Kafka itself uses a token bucket for its controller mutation quota
(KIP-599).

Limits are per gateway: the caller passes the share of the tenant's quota
that this replica enforces (see ``docs/gateway.md``). A limit of None keeps no
state and never waits.

Times are seconds from a monotonic clock, passed in by the caller, so tests
drive time by hand. Nothing here is thread-safe; the gateway calls it from
its event loop only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, NamedTuple

DEFAULT_WINDOW_S: Final = 1.0
"""Kafka's ``quota.window.size.seconds``: how many seconds of its limit a quiet tenant may burst."""

DEFAULT_MAX_THROTTLE_MS: Final = 30_000
"""The longest ``throttle_time_ms`` one answer carries: the clients' default ``request.timeout.ms``.

Only what the answer reports is capped: the debt stays, and the tenant's next
request waits for the rest.
"""

MIN_FETCH_CAP_BYTES: Final = 1024
"""The smallest fetch the gateway forwards, however small the quota: a fetch waits for this much."""


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """How large a burst is and how long one reported throttle may be."""

    window_s: float = DEFAULT_WINDOW_S
    max_throttle_ms: int = DEFAULT_MAX_THROTTLE_MS

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"quota window must be positive, got {self.window_s}")
        if self.max_throttle_ms < 0:
            raise ValueError(f"max throttle must not be negative, got {self.max_throttle_ms}")


class ByteBudget:
    """Bytes a tenant may send now: filled at ``rate`` a second up to ``capacity``; may go negative.

    Starts full. Changing the rate keeps the balance (debt already run up is
    still owed), clamped to the new capacity.
    """

    __slots__ = ("_at", "_balance", "capacity", "rate")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self._balance = capacity
        self._at = now

    def balance(self, now: float) -> float:
        if now > self._at:
            self._balance = min(self.capacity, self._balance + (now - self._at) * self.rate)
            self._at = now
        return self._balance

    def retune(self, rate: float, capacity: float, now: float) -> None:
        self._balance = min(capacity, self.balance(now))
        self.rate, self.capacity = rate, capacity

    def charge(self, nbytes: float, now: float) -> None:
        self._balance = self.balance(now) - nbytes

    def seconds_until(self, level: float, now: float) -> float:
        """Seconds from ``now`` until the balance is at least ``level`` (at most the capacity)."""
        return max(0.0, (level - self.balance(now)) / self.rate)


def tenant_budget(
    budgets: dict[str, ByteBudget], tenant: str, rate: float, capacity: float, now: float
) -> ByteBudget:
    """``tenant``'s budget in ``budgets`` at ``rate`` and ``capacity``: made (full) on first
    use, retuned (its balance kept) when the rate has changed since. Every per-tenant
    bucket of the gateway's limits is kept this way."""
    budget = budgets.get(tenant)
    if budget is None:
        budget = budgets[tenant] = ByteBudget(rate, capacity, now)
    elif budget.rate != rate:
        budget.retune(rate, capacity, now)
    return budget


class FetchTicket(NamedTuple):
    """A forwarded fetch's reservation: the most it asked for, charged until it is settled."""

    tenant: str
    reserved: int


class QuotaManager:
    """One produce budget and one consume budget per tenant, and the waits and throttles they give.

    Invariant: a tenant has a budget in a direction only while that direction
    has a limit; a call with ``limit=None`` drops it.
    """

    __slots__ = ("_config", "_fetch", "_produce")

    def __init__(self, config: QuotaConfig | None = None) -> None:
        self._config = config if config is not None else QuotaConfig()
        self._produce: dict[str, ByteBudget] = {}
        self._fetch: dict[str, ByteBudget] = {}

    @property
    def config(self) -> QuotaConfig:
        return self._config

    # -- produce -----------------------------------------------------------------

    def produce_wait_s(self, tenant: str, nbytes: int, limit: float | None, now: float) -> float:
        """Seconds a produce of ``nbytes`` must wait before it is forwarded (0: forward now)."""
        budget = self._budget(self._produce, tenant, limit, now)
        if budget is None:
            return 0.0
        capacity = budget.capacity
        return budget.seconds_until(min(nbytes, 2 * capacity) - capacity, now)

    def charge_produce(self, tenant: str, nbytes: int, limit: float | None, now: float) -> int:
        """Charge a forwarded produce; the throttle in ms its answer carries (0 if none)."""
        return self._charge(self._produce, tenant, nbytes, limit, now)

    # -- fetch -------------------------------------------------------------------

    def fetch_wait_s(self, tenant: str, limit: float | None, now: float) -> float:
        """Seconds a fetch must wait before it is forwarded (0: forward now)."""
        budget = self._budget(self._fetch, tenant, limit, now)
        if budget is None:
            return 0.0
        return budget.seconds_until(min(MIN_FETCH_CAP_BYTES, budget.capacity), now)

    def fetch_admission(self, tenant: str, limit: float | None, now: float) -> FetchTicket | None:
        """Reserve what a fetch forwarded now may ask for; None when the tenant is unlimited.

        Call when :meth:`fetch_wait_s` is 0; the reservation is charged at once.
        """
        budget = self._budget(self._fetch, tenant, limit, now)
        if budget is None:
            return None
        reserved = max(MIN_FETCH_CAP_BYTES, math.floor(budget.balance(now)))
        budget.charge(reserved, now)
        return FetchTicket(tenant, reserved)

    def settle_fetch(self, ticket: FetchTicket, nbytes: int, now: float) -> int:
        """Replace a reservation with the answer's size; the throttle in ms it carries."""
        budget = self._fetch.get(ticket.tenant)
        if budget is None:  # the limit was lifted meanwhile
            return 0
        budget.charge(nbytes - ticket.reserved, now)
        return self._throttle_ms(budget, now)

    # -- budgets -----------------------------------------------------------------

    def _budget(
        self, budgets: dict[str, ByteBudget], tenant: str, limit: float | None, now: float
    ) -> ByteBudget | None:
        if limit is None:
            budgets.pop(tenant, None)
            return None
        if not limit > 0:
            raise ValueError(f"tenant {tenant!r} has a non-positive byte-rate limit {limit}")
        return tenant_budget(budgets, tenant, limit, limit * self._config.window_s, now)

    def _charge(
        self,
        budgets: dict[str, ByteBudget],
        tenant: str,
        nbytes: int,
        limit: float | None,
        now: float,
    ) -> int:
        if nbytes < 0:
            raise ValueError(f"cannot charge a negative byte count {nbytes}")
        budget = self._budget(budgets, tenant, limit, now)
        if budget is None:
            return 0
        budget.charge(nbytes, now)
        return self._throttle_ms(budget, now)

    def _throttle_ms(self, budget: ByteBudget, now: float) -> int:
        owed_ms = math.ceil(budget.seconds_until(0.0, now) * 1000)
        return min(owed_ms, self._config.max_throttle_ms)
