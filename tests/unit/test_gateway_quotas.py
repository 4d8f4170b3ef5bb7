"""Per-tenant byte budgets (shoal.gateway.quotas): waits before forwarding, throttles after.

The clock is a number passed to every call, so each test states the instants
it means and nothing sleeps. The simulated clients below send again as soon
as the gateway lets a request through, from as many connections as a test
asks for; what the tests check is the bound the module's docstring states:
over any span of T seconds, at most ``limit * T`` plus two windows' worth is
forwarded (one window plus the request for requests larger than two windows).
"""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoal.gateway.quotas import (
    DEFAULT_MAX_THROTTLE_MS,
    MIN_FETCH_CAP_BYTES,
    ByteBudget,
    QuotaConfig,
    QuotaManager,
)

KB = 1000
LIMIT = 100 * KB
"""Bytes per second; the default one-second window makes the capacity 100 kB."""
T0 = 1_000.0
"""An arbitrary monotonic-clock start, so no test leans on time zero."""


def greedy_producers(
    quotas: QuotaManager, sizes: list[int], connections: int, duration_s: float
) -> list[tuple[float, int]]:
    """(forwarded at, bytes) of ``connections`` clients sending ``sizes`` in turn, each
    as soon as its last request went; the gateway lets them through one at a time."""
    ready = [T0] * connections
    forwarded: list[tuple[float, int]] = []
    turn = 0
    while True:
        conn = min(range(connections), key=lambda c: ready[c])
        size = sizes[turn % len(sizes)]
        turn += 1
        # The tenant's queue: a request waits behind those forwarded before it.
        now = max(ready[conn], forwarded[-1][0] if forwarded else T0)
        now += quotas.produce_wait_s("acme", size, LIMIT, now)
        if now > T0 + duration_s:
            return forwarded
        quotas.charge_produce("acme", size, LIMIT, now)
        forwarded.append((now, size))
        ready[conn] = now + 0.001


def most_in_any_span(forwarded: list[tuple[float, int]], span_s: float) -> int:
    """The most bytes forwarded within any ``span_s`` seconds (both ends included)."""
    times = [t for t, _ in forwarded]
    sums = [0]
    for _, size in forwarded:
        sums.append(sums[-1] + size)
    return max(
        sums[bisect.bisect_right(times, start + span_s)] - sums[i] for i, start in enumerate(times)
    )


# The budget


def test_a_budget_starts_full_refills_at_its_rate_and_stops_at_its_capacity() -> None:
    budget = ByteBudget(rate=1000, capacity=500, now=T0)
    assert budget.balance(T0) == 500
    budget.charge(2000, T0)
    assert budget.balance(T0) == -1500
    assert budget.balance(T0 + 1) == -500
    assert budget.seconds_until(0, T0 + 1) == pytest.approx(0.5)
    assert budget.balance(T0 + 10) == 500


def test_retuning_keeps_the_debt_and_clamps_a_surplus() -> None:
    budget = ByteBudget(rate=1000, capacity=1000, now=T0)
    budget.retune(rate=100, capacity=100, now=T0)
    assert budget.balance(T0) == 100
    budget.charge(300, T0)
    budget.retune(rate=1000, capacity=1000, now=T0)
    assert budget.balance(T0) == -200
    assert budget.balance(T0 + 0.2) == pytest.approx(0, abs=1e-6)


def test_quota_config_rejects_settings_that_cannot_work() -> None:
    with pytest.raises(ValueError, match="window"):
        QuotaConfig(window_s=0)
    with pytest.raises(ValueError, match="throttle"):
        QuotaConfig(max_throttle_ms=-1)


# Produce


def test_a_quiet_tenant_may_send_one_window_at_once_then_waits_its_debt_out() -> None:
    quotas = QuotaManager()
    assert quotas.produce_wait_s("acme", LIMIT, LIMIT, T0) == 0
    assert quotas.charge_produce("acme", LIMIT, LIMIT, T0) == 0
    # Balance 0: the next request of 150 kB may go once it can leave at most
    # one window of debt, 50 kB of refill away.
    assert quotas.produce_wait_s("acme", 150 * KB, LIMIT, T0) == pytest.approx(0.5)
    assert quotas.charge_produce("acme", 150 * KB, LIMIT, T0 + 0.5) == 1000


