"""Per-tenant byte-rate quotas measured as Kafka does: pure logic, no I/O, no clock.

The gateway measures the bytes each tenant produces and fetches, and answers an
over-quota request with a throttle time, as a Kafka broker does (KIP-13, and
KIP-219 for how the throttle is applied). The rate is Kafka's; the throttle and
the shortest measuring span are not (see *Why not Kafka's throttle*):

* **Measuring** (``org.apache.kafka.common.metrics.stats.Rate`` over a
  ``SampledStat``): bytes are summed into ``samples`` windows of ``window_s``
  each (Kafka's ``quota.window.num`` = 11 and ``quota.window.size.seconds`` = 1).
  A window starts at the first record after the previous one completed, not on
  a clock boundary. A window whose last record is ``samples * window_s`` old no
  longer counts. The rate is the bytes of the live windows divided by the time
  from the oldest live window's start to now; while that time is under one
  window, one empty window is added (:data:`MIN_FULL_WINDOWS`, where Kafka's
  ``Rate.windowSize`` pads to ``samples - 1``), so a first burst is not
  measured as a huge rate over a few ms.
* **Throttling**: bytes are recorded first; the throttle is then the time until
  the rate, measured by the same rules, is back at the bound if nothing more
  arrives, counting the windows that expire on the way
  (:meth:`SampledRate.delay_until`, rounded up to a twentieth of a window). At
  or under the bound it is 0. The request is never refused: its bytes are
  counted, and the client is told to wait (``throttle_time_ms``) while the
  gateway stops reading from its connection for that long.
* **Capping** (our choice, see :data:`DEFAULT_MAX_THROTTLE_MS`): at most 30 s,
  the clients' default ``request.timeout.ms``.
* **Fetch size** (``ClientQuotaManager.getMaxValueInQuotaWindow``): the gateway
  asks the broker for no more than :meth:`QuotaManager.fetch_cap` bytes, one
  window's worth of the limit, so one fetch response cannot overshoot a consume
  quota by much.

Why not Kafka's throttle: ``QuotaUtils.throttleTime`` is ``X = (O - T) / T * W``,
the delay that would spread the observed rate O over window W back to the bound
T if every measured byte stayed. But windows expire during the wait, so X is
not the time back to the bound, and a client that waits out every throttle runs
about 10% over its quota, up to 36% over 20 s spans with 1 MB requests. With
the exact time it gets the bound to within about 1% over every 20 s span (from
one send to the first send 20 s later), for requests of 16 KiB to 1 MiB.
Kafka's minimum span of ``samples - 1`` windows also lets a new or newly quiet
tenant send ten windows' worth at once; with one window it bursts about one
window's worth, then gets the bound.

Limits are per gateway. A tenant's quota in the tenancy store is for the
whole service; the caller passes each call the share for this gateway replica
(the tenant's quota divided by the number of gateway replicas), as a Kafka
quota is enforced per broker. This module never sees the tenant-wide number.

Tenants, and each tenant's produce and fetch directions, are measured
independently: recording for one never changes another's throttle. An
unlimited direction (``limit=None``) keeps no state at all, so the common case
costs nothing. A tenant's state stays until :meth:`QuotaManager.forget`.

Times are seconds from a monotonic clock (``time.monotonic()``), passed in by
the caller, so tests drive time by hand. Nothing here is thread-safe; the
gateway calls it from its event loop only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, NamedTuple

DEFAULT_SAMPLES: Final = 11
"""Kafka's ``quota.window.num``: windows kept for measuring a rate."""

DEFAULT_WINDOW_S: Final = 1.0
"""Kafka's ``quota.window.size.seconds``: the length of one window."""

DEFAULT_MAX_THROTTLE_MS: Final = 30_000
"""The longest throttle one request can earn.

Kafka leaves byte-rate throttles uncapped; it caps only the request-time and
connection-rate quotas' throttles, at one ``quota.window.size``
(``ClientRequestQuotaManager``, ``ConnectionQuotas``). We cap byte-rate
throttles at 30 s, the default ``request.timeout.ms`` of the Java producer and
consumer and of librdkafka's producer. The gateway stops reading from a
throttled connection for the throttle time, so a client that sends anyway (one
older than KIP-219, or one that ignores ``throttle_time_ms``) waits that long
for its answer; past its request timeout it gives up, reconnects and sends the
same bytes again, which then count twice.

A throttle never outlasts ``samples * window_s`` (11 s by default) anyway: by
then every window has expired and the rate is 0. So the cap binds only when
``samples * window_s`` is set above it, and one request bigger than about
``min(max_throttle_s, samples * window_s) * limit`` bytes (11 s of quota by
default) gets through faster than the quota. Fetches are bounded by
:meth:`QuotaManager.fetch_cap` (one window's worth) and produce batches by the
broker's ``message.max.bytes`` (about 1 MB, 11 s of a 95 KB/s quota).
"""

