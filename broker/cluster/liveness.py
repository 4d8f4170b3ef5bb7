"""Fencing a peer that is certainly gone: its listener refuses connections.

A broker that dies tells nobody; its etcd lease lasts the session timeout
(``SHOAL_BROKER_SESSION_TIMEOUT_MS``), and only then does the controller
move its leaderships: that wait was most of the failover time after a
crash. But a process that is gone has closed its port, and the kernel of
its host answers a connection with a reset (ECONNREFUSED). That is
certain, where silence is not: a frozen process (SIGSTOP, a long stall)
still has its connections accepted by the kernel, and a cut link fails
with a timeout or an unreachable route, so neither is mistaken for death
here; only the lease ends those.

So every broker knocks on each peer's advertised listener every probe
interval. On a refusal it reads the peer's registration (its lease) from
etcd, knocks once more, and if refused again revokes that lease: the
registration goes at once, the controller (or, if the dead broker was the
controller, the next one) elects new leaders for its partitions, and the
broker, if it was alive after all, finds its lease gone at its next renewal
and registers again (as after a lease expiry, it leads nothing until its
image shows what moved meanwhile).

Why the order read-lease, knock, revoke is safe against a restart: a broker
binds its listener before it registers, so a registration read before a
refused knock cannot belong to an incarnation whose listener was open at
the time of the knock; it is the dead one's (or its successor's that died
too). A clean shutdown revokes its own lease before it closes its listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final, Protocol

from shoal.broker.cluster.model import ClusterImage, NodeId
from shoal.broker.cluster.store import StoreError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 1.0
"""A knock that takes longer is not a refusal (a frozen or unreachable peer)."""


class FencingStore(Protocol):
    async def registration_lease(self, node_id: NodeId) -> tuple[int, str, int] | None:
        """The lease id, host and port of ``node_id``'s registration, if it is registered."""
        ...

    async def fence_broker(self, node_id: NodeId, lease_id: int) -> bool:
        """Revoke ``lease_id`` (ending the registration under it); False if already gone."""
        ...


async def refuses_connections(host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether ``host:port`` actively refuses a TCP connection (nothing listens there)."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError):
        return False  # unreachable, cut off, or too slow: not certain
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


class PeerProbe:
    """Knocks on every peer's listener every ``interval_s``; fences those that refuse."""

    def __init__(self, node_id: NodeId, store: FencingStore, interval_s: float) -> None:
        self.node_id = node_id
        self.store = store
        self.interval_s = interval_s
        self._peers: dict[NodeId, tuple[str, int]] = {}

    def on_image(self, image: ClusterImage) -> None:
        self._peers = {
            node: (registration.host, registration.port)
            for node, registration in image.brokers.items()
            if node != self.node_id
        }

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            peers = list(self._peers.items())
            if peers:
                await asyncio.gather(*(self.check(node, *address) for node, address in peers))

    async def check(self, node_id: NodeId, host: str, port: int) -> bool:
        """Knock on one peer; True if it was fenced."""
        if not await refuses_connections(host, port):
            return False
        try:
            found = await self.store.registration_lease(node_id)
            if found is None:
                return False
            lease_id, host, port = found
            if not await refuses_connections(host, port):
                return False
            fenced = await self.store.fence_broker(node_id, lease_id)
        except StoreError as exc:
            log.info("event=broker_fence_failed node_id=%d error=%s", node_id, exc)
            return False
        if fenced:
            log.warning(
                "event=broker_fenced node_id=%d address=%s:%d reason=connection_refused by=%d",
                node_id,
                host,
                port,
                self.node_id,
            )
        return fenced
