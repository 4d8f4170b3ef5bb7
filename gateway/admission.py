"""Holding a tenant's requests until its quota lets them through, first come first served.

:mod:`shoal.gateway.quotas` says how long a request must wait; this module
waits. Requests of one tenant and direction queue behind one lock, so they
are let through in the order they arrived whichever connection they came on,
and each sees the charge of the one before it. Other tenants never queue here
behind this one.

While a request waits, its connection is not read: a tenant's clients are held
back by TCP, and the gateway holds at most one request per connection. The
HTTP door does not wait (:meth:`Admission.try_produce`, :meth:`Admission.try_fetch`):
it tells the client when to come back.

The request quota (:mod:`shoal.gateway.request_quota`) is charged after a
request has run, not before: :func:`charge_request` charges its time and
gives its answer's throttle; :meth:`Admission.request_turn` holds a
connection's next read while the tenant owes more than one window (no queue:
a held connection is let go as soon as the debt allows).

Every request let through, whether it waited and the throttle its answer
carried go to the traffic ledger that splits the tenant's quota between
gateway replicas (:mod:`shoal.gateway.quota_shares`). Callers pass the
tenant's quotas for the whole service; this replica's part is taken at every
check, so a request waiting through a round is let go at the new split, not
held to the part it arrived under (which may be the floor an idle replica
gets: a twentieth of an even share).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from shoal.gateway.connection_rate import ConnectionRates, LoginVerdict
from shoal.gateway.mutation_quota import MutationQuotas, MutationVerdict
from shoal.gateway.quota_shares import ROUND_S, Direction, QuotaShares, TrafficLedger
from shoal.gateway.quotas import FetchTicket, QuotaManager
from shoal.gateway.request_quota import RequestQuotas

if TYPE_CHECKING:
    from shoal.gateway.access import TenantAccess
    from shoal.gateway.apis.base import MutationCharger
    from shoal.gateway.server import GatewayServices


class QuotaWaitError(Exception):
    """A request that may not go yet, and how long until it may (the HTTP door's 429)."""

    def __init__(self, wait_s: float, quota: str = "byte-rate quota") -> None:
        super().__init__(f"over the {quota} for {wait_s:.3f} s")
        self.wait_s = wait_s
        self.quota = quota


class Admission:
    """Waits out a tenant's quota before its produce and fetch requests are forwarded.

    Every ``quota`` argument is the tenant's limit for the whole service (None:
    unlimited); ``shares`` gives this replica's part of it (all of it without
    other replicas).
    """

    def __init__(
        self,
        quotas: QuotaManager,
        traffic: TrafficLedger,
        clock: Callable[[], float] = time.monotonic,
        mutations: MutationQuotas | None = None,
        logins: ConnectionRates | None = None,
        requests: RequestQuotas | None = None,
        shares: QuotaShares | None = None,
    ) -> None:
        self.quotas = quotas
        self.traffic = traffic
        self.shares = shares if shares is not None else QuotaShares("gateway")
        self._clock = clock
        self.mutations = mutations if mutations is not None else MutationQuotas()
        self.logins = logins if logins is not None else ConnectionRates()
        self.requests = requests if requests is not None else RequestQuotas()
        self._produce_queues: dict[str, asyncio.Lock] = {}
        self._fetch_queues: dict[str, asyncio.Lock] = {}

    async def produce(self, tenant: str, nbytes: int, quota: float | None) -> int:
        """Wait until a produce of ``nbytes`` may go and charge it; its answer's throttle (ms)."""
        if quota is None:  # and a lifted limit's debt is forgotten
            return self.quotas.charge_produce(tenant, nbytes, None, self._clock())
        async with _queue(self._produce_queues, tenant):
            # A deadline, not an event: the budget refills with time. Checked again
            # after the sleep, since the HTTP door charges the same budget unqueued.
            waited = await self._wait_out(
                "produce",
                tenant,
                lambda: self.quotas.produce_wait_s(
                    tenant, nbytes, self.shares.share("produce", tenant, quota), self._clock()
                ),
            )
            throttle_ms = self.quotas.charge_produce(
                tenant, nbytes, self.shares.share("produce", tenant, quota), self._clock()
            )
            self._let_through("produce", tenant, nbytes, waited, throttle_ms)
            return throttle_ms

    async def fetch(self, tenant: str, quota: float | None) -> FetchTicket | None:
        """Wait until a fetch may go; its reservation (None when the tenant is unlimited)."""
        if quota is None:
            return self.quotas.fetch_admission(tenant, None, self._clock())
        async with _queue(self._fetch_queues, tenant):
            waited = await self._wait_out(
                "fetch",
                tenant,
                lambda: self.quotas.fetch_wait_s(
                    tenant, self.shares.share("fetch", tenant, quota), self._clock()
                ),
            )
            self.traffic.admitted("fetch", tenant, 0, waited)
            return self.quotas.fetch_admission(
                tenant, self.shares.share("fetch", tenant, quota), self._clock()
            )

    async def _wait_out(
        self, direction: Direction, tenant: str, wait_s: Callable[[], float]
    ) -> bool:
        """Sleep until ``wait_s()`` is 0; whether there was any wait. While it lasts the
        traffic ledger reports the tenant as waiting here, however many rounds that takes.
        ``wait_s`` is asked again at least every round, since a new split may shorten it."""
        wait = wait_s()
        if wait <= 0:
            return False
        self.traffic.waiting(direction, tenant)
        try:
            while wait > 0:
                await asyncio.sleep(min(wait, ROUND_S))
                wait = wait_s()
        finally:
            self.traffic.stopped_waiting(direction, tenant)
        return True

    def _let_through(
        self, direction: Direction, tenant: str, amount: float, waited: bool, throttle_ms: int
    ) -> None:
        """Tell the traffic ledger what went through, whether it waited, and its throttle."""
        self.traffic.admitted(direction, tenant, amount, waited)
        if throttle_ms > 0:
            self.traffic.throttled(direction, tenant, throttle_ms / 1000)

    def _told_to_wait(self, direction: Direction, tenant: str, wait_s: float) -> None:
        """The HTTP door refused a request for ``wait_s``: until then the tenant wants more
        than its part here, as a throttled Kafka client does."""
        self.traffic.admitted(direction, tenant, 0, waited=True)
        self.traffic.throttled(direction, tenant, wait_s)

    def try_produce(self, tenant: str, nbytes: int, quota: float | None) -> int:
        """:meth:`produce` without waiting: QuotaWaitError if it may not go now."""
        now = self._clock()
        limit = self.shares.share("produce", tenant, quota)
        if limit is None:
            return self.quotas.charge_produce(tenant, nbytes, None, now)
        wait = self.quotas.produce_wait_s(tenant, nbytes, limit, now)
        if wait > 0:
            self._told_to_wait("produce", tenant, wait)
            raise QuotaWaitError(wait)
        throttle_ms = self.quotas.charge_produce(tenant, nbytes, limit, now)
        self._let_through("produce", tenant, nbytes, False, throttle_ms)
        return throttle_ms

    def try_fetch(self, tenant: str, quota: float | None) -> FetchTicket | None:
        """:meth:`fetch` without waiting: QuotaWaitError if it may not go now."""
        now = self._clock()
        limit = self.shares.share("fetch", tenant, quota)
        if limit is None:
            return self.quotas.fetch_admission(tenant, None, now)
        wait = self.quotas.fetch_wait_s(tenant, limit, now)
        if wait > 0:
            self._told_to_wait("fetch", tenant, wait)
            raise QuotaWaitError(wait)
        return self.quotas.fetch_admission(tenant, limit, now)

    def mutate(
        self, tenant: str, costs: Sequence[int], quota: float | None, strict: bool
    ) -> MutationVerdict:
        """Charge a topic request's partition mutations (:mod:`shoal.gateway.mutation_quota`).

        Never waits: a strict request is refused topic by topic, a permissive one
        answered with a throttle the connection then waits out.
        """
        limit = self.shares.share("mutations", tenant, quota)
        verdict = self.mutations.charge(tenant, costs, limit, strict, self._clock())
        if limit is not None:
            self._let_through("mutations", tenant, verdict.charged, False, verdict.throttle_ms)
        return verdict

    def login(self, tenant: str, quota: float | None) -> LoginVerdict:
        """Charge one accepted login to the tenant's connection creation rate
        (:mod:`shoal.gateway.connection_rate`). Never waits: the session holds the
        login for the verdict's wait, or refuses it."""
        limit = self.shares.share("logins", tenant, quota)
        verdict = self.logins.admit(tenant, limit, self._clock())
        if limit is not None:
            held = verdict.wait_s > 0
            self.traffic.admitted("logins", tenant, 0 if verdict.refused else 1, waited=held)
        return verdict

    async def request_turn(self, tenant: str, quota: float | None) -> None:
        """Wait until the tenant owes no more than one window of request time
        (:mod:`shoal.gateway.request_quota`); the Kafka door calls it before it reads
        a connection's next request."""
        if quota is None:
            self.requests.wait_s(tenant, None, self._clock())  # forgets a lifted limit's debt
            return
        await self._wait_out(
            "requests",
            tenant,
            lambda: self.requests.wait_s(
                tenant, self.shares.share("requests", tenant, quota), self._clock()
            ),
        )

    def try_request(self, tenant: str, quota: float | None) -> None:
        """:meth:`request_turn` without waiting: QuotaWaitError if the tenant owes too much."""
        limit = self.shares.share("requests", tenant, quota)
        wait = self.requests.wait_s(tenant, limit, self._clock())
        if wait > 0:
            self._told_to_wait("requests", tenant, wait)
            raise QuotaWaitError(wait, "request quota (request_percentage)")

    def handled(self, tenant: str, seconds: float, quota: float | None) -> int:
        """Charge ``seconds`` of a request's handling time; the throttle (ms) its answer
        carries. Never waits: the session mutes the connection for the throttle."""
        limit = self.shares.share("requests", tenant, quota)
        throttle_ms = self.requests.charge(tenant, seconds, limit, self._clock())
        if limit is not None:
            self._let_through("requests", tenant, seconds * 100, False, throttle_ms)
        return throttle_ms

    def fetched(self, ticket: FetchTicket | None, nbytes: int) -> int:
        """Settle a fetch with its answer's size; the throttle (ms) the answer carries."""
        if ticket is None:
            return 0
        throttle_ms = self.quotas.settle_fetch(ticket, nbytes, self._clock())
        self._let_through("fetch", ticket.tenant, nbytes, False, throttle_ms)
        return throttle_ms


def _queue(queues: dict[str, asyncio.Lock], tenant: str) -> asyncio.Lock:
    lock = queues.get(tenant)
    if lock is None:
        lock = queues[tenant] = asyncio.Lock()
    return lock


def mutation_charger(services: GatewayServices, access: TenantAccess) -> MutationCharger:
    """The tenant's controller mutation quota as the rewriters charge it: this replica's
    share of ``controller_mutation_rate``; every refused topic is counted in
    ``shoal_gateway_limit_refusals_total{limit="controller_mutations"}``."""
    tenant = access.tenant

    def charge(costs: Sequence[int], strict: bool) -> MutationVerdict:
        quota = access.quotas.controller_mutation_rate
        verdict = services.admission.mutate(tenant, costs, quota, strict)
        for _ in verdict.refused:
            services.metrics.limit_refused(tenant, "controller_mutations")
        return verdict

    return charge


def charge_request(
    services: GatewayServices, access: TenantAccess, seconds: float, after_answer: bool = False
) -> int:
    """Charge ``seconds`` of the gateway's time to the tenant's request quota (this replica's
    share of ``request_percentage``) and its usage; the throttle (ms) the answer carries.
    Every throttled answer is counted in
    ``shoal_gateway_limit_refusals_total{limit="request_rate"}``. With ``after_answer``
    (time spent once the answer's throttle was decided) the time is owed, and 0 returned:
    the next answer reports the debt."""
    if after_answer and seconds <= 0:
        return 0
    tenant = access.tenant
    throttle_ms = services.admission.handled(tenant, seconds, access.quotas.request_percentage)
    if after_answer:
        throttle_ms = 0
    services.usage.handled(tenant, seconds, throttle_ms)
    if throttle_ms > 0:
        services.metrics.limit_refused(tenant, "request_rate")
    return throttle_ms