MIN_FULL_WINDOWS: Final = 1
"""A rate is never measured over less than one window (Kafka: ``samples - 1``)."""

MIN_FETCH_CAP_BYTES: Final = 1024
"""The smallest fetch size :meth:`QuotaManager.fetch_cap` asks for, however small the quota."""


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """How rates are measured and throttles bounded; Kafka's quota settings and defaults.

    ``samples`` must be at least 2 (Kafka allows 1, which makes its minimum span
    of ``samples - 1`` windows zero).
    """

    samples: int = DEFAULT_SAMPLES
    window_s: float = DEFAULT_WINDOW_S
    max_throttle_ms: int = DEFAULT_MAX_THROTTLE_MS

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValueError(f"quota samples must be at least 2, got {self.samples}")
        if not self.window_s > 0:
            raise ValueError(f"quota window must be positive, got {self.window_s}")
        if self.max_throttle_ms < 0:
            raise ValueError(f"max throttle must not be negative, got {self.max_throttle_ms}")


class Measurement(NamedTuple):
    """A rate and the span it was measured over (Kafka's ``Rate.measure``, ``Rate.windowSize``)."""

    rate: float
    """Bytes per second."""
    window_s: float
    """Seconds the rate was measured over (Kafka's ``Rate.windowSize``)."""


@dataclass(slots=True)
class _Sample:
    """The bytes recorded in one window, which started at ``start``."""

    start: float
    last_event: float
    value: float = 0.0

    def reset(self, now: float) -> None:
        self.start = now
        self.last_event = now
        self.value = 0.0


class SampledRate:
    """A rate in bytes per second over the last ``samples`` windows: Kafka's ``Rate``.

    Invariants: at most ``samples + 1`` windows are held, in a ring; the
    current one is written until it is ``window_s`` old, then the next one is
    reset and takes over. Kafka keeps the one extra window so that a window
    still overlapping the measured span is not recycled while it counts.
    A window is emptied (and restarted at ``now``) when measuring finds its
    last record ``samples * window_s`` or more in the past.
    """

    __slots__ = ("_config", "_current", "_samples")

    def __init__(self, config: QuotaConfig | None = None) -> None:
        self._config = config if config is not None else QuotaConfig()
        self._samples: list[_Sample] = []
        self._current = 0

    def record(self, value: float, now: float) -> None:
        """Add ``value`` bytes at time ``now`` (seconds, monotonic)."""
        if not self._samples:
            self._samples.append(_Sample(now, now))
        sample = self._samples[self._current]
        if now - sample.start >= self._config.window_s:
            sample = self._advance(now)
        sample.value += value
        sample.last_event = now

    def measure(self, now: float) -> Measurement:
        """The rate at ``now`` and the window it is measured over, in one pass."""
        self._purge(now)
        window = self._window_size(now)
        total = sum(sample.value for sample in self._samples)
        return Measurement(total / window, window)

    def rate(self, now: float) -> float:
        """Bytes per second at ``now``."""
        return self.measure(now).rate

    def window_size(self, now: float) -> float:
        """Seconds the rate at ``now`` is measured over (Kafka's ``Rate.windowSize``)."""
        return self.measure(now).window_s

    def _advance(self, now: float) -> _Sample:
        self._current = (self._current + 1) % (self._config.samples + 1)
        if self._current == len(self._samples):
            sample = _Sample(now, now)
            self._samples.append(sample)
            return sample
        sample = self._samples[self._current]
        sample.reset(now)
        return sample

    def _purge(self, now: float) -> None:
        # Judged by a window's last record, not its start: a window that still
        # overlaps the measured span keeps counting though it began before it.
        expire_age = self._config.samples * self._config.window_s
        for sample in self._samples:
            if now - sample.last_event >= expire_age:
                sample.reset(now)

    def _window_size(self, now: float) -> float:
        # Called after _purge. Purged windows restart at `now`, so the oldest
        # start is the oldest window that still holds live bytes.
        oldest = min((sample.start for sample in self._samples), default=now)
        return self._padded(now - oldest)

    def _padded(self, elapsed: float) -> float:
        window_s = self._config.window_s
        full_windows = math.floor(elapsed / window_s)
        if full_windows < MIN_FULL_WINDOWS:
            # Kafka's Rate.windowSize with a minimum of one window, not samples - 1:
            # a new (or newly quiet) tenant is measured as if the window it lacks
            # held nothing. The padding stops at the first full window, so the
            # span drops there from nearly two windows to one, as in Kafka.
            elapsed += (MIN_FULL_WINDOWS - full_windows) * window_s
        return elapsed

    def _rate_at(self, later: float) -> float:
        """The rate at ``later`` if nothing more is recorded; changes nothing."""
        expire_age = self._config.samples * self._config.window_s
        live = [s for s in self._samples if later - s.last_event < expire_age]
        if not live:
            return 0.0
        oldest = min(s.start for s in live)
        return sum(s.value for s in live) / self._padded(later - oldest)

    def delay_until(self, bound: float, now: float, max_s: float) -> float:
        """Seconds from ``now`` until the rate is back at ``bound`` if nothing more arrives.

        Found by stepping forward a twentieth of a window at a time, so that
        windows expiring on the way are counted as they expire: the first step
        at which the rate is at or under ``bound``. At most ``max_s``; never more than
        ``samples * window_s``, when every window has expired.
        """
        step = self._config.window_s / 20
        steps = 0
        # Counting steps, not adding floats, keeps a delay that lands on a step exact.
        while steps * step < max_s and self._rate_at(now + steps * step) > bound:
            steps += 1
        return min(steps * step, max_s)


