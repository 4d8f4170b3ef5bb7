"""Turns for the logins' work, so that a storm of them cannot crowd out sessions already in.

A login costs the gateway a few steps of Python (decoding ApiVersions, SaslHandshake
and SaslAuthenticate, checking the key, encoding the answers), a fraction of a
millisecond each. A thousand clients logging in at once put dozens of those
steps in every round of the event loop, and a produce request of a session
already in waits behind all of them, twice (its request, then its answer):
a neighbour's produce p99 went from 2 ms to 13-23 ms during a storm of a thousand
(5-11 ms with the turns and the accepts below). The event loop
has no priorities, so the steps of logins take turns instead: at most
:data:`TURNS_PER_ROUND` of them start in one round of the loop, and the rest
wait for the next rounds. Logins take a little longer in a storm; sessions that
are in never queue behind more than a few login steps.

A turn is not held across waits (a client that is slow to send its next frame
holds nothing): it is given back when the loop's next round begins.

Accepting is the other half: asyncio accepts up to a server's ``backlog``
connections in one callback (and starts a task for each), which took 3-9 ms
of one round when a storm's connections queued up. Each listening socket
accepts :data:`ACCEPTS_PER_ROUND` per round instead, while the kernel still
queues up to :data:`LISTEN_BACKLOG` for it (:func:`listen_deeply`; Linux caps
it at ``net.core.somaxconn``).

The turns are for SASL logins (and re-authentication); TLS handshakes,
asyncio's or :mod:`shoal.gateway.tls_stream`'s, take none.
"""

from __future__ import annotations

import asyncio
from typing import Final

TURNS_PER_ROUND: Final = 2
ACCEPTS_PER_ROUND: Final = 4
"""The ``backlog`` to give :func:`asyncio.start_server`: connections accepted per round."""
LISTEN_BACKLOG: Final = 1024
"""Connections the kernel queues for a listener while the gateway gets to them."""


class LoginTurns:
    """Hands out at most ``per_round`` turns in each round of the running loop."""

    def __init__(self, per_round: int = TURNS_PER_ROUND) -> None:
        self._turns = asyncio.Semaphore(per_round)

    async def take(self) -> None:
        """Wait for a turn; the work that follows until the next ``await`` runs in it."""
        await self._turns.acquire()
        # call_soon runs in the next round: the ready queue of this one is fixed when
        # it begins, so turns taken in a round are all given back after it.
        asyncio.get_running_loop().call_soon(self._turns.release)


def listen_deeply(server: asyncio.Server) -> None:
    """Give ``server``'s sockets a kernel queue of :data:`LISTEN_BACKLOG`: asyncio set it
    to the ``backlog`` it accepts per round, which would drop a storm's connections."""
    for listening in server.sockets:
        # asyncio's wrapper offers no listen(); a duplicate reaches the same socket.
        with listening.dup() as same:
            same.listen(LISTEN_BACKLOG)
