"""Holding requests for their tenant's budget (shoal.gateway.admission), on a real event loop.

Small windows (10 or 20 ms of the limit) keep the waits short: 1 kB requests
at 100 kB/s are let through about one every 10 ms.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from shoal.gateway.admission import Admission, QuotaWaitError
from shoal.gateway.quota_shares import FLOOR, Load, QuotaShares, TrafficLedger, parse_report
from shoal.gateway.quotas import QuotaConfig, QuotaManager

LIMIT = 100_000
SIZE = 1000


def admission(window_s: float = 0.01) -> Admission:
    return Admission(QuotaManager(QuotaConfig(window_s=window_s)), TrafficLedger())


async def test_connections_of_one_tenant_are_let_through_in_arrival_order_at_the_limit() -> None:
    gate = admission()
    forwarded: list[tuple[int, float]] = []

    async def connection(number: int) -> None:
        for _ in range(5):
            await gate.produce("acme", SIZE, LIMIT)
            forwarded.append((number, time.monotonic()))

    started = time.monotonic()
    await asyncio.gather(*(connection(n) for n in range(4)))
    elapsed = time.monotonic() - started
    # 20 kB at 100 kB/s, less the 1 kB window a quiet tenant starts with.
    assert elapsed >= (20 * SIZE - 2 * SIZE) / LIMIT
    # Connection 0 spends the quiet tenant's burst (one window, and one of debt)
    # and its third request waits holding the queue; from then on, first come
    # first served: the connections take turns.
    assert [n for n, _ in forwarded] == [0, 0, 0] + [1, 2, 3, 0] * 2 + [1, 2, 3] * 3


async def test_another_tenant_does_not_queue_behind_one_in_debt() -> None:
    gate = admission()
    await gate.produce("acme", 50 * SIZE, LIMIT)  # half a second owed
    waiting = asyncio.create_task(gate.produce("acme", SIZE, LIMIT))
    started = time.monotonic()
    assert await gate.produce("globex", SIZE, LIMIT) == 0
    assert await gate.produce("free", 50 * SIZE, None) == 0
    assert time.monotonic() - started < 0.1
    assert not waiting.done()
    await waiting


async def test_a_fetch_waits_for_its_tenants_debt_and_is_charged_its_answer() -> None:
    # The clock stands still from the fetch to its answer, so the throttle is the debt's
    # whole time (a millisecond passing between them refilled 100 bytes: 179 ms, once).
    stopped: list[float] = []
    gate = Admission(
        QuotaManager(QuotaConfig(window_s=0.02)),
        TrafficLedger(),
        clock=lambda: stopped[0] if stopped else time.monotonic(),
    )
    stopped.append(time.monotonic())
    ticket = await gate.fetch("acme", LIMIT)
    assert ticket is not None and ticket.reserved == 2 * SIZE
    # The answer came back with 20 kB (a first batch returned whole): 0.18 s owed.
    assert gate.fetched(ticket, 20 * SIZE) == 180
    stopped.clear()
    started = time.monotonic()
    await gate.fetch("acme", LIMIT)
    assert time.monotonic() - started >= 0.18
    assert await gate.fetch("acme", None) is None
    assert gate.fetched(None, 20 * SIZE) == 0


async def test_the_http_door_is_told_to_come_back_and_shares_the_budget() -> None:
    gate = admission()
    await gate.produce("acme", 2 * SIZE, LIMIT)  # the Kafka door spent the window and more
    with pytest.raises(QuotaWaitError) as refused:
        gate.try_produce("acme", SIZE, LIMIT)
    assert refused.value.wait_s > 0
    await asyncio.sleep(refused.value.wait_s)
    assert gate.try_produce("acme", SIZE, LIMIT) >= 0
    assert gate.try_fetch("acme", None) is None


async def test_what_went_through_and_what_waited_is_reported_for_the_replicas() -> None:
    gate = admission()
    throttles = [await gate.produce("acme", SIZE, LIMIT) for _ in range(3)]  # the third waits
    first = gate.try_fetch("acme", LIMIT)  # reserves the whole window
    with pytest.raises(QuotaWaitError):
        gate.try_fetch("acme", LIMIT)
    gate.fetched(first, 0)
    ticket = await gate.fetch("globex", LIMIT)
    gate.fetched(ticket, 500)
    report = parse_report(gate.traffic.report(period_s=2.0))
    assert report["produce"]["acme"].rate == 3 * SIZE / 2
    assert report["produce"]["acme"].waited
    assert report["fetch"]["acme"].waited and report["fetch"]["acme"].rate == 0
    assert not report["fetch"]["globex"].waited and report["fetch"]["globex"].rate == 250
    # Until the last answer's throttle has run out, acme still wants more than its part
    # here (test_gateway_quota_shares follows that on a clock of its own).
    assert throttles[-1] > 0
    await asyncio.sleep(throttles[-1] / 1000)
    gate.traffic.report(period_s=1.0)  # the period the throttle ran into still waited
    assert parse_report(gate.traffic.report(period_s=1.0)) == {
        "produce": {},
        "fetch": {},
        "mutations": {},
        "logins": {},
        "requests": {},
    }


async def test_a_request_waiting_through_reports_is_reported_waiting_in_each() -> None:
    """A request held longer than a round still wants this replica's part: each report
    made while it waits says so, though nothing went through yet."""
    gate = admission()
    await gate.produce("acme", 50 * SIZE, LIMIT)  # half a second owed
    held = asyncio.create_task(gate.produce("acme", SIZE, LIMIT))
    await asyncio.sleep(0.05)
    gate.traffic.report(period_s=1.0)
    await asyncio.sleep(0.05)
    while_held = parse_report(gate.traffic.report(period_s=1.0))
    assert while_held["produce"]["acme"] == Load(0.0, waited=True)
    throttle_ms = await held
    let_through = parse_report(gate.traffic.report(period_s=1.0))
    assert let_through["produce"]["acme"] == Load(SIZE, waited=True)
    await asyncio.sleep(throttle_ms / 1000)
    gate.traffic.report(period_s=1.0)  # the period the throttle ran into still waited
    assert parse_report(gate.traffic.report(period_s=1.0))["produce"] == {}


async def test_a_request_waiting_through_a_new_split_is_let_go_at_its_new_part() -> None:
    """A replica a tenant had not used holds the floor of its quota (a fortieth, with two
    replicas); once the round after its first requests gives it half, a request already
    waiting there waits at half the quota, not the floor it arrived under."""
    quota = 1_000_000
    shares = QuotaShares("here")
    elsewhere = TrafficLedger()
    elsewhere.admitted("produce", "acme", quota, waited=True)
    shares.update({"here": b"", "there": elsewhere.report(period_s=1.0)})
    gate = Admission(QuotaManager(QuotaConfig(window_s=0.01)), TrafficLedger(), shares=shares)
    assert shares.share("produce", "acme", quota) == pytest.approx(FLOOR * quota / 2)
    # 400 kB at the floor (25 kB/s) is 16 s owed; at half the quota, 0.8 s.
    await gate.produce("acme", 400_000, quota)
    started = time.monotonic()
    held = asyncio.create_task(gate.produce("acme", SIZE, quota))
    await asyncio.sleep(0.05)
    elsewhere.admitted("produce", "acme", quota / 2, waited=True)
    shares.update(
        {"here": gate.traffic.report(period_s=1.0), "there": elsewhere.report(period_s=1.0)}
    )
    assert shares.share("produce", "acme", quota) == quota / 2
    await asyncio.wait_for(held, 5.0)
    # One round at the floor (the wait is asked again every round), then 0.75 s at half.
    assert time.monotonic() - started < 1.0 + 0.75 + 0.5


def test_controller_mutations_are_charged_and_reported_for_the_replicas() -> None:
    gate = admission()
    rate = 1.0  # a burst of 11 partitions

    accepted = gate.mutate("acme", [6, 6], rate, strict=True)
    refused = gate.mutate("acme", [1], rate, strict=True)
    unlimited = gate.mutate("globex", [100], None, strict=True)

    assert (accepted.refused, accepted.throttle_ms) == (frozenset(), 0)
    assert refused.refused == frozenset({0}) and refused.throttle_ms > 0
    assert unlimited.refused == frozenset() and unlimited.throttle_ms == 0
    report = parse_report(gate.traffic.report(period_s=1.0))["mutations"]
    assert set(report) == {"acme"}, "an unlimited tenant is not reported"
    assert report["acme"].rate == 12
    assert report["acme"].waited


def test_logins_are_charged_and_reported_for_the_replicas() -> None:
    gate = admission()
    verdicts = [gate.login("acme", 2.0) for _ in range(3)]
    unlimited = gate.login("globex", None)

    assert [v.wait_s > 0 for v in verdicts] == [False, False, True]
    assert unlimited.wait_s == 0 and not unlimited.refused
    report = parse_report(gate.traffic.report(period_s=1.0))["logins"]
    assert set(report) == {"acme"}, "an unlimited tenant is not reported"
    assert report["acme"].rate == 3
    assert report["acme"].waited