class QuotaManager:
    """One produce rate and one fetch rate per tenant, and the throttles they earn.

    Invariant: a tenant appears in a direction's table only while that
    direction has a limit; a call with ``limit=None`` drops what was there.
    Changing a limit keeps the measured history, as Kafka does on a quota
    update: the bytes already sent still count against the new bound.
    """

    __slots__ = ("_config", "_fetch", "_produce")

    def __init__(self, config: QuotaConfig | None = None) -> None:
        self._config = config if config is not None else QuotaConfig()
        self._produce: dict[str, SampledRate] = {}
        self._fetch: dict[str, SampledRate] = {}

    @property
    def config(self) -> QuotaConfig:
        return self._config

    def record_produce(self, tenant: str, nbytes: int, limit: float | None, now: float) -> int:
        """Count ``nbytes`` produced by ``tenant``; the throttle in ms it earns (0 if none).

        ``limit`` is this gateway's share of the tenant's producer byte rate,
        in bytes per second; None is unlimited.
        """
        return self._record(self._produce, tenant, nbytes, limit, now)

    def record_fetch(self, tenant: str, nbytes: int, limit: float | None, now: float) -> int:
        """Count ``nbytes`` fetched by ``tenant``; the throttle in ms it earns (0 if none).

        ``nbytes`` is the size of the response actually sent, which can exceed
        :meth:`fetch_cap`: a broker returns the first batch whole, whatever the
        fetch's max bytes, so that a consumer always makes progress.
        """
        return self._record(self._fetch, tenant, nbytes, limit, now)

    def fetch_cap(self, limit: float | None) -> int | None:
        """The most bytes a fetch should ask the broker for under ``limit``; None if unlimited.

        One window's worth of the limit: as in Kafka, the most a quiet tenant
        can take without a throttle, which is one window here and ``samples -
        1`` windows there. A consumer fetching at its quota so earns a throttle
        of about one window per fetch, where Kafka's size would earn ten
        seconds. At least :data:`MIN_FETCH_CAP_BYTES`, so tiny quotas still
        make whole requests.
        """
        if limit is None:
            return None
        return max(MIN_FETCH_CAP_BYTES, math.floor(limit * self._config.window_s))

    def tracked_tenants(self) -> frozenset[str]:
        """Tenants with measured state in either direction (for a gauge, or to sweep idle ones)."""
        return frozenset(self._produce.keys() | self._fetch.keys())

    def forget(self, tenant: str) -> None:
        """Drop everything measured for ``tenant`` (deleted, or its last connection closed)."""
        self._produce.pop(tenant, None)
        self._fetch.pop(tenant, None)

    def _record(
        self,
        rates: dict[str, SampledRate],
        tenant: str,
        nbytes: int,
        limit: float | None,
        now: float,
    ) -> int:
        if limit is None:
            rates.pop(tenant, None)
            return 0
        if not limit > 0:
            raise ValueError(f"tenant {tenant!r} has a non-positive byte-rate limit {limit}")
        if nbytes < 0:
            raise ValueError(f"cannot record a negative byte count {nbytes}")
        rate = rates.get(tenant)
        if rate is None:
            rate = rates[tenant] = SampledRate(self._config)
        rate.record(nbytes, now)
        max_s = self._config.max_throttle_ms / 1000
        return math.floor(rate.delay_until(limit, now, max_s) * 1000 + 0.5)
