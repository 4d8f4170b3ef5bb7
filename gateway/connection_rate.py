"""Per-tenant connection creation rate (Kafka's KIP-612 ``connection_creation_rate``). Pure logic.

A tenant's ``max_connection_rate`` is how many Kafka connections a second it
may open (logins, counted when their credentials have been accepted), so that
one tenant's reconnect storm (a crash-looping deployment of a hundred pods)
does not take the gateway's CPU, spent on TLS handshakes and password hashes,
from everyone else. Kafka applies the quota per broker and per client IP;
here it is the tenant's, over every gateway replica (its share, as for byte
rates: :mod:`shoal.gateway.quota_shares`).

**The budget** is a token bucket of logins: filled at the rate up to a burst
of one second's worth (at least one login), starting full. Each login takes
one token, and may take the bucket below zero.

**Holding, not failing** (as Kafka throttles a connection-rate quota: it
delays the connection rather than refusing it): a login that finds no whole
token is charged anyway and held until the bucket is back at zero, so
simultaneous logins are served one after another at the rate, in the order
they came, whatever connection they came on. A login whose hold would be
longer than ``max_wait_s`` (10 s) is refused instead and not charged: a storm
past that depth is told to come back later rather than queued without end.

Times are seconds from a monotonic clock, passed in by the caller; nothing
here is thread-safe (the gateway's event loop calls it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from shoal.gateway.quotas import ByteBudget, tenant_budget

DEFAULT_MAX_WAIT_S: Final = 10.0
"""The longest a login is held; past it, it is refused."""
LIMIT_NAME: Final = "maxConnectionRate"
"""The limit as a Tenant resource names it, for messages."""


@dataclass(frozen=True, slots=True)
class LoginVerdict:
    """What the bucket made of one login."""

    wait_s: float = 0.0
    """How long to hold the login's answer (0: at once)."""
    refused: bool = False
    """The hold would have been longer than the longest allowed: refuse the login."""


AT_ONCE: Final = LoginVerdict()


def burst(rate: float) -> float:
    """One second's worth of logins, and at least one, so a slow rate still admits one."""
    return max(1.0, rate)


class ConnectionRates:
    """One bucket of logins per tenant with a ``max_connection_rate``.

    Invariant: a tenant has a bucket only while it has a limit; a call with
    ``rate=None`` drops it (and forgets its debt).
    """

    __slots__ = ("_buckets", "max_wait_s")

    def __init__(self, max_wait_s: float = DEFAULT_MAX_WAIT_S) -> None:
        self.max_wait_s = max_wait_s
        self._buckets: dict[str, ByteBudget] = {}

    def admit(self, tenant: str, rate: float | None, now: float) -> LoginVerdict:
        """Charge one login of ``tenant`` at ``rate`` logins a second (None: unlimited)."""
        if rate is None:
            self._buckets.pop(tenant, None)
            return AT_ONCE
        bucket = tenant_budget(self._buckets, tenant, rate, burst(rate), now)
        # The login may go once the bucket, less this login's token, is back at zero.
        wait_s = bucket.seconds_until(1.0, now)
        if wait_s > self.max_wait_s:
            return LoginVerdict(wait_s, refused=True)
        bucket.charge(1.0, now)
        return LoginVerdict(wait_s)


def refusal_message(tenant: str, rate: float) -> str:
    """Why a login was refused, in the tenant's terms, and what to do."""
    return (
        f"tenant {tenant} opens connections faster than its limit ({LIMIT_NAME})"
        f" of {rate:g}/s; retry later"
    )
