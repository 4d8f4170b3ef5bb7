"""The controller mutation quota's token bucket (KIP-599), with time driven by hand."""

from __future__ import annotations

import pytest
from shoal.gateway.mutation_quota import DEFAULT_BURST_S, MutationQuotas, MutationVerdict

T0 = 1000.0


def test_a_quiet_tenant_may_burst_eleven_seconds_of_its_rate() -> None:
    quotas = MutationQuotas()

    verdict = quotas.charge("acme", [10, 12], 2.0, strict=True, now=T0)

    assert verdict == MutationVerdict(frozenset(), 0, 22)
    assert quotas.balance("acme", T0) == pytest.approx(2.0 * DEFAULT_BURST_S - 22)


def test_strict_accepts_while_the_bucket_is_not_below_zero_and_refuses_after() -> None:
    quotas = MutationQuotas()
    quotas.charge("acme", [17], 2.0, strict=True, now=T0)  # 22 - 17 = 5 left

    verdict = quotas.charge("acme", [10, 1, 1], 2.0, strict=True, now=T0)

    # The first topic finds 5 tokens and overdraws to -5; the rest are refused.
    assert verdict.refused == frozenset({1, 2})
    assert verdict.charged == 10
    assert verdict.throttle_ms == 2500, "5 tokens owed at 2 a second"
    assert quotas.balance("acme", T0) == pytest.approx(-5)


def test_an_accepted_overdraw_carries_no_throttle_in_strict_mode() -> None:
    quotas = MutationQuotas()

    verdict = quotas.charge("acme", [30], 1.0, strict=True, now=T0)

    assert verdict == MutationVerdict(frozenset(), 0, 30)
    assert quotas.balance("acme", T0) == pytest.approx(-19)
    refused = quotas.charge("acme", [1], 1.0, strict=True, now=T0 + 1)
    assert refused.refused == frozenset({0})
    assert refused.throttle_ms == 18_000


def test_after_waiting_out_the_throttle_the_tenant_may_mutate_again() -> None:
    quotas = MutationQuotas()
    quotas.charge("acme", [25], 2.0, strict=True, now=T0)  # -3
    refused = quotas.charge("acme", [1], 2.0, strict=True, now=T0)
    assert refused.throttle_ms == 1500

    later = T0 + refused.throttle_ms / 1000
    assert quotas.charge("acme", [1], 2.0, strict=True, now=later) == MutationVerdict(
        frozenset(), 0, 1
    )


def test_permissive_accepts_everything_and_throttles_until_the_debt_is_paid() -> None:
    quotas = MutationQuotas()

    verdict = quotas.charge("acme", [20, 10], 2.0, strict=False, now=T0)

    assert verdict.refused == frozenset()
    assert verdict.charged == 30
    assert verdict.throttle_ms == 4000, "8 tokens owed at 2 a second"
    assert quotas.charge("acme", [1], 2.0, strict=False, now=T0 + 4).throttle_ms == 500


def test_permissive_within_the_burst_is_not_throttled() -> None:
    quotas = MutationQuotas()

    assert quotas.charge("acme", [3], 1.0, strict=False, now=T0).throttle_ms == 0


def test_topics_that_cost_nothing_are_never_refused() -> None:
    quotas = MutationQuotas()
    quotas.charge("acme", [20], 1.0, strict=True, now=T0)  # -9

    verdict = quotas.charge("acme", [0, 1, 0], 1.0, strict=True, now=T0)

    assert verdict.refused == frozenset({1})
    assert verdict.charged == 0


def test_the_reported_throttle_is_capped_but_the_debt_stays() -> None:
    quotas = MutationQuotas(max_throttle_ms=30_000)
    quotas.charge("acme", [1000], 1.0, strict=True, now=T0)  # -989

    refused = quotas.charge("acme", [1], 1.0, strict=True, now=T0)

    assert refused.throttle_ms == 30_000
    assert quotas.charge("acme", [1], 1.0, strict=True, now=T0 + 30).refused == frozenset({0})


def test_each_tenant_has_its_own_bucket() -> None:
    quotas = MutationQuotas()
    quotas.charge("acme", [50], 1.0, strict=True, now=T0)

    assert quotas.charge("acme", [1], 1.0, strict=True, now=T0).refused == frozenset({0})
    assert quotas.charge("globex", [5], 1.0, strict=True, now=T0).refused == frozenset()
    assert quotas.charge("initech", [500], None, strict=True, now=T0) == MutationVerdict()


def test_lifting_the_limit_forgets_the_debt() -> None:
    quotas = MutationQuotas()
    quotas.charge("acme", [50], 1.0, strict=True, now=T0)

    assert quotas.charge("acme", [50], None, strict=True, now=T0) == MutationVerdict()
    assert quotas.balance("acme", T0) is None
    assert quotas.charge("acme", [1], 1.0, strict=True, now=T0).refused == frozenset()


def test_a_new_rate_keeps_the_debt_and_refills_at_the_new_rate() -> None:
    quotas = MutationQuotas()
    quotas.charge("acme", [21], 1.0, strict=True, now=T0)  # -10

    refused = quotas.charge("acme", [1], 5.0, strict=True, now=T0)

    assert refused.refused == frozenset({0})
    assert refused.throttle_ms == 2000, "10 tokens owed at 5 a second"


def test_a_smaller_rate_clamps_a_full_bucket_to_its_burst() -> None:
    quotas = MutationQuotas()
    quotas.charge("acme", [0], 10.0, strict=True, now=T0)

    quotas.charge("acme", [0], 1.0, strict=True, now=T0)

    assert quotas.balance("acme", T0) == pytest.approx(DEFAULT_BURST_S)


def test_a_non_positive_rate_is_a_bug() -> None:
    with pytest.raises(ValueError, match="non-positive"):
        MutationQuotas().charge("acme", [1], 0.0, strict=True, now=T0)
