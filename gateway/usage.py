"""What each tenant has used through this gateway since it started: pure counters.

Both doors (Kafka and HTTP) record here: bytes in (produce requests as they
arrive), bytes out (fetch responses as they leave), requests, and the
throttle time they earned; and the time the gateway spent handling the
tenant's requests (:mod:`shoal.gateway.request_quota`) with the throttle
that earned. The HTTP usage route reads it for the caller's
tenant, and the Prometheus exposition reads it for all of them, so the two
never disagree. Counters only grow (Prometheus counters' contract); a
gateway restart starts them again from zero, which rate() handles.

Like the quota manager it is called from the event loop only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(slots=True)
class TenantUsage:
    bytes_in: int = 0
    bytes_out: int = 0
    produce_requests: int = 0
    fetch_requests: int = 0
    throttle_ms: int = 0
    """Throttle earned by the byte-rate quotas."""
    request_seconds: float = 0.0
    """Gateway time spent handling the tenant's requests, as the request quota charges it."""
    request_throttle_ms: int = 0
    """Throttle earned by the request quota (``request_percentage``)."""


class UsageLedger:
    def __init__(self) -> None:
        self._tenants: dict[str, TenantUsage] = {}

    def _usage(self, tenant: str) -> TenantUsage:
        usage = self._tenants.get(tenant)
        if usage is None:
            usage = self._tenants[tenant] = TenantUsage()
        return usage

    def produced(self, tenant: str, nbytes: int, throttle_ms: int) -> None:
        usage = self._usage(tenant)
        usage.bytes_in += nbytes
        usage.produce_requests += 1
        usage.throttle_ms += throttle_ms

    def fetched(self, tenant: str, nbytes: int, throttle_ms: int) -> None:
        usage = self._usage(tenant)
        usage.bytes_out += nbytes
        usage.fetch_requests += 1
        usage.throttle_ms += throttle_ms

    def handled(self, tenant: str, seconds: float, throttle_ms: int) -> None:
        usage = self._usage(tenant)
        usage.request_seconds += seconds
        usage.request_throttle_ms += throttle_ms

    def of(self, tenant: str) -> TenantUsage:
        """A copy of the tenant's counters (zeros for a tenant never seen)."""
        usage = self._tenants.get(tenant)
        return TenantUsage() if usage is None else replace(usage)

    def all(self) -> dict[str, TenantUsage]:
        return {tenant: self.of(tenant) for tenant in self._tenants}