def test_a_request_larger_than_two_windows_waits_for_a_full_bucket() -> None:
    quotas = QuotaManager()
    quotas.charge_produce("acme", LIMIT, LIMIT, T0)
    assert quotas.produce_wait_s("acme", 1_000 * KB, LIMIT, T0) == pytest.approx(1.0)
    # Ten seconds' worth: the throttle is the whole debt, nine seconds.
    assert quotas.charge_produce("acme", 1_000 * KB, LIMIT, T0 + 1) == 9000
    assert quotas.produce_wait_s("acme", 1_000 * KB, LIMIT, T0 + 1) == pytest.approx(10.0)


def test_the_reported_throttle_is_capped_but_the_debt_is_not() -> None:
    quotas = QuotaManager(QuotaConfig(max_throttle_ms=2000))
    assert quotas.charge_produce("acme", 600 * KB, LIMIT, T0) == 2000
    # 500 kB owed: the next window-sized request still waits the whole five seconds.
    assert quotas.produce_wait_s("acme", LIMIT, LIMIT, T0) == pytest.approx(5.0)
    assert QuotaManager().charge_produce("acme", 4_100 * KB, LIMIT, T0) == DEFAULT_MAX_THROTTLE_MS


@pytest.mark.parametrize("connections", [1, 8, 32])
@pytest.mark.parametrize("size", [2 * KB, 100 * KB, 180 * KB])
def test_more_connections_buy_no_more_bytes(connections: int, size: int) -> None:
    forwarded = greedy_producers(QuotaManager(), [size], connections, 120)
    for span_s in (1, 5, 30, 119):
        assert most_in_any_span(forwarded, span_s) <= LIMIT * span_s + 2 * LIMIT
    # And the tenant does get its quota: over two minutes, within a request of it.
    assert sum(b for _, b in forwarded) >= LIMIT * 120 - size


def test_megabyte_requests_overshoot_by_at_most_one_window_and_one_request() -> None:
    size = 1_000 * KB
    forwarded = greedy_producers(QuotaManager(), [size], 8, 300)
    for span_s in (5, 30, 60):
        assert most_in_any_span(forwarded, span_s) <= LIMIT * span_s + LIMIT + size
    assert sum(b for _, b in forwarded) >= LIMIT * 300 - size


@given(
    st.lists(st.integers(KB, 400 * KB), min_size=1, max_size=8),
    st.integers(1, 32),
    st.floats(0.5, 20),
)
def test_any_mix_of_sizes_and_connections_stays_within_the_bound(
    sizes: list[int], connections: int, span_s: float
) -> None:
    forwarded = greedy_producers(QuotaManager(), sizes, connections, 30)
    slack = max(2 * LIMIT, LIMIT + max(sizes))
    assert most_in_any_span(forwarded, span_s) <= LIMIT * span_s + slack + 1e-6


def test_tenants_and_directions_are_independent() -> None:
    quotas = QuotaManager()
    quotas.charge_produce("acme", 10 * LIMIT, LIMIT, T0)
    assert quotas.produce_wait_s("acme", 1, LIMIT, T0) > 0
    assert quotas.produce_wait_s("globex", 1, LIMIT, T0) == 0
    assert quotas.fetch_wait_s("acme", LIMIT, T0) == 0


def test_an_unlimited_tenant_never_waits_and_lifting_a_limit_forgets_the_debt() -> None:
    quotas = QuotaManager()
    assert quotas.charge_produce("acme", 10 * LIMIT, None, T0) == 0
    assert quotas.produce_wait_s("acme", 10 * LIMIT, None, T0) == 0
    quotas.charge_produce("acme", 10 * LIMIT, LIMIT, T0)
    assert quotas.produce_wait_s("acme", 1, None, T0) == 0
    assert quotas.produce_wait_s("acme", 1, LIMIT, T0) == 0, "a new limit starts with a full bucket"


