"""wait_at_most: a wake-up or a deadline, whichever comes first, and nothing left behind."""

from __future__ import annotations

import asyncio

import pytest
from shoal.broker.tasks import wait_at_most


async def test_returns_as_soon_as_the_waiter_is_woken() -> None:
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    loop.call_later(0.01, waiter.set_result, None)
    started = loop.time()
    await wait_at_most(waiter, 5)
    assert loop.time() - started < 1


async def test_returns_at_the_deadline_with_the_waiter_resolved() -> None:
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    started = loop.time()
    await wait_at_most(waiter, 0.05)
    assert loop.time() - started >= 0.04
    assert waiter.done() and waiter.result() is None


async def test_a_cancelled_wait_cancels_its_timer_and_propagates() -> None:
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    task = asyncio.create_task(wait_at_most(waiter, 60))
    await asyncio.sleep(0)
    timers = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert all(h.cancelled() for h in timers)
