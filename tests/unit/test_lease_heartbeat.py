"""The broker's lease renewals against an etcd that holds some of them and answers others.

A fake etcd client stands in for aetcd's (the thread makes its own, so the
module's ``EtcdClient`` is replaced); real etcd members cut off from their
quorum are in tests/integration/test_fault_network.py (``etcd_minority``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from shoal.broker.cluster import heartbeat
from shoal.broker.cluster.heartbeat import LeaseHeartbeat
from shoal.broker.cluster.session import BrokerSession

from shoal.etcd_address import EtcdAddress

INTERVAL_S = 0.1
TTL_S = 3


class HangingEtcd:
    """Each client made holds its first ``hang`` renewals forever and answers the rest,
    as a connection to a member cut off with a minority (or over a dead link) does."""

    made: ClassVar[list[HangingEtcd]] = []
    hang = 1

    def __init__(self, address: EtcdAddress, timeout: float | None) -> None:
        self.renewals = 0
        self.answered = 0
        self.closed = False
        HangingEtcd.made.append(self)

    async def refresh_lease(self, lease_id: int) -> Any:
        self.renewals += 1
        if self.renewals <= HangingEtcd.hang:
            await asyncio.Event().wait()
        self.answered += 1
        return SimpleNamespace(TTL=TTL_S)

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def hanging_etcd(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[HangingEtcd]]:
    HangingEtcd.made = []
    HangingEtcd.hang = 1
    monkeypatch.setattr(heartbeat, "EtcdClient", HangingEtcd)
    yield HangingEtcd


def came_true(check: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``check`` held within ``timeout_s`` (asked every 50 ms; the heartbeat's
    own thread makes the changes, so nothing here can wait on an event of it)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def beating(session: BrokerSession, address: str) -> LeaseHeartbeat:
    """A heartbeat for lease 7, started (its thread makes its own clients)."""
    beat = LeaseHeartbeat(
        EtcdAddress.parse(address), 5.0, session, b"/shoal/brokers/0", lambda: b"{}",
        TTL_S, INTERVAL_S, stall_timeout_s=5.0,
    )  # fmt: skip
    beat.start(7)
    return beat


@pytest.fixture
def session() -> BrokerSession:
    """A broker's session, just renewed."""
    fresh = BrokerSession(retry_window_s=0.0)
    fresh.renewed(time.monotonic(), TTL_S)
    return fresh


def test_a_renewal_held_by_etcd_does_not_hold_up_the_next(
    hanging_etcd: type[HangingEtcd], session: BrokerSession
) -> None:
    started = time.monotonic()

    async def beat_a_while() -> None:
        beat = beating(session, "http://etcd-0:2379,etcd-1:2379,etcd-2:2379")
        try:
            await asyncio.sleep(10 * INTERVAL_S)
        finally:
            await beat.stop()

    asyncio.run(beat_a_while())
    # Renewals after the held one were answered meanwhile, and kept the session fresh.
    assert sum(client.answered for client in hanging_etcd.made) >= 5
    assert session.valid_until > started + 0.5 + TTL_S - 0.5


def test_a_renewal_that_times_out_retires_its_connection(
    hanging_etcd: type[HangingEtcd], session: BrokerSession
) -> None:
    async def retired() -> None:
        beat = beating(session, "http://etcd-0:2379")
        try:
            # The held renewal's deadline is interval + PENDING_S; a loaded machine is slow.
            # Closed by the heartbeat itself, not by its stop (which is after this).
            retired_in_time = await asyncio.to_thread(
                came_true,
                lambda: len(hanging_etcd.made) >= 2 and hanging_etcd.made[0].closed,
                10.0,
            )
            assert retired_in_time, f"connections made: {len(hanging_etcd.made)}"
        finally:
            await beat.stop()

    asyncio.run(retired())
