"""Splitting a tenant's quota between gateway replicas, where its traffic is. Pure logic.

A tenant's byte rates are for the whole service, but each gateway replica
enforces its budget alone (:mod:`shoal.gateway.quotas`). So every second each
replica reports, per tenant and direction, the bytes it let through in the
last second and whether any of them had to wait (it wanted more than its
share): :class:`TrafficLedger`. The reports travel through etcd with the
replicas' membership (:mod:`shoal.gateway.membership`), and from the same
reports every replica computes the same split (:func:`split_quota`), taking
its own part:

* a replica whose requests did not wait gets what it used plus a quarter
  (:data:`HEADROOM`), and at least :data:`FLOOR` of an even share: it needs no
  more, the headroom lets it grow, and when it grows past its share its
  requests wait and it becomes one of the next kind;
* what is left is split evenly between the replicas whose requests waited;
* when none waited, what lies above the floors is split in proportion to
  those amounts, so every replica has room to grow.

A tenant whose clients all use one of two replicas so gets 97.5% of its quota
there within a second or two, where an even split gave it half.

Error bound: the parts sum to the quota when the replicas computed them from
the same reports. Reports are read by each replica at its own moment, so for
up to one round (a second) a replica may hold a part computed from reports a
second older than another's: the sum is then off by at most what changed in
that second. Each replica's bucket also lets a quiet tenant burst one window
of its part, so over any span T a tenant gets at most ``quota * T`` plus two
windows plus one round's change, however its connections are spread.

The controller mutation quota (``controller_mutation_rate``,
:mod:`shoal.gateway.mutation_quota`) is split the same way as a third
"direction": partitions mutated a second, and whether a topic was refused or
a request throttled. Its buckets burst 11 seconds of their part (Kafka's), so
the bound there is ``quota * T`` plus 11 seconds of the quota plus one
round's change, plus, per replica, the one topic that may overdraw a bucket.

The connection creation rate (``max_connection_rate``,
:mod:`shoal.gateway.connection_rate`) is a fourth direction, "logins": logins
let through a second, and whether one was held. Each replica's bucket bursts
one second of its part, and at least one login, so over any span T a tenant
opens at most ``rate * T`` plus one second of the rate, plus one login per
replica (the minimum burst), plus one round's change. A replica the tenant
has not used yet holds only the floor of an even share until its held logins
are reported, a round later.

The request quota (``request_percentage``, :mod:`shoal.gateway.request_quota`)
is a fifth direction, "requests": the percentage of a thread's time the
tenant's requests took here in the last second, and whether an answer was
throttled or a connection held. Each replica's bucket bursts one window of
its part, so over any span T a tenant's requests take at most
``percentage / 100 * T`` seconds of handling time plus, per replica, two
windows of its part (burst and held-back debt) and the requests in flight
when it went over, plus one round's change.

Cost: one etcd put and one range read per replica per second, of a size
proportional to the tenants with quotas and traffic there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

Direction = Literal["produce", "fetch", "mutations", "logins", "requests"]
"""Bytes produced, bytes fetched, partitions created or deleted (controller mutations),
Kafka connections opened (logins), and request-handling time in percent of a thread
(requests)."""
DIRECTIONS: Final[tuple[Direction, ...]] = ("produce", "fetch", "mutations", "logins", "requests")

ROUND_S: Final = 1.0
"""How often the replicas exchange reports: how fast a tenant's parts follow its traffic."""

HEADROOM: Final = 1.25
"""A replica that did not wait gets its last second's rate times this."""
FLOOR: Final = 0.05
"""...and at least this fraction of an even share, so a first request there is not starved."""


@dataclass(frozen=True, slots=True)
class Load:
    """One replica's traffic for one tenant and direction over the last report."""

    rate: float
    """Bytes (for mutations: partitions; for requests: percent of a thread) per second let
    through."""
    waited: bool
    """Whether any request had to wait (or, over HTTP, was told to come back)."""


def split_quota(
    quota: float, members: Collection[str], loads: Mapping[str, Load]
) -> dict[str, float]:
    """Each member's part of ``quota``; the parts sum to ``quota``, none is under the floor.

    ``loads`` holds the members' last reports for one tenant and direction; a
    member without one used nothing and did not wait. Reports of non-members
    (gateways that went away) are ignored.
    """
    if not members:
        return {}
    floor = FLOOR * quota / len(members)
    waiting = [m for m in members if m in loads and loads[m].waited]
    wants = {
        m: max(floor, HEADROOM * loads[m].rate if m in loads else 0.0)
        for m in members
        if m not in waiting
    }
    if not waiting:
        return _above_floor(wants, quota, floor, exactly=True)
    calm = _above_floor(wants, quota - len(waiting) * floor, floor, exactly=False)
    rest = (quota - sum(calm.values())) / len(waiting)
    return {**calm, **dict.fromkeys(waiting, rest)}


def _above_floor(
    wants: Mapping[str, float], budget: float, floor: float, exactly: bool
) -> dict[str, float]:
    """``wants`` (each at least ``floor``) fitted to ``budget``: what lies above the
    floors is scaled, down when it does not fit, and with ``exactly`` also up to
    fill the budget (evenly when no one wants more than the floor)."""
    above = {m: w - floor for m, w in wants.items()}
    spare = budget - floor * len(wants)
    total = sum(above.values())
    if total <= 0:
        share = spare / len(wants) if exactly else 0.0
        return {m: floor + share for m in wants}
    if total <= spare and not exactly:
        return dict(wants)
    return {m: floor + spare * a / total for m, a in above.items()}


