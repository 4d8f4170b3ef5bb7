"""Per-tenant byte-rate quotas (shoal.gateway.quotas): Kafka's Rate, throttles back to the bound.

The clock is a number passed to every call, so each test states the instants
it means and nothing sleeps. Expected values are worked out by hand from the
definitions: a rate is the live bytes over the time since the oldest live
window started, plus one empty window while that time is under one window; a
throttle is the first twentieth of a window (50 ms) at which that rate, with
nothing more recorded, is back at the bound. Byte counts are picked so the
exact time falls between two steps.
"""

from __future__ import annotations

import bisect

import pytest
from shoal.gateway.quotas import (
    DEFAULT_MAX_THROTTLE_MS,
    MIN_FETCH_CAP_BYTES,
    QuotaConfig,
    QuotaManager,
    SampledRate,
)

MB = 1_000_000
KIB = 1024
MIB = 1024 * KIB
T0 = 1_000.0
"""An arbitrary monotonic-clock start, so no test leans on time zero."""

ROUND_TRIP_S = 0.002
"""What a simulated client adds to each throttle before its next request."""


def _obedient_producer(request_bytes: int, duration_s: float) -> list[float]:
    """Send times (from T0) of a producer that sends again as soon as each throttle ends."""
    quotas = QuotaManager()
    now = T0
    sent: list[float] = []
    while now < T0 + duration_s:
        throttle = quotas.record_produce("acme", request_bytes, MB, now)
        sent.append(now - T0)
        now += throttle / 1000 + ROUND_TRIP_S
    return sent


def _span_rates(sent: list[float], request_bytes: int, span_s: float) -> list[tuple[float, float]]:
    """(start, bytes per second) from each send to the first send ``span_s`` or more later.

    Measured send to send, so each request is paired with the throttle it
    earned: a span cut at fixed instants gains or loses a whole request at its
    edges, which for 1 MiB requests is 5% of 20 s at 1 MB/s.
    """
    rates = []
    for i, start in enumerate(sent):
        j = bisect.bisect_left(sent, start + span_s)
        if j == len(sent):
            break
        rates.append((start, (j - i) * request_bytes / (sent[j] - start)))
    return rates


# Measuring a rate


def test_a_first_burst_is_measured_over_one_window() -> None:
    rate = SampledRate()
    rate.record(1000, T0)
    # Not 1000 bytes over 0 s: the missing window counts as empty.
    assert rate.window_size(T0) == 1.0
    assert rate.rate(T0) == 1000.0
    assert rate.window_size(T0 + 0.5) == 1.5
    assert rate.rate(T0 + 0.5) == pytest.approx(1000 / 1.5)


def test_the_padding_stops_at_the_first_full_window() -> None:
    rate = SampledRate()
    rate.record(1000, T0)
    assert rate.window_size(T0 + 0.99) == pytest.approx(1.99)
    # As in Kafka's Rate.windowSize, the span drops back to the time elapsed.
    assert rate.window_size(T0 + 1.0) == 1.0
    assert rate.rate(T0 + 1.0) == 1000.0
    rate.record(1000, T0 + 2.5)
    assert rate.window_size(T0 + 2.5) == 2.5
    assert rate.rate(T0 + 2.5) == pytest.approx(2000 / 2.5)


def test_old_samples_expire_after_samples_times_window() -> None:
    rate = SampledRate()
    rate.record(5000, T0)
    assert rate.rate(T0 + 10.99) == pytest.approx(5000 / 10.99)
    assert rate.rate(T0 + 11.0) == 0.0
    assert rate.window_size(T0 + 11.0) == 1.0


def test_a_window_counts_until_its_last_record_expires_not_its_first() -> None:
    rate = SampledRate()
    rate.record(1000, T0)
    rate.record(1000, T0 + 0.9)  # Same window: it is under window_s old.
    # 11.5 s after the window started but only 10.6 s after its last record.
    assert rate.rate(T0 + 11.5) == pytest.approx(2000 / 11.5)
    assert rate.rate(T0 + 12.0) == 0.0


def test_a_quiet_spell_is_measured_as_an_empty_window() -> None:
    rate = SampledRate()
    rate.record(MB, T0)
    rate.record(1000, T0 + 60)
    # The old burst has expired and the new record starts over at one window.
    assert rate.rate(T0 + 60) == 1000.0


