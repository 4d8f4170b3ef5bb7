"""Fencing a peer whose listener refuses connections: PeerProbe over a fake store and
real loopback sockets (a closed port refuses; a listening one, even never answering,
does not)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from shoal.broker.cluster.etcd_store import _keepalive_interval
from shoal.broker.cluster.heartbeat import retry_window
from shoal.broker.cluster.liveness import PeerProbe, refuses_connections
from shoal.broker.cluster.model import BrokerRegistration, ClusterImage, NodeId


class FakeStore:
    def __init__(self, registrations: dict[NodeId, tuple[int, str, int]]) -> None:
        self.registrations = registrations
        self.fenced: list[tuple[NodeId, int]] = []
        self.reads = 0

    async def registration_lease(self, node_id: NodeId) -> tuple[int, str, int] | None:
        self.reads += 1
        return self.registrations.get(node_id)

    async def fence_broker(self, node_id: NodeId, lease_id: int) -> bool:
        self.fenced.append((node_id, lease_id))
        return True


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def frozen_listener() -> Iterator[int]:
    """A listening socket nobody accepts from: the kernel completes the handshake, as it
    does for a process stopped with SIGSTOP."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def image(*brokers: tuple[int, int]) -> ClusterImage:
    registrations = {
        NodeId(node): BrokerRegistration(NodeId(node), "127.0.0.1", port) for node, port in brokers
    }
    return ClusterImage.build("cluster", 1, registrations, {}, None)


def test_a_closed_port_refuses_and_a_frozen_listener_does_not(frozen_listener: int) -> None:
    assert asyncio.run(refuses_connections("127.0.0.1", _closed_port()))
    assert not asyncio.run(refuses_connections("127.0.0.1", frozen_listener))


def test_a_peer_whose_port_is_closed_is_fenced_by_its_registrations_lease() -> None:
    dead = _closed_port()
    store = FakeStore({NodeId(2): (77, "127.0.0.1", dead)})
    probe = PeerProbe(NodeId(1), store, 0.5)
    probe.on_image(image((1, 1), (2, dead)))
    assert asyncio.run(probe.check(NodeId(2), "127.0.0.1", dead))
    assert store.fenced == [(NodeId(2), 77)]


def test_a_frozen_peer_is_left_to_its_session(frozen_listener: int) -> None:
    store = FakeStore({NodeId(2): (77, "127.0.0.1", frozen_listener)})
    probe = PeerProbe(NodeId(1), store, 0.5)
    assert not asyncio.run(probe.check(NodeId(2), "127.0.0.1", frozen_listener))
    assert store.fenced == []
    assert store.reads == 0  # a peer that accepts costs etcd nothing


def test_a_peer_restarted_elsewhere_since_the_first_knock_is_not_fenced(
    frozen_listener: int,
) -> None:
    """Its new registration (read after the first refusal) names a listener that is open:
    the second knock, at that address, is answered."""
    store = FakeStore({NodeId(2): (78, "127.0.0.1", frozen_listener)})
    probe = PeerProbe(NodeId(1), store, 0.5)
    assert not asyncio.run(probe.check(NodeId(2), "127.0.0.1", _closed_port()))
    assert store.fenced == []


def test_a_peer_no_longer_registered_is_not_fenced() -> None:
    store = FakeStore({})
    probe = PeerProbe(NodeId(1), store, 0.5)
    assert not asyncio.run(probe.check(NodeId(2), "127.0.0.1", _closed_port()))
    assert store.fenced == []


def test_the_probe_knocks_on_peers_only() -> None:
    probe = PeerProbe(NodeId(1), FakeStore({}), 0.5)
    probe.on_image(image((1, 9001), (2, 9002), (3, 9003)))
    assert set(probe._peers) == {NodeId(2), NodeId(3)}


def test_renewals_go_out_every_heartbeat_and_at_least_three_times_per_ttl() -> None:
    assert _keepalive_interval(3, 0.25) == 0.25
    assert _keepalive_interval(9, 2.0) == 2.0  # Kafka's 9 s session, 2 s heartbeats
    assert _keepalive_interval(3, 2.0) == 1.0
    assert _keepalive_interval(9) == 3.0


def test_a_broker_frozen_long_enough_to_be_replaced_never_counts_as_still_trying() -> None:
    """A woken zombie whose last renewal failed just before the freeze must not lead on
    that failure: the retry window is shorter than the session less a renewal interval."""
    for ttl_s, heartbeat_s in ((3, 0.25), (2, 0.25), (9, 2.0)):
        interval = _keepalive_interval(ttl_s, heartbeat_s)
        assert interval + 1.0 < retry_window(interval, ttl_s) < ttl_s - interval