class TrafficLedger:
    """Bytes let through, and whether any request waited, per tenant and direction, since
    the last :meth:`report`; and each tenant's open Kafka connections here.

    A request still waiting when a report is made counts as waiting in it, and
    so does a tenant whose answers carried a throttle that has not run out: a
    request held, or a client told to back off, for longer than a round would
    otherwise leave rounds with neither bytes nor a wait, and the split would
    hand this replica's part to the others (leaving it the floor, at which the
    next throttle is twenty times as long) while the tenant still wants it.
    """

    __slots__ = ("_bytes", "_clock", "_throttled_until", "_waited", "_waiting", "connections")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._bytes: dict[tuple[Direction, str], float] = {}
        self._waited: set[tuple[Direction, str]] = set()
        self._waiting: dict[tuple[Direction, str], int] = {}
        self._throttled_until: dict[tuple[Direction, str], float] = {}
        self.connections: dict[str, int] = {}

    def throttled(self, direction: Direction, tenant: str, seconds: float) -> None:
        """An answer of the tenant carries a throttle of ``seconds``: until it runs out, the
        tenant wants more than its part here, and every report says it waited."""
        key = (direction, tenant)
        self._waited.add(key)
        until = self._clock() + seconds
        if until > self._throttled_until.get(key, 0.0):
            self._throttled_until[key] = until

    def waiting(self, direction: Direction, tenant: str) -> None:
        """A request of the tenant has started to wait, until :meth:`stopped_waiting`."""
        key = (direction, tenant)
        self._waiting[key] = self._waiting.get(key, 0) + 1
        self._waited.add(key)

    def stopped_waiting(self, direction: Direction, tenant: str) -> None:
        """A request that :meth:`waiting` announced is no longer waiting (let through or gone)."""
        key = (direction, tenant)
        left = self._waiting.get(key, 0) - 1
        if left > 0:
            self._waiting[key] = left
        else:
            self._waiting.pop(key, None)

    def connected(self, tenant: str) -> None:
        self.connections[tenant] = self.connections.get(tenant, 0) + 1

    def disconnected(self, tenant: str) -> None:
        left = self.connections.get(tenant, 0) - 1
        if left > 0:
            self.connections[tenant] = left
        else:
            self.connections.pop(tenant, None)

    def admitted(self, direction: Direction, tenant: str, nbytes: float, waited: bool) -> None:
        key = (direction, tenant)
        self._bytes[key] = self._bytes.get(key, 0) + nbytes
        if waited:
            self._waited.add(key)

    def report(self, period_s: float) -> bytes:
        """The traffic since the last report, as JSON for etcd; starts the next period."""
        document: dict[str, Any] = {d: {} for d in DIRECTIONS}
        for (direction, tenant), nbytes in self._bytes.items():
            document[direction][tenant] = [nbytes / period_s, (direction, tenant) in self._waited]
        for direction, tenant in self._waited - self._bytes.keys():
            document[direction][tenant] = [0.0, True]
        document["connections"] = self.connections
        self._bytes.clear()
        now = self._clock()
        self._throttled_until = {k: t for k, t in self._throttled_until.items() if t > now}
        self._waited = set(self._waiting) | self._throttled_until.keys()
        return json.dumps(document, separators=(",", ":")).encode()


def parse_report(raw: bytes) -> dict[Direction, dict[str, Load]]:
    """A replica's traffic; an empty or unreadable report (an older gateway's) has none."""
    document = _document(raw)
    return {
        d: {tenant: Load(float(v[0]), bool(v[1])) for tenant, v in document.get(d, {}).items()}
        for d in DIRECTIONS
    }


def parse_connections(raw: bytes) -> dict[str, int]:
    """A replica's open connections per tenant, from its report."""
    return {t: int(n) for t, n in _document(raw).get("connections", {}).items()}


def _document(raw: bytes) -> dict[str, Any]:
    try:
        document = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


class QuotaShares:
    """This replica's part of each tenant's quotas, from the latest round of reports."""

    def __init__(self, gateway_id: str) -> None:
        self.gateway_id = gateway_id
        self._members: tuple[str, ...] = (gateway_id,)
        self._loads: dict[Direction, dict[str, dict[str, Load]]] = {d: {} for d in DIRECTIONS}
        self._parts: dict[tuple[Direction, str, float], float] = {}
        self._connections_elsewhere: dict[str, int] = {}

    def update(self, reports: Mapping[str, bytes]) -> None:
        """Take a new round: every live replica's report, by gateway id (this one's included)."""
        self._members = tuple(sorted(reports)) or (self.gateway_id,)
        loads: dict[Direction, dict[str, dict[str, Load]]] = {d: {} for d in DIRECTIONS}
        for member, raw in reports.items():
            for direction, tenants in parse_report(raw).items():
                for tenant, load in tenants.items():
                    loads[direction].setdefault(tenant, {})[member] = load
        self._loads = loads
        self._parts.clear()
        elsewhere: dict[str, int] = {}
        for member, raw in reports.items():
            if member != self.gateway_id:
                for tenant, count in parse_connections(raw).items():
                    elsewhere[tenant] = elsewhere.get(tenant, 0) + count
        self._connections_elsewhere = elsewhere

    def connections_elsewhere(self, tenant: str) -> int:
        """The tenant's open connections on the other replicas, as of the last round."""
        return self._connections_elsewhere.get(tenant, 0)

    @property
    def count(self) -> int:
        return len(self._members)

    def share(self, direction: Direction, tenant: str, quota: float | None) -> float | None:
        """This replica's part of ``quota`` (None: unlimited)."""
        if quota is None:
            return None
        key = (direction, tenant, quota)
        part = self._parts.get(key)
        if part is None:
            members = (
                self._members
                if self.gateway_id in self._members
                else (*self._members, self.gateway_id)
            )
            loads = self._loads[direction].get(tenant, {})
            part = split_quota(quota, members, loads)[self.gateway_id]
            self._parts[key] = part
        return part
