"""Turns for the logins' work, so that a storm of them cannot crowd out sessions already in.

A login costs the gateway a few steps of Python (decoding ApiVersions, SaslHandshake
and SaslAuthenticate, checking the key, encoding the answers), a fraction of a
millisecond each. A thousand clients logging in at once put dozens of those
steps in every round of the event loop, and a produce request of a session
already in waits behind all of them at each of its steps (its request read,
forwarded, answered, written): a neighbour's produce p99 went from 2 ms to
13-23 ms during a storm of a thousand. The event loop has no priorities, so the
steps of logins take turns instead: at most :data:`TURNS_PER_ROUND` of them
start in one round of the loop, and the rest wait for the next rounds. Sessions
that are in never queue behind more than one login step. A storm does not take
longer for it: a thousand logins took 0.6-1.1 s with two turns a round and with
one, which the clients' own pace sets.

A turn is not held across waits (a client that is slow to send its next frame
holds nothing): it is given back when the loop's next round begins. So work that
goes on after a wait takes a turn again (:meth:`LoginTurns.keep`): a key's check
waits for its hash, and every login of that key that arrived meanwhile waits on
the same check (:mod:`shoal.tenancy.verifier`), so all of them went on in the one
round the hash ended, 30 refusals encoded in 5.5 ms while a neighbour's produce
waited behind them.

Accepting is the other half: asyncio accepts up to a server's ``backlog``
connections in one callback (and starts a task for each), which took 3-9 ms
of one round when a storm's connections queued up. Each listening socket
accepts :data:`ACCEPTS_PER_ROUND` per round instead, while the kernel still
queues up to :data:`LISTEN_BACKLOG` for it (:func:`listen_deeply`; Linux caps
it at ``net.core.somaxconn``). An idle round is a few microseconds, so one a
round still accepts thousands a second.

Measured with the storm test (tests/integration/test_gateway_connection_storm.py,
medians of five to eight runs of the neighbour's p99 during the storm): 8.0 ms with two
turns and four accepts a round, 6.7 with one turn and two accepts, 5.1 with one
of each; 4.6 once accepts also stopped growing the descriptor table
(:mod:`shoal.descriptor_table`), against 2.4 before the storm.

The turns are for SASL logins (and re-authentication); TLS handshakes,
asyncio's or :mod:`shoal.gateway.tls_stream`'s, take none.
"""

from __future__ import annotations

import asyncio
from typing import Final

TURNS_PER_ROUND: Final = 1
ACCEPTS_PER_ROUND: Final = 1
"""The ``backlog`` to give :func:`asyncio.start_server`: connections accepted per round."""
LISTEN_BACKLOG: Final = 1024
"""Connections the kernel queues for a listener while the gateway gets to them."""


class LoginTurns:
    """Hands out at most ``per_round`` turns in each round of the running loop."""

    def __init__(self, per_round: int = TURNS_PER_ROUND) -> None:
        self._turns = asyncio.Semaphore(per_round)
        self._given_back = 0
        """Turns given back so far: a turn taken when this was N has ended once it moves."""

    async def take(self) -> int:
        """Wait for a turn; the work that follows until the next ``await`` runs in it.
        Returns the turn, for :meth:`keep`."""
        await self._turns.acquire()
        # call_soon runs in the next round: the ready queue of this one is fixed when
        # it begins, so turns taken in a round are all given back after it.
        asyncio.get_running_loop().call_soon(self._give_back)
        return self._given_back

    async def keep(self, turn: int) -> int:
        """Go on in ``turn`` if it has not ended (nothing waited since it was taken),
        or wait for a new one. Returns the turn the work goes on in."""
        if turn == self._given_back:
            return turn
        # Another login's turn given back in this round also ends ``turn`` here: one
        # turn more than needed, never one fewer.
        return await self.take()

    def _give_back(self) -> None:
        self._given_back += 1
        self._turns.release()


def listen_deeply(server: asyncio.Server) -> None:
    """Give ``server``'s sockets a kernel queue of :data:`LISTEN_BACKLOG`: asyncio set it
    to the ``backlog`` it accepts per round, which would drop a storm's connections."""
    for listening in server.sockets:
        # asyncio's wrapper offers no listen(); a duplicate reaches the same socket.
        with listening.dup() as same:
            same.listen(LISTEN_BACKLOG)
