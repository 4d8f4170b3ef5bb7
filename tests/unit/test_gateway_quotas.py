"""Per-tenant byte-rate quotas (shoal.gateway.quotas): Kafka's Rate and throttle arithmetic.

The clock is a number passed to every call, so each test states the instants
it means and nothing sleeps. Expected throttles are worked out by hand from
Kafka's formula, ``(rate - bound) / bound * window``, with the window Kafka's
``Rate.windowSize`` gives: at least ``(samples - 1) * window_s`` = 10 s.
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
    throttle_ms,
)

MB = 1_000_000
KIB = 1024
T0 = 1_000.0
"""An arbitrary monotonic-clock start, so no test leans on time zero."""


def _greedy_producer(
    bound: float, duration_s: float, request_bytes: int = 100 * KIB
) -> list[float]:
    """The send times of a producer that sends whenever allowed, honouring every throttle."""
    quotas = QuotaManager()
    now = T0
    sent: list[float] = []
    while now < T0 + duration_s:
        throttle = quotas.record_produce("acme", request_bytes, bound, now)
        sent.append(now - T0)
        now += throttle / 1000
    return sent


# Kafka's throttle formula


def test_throttle_ms_is_zero_at_or_under_the_bound() -> None:
    assert throttle_ms(999.0, 1000.0, 10.0) == 0
    assert throttle_ms(1000.0, 1000.0, 10.0) == 0


def test_throttle_ms_is_the_delay_that_brings_the_rate_back_to_the_bound() -> None:
    # 1.5x the bound over 10 s: waiting 5 s spreads the same bytes over 15 s.
    assert throttle_ms(1500.0, 1000.0, 10.0) == 5000
    assert throttle_ms(3000.0, 1000.0, 10.5) == 21_000


def test_throttle_ms_rounds_half_up_like_java() -> None:
    assert throttle_ms(1000.5, 1000.0, 1.0) == 1
    assert throttle_ms(1002.5, 1000.0, 1.0) == 3


def test_throttle_ms_is_capped() -> None:
    assert throttle_ms(100 * MB, MB, 10.0) == DEFAULT_MAX_THROTTLE_MS
    assert throttle_ms(100 * MB, MB, 10.0, max_throttle_ms=5000) == 5000


def test_throttle_ms_refuses_a_bound_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        throttle_ms(1.0, 0.0, 10.0)


# Measuring a rate


def test_a_first_burst_is_measured_over_the_minimum_window() -> None:
    rate = SampledRate()
    rate.record(1000, T0)
    # Not 1000 bytes over 0 s: the ten missing windows count as empty.
    assert rate.window_size(T0) == 10.0
    assert rate.rate(T0) == 100.0
    assert rate.window_size(T0 + 0.5) == 10.5
    assert rate.rate(T0 + 0.5) == pytest.approx(1000 / 10.5)


def test_the_window_grows_past_the_minimum_once_enough_time_has_passed() -> None:
    rate = SampledRate()
    rate.record(1000, T0)
    rate.record(1000, T0 + 10.5)
    assert rate.window_size(T0 + 10.5) == pytest.approx(10.5)
    assert rate.rate(T0 + 10.5) == pytest.approx(2000 / 10.5)


def test_old_samples_expire_after_samples_times_window() -> None:
    rate = SampledRate()
    rate.record(5000, T0)
    assert rate.rate(T0 + 10.99) == pytest.approx(5000 / 10.99)
    assert rate.rate(T0 + 11.0) == 0.0
    assert rate.window_size(T0 + 11.0) == 10.0


def test_a_window_counts_until_its_last_record_expires_not_its_first() -> None:
    rate = SampledRate()
    rate.record(1000, T0)
    rate.record(1000, T0 + 0.9)  # Same window: it is under window_s old.
    # 11.5 s after the window started but only 10.6 s after its last record.
    assert rate.rate(T0 + 11.5) == pytest.approx(2000 / 11.5)
    assert rate.rate(T0 + 12.0) == 0.0


def test_a_quiet_spell_is_measured_as_empty_windows() -> None:
    rate = SampledRate()
    rate.record(MB, T0)
    rate.record(1000, T0 + 60)
    # The old burst has expired and the new record starts over at the minimum window.
    assert rate.rate(T0 + 60) == 100.0


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


def test_a_burst_over_quota_earns_kafkas_throttle() -> None:
    quotas = QuotaManager()
    assert quotas.record_produce("acme", 10 * MB, MB, T0) == 0  # Exactly the bound.
    # 20 MB over the 10 s minimum window is 2 MB/s: 10 s to spread it over 20 s.
    assert quotas.record_produce("acme", 10 * MB, MB, T0) == 10_000
    # 0.5 s later the same bytes sit in a 10.5 s window: (20 / 10.5 - 1) * 10.5 s.
    assert quotas.record_produce("acme", 0, MB, T0 + 0.5) == 9500


def test_a_fetch_burst_over_quota_earns_kafkas_throttle() -> None:
    quotas = QuotaManager()
    assert quotas.record_fetch("acme", 30 * MB, MB, T0) == 20_000


def test_the_throttle_is_capped() -> None:
    quotas = QuotaManager()
    assert quotas.record_produce("acme", 1000 * MB, MB, T0) == DEFAULT_MAX_THROTTLE_MS
    small_cap = QuotaManager(QuotaConfig(max_throttle_ms=2000))
    assert small_cap.record_produce("acme", 1000 * MB, MB, T0) == 2000


def test_a_client_that_honours_every_throttle_gets_the_bound_in_the_long_run() -> None:
    # Ten minutes, measured after a two-minute warm-up: the span must be long
    # next to the bursts Kafka's window allows (see the next test).
    sent = _greedy_producer(MB, 600)
    late = [t for t in sent if t >= 120]
    achieved = len(late) * 100 * KIB / 480
    assert achieved == pytest.approx(MB, rel=0.05)


def test_any_span_gets_the_bound_give_or_take_one_measuring_span() -> None:
    # What Kafka's sliding window promises a greedy client over a short span:
    # whenever its windows empty it may send (samples - 1) windows' worth at
    # once, so 40 s of a one-minute run can be ~10% over or under the bound.
    sent = _greedy_producer(MB, 60)
    slack = 11 * MB + 100 * KIB  # samples * window_s of quota, plus one request.
    for span in (5.0, 11.0, 40.0):
        for i, start in enumerate(sent):
            if start + span > 60:
                break
            moved = (bisect.bisect_left(sent, start + span) - i) * 100 * KIB
            assert abs(moved - MB * span) <= slack, (span, start)


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
    assert quotas.record_fetch("acme", 5 * MB, MB, T0) == 0


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
    assert quotas.record_produce("acme", 10 * MB, 2 * MB, T0) == 0
    # Same 1 MB/s measured rate, now against half the bound: 10 s more.
    assert quotas.record_produce("acme", 0, MB / 2, T0) == 10_000


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


def test_a_fetch_of_one_cap_at_the_bound_earns_about_one_window_of_throttle() -> None:
    quotas = QuotaManager()
    cap = quotas.fetch_cap(MB)
    assert cap is not None
    # Already at the bound (10 MB over the 10 s minimum window), one more
    # capped response: (11 / 10 - 1) * 10 s = 1 s.
    assert quotas.record_fetch("acme", 10 * MB, MB, T0) == 0
    assert quotas.record_fetch("acme", cap, MB, T0) == 1000