def test_quota_config_rejects_settings_that_cannot_measure() -> None:
    with pytest.raises(ValueError, match="samples"):
        QuotaConfig(samples=1)
    with pytest.raises(ValueError, match="window"):
        QuotaConfig(window_s=0)
    with pytest.raises(ValueError, match="throttle"):
        QuotaConfig(max_throttle_ms=-1)


# Throttling tenants


def test_under_quota_is_not_throttled() -> None:
    quotas = QuotaManager()
    for i in range(100):
        # 100 KB every 0.2 s is 500 KB/s, half the bound.
        assert quotas.record_produce("acme", 100_000, MB, T0 + 0.2 * i) == 0
        assert quotas.record_fetch("acme", 100_000, MB, T0 + 0.2 * i) == 0


def test_a_burst_waits_until_the_rate_is_back_at_the_bound() -> None:
    quotas = QuotaManager()
    assert quotas.record_produce("acme", MB, MB, T0) == 0  # One window at the bound.
    # 2.02 MB: over 1 + d s while padded, that never reaches the bound before
    # the padding stops at d = 1 s; then 2.02 MB / d s reaches it at 2.02 s.
    # Kafka's formula would say (2.02 - 1) * 1 s = 1.02 s.
    assert quotas.record_produce("acme", 1_020_000, MB, T0) == 2050
    # 0.5 s later the same bytes need 1.52 s more.
    assert quotas.record_produce("acme", 0, MB, T0 + 0.5) == 1550


def test_a_throttle_is_rounded_up_to_a_twentieth_of_a_window() -> None:
    # 1.52 MB over 1 + d s is at the bound at d = 0.52 s.
    assert QuotaManager().record_produce("acme", 1_520_000, MB, T0) == 550
    # 3.03 MB is back at the bound at 3.03 s (the padding is gone by then).
    assert QuotaManager().record_fetch("acme", 3_030_000, MB, T0) == 3050


