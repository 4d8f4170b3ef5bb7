"""Per-tenant controller mutation quotas (Kafka's KIP-599 ``controller_mutation_rate``). Pure logic.

A tenant's ``controller_mutation_rate`` is how many partitions a second its
CreateTopics, CreatePartitions and DeleteTopics may create or delete: a new
topic costs its partitions, CreatePartitions the partitions it adds,
DeleteTopics the partitions of the topic it deletes. One storm of topic
creations by one tenant cannot then swamp the brokers' controller for all.

**The budget** is Kafka's token bucket: filled at the rate up to a burst of
``rate * burst_s`` (Kafka's ``controller.quota.window.num`` samples times
``controller.quota.window.size.seconds``, 11 x 1 s by default), starting full.
Charges may take it below zero; that debt is paid back at the rate.

**Strict** (the API versions that know THROTTLING_QUOTA_EXCEEDED: CreateTopics
v6+, CreatePartitions v3+, DeleteTopics v5+): the topics of a request are taken
in order; one is accepted whenever the bucket is not below zero, even if its
cost overdraws it, and refused while the bucket is below zero. A refused topic
gets THROTTLING_QUOTA_EXCEEDED, and the answer's ``throttle_time_ms`` is the
time until the bucket is back at zero. An answer with nothing refused carries
no throttle, even if it overdrew (Kafka's StrictControllerMutationQuota).

**Permissive** (older versions, whose clients would not understand the
error): every topic is accepted and charged; if that leaves the bucket below
zero the answer carries the time until it is back at zero, and the gateway
mutes the connection that long (Kafka's PermissiveControllerMutationQuota).

A topic that costs nothing (one the brokers will refuse anyway: it exists
already, or the partition count does not grow) is always let through, so
the client gets the brokers' error rather than a throttle, as in Kafka, where
those checks come before the quota's.

Unlike Kafka, the reported throttle is capped at ``max_throttle_ms`` (30 s,
the clients' default request timeout), as for byte quotas: the debt stays and
the next request is refused for the rest.

Times are seconds from a monotonic clock, passed in by the caller; nothing
here is thread-safe (the gateway's event loop calls it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from shoal.gateway.quotas import DEFAULT_MAX_THROTTLE_MS, ByteBudget, tenant_budget

DEFAULT_BURST_S: Final = 11.0
"""Kafka's default burst: ``controller.quota.window.num`` (11) samples of
``controller.quota.window.size.seconds`` (1)."""

NO_REFUSALS: Final[frozenset[int]] = frozenset()


@dataclass(frozen=True, slots=True)
class MutationVerdict:
    """What the quota made of one request's topics."""

    refused: frozenset[int] = NO_REFUSALS
    """Indexes (into the costs given) of the topics refused with THROTTLING_QUOTA_EXCEEDED."""
    throttle_ms: int = 0
    """The answer's ``throttle_time_ms`` and how long the connection is muted."""
    charged: int = 0
    """Partitions charged (the accepted topics' costs)."""


UNLIMITED: Final = MutationVerdict()


class MutationQuotas:
    """One token bucket per tenant with a ``controller_mutation_rate``.

    Invariant: a tenant has a bucket only while it has a limit; a call with
    ``limit=None`` drops it (and forgets its debt).
    """

    __slots__ = ("_buckets", "burst_s", "max_throttle_ms")

    def __init__(
        self, burst_s: float = DEFAULT_BURST_S, max_throttle_ms: int = DEFAULT_MAX_THROTTLE_MS
    ) -> None:
        if not burst_s > 0:
            raise ValueError(f"mutation burst must be positive, got {burst_s}")
        self.burst_s = burst_s
        self.max_throttle_ms = max_throttle_ms
        self._buckets: dict[str, ByteBudget] = {}

    def charge(
        self,
        tenant: str,
        costs: Sequence[int],
        limit: float | None,
        strict: bool,
        now: float,
    ) -> MutationVerdict:
        """Charge one request's topics (their partition counts, in request order)."""
        bucket = self._bucket(tenant, limit, now)
        if bucket is None:
            return UNLIMITED
        refused: set[int] = set()
        charged = 0
        for index, cost in enumerate(costs):
            if cost <= 0:
                continue
            if strict and bucket.balance(now) < 0:
                refused.add(index)
                continue
            bucket.charge(cost, now)
            charged += cost
        throttle_ms = 0
        if refused or not strict:
            throttle_ms = min(
                math.ceil(bucket.seconds_until(0.0, now) * 1000), self.max_throttle_ms
            )
        return MutationVerdict(frozenset(refused), throttle_ms, charged)

    def balance(self, tenant: str, now: float) -> float | None:
        """The tenant's tokens now (None: no bucket)."""
        bucket = self._buckets.get(tenant)
        return None if bucket is None else bucket.balance(now)

    def _bucket(self, tenant: str, limit: float | None, now: float) -> ByteBudget | None:
        if limit is None:
            self._buckets.pop(tenant, None)
            return None
        if not limit > 0:
            raise ValueError(f"tenant {tenant!r} has a non-positive mutation rate {limit}")
        return tenant_budget(self._buckets, tenant, limit, limit * self.burst_s, now)
