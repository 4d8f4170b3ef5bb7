"""The request quota (shoal.gateway.request_quota): its bucket on a virtual clock, and the
stopwatch that measures what a request costs, slice by slice.

What a tenant must be able to rely on: a quiet tenant may spend one window of its
percentage at once; past it, each answer carries the time until its debt is paid;
a percentage above 100 is more than one thread; debt is kept across a retune and
forgotten when the limit is lifted; and only the time its own code runs is
charged, never the time it waits (for a broker's answer, a long poll, a quota).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from shoal.gateway.admission import Admission, QuotaWaitError
from shoal.gateway.quota_shares import Load, TrafficLedger, parse_report, split_quota
from shoal.gateway.quotas import QuotaConfig, QuotaManager
from shoal.gateway.request_quota import RequestQuotas, Stopwatch, seconds_per_second, timed


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- the bucket ----------------------------------------------------------------------------


def test_the_unit_is_kafkas_percentage_of_one_thread() -> None:
    assert seconds_per_second(100) == 1.0
    assert seconds_per_second(50) == 0.5
    assert seconds_per_second(250) == 2.5, "above 100 is more than one thread"


def test_a_quiet_tenant_spends_one_window_at_once_then_is_throttled_for_its_debt() -> None:
    quotas = RequestQuotas()
    # 50%: half a second of handling time a second, one window (1 s) of it in hand.
    assert quotas.charge("acme", 0.375, 50, now=0.0) == 0
    assert quotas.charge("acme", 0.125, 50, now=0.0) == 0, "exactly the window: no debt"
    # 0.125 s owed at 0.5 s/s: 250 ms until it is paid.
    assert quotas.charge("acme", 0.125, 50, now=0.0) == 250


def test_the_throttle_shrinks_as_the_bucket_refills() -> None:
    quotas = RequestQuotas()
    assert quotas.charge("acme", 1.5, 100, now=0.0) == 500
    assert quotas.charge("acme", 0.0, 100, now=0.3) == 200
    assert quotas.charge("acme", 0.0, 100, now=0.5) == 0
    assert quotas.balance("acme", now=10.0) == 1.0, "no more than a window is saved"


def test_a_percentage_above_100_allows_more_than_one_thread() -> None:
    quotas = RequestQuotas()
    # 300%: three seconds of handling time a second (several connections' requests at once).
    assert quotas.charge("acme", 3.0, 300, now=0.0) == 0
    assert quotas.charge("acme", 3.0, 300, now=1.0) == 0
    assert quotas.charge("acme", 0.3, 300, now=1.0) == 100


def test_tenants_have_budgets_of_their_own() -> None:
    quotas = RequestQuotas()
    assert quotas.charge("acme", 5.0, 10, now=0.0) > 0
    assert quotas.charge("globex", 0.05, 10, now=0.0) == 0


def test_a_reported_throttle_is_capped_but_the_debt_is_kept() -> None:
    quotas = RequestQuotas(max_throttle_ms=30_000)
    # 1%: 10 ms a second. One second of work leaves 0.99 s owed: 99 s of refill.
    assert quotas.charge("acme", 1.0, 1, now=0.0) == 30_000
    assert quotas.charge("acme", 0.0, 1, now=60.0) == 30_000, "39 s still owed"
    assert quotas.charge("acme", 0.0, 1, now=99.0) == 0


def test_connections_are_held_only_while_more_than_a_window_is_owed() -> None:
    quotas = RequestQuotas()
    assert quotas.wait_s("acme", 50, now=0.0) == 0
    quotas.charge("acme", 1.0, 50, now=0.0)  # 0.5 s owed: exactly one window
    assert quotas.wait_s("acme", 50, now=0.0) == 0
    quotas.charge("acme", 0.25, 50, now=0.0)  # 0.75 s owed
    assert quotas.wait_s("acme", 50, now=0.0) == pytest.approx(0.5)
    assert quotas.wait_s("acme", 50, now=0.5) == 0


def test_a_new_percentage_keeps_the_debt_and_lifting_the_limit_forgets_it() -> None:
    quotas = RequestQuotas()
    quotas.charge("acme", 2.0, 100, now=0.0)  # 1 s owed
    assert quotas.charge("acme", 0.0, 200, now=0.0) == 500, "the same debt, paid twice as fast"
    assert quotas.charge("acme", 0.0, None, now=0.0) == 0
    assert quotas.balance("acme", now=0.0) is None
    assert quotas.charge("acme", 0.0, 200, now=0.0) == 0, "a fresh, full bucket"


def test_nonsense_is_refused() -> None:
    quotas = RequestQuotas()
    with pytest.raises(ValueError, match="non-positive"):
        quotas.charge("acme", 0.1, 0, now=0.0)
    with pytest.raises(ValueError, match="negative"):
        quotas.charge("acme", -0.1, 50, now=0.0)
    with pytest.raises(ValueError, match="window"):
        RequestQuotas(window_s=0)


# -- the stopwatch -------------------------------------------------------------------------


def test_the_stopwatch_sums_its_slices_and_counts_nested_ones_once() -> None:
    clock = FakeClock()
    watch = Stopwatch(clock)
    watch.start()
    clock.advance(1)
    watch.start()  # nested: the outer slice already counts this
    clock.advance(2)
    watch.stop()
    watch.stop()
    clock.advance(100)  # not running
    watch.start()
    clock.advance(4)
    watch.stop()
    assert watch.take() == 7
    assert watch.take() == 0, "taken once"
    with pytest.raises(RuntimeError):
        watch.stop()


def test_take_includes_the_running_slice_and_leaves_the_rest_for_later() -> None:
    clock = FakeClock()
    watch = Stopwatch(clock)
    watch.start()
    clock.advance(3)
    assert watch.take() == 3, "the answer's throttle is decided before it is encoded"
    clock.advance(2)
    watch.stop()
    assert watch.take() == 2, "encoding the answer is charged after"


async def test_timed_counts_the_slices_a_coroutine_runs_and_never_its_waits() -> None:
    clock = FakeClock()
    watch = Stopwatch(clock)
    broker_answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def request() -> str:
        clock.advance(1)  # decode and rewrite
        answer = await broker_answer  # a long poll at the broker
        clock.advance(2)  # decode and rewrite the answer
        await asyncio.sleep(0)  # a real suspension, however short
        clock.advance(4)
        return answer

    async def broker() -> None:
        await asyncio.sleep(0)
        clock.advance(500)  # the broker's time, and other tenants' requests
        broker_answer.set_result("records")

    result, _ = await asyncio.gather(timed(request(), watch), broker())
    assert result == "records"
    assert watch.take() == 7


async def test_timed_passes_errors_and_cancellation_to_the_coroutine() -> None:
    clock = FakeClock()
    watch = Stopwatch(clock)

    async def refused() -> None:
        clock.advance(1)
        await asyncio.sleep(0)
        raise LookupError("no such topic")

    with pytest.raises(LookupError, match="no such topic"):
        await timed(refused(), watch)
    assert watch.take() == 1

    cleaned: list[str] = []

    async def waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            clock.advance(3)
            cleaned.append("yes")

    task = asyncio.create_task(timed(waits_forever(), watch))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["yes"]
    assert watch.take() == 3, "the cleanup ran, and is charged"


# -- admission and the replicas' split ------------------------------------------------------


def admission() -> tuple[Admission, TrafficLedger]:
    ledger = TrafficLedger()
    return Admission(QuotaManager(QuotaConfig()), ledger, requests=RequestQuotas(0.01)), ledger


async def test_admission_holds_a_tenant_that_owes_more_than_a_window_and_then_lets_it_go() -> None:
    gate, _ = admission()
    # 100% with a 10 ms window: 30 ms of work leaves 20 ms owed, 10 ms past the window.
    assert gate.handled("acme", 0.03, 100) == 20
    loop = asyncio.get_running_loop()
    started = loop.time()
    await gate.request_turn("acme", 100)
    assert loop.time() - started >= 0.009
    await asyncio.wait_for(gate.request_turn("globex", 100), 0.005)
    with pytest.raises(QuotaWaitError, match="request quota"):
        gate.handled("acme", 0.03, 100)
        gate.try_request("acme", 100)


def test_request_time_is_reported_to_the_other_replicas_in_percent() -> None:
    gate, ledger = admission()
    gate.handled("acme", 0.002, 10)  # within the window: no throttle
    gate.handled("acme", 0.2, 10)  # throttled: counts as having waited
    gate.handled("globex", 0.5, None)  # unlimited: not reported
    report = ledger.report(period_s=1.0)
    assert json.loads(report)["requests"] == {"acme": [pytest.approx(20.2), True]}
    assert parse_report(report)["requests"]["acme"] == Load(pytest.approx(20.2), True)


def test_a_tenant_at_one_replica_of_two_gets_nearly_all_its_percentage_there() -> None:
    parts = split_quota(40.0, ["a", "b"], {"a": Load(40.0, True)})
    assert parts["a"] == pytest.approx(39.0)
    assert sum(parts.values()) == pytest.approx(40.0)