def test_a_changed_limit_keeps_what_is_owed() -> None:
    quotas = QuotaManager()
    quotas.charge_produce("acme", 3 * LIMIT, LIMIT, T0)
    # 200 kB owed, now repaid at 200 kB/s: a window's worth (200 kB) may go once it is paid.
    assert quotas.produce_wait_s("acme", 2 * LIMIT, 2 * LIMIT, T0) == pytest.approx(1.0)


def test_bad_limits_and_counts_are_refused() -> None:
    quotas = QuotaManager()
    with pytest.raises(ValueError, match="non-positive"):
        quotas.produce_wait_s("acme", 1, 0, T0)
    with pytest.raises(ValueError, match="negative"):
        quotas.charge_produce("acme", -1, LIMIT, T0)


# Fetch


def test_a_fetch_reserves_the_balance_and_concurrent_fetches_split_it() -> None:
    quotas = QuotaManager()
    first = quotas.fetch_admission("acme", LIMIT, T0)
    assert first is not None and first.reserved == LIMIT
    # Nothing left: the next fetch waits for the smallest fetch's worth.
    assert quotas.fetch_wait_s("acme", LIMIT, T0) == pytest.approx(MIN_FETCH_CAP_BYTES / LIMIT)
    later = T0 + 0.3
    assert quotas.fetch_wait_s("acme", LIMIT, later) == 0
    second = quotas.fetch_admission("acme", LIMIT, later)
    assert second is not None and second.reserved == pytest.approx(30 * KB, abs=1)


def test_an_answer_smaller_than_its_reservation_gives_the_rest_back() -> None:
    quotas = QuotaManager()
    ticket = quotas.fetch_admission("acme", LIMIT, T0)
    assert ticket is not None
    assert quotas.settle_fetch(ticket, 0, T0) == 0
    again = quotas.fetch_admission("acme", LIMIT, T0)
    assert again is not None and again.reserved == LIMIT


def test_an_answer_larger_than_its_reservation_is_owed() -> None:
    quotas = QuotaManager()
    ticket = quotas.fetch_admission("acme", LIMIT, T0)
    assert ticket is not None
    # A first batch returned whole (KIP-74): 250 kB where 100 kB was asked.
    assert quotas.settle_fetch(ticket, 250 * KB, T0) == 1500
    owed_s = 1.5 + MIN_FETCH_CAP_BYTES / LIMIT
    assert quotas.fetch_wait_s("acme", LIMIT, T0) == pytest.approx(owed_s)


def test_a_tiny_quota_still_fetches_whole_kilobytes() -> None:
    quotas = QuotaManager()
    ticket = quotas.fetch_admission("acme", 100, T0)
    assert ticket is not None and ticket.reserved == MIN_FETCH_CAP_BYTES
    assert quotas.fetch_wait_s("acme", 100, T0) == pytest.approx(10.24)


def test_an_unlimited_fetch_reserves_nothing() -> None:
    assert QuotaManager().fetch_admission("acme", None, T0) is None


@pytest.mark.parametrize("consumers", [1, 8, 32])
def test_consumers_fetching_flat_out_get_the_bound(consumers: int) -> None:
    """Each consumer fetches as soon as its last answer came back, 5 ms later, and
    always gets all it asked for (a deep backlog)."""
    quotas = QuotaManager()
    ready = [T0] * consumers
    delivered: list[tuple[float, int]] = []
    while True:
        c = min(range(consumers), key=lambda i: ready[i])
        now = ready[c] + quotas.fetch_wait_s("acme", LIMIT, ready[c])
        if now > T0 + 120:
            break
        ticket = quotas.fetch_admission("acme", LIMIT, now)
        assert ticket is not None
        quotas.settle_fetch(ticket, ticket.reserved, now + 0.005)
        delivered.append((now + 0.005, ticket.reserved))
        ready[c] = now + 0.005
    delivered.sort()
    for span_s in (1, 5, 30):
        assert most_in_any_span(delivered, span_s) <= LIMIT * span_s + 2 * LIMIT
    assert sum(b for _, b in delivered) >= LIMIT * 119
