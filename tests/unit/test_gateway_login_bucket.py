"""The connection creation rate's bucket (shoal.gateway.connection_rate), on a virtual clock.

What a tenant must be able to rely on: a quiet tenant's first second of logins
goes at once, a storm is paced at the rate in arrival order rather than failed,
a login is refused only when its hold would pass the longest allowed (and then
costs nothing), a slow rate still admits one login, and lifting the limit
forgets the debt.
"""

from __future__ import annotations

import pytest
from shoal.gateway.connection_rate import ConnectionRates, burst, refusal_message


def waits(rates: ConnectionRates, count: int, rate: float, now: float = 0.0) -> list[float]:
    verdicts = [rates.admit("acme", rate, now) for _ in range(count)]
    assert not any(v.refused for v in verdicts)
    return [round(v.wait_s, 6) for v in verdicts]


def test_a_burst_of_one_seconds_worth_goes_at_once_then_logins_are_paced() -> None:
    # 4 a second: 4 at once, then one every quarter second, in order.
    assert waits(ConnectionRates(), 8, 4.0) == [0, 0, 0, 0, 0.25, 0.5, 0.75, 1.0]


def test_twenty_simultaneous_logins_at_four_a_second_take_four_seconds() -> None:
    last = waits(ConnectionRates(), 20, 4.0)[-1]
    assert last == pytest.approx(4.0)


def test_the_bucket_refills_at_the_rate_up_to_the_burst() -> None:
    rates = ConnectionRates()
    waits(rates, 4, 4.0)
    assert waits(rates, 1, 4.0, now=0.5) == [0], "two tokens came back in half a second"
    assert waits(rates, 2, 4.0, now=100.0) == [0, 0]
    assert waits(rates, 3, 4.0, now=100.0) == [0, 0, 0.25], "no more than the burst is saved"


def test_a_slow_rate_still_admits_one_login_at_once() -> None:
    assert burst(0.25) == 1.0
    assert waits(ConnectionRates(), 3, 0.25) == [0, 4.0, 8.0]


def test_a_hold_longer_than_the_longest_is_refused_and_costs_nothing() -> None:
    rates = ConnectionRates(max_wait_s=10.0)
    assert waits(rates, 3, 0.25) == [0, 4.0, 8.0]

    refused = rates.admit("acme", 0.25, 0.0)
    assert refused.refused and refused.wait_s == pytest.approx(12.0)
    # Not charged: four seconds later the next login waits as the refused one would have.
    assert rates.admit("acme", 0.25, 4.0).wait_s == pytest.approx(8.0)


def test_tenants_have_buckets_of_their_own() -> None:
    rates = ConnectionRates()
    waits(rates, 10, 1.0)
    assert rates.admit("globex", 1.0, 0.0).wait_s == 0


def test_lifting_the_limit_forgets_the_debt() -> None:
    rates = ConnectionRates()
    waits(rates, 5, 1.0)
    assert rates.admit("acme", None, 0.0).wait_s == 0
    assert rates.admit("acme", 1.0, 0.0).wait_s == 0


def test_a_lower_rate_keeps_the_debt_and_pays_it_slower() -> None:
    rates = ConnectionRates()
    waits(rates, 2, 1.0)  # one token owed
    assert rates.admit("acme", 0.5, 0.0).wait_s == pytest.approx(4.0)


def test_the_refusal_speaks_the_tenants_terms() -> None:
    assert refusal_message("acme", 5.0) == (
        "tenant acme opens connections faster than its limit (maxConnectionRate) of 5/s;"
        " retry later"
    )
