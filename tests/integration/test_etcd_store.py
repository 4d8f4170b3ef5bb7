"""The broker's etcd store against a real etcd: registration and its lease."""

from __future__ import annotations

import asyncio

from harness import EtcdServer
from shoal.broker.cluster.etcd_store import EtcdMetadataStore
from shoal.broker.cluster.model import BrokerRegistration


async def test_a_deregistered_broker_closes_cleanly_after_its_keepalive_would_have_run(
    etcd: EtcdServer,
) -> None:
    # A broker's shutdown deregisters, then closes the store; a keep-alive
    # round falling between the two once crashed the shutdown (exit code 1).
    url = etcd.chroot_url()
    store = EtcdMetadataStore(url)
    await store.connect()
    await store.register_broker(BrokerRegistration(7, "127.0.0.1", 9092), ttl_s=2)
    await store.deregister_broker()
    await asyncio.sleep(1.5)  # two keep-alive intervals (ttl / 3)
    await store.close()

    reader = EtcdMetadataStore(url)
    await reader.connect()
    try:
        image = await anext(reader.images())
        assert 7 not in image.brokers
    finally:
        await reader.close()
