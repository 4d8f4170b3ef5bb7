"""Stopping the broker's background tasks, and waiting on a wake-up for at most a while."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it has finished; None is nothing to stop."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def wait_at_most(waiter: asyncio.Future[None], seconds: float) -> None:
    """Wait until ``waiter`` is done or ``seconds`` have passed, whichever comes first.

    What ``asyncio.wait([waiter], timeout=seconds)`` does, at half its cost (it
    builds a set, a future of its own and a callback per future): a parked
    fetch or an acks=all produce waits like this once or twice per record.
    On a timeout the waiter is resolved, so whoever holds it sees it done.
    """
    timer = asyncio.get_running_loop().call_later(seconds, _resolve, waiter)
    try:
        await waiter
    finally:
        timer.cancel()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
