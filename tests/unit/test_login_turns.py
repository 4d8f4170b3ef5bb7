"""The logins' turns: a few login steps per round of the event loop, and listeners that
accept a few connections per round while the kernel queues the rest.

The storm these protect against, with real clients and a neighbour's latency,
is tests/integration/test_gateway_connection_storm.py.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter

from shoal.gateway.login_turns import ACCEPTS_PER_ROUND, LoginTurns, listen_deeply


class Rounds:
    """Counts the event loop's rounds: a callback that runs once in each and schedules
    itself for the next."""

    def __init__(self) -> None:
        self.now = 0
        self._running = True
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.now += 1
        if self._running:
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._running = False


async def test_at_most_the_turns_per_round_start_in_one_round() -> None:
    turns, rounds = LoginTurns(per_round=2), Rounds()
    started: list[int] = []

    async def login() -> None:
        await turns.take()
        started.append(rounds.now)

    await asyncio.gather(*(login() for _ in range(20)))
    rounds.stop()

    assert len(started) == 20
    assert max(Counter(started).values()) <= 2
    # Taking turns spreads the twenty over about ten rounds, not a hundred.
    assert started[-1] - started[0] < 40


async def test_a_login_waiting_for_its_client_holds_no_turn() -> None:
    turns = LoginTurns(per_round=1)
    never = asyncio.Event()

    async def slow_client() -> None:
        await turns.take()
        await never.wait()

    stuck = asyncio.create_task(slow_client())
    await asyncio.sleep(0)
    try:
        async with asyncio.timeout(1):
            for _ in range(5):
                await turns.take()
    finally:
        stuck.cancel()


async def test_a_listener_with_a_small_accept_backlog_still_queues_a_storm_in_the_kernel() -> None:
    accepted: list[asyncio.StreamWriter] = []
    all_accepted = asyncio.Event()

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        if len(accepted) == 200:
            all_accepted.set()

    server = await asyncio.start_server(accept, "127.0.0.1", 0, backlog=ACCEPTS_PER_ROUND)
    listen_deeply(server)
    port = server.sockets[0].getsockname()[1]
    clients: list[socket.socket] = []
    try:
        # The loop is held here, as a busy gateway's would be: nothing is accepted, and
        # every connect must complete in the kernel's queue. With a queue of
        # ACCEPTS_PER_ROUND, the SYNs past it are dropped and these connects time out.
        clients.extend(
            socket.create_connection(("127.0.0.1", port), timeout=0.5) for _ in range(200)
        )
        async with asyncio.timeout(10):
            await all_accepted.wait()
    finally:
        for client in clients:
            client.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_logins_that_went_on_after_one_wait_take_turns_again() -> None:
    """Every login of a key waits on the same check of its secret (shoal.tenancy.verifier):
    when it ends they all go on in one round unless each takes a turn again."""
    turns, rounds = LoginTurns(per_round=2), Rounds()
    checked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    all_waiting = asyncio.Event()
    waiting: list[int] = []
    went_on: list[int] = []

    async def login() -> None:
        turn = await turns.take()
        waiting.append(turn)
        if len(waiting) == 20:
            all_waiting.set()
        await checked
        await turns.keep(turn)
        went_on.append(rounds.now)

    logins = asyncio.gather(*(login() for _ in range(20)))
    await all_waiting.wait()
    checked.set_result(None)
    await logins
    rounds.stop()

    assert len(went_on) == 20
    assert max(Counter(went_on).values()) <= 2


async def test_a_login_that_did_not_wait_goes_on_in_the_turn_it_has() -> None:
    turns, rounds = LoginTurns(per_round=1), Rounds()
    turn = await turns.take()
    round_taken = rounds.now

    assert await turns.keep(turn) == turn
    assert rounds.now == round_taken
    rounds.stop()
