"""The broker's etcd store against a real etcd: registration and its lease."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

import pytest
from harness import EtcdServer
from shoal.broker.cluster.etcd_store import EtcdMetadataStore
from shoal.broker.cluster.model import (
    BrokerRegistration,
    NodeId,
    PartitionState,
    TopicName,
    TopicRecord,
)
from shoal.broker.cluster.store import ConflictError, StoreUnavailableError, TopicExistsError


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


def _wedge_loop(seconds: float) -> None:
    """Block the calling event loop, as a long synchronous step in a broker would."""
    time.sleep(seconds)


async def _registered(reader: EtcdMetadataStore, node_id: int) -> bool:
    return await reader.registration_lease(NodeId(node_id)) is not None


async def test_a_busy_event_loop_keeps_the_session_and_a_wedged_one_loses_it(
    etcd: EtcdServer,
) -> None:
    """Renewals go out from a thread of their own: a loop blocked for most of the TTL
    keeps the lease (no false failover under load); one blocked past the stall timeout
    does not (a wedged broker is fenced like a frozen one)."""
    url = etcd.chroot_url()
    store = EtcdMetadataStore(url)
    reader = EtcdMetadataStore(url)
    await store.connect()
    await reader.connect()
    try:
        await store.register_broker(
            BrokerRegistration(NodeId(8), "127.0.0.1", 9093),
            ttl_s=2,
            heartbeat_s=0.25,
            stall_timeout_s=4,
        )
        _wedge_loop(3.0)  # past the 2 s TTL
        assert await _registered(reader, 8)
        assert store.session.may_lead(time.monotonic())
        _wedge_loop(9.0)  # past the 4 s stall timeout, then the 2 s TTL and etcd's check
        assert not await _registered(reader, 8)
        assert not store.session.may_lead(time.monotonic())
        await asyncio.sleep(1.0)  # the loop runs again: the thread registers anew
        assert await _registered(reader, 8)
    finally:
        await store.deregister_broker()
        await store.close()
        await reader.close()


async def test_fencing_a_broker_ends_its_registration_at_once(etcd: EtcdServer) -> None:
    url = etcd.chroot_url()
    store = EtcdMetadataStore(url)
    peer = EtcdMetadataStore(url)
    await store.connect()
    await peer.connect()
    try:
        await store.register_broker(BrokerRegistration(NodeId(9), "127.0.0.1", 9094), ttl_s=9)
        found = await peer.registration_lease(NodeId(9))
        assert found is not None and found[1:] == ("127.0.0.1", 9094)
        assert await peer.fence_broker(NodeId(9), found[0])
        assert await peer.registration_lease(NodeId(9)) is None
        assert not await peer.fence_broker(NodeId(9), found[0])
    finally:
        await store.close()
        await peer.close()


async def test_topics_larger_than_one_etcd_transaction_are_created_and_grown_whole(
    etcd: EtcdServer,
) -> None:
    """etcd takes at most 128 operations in a transaction: a topic of 1,000 partitions, or
    350 added at once, is written in several, and appears whole once its record is in."""
    url = etcd.chroot_url()
    store = EtcdMetadataStore(url)
    reader = EtcdMetadataStore(url)
    await store.connect()
    await reader.connect()
    replicas = (NodeId(0),)
    record = TopicRecord(TopicName("wide"), uuid.uuid4(), (replicas,) * 1000)
    try:
        revision = await store.create_topic(record, [PartitionState(NodeId(0), 0, replicas)] * 1000)
        image = await anext(reader.images())
        assert image.revision >= revision
        topic = image.topics[TopicName("wide")]
        assert topic.record == record
        assert sorted(topic.partitions) == list(range(1000))
        with pytest.raises(TopicExistsError):
            await store.create_topic(record, [PartitionState(NodeId(0), 0, replicas)] * 1000)

        grown = dataclasses.replace(record, assignment=(replicas,) * 1350)
        added = {i: PartitionState(NodeId(0), 0, replicas) for i in range(1000, 1350)}
        with pytest.raises(ConflictError):
            await store.update_topic(grown, topic.revision - 1, added)
        await store.update_topic(grown, topic.revision, added)
        image = await anext(reader.images())
        assert sorted(image.topics[TopicName("wide")].partitions) == list(range(1350))
    finally:
        await store.close()
        await reader.close()


async def test_two_requests_writing_one_wide_topic_at_once_do_not_mix(etcd: EtcdServer) -> None:
    """Brokers create topics themselves when the controller is away (and auto-create):
    two creations of one name, each in several transactions, must not leave partitions
    whose state came from the request whose record lost."""
    url = etcd.chroot_url()
    stores = [EtcdMetadataStore(url) for _ in range(3)]
    for store in stores:
        await store.connect()
    name = TopicName("contested")

    async def create(node: int) -> int:
        replicas = (NodeId(node),)
        record = TopicRecord(name, uuid.uuid4(), (replicas,) * 500)
        return await stores[node].create_topic(
            record, [PartitionState(NodeId(node), 0, replicas)] * 500
        )

    try:
        outcomes = await asyncio.gather(create(0), create(1), return_exceptions=True)
        # The loser hears the topic exists, or, while the winner is still writing, to retry.
        refused = [o for o in outcomes if isinstance(o, TopicExistsError | StoreUnavailableError)]
        assert len(refused) == 1 and len(outcomes) == 2, outcomes
        topic = (await anext(stores[2].images())).topics[name]
        (winner,) = set(topic.record.assignment)
        assert sorted(topic.partitions) == list(range(500))
        assert {state.leader for state in topic.partitions.values()} == set(winner)
        # The marker went with the write: the topic can be grown.
        grown = dataclasses.replace(topic.record, assignment=(winner,) * 700)
        added = {i: PartitionState(winner[0], 0, winner) for i in range(500, 700)}
        await stores[2].update_topic(grown, topic.revision, added)
    finally:
        for store in stores:
            await store.close()
