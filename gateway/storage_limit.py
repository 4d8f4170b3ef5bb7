"""A tenant's storage limit (``max_storage_bytes``): no more produce once its data is that large.

What counts is what the tenant's data takes once: the sum over its partitions
of the leader replica's size (:func:`shoal.gateway.storage.tenant_storage`'s
``leader_bytes``), so a topic's replication factor neither helps nor hurts.
The brokers know sizes, not tenants, and asking them costs a DescribeLogDirs
to every broker; so the limit is checked against the latest survey, not
against the bytes on disk this instant. While any tenant has the limit,
:meth:`StorageLimits.run` takes the gateway's shared survey
(:class:`~shoal.gateway.storage.StorageSurveyor`, the one the usage route
reads too) every ``period_s`` and keeps each limited tenant's stored bytes.

A tenant at or over its limit has every Produce partition answered with
POLICY_VIOLATION and a message naming its limit and the ways out; nothing is
written. Both doors share the check, because the HTTP door produces through
the same rewriter (:mod:`shoal.gateway.tenant_client`).

Accuracy: a tenant may go on writing until the next survey sees it over, so it
can overshoot its limit by what it produces in one period (plus the time one
survey takes); and it may produce again one period after deleting records or
topics. A survey some broker did not answer would under-count, so it is not
used: the tenant's last complete figure stands until a complete one comes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from shoal.gateway.storage import DEFAULT_TTL_S, StorageSurveyor, Survey
from shoal.gateway.upstream import UpstreamError
from shoal.tenancy.model import Tenant

if TYPE_CHECKING:
    from shoal.gateway.access import TenantAccess
    from shoal.gateway.server import GatewayServices

log = logging.getLogger(__name__)

LIMIT_NAME: Final = "maxStorageBytes"
"""The limit as a Tenant resource names it: what the tenant's platform team set."""
METRIC_LIMIT: Final = "storage"
"""``shoal_gateway_limit_refusals_total{limit="storage"}``: refused Produce requests."""
_UNITS: Final = ("B", "KB", "MB", "GB", "TB", "PB")

StorageCheck = Callable[[], "str | None"]
"""Whether the tenant may produce now: None, or the refusal's message."""


def human_bytes(count: int) -> str:
    """``count`` in decimal units with at most one decimal (``10.2 MB``, ``200 KB``):
    a person reads the message, and ``10234567 bytes`` is hard to compare at a glance."""
    value = float(count)
    unit = 0
    while value >= 1000 and unit < len(_UNITS) - 1:
        value /= 1000
        unit += 1
    text = f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{text} {_UNITS[unit]}"


def storage_refusal(tenant: str, stored: int | None, limit: int | None) -> str | None:
    """The refusal's message when ``stored`` bytes have reached ``limit``, else None.

    Unknown usage (no survey yet) and no limit let the produce through: a limit
    only bites once a survey has seen the tenant at it.
    """
    if limit is None or stored is None or stored < limit:
        return None
    return (
        f"tenant {tenant} stores {human_bytes(stored)}, its limit ({LIMIT_NAME}) is"
        f" {human_bytes(limit)}: delete records or topics, shorten retention,"
        " or ask for a higher limit"
    )


def limited_usage(survey: Survey, limits: Mapping[str, int]) -> dict[str, int]:
    """Each limited tenant's stored bytes in ``survey``: what
    :func:`~shoal.gateway.storage.tenant_storage` calls ``leader_bytes``, for every
    limited tenant in one pass over the survey rather than one pass per tenant."""
    stored = dict.fromkeys(limits, 0)
    for node, sizes in survey.sizes.items():
        for (topic, partition), size in sizes.items():
            # Tenant names never contain a dot: the first one ends the tenant part.
            tenant, dot, name = topic.partition(".")
            if dot and name and tenant in stored and survey.leaders.get((topic, partition)) == node:
                stored[tenant] += size
    return stored


class StorageLimits:
    """Every limited tenant's stored bytes as of the latest complete survey.

    Only :meth:`run` writes :attr:`stored`; requests read it, on the same loop.
    """

    def __init__(
        self,
        surveyor: StorageSurveyor,
        tenants: Callable[[], Mapping[str, Tenant]],
        period_s: float = DEFAULT_TTL_S,
    ) -> None:
        self._surveyor = surveyor
        self._tenants = tenants
        self.period_s = period_s
        self.stored: dict[str, int] = {}

    def limits(self) -> dict[str, int]:
        """The tenants with a storage limit, and their limits, as the gateway last read them."""
        return {
            name: tenant.quotas.max_storage_bytes
            for name, tenant in self._tenants().items()
            if tenant.quotas.max_storage_bytes is not None
        }

    def refusal(self, tenant: str, limit: int | None) -> str | None:
        """Why ``tenant`` may not produce now (see :func:`storage_refusal`), or None."""
        return storage_refusal(tenant, self.stored.get(tenant), limit)

    def apply(self, survey: Survey, limits: Mapping[str, int]) -> None:
        """Take a survey's figures for the limited tenants; an incomplete survey keeps the
        last figures (a broker that did not answer would hide its leaders' bytes)."""
        if not survey.complete:
            log.warning("event=storage_limit_survey_incomplete brokers=%d", len(survey.sizes))
            self.stored = {t: b for t, b in self.stored.items() if t in limits}
            return
        self.stored = limited_usage(survey, limits)

    async def refresh(self) -> None:
        """One round: survey (shared, so at most one per period) if any tenant is limited."""
        limits = self.limits()
        if not limits:
            self.stored = {}
            return
        try:
            survey = await self._surveyor.survey()
        except (UpstreamError, OSError) as exc:
            log.warning("event=storage_limit_survey_failed error=%s", exc)
            return
        self.apply(survey, limits)

    async def run(self) -> None:
        """Refresh every period until cancelled."""
        while True:
            await self.refresh()
            await asyncio.sleep(self.period_s)


def storage_check(services: GatewayServices, access: TenantAccess) -> StorageCheck:
    """The Produce rewriter's storage check for one request of ``access``'s tenant;
    each refusal is counted in ``shoal_gateway_limit_refusals_total{limit="storage"}``."""

    def check() -> str | None:
        message = services.storage_limits.refusal(access.tenant, access.quotas.max_storage_bytes)
        if message is not None:
            services.metrics.limit_refused(access.tenant, METRIC_LIMIT)
        return message

    return check