def test_a_throttle_ends_when_old_windows_expire() -> None:
    quotas = QuotaManager()
    # 12 MB never falls to the bound while it counts: the throttle ends when
    # its window expires, samples * window_s = 11 s later.
    assert quotas.record_produce("acme", 12 * MB, MB, T0) == 11_000
    # 12.1 MB over 10.52 s is over the bound; Kafka's formula would throttle
    # (12.1 / 10.52 - 1) * 10.52 s = 1.58 s. The 12 MB window expires 0.48 s
    # on, leaving 0.1 MB over 1.48 s: 0.5 s.
    assert quotas.record_produce("acme", MB // 10, MB, T0 + 10.52) == 500


def test_the_throttle_is_capped_and_never_outlasts_the_windows() -> None:
    assert QuotaManager().record_produce("acme", 1000 * MB, MB, T0) == 11_000
    small_cap = QuotaManager(QuotaConfig(max_throttle_ms=2000))
    assert small_cap.record_produce("acme", 1000 * MB, MB, T0) == 2000
    long_windows = QuotaManager(QuotaConfig(samples=50))
    assert long_windows.record_produce("acme", 1000 * MB, MB, T0) == DEFAULT_MAX_THROTTLE_MS


@pytest.mark.parametrize("request_bytes", [16 * KIB, 100 * KIB, MIB])
def test_a_client_that_waits_out_every_throttle_gets_the_bound(request_bytes: int) -> None:
    sent = _obedient_producer(request_bytes, 120)
    rates = _span_rates(sent, request_bytes, 20)
    first_start, first_rate = rates[0]
    assert first_start == 0.0
    assert first_rate == pytest.approx(MB, rel=0.10)
    late = [(start, rate) for start, rate in rates if start >= 20]
    assert len(late) > 60 * MB / request_bytes  # Spans starting over at least a minute.
    for start, rate in late:
        assert rate == pytest.approx(MB, rel=0.03), start


def test_tenants_are_independent() -> None:
    alone = QuotaManager()
    shared = QuotaManager()
    for i in range(50):
        now = T0 + 0.1 * i
        expected = alone.record_produce("acme", 500 * KIB, MB, now)
        assert shared.record_produce("acme", 500 * KIB, MB, now) == expected
        # A neighbour far over its own quota changes nothing for acme, and acme's
        # throttles leave the quiet neighbour unthrottled.
        shared.record_produce("noisy", 50 * MB, MB, now)
        assert shared.record_produce("quiet", KIB, MB, now) == 0
    assert expected > 0


def test_produce_and_fetch_are_measured_apart() -> None:
    quotas = QuotaManager()
    assert quotas.record_produce("acme", 50 * MB, MB, T0) > 0
    assert quotas.record_fetch("acme", MB, MB, T0) == 0  # One window at the bound.


def test_an_unlimited_direction_keeps_no_state() -> None:
    quotas = QuotaManager()
    assert quotas.record_produce("acme", 1000 * MB, None, T0) == 0
    assert quotas.record_fetch("acme", 1000 * MB, None, T0) == 0
    assert quotas.tracked_tenants() == frozenset()
    # The unlimited bytes were not counted once a limit appears.
    assert quotas.record_produce("acme", KIB, MB, T0) == 0


def test_lifting_a_limit_drops_that_directions_state() -> None:
    quotas = QuotaManager()
    assert quotas.record_produce("acme", 50 * MB, MB, T0) > 0
    quotas.record_fetch("acme", KIB, MB, T0)
    assert quotas.record_produce("acme", 0, None, T0) == 0
    assert quotas.record_produce("acme", 0, MB, T0) == 0  # The 50 MB are gone.
    quotas.record_produce("acme", 0, None, T0)
    quotas.record_fetch("acme", 0, None, T0)
    assert quotas.tracked_tenants() == frozenset()


def test_forget_drops_a_tenants_state_in_both_directions() -> None:
    quotas = QuotaManager()
    quotas.record_produce("acme", 50 * MB, MB, T0)
    quotas.record_fetch("acme", 50 * MB, MB, T0)
    quotas.record_produce("other", KIB, MB, T0)
    quotas.forget("acme")
    assert quotas.tracked_tenants() == frozenset({"other"})
    assert quotas.record_produce("acme", KIB, MB, T0) == 0
    assert quotas.record_fetch("acme", KIB, MB, T0) == 0


def test_a_changed_limit_applies_to_bytes_already_measured() -> None:
    quotas = QuotaManager()
    assert quotas.record_produce("acme", 1_010_000, 2 * MB, T0) == 0
    # The same 1.01 MB against 0.5 MB/s: over 1 + d s it stays above 0.5 MB/s
    # until the padding stops at 1 s; over d s it reaches it at 2.02 s.
    assert quotas.record_produce("acme", 0, MB / 2, T0) == 2050


def test_a_limit_that_is_not_positive_is_refused() -> None:
    quotas = QuotaManager()
    with pytest.raises(ValueError, match="non-positive"):
        quotas.record_produce("acme", KIB, 0, T0)


def test_a_negative_byte_count_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        QuotaManager().record_fetch("acme", -1, MB, T0)


# Fetch sizes


def test_fetch_cap_is_one_window_of_the_limit() -> None:
    assert QuotaManager().fetch_cap(MB) == MB
    assert QuotaManager(QuotaConfig(window_s=0.5)).fetch_cap(MB) == MB // 2


def test_fetch_cap_never_goes_below_one_kib() -> None:
    assert QuotaManager().fetch_cap(10.0) == MIN_FETCH_CAP_BYTES == KIB


def test_fetch_cap_is_none_when_unlimited() -> None:
    assert QuotaManager().fetch_cap(None) is None


def test_a_consumer_fetching_one_cap_at_a_time_waits_one_window_per_fetch() -> None:
    quotas = QuotaManager()
    cap = quotas.fetch_cap(MB)
    assert cap is not None
    now = T0
    throttles = []
    for _ in range(60):
        throttle = quotas.record_fetch("acme", cap, MB, now)
        throttles.append(throttle)
        now += throttle / 1000 + ROUND_TRIP_S
    # The first cap is free (one window at the bound). The second makes two
    # windows' worth, back at the bound once 2 s have passed since the first
    # (the padded span never gets there). From then on each cap needs one
    # more window: while nothing has expired the span grows by it, and once
    # windows expire, one cap's window leaves as the next one arrives.
    assert throttles[:2] == [0, 2000]
    assert set(throttles[2:]) == {1000}
