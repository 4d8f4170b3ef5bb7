"""Holding a tenant's requests until its quota lets them through, first come first served.

:mod:`shoal.gateway.quotas` says how long a request must wait; this module
waits. Requests of one tenant and direction queue behind one lock, so they
are let through in the order they arrived whichever connection they came on,
and each sees the charge of the one before it. Other tenants never queue here
behind this one.

While a request waits, its connection is not read: a tenant's clients are held
back by TCP, and the gateway holds at most one request per connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from shoal.gateway.quotas import FetchTicket, QuotaManager


class Admission:
    """Waits out a tenant's quota before its produce and fetch requests are forwarded."""

    def __init__(self, quotas: QuotaManager, clock: Callable[[], float] = time.monotonic) -> None:
        self.quotas = quotas
        self._clock = clock
        self._produce_queues: dict[str, asyncio.Lock] = {}
        self._fetch_queues: dict[str, asyncio.Lock] = {}

    async def produce(self, tenant: str, nbytes: int, limit: float | None) -> int:
        """Wait until a produce of ``nbytes`` may go and charge it; its answer's throttle (ms)."""
        if limit is None:
            self.quotas.charge_produce(tenant, nbytes, None, self._clock())
            return 0
        async with _queue(self._produce_queues, tenant):
            # A deadline, not an event: the budget refills with time. Checked again
            # after the sleep, since the HTTP door charges the same budget unqueued.
            while (wait := self.quotas.produce_wait_s(tenant, nbytes, limit, self._clock())) > 0:  # noqa: ASYNC110
                await asyncio.sleep(wait)
            return self.quotas.charge_produce(tenant, nbytes, limit, self._clock())

    async def fetch(self, tenant: str, limit: float | None) -> FetchTicket | None:
        """Wait until a fetch may go; its reservation (None when the tenant is unlimited)."""
        if limit is None:
            return self.quotas.fetch_admission(tenant, None, self._clock())
        async with _queue(self._fetch_queues, tenant):
            while (wait := self.quotas.fetch_wait_s(tenant, limit, self._clock())) > 0:  # noqa: ASYNC110
                await asyncio.sleep(wait)
            return self.quotas.fetch_admission(tenant, limit, self._clock())

    def fetched(self, ticket: FetchTicket | None, nbytes: int) -> int:
        """Settle a fetch with its answer's size; the throttle (ms) the answer carries."""
        if ticket is None:
            return 0
        return self.quotas.settle_fetch(ticket, nbytes, self._clock())


def _queue(queues: dict[str, asyncio.Lock], tenant: str) -> asyncio.Lock:
    lock = queues.get(tenant)
    if lock is None:
        lock = queues[tenant] = asyncio.Lock()
    return lock
