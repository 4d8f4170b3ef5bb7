"""Topic resources against a real broker and etcd: what the operator's Topic handler does.

Each test uses its own tenant, so the tests share one broker and stay apart; the
under-replication test starts three brokers of its own.
The topic is checked with confluent-kafka's AdminClient, as a user would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource
from conftest import BrokerFactory
from harness import BrokerProcess
from replicated import REPLICATED_ENV
from shoal.operator.kafka_admin import ClusterAdmin
from shoal.operator.topics import TopicError, TopicSpec, reconcile_topic, remove_topic
from shoal.tenancy.model import Quotas, Tenant
from shoal.tenancy.store import TenancyStore

pytestmark = pytest.mark.slow


@pytest.fixture
async def store(broker: BrokerProcess) -> AsyncIterator[TenancyStore]:
    async with TenancyStore(broker.etcd_url) as tenancy:
        yield tenancy


@pytest.fixture
async def admin(broker: BrokerProcess) -> AsyncIterator[ClusterAdmin]:
    async with ClusterAdmin(broker.bootstrap) as client:
        yield client


def topic(tenant: str, name: str = "orders", **spec: Any) -> TopicSpec:
    return TopicSpec.from_resource(
        name, {"cluster": "demo", "tenant": tenant, "partitions": 1, "replicas": 1, **spec}
    )


async def new_tenant(store: TenancyStore, name: str, max_partitions: int | None = None) -> None:
    quotas = Quotas(max_partitions=max_partitions)
    await store.create_tenant(Tenant(name, int(time.time() * 1000), quotas))


def described(broker: BrokerProcess, name: str) -> tuple[int, int] | None:
    """(partitions, replicas) of a broker-side topic, or None if it does not exist."""
    found = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    if name not in found.topics:
        return None
    partitions = found.topics[name].partitions
    return len(partitions), len(partitions[0].replicas)


def overrides(broker: BrokerProcess, name: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    entries = admin.describe_configs([resource])[resource].result(10)
    return {
        k: e.value
        for k, e in entries.items()
        if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    }


async def test_a_topic_is_created_grown_reconfigured_and_removed(
    broker: BrokerProcess, store: TenancyStore, admin: ClusterAdmin
) -> None:
    await new_tenant(store, "acme")
    spec = topic(
        "acme", partitions=2, config={"retention.ms": "60000", "cleanup.policy": "compact"}
    )

    status = await reconcile_topic(admin, store, spec)

    assert described(broker, "acme.orders") == (2, 1)
    assert overrides(broker, "acme.orders") == {
        "retention.ms": "60000",
        "cleanup.policy": "compact",
    }
    assert status["topicName"] == "orders"
    assert status["partitions"] == 2 and status["replicas"] == 1
    assert status["underReplicated"] == 0
    assert len(status["topicId"]) == 22  # Kafka's base64 topic id

    grown = topic("acme", partitions=5, config={"retention.ms": "120000"})
    again = await reconcile_topic(admin, store, grown)

    assert described(broker, "acme.orders") == (5, 1)
    # cleanup.policy left the spec, so it is back at the cluster's default
    assert overrides(broker, "acme.orders") == {"retention.ms": "120000"}
    assert again["partitions"] == 5 and again["topicId"] == status["topicId"]

    await remove_topic(admin, grown)
    assert described(broker, "acme.orders") is None
    await remove_topic(admin, grown)  # already gone: no error


async def test_compression_type_is_set_from_the_spec_and_a_bad_codec_is_the_users_to_fix(
    broker: BrokerProcess, store: TenancyStore, admin: ClusterAdmin
) -> None:
    await new_tenant(store, "squeeze")
    spec = topic("squeeze", config={"compression.type": "lz4", "compression.lz4.level": "12"})

    await reconcile_topic(admin, store, spec)

    assert overrides(broker, "squeeze.orders") == {
        "compression.type": "lz4",
        "compression.lz4.level": "12",
    }
    for bad in ({"compression.type": "brotli"}, {"compression.gzip.level": "10"}):
        with pytest.raises(TopicError) as caught:
            await reconcile_topic(admin, store, topic("squeeze", config=bad))
        assert not caught.value.retryable
        assert next(iter(bad)) in str(caught.value)
    assert overrides(broker, "squeeze.orders")["compression.type"] == "lz4"


async def test_a_deleted_topic_is_recreated(
    broker: BrokerProcess, store: TenancyStore, admin: ClusterAdmin
) -> None:
    await new_tenant(store, "drift")
    spec = topic("drift", "events", partitions=3)
    first = await reconcile_topic(admin, store, spec)
    outsider = AdminClient({"bootstrap.servers": broker.bootstrap})  # alive until answered
    outsider.delete_topics(["drift.events"])["drift.events"].result(10)
    assert described(broker, "drift.events") is None

    repaired = await reconcile_topic(admin, store, spec)

    assert described(broker, "drift.events") == (3, 1)
    assert repaired["topicId"] != first["topicId"]


async def test_topic_name_defaults_to_the_resource_name_and_can_be_set(
    broker: BrokerProcess, store: TenancyStore, admin: ClusterAdmin
) -> None:
    await new_tenant(store, "naming")
    status = await reconcile_topic(admin, store, topic("naming", "k8s-name", topicName="a.b_c"))
    assert status["topicName"] == "a.b_c"
    assert described(broker, "naming.a.b_c") == (1, 1)
    assert described(broker, "naming.k8s-name") is None


async def test_a_missing_tenant_is_a_retryable_error(
    broker: BrokerProcess, store: TenancyStore, admin: ClusterAdmin
) -> None:
    with pytest.raises(TopicError) as caught:
        await reconcile_topic(admin, store, topic("ghost"))
    assert caught.value.retryable
    assert str(caught.value) == "tenant ghost does not exist on cluster demo"
    assert described(broker, "ghost.orders") is None


async def test_the_tenants_partition_limit_counts_all_its_topics(
    broker: BrokerProcess, store: TenancyStore, admin: ClusterAdmin
) -> None:
    await new_tenant(store, "small", max_partitions=4)
    await reconcile_topic(admin, store, topic("small", "one", partitions=3))

    with pytest.raises(TopicError) as refused:
        await reconcile_topic(admin, store, topic("small", "two", partitions=2))
    assert not refused.value.retryable
    assert "at most 4 partitions" in str(refused.value)
    assert "holds 3" in str(refused.value)
    assert described(broker, "small.two") is None

    with pytest.raises(TopicError, match="at most 4 partitions"):
        await reconcile_topic(admin, store, topic("small", "one", partitions=5))
    assert described(broker, "small.one") == (3, 1)

    await reconcile_topic(admin, store, topic("small", "one", partitions=4))
    assert described(broker, "small.one") == (4, 1)


async def test_shrinking_and_changing_replicas_are_refused(
    broker: BrokerProcess, store: TenancyStore, admin: ClusterAdmin
) -> None:
    await new_tenant(store, "fixed")
    await reconcile_topic(admin, store, topic("fixed", partitions=2))

    with pytest.raises(TopicError, match="can only be added") as shrink:
        await reconcile_topic(admin, store, topic("fixed", partitions=1))
    assert not shrink.value.retryable
    with pytest.raises(TopicError, match=r"spec\.replicas is 3") as replicas:
        await reconcile_topic(admin, store, topic("fixed", partitions=2, replicas=3))
    assert not replicas.value.retryable
    assert described(broker, "fixed.orders") == (2, 1)


async def test_a_replication_factor_the_cluster_cannot_hold_is_reported(
    broker: BrokerProcess, store: TenancyStore, admin: ClusterAdmin
) -> None:
    await new_tenant(store, "big")
    with pytest.raises(TopicError, match=r"[Rr]eplication factor") as caught:
        await reconcile_topic(admin, store, topic("big", replicas=3))
    assert not caught.value.retryable
    assert described(broker, "big.orders") is None


async def test_partitions_short_of_replicas_are_counted(broker_factory: BrokerFactory) -> None:
    brokers = [broker_factory(n, env=REPLICATED_ENV) for n in range(3)]
    bootstrap = ",".join(b.bootstrap for b in brokers[:2])
    spec = topic("ha", partitions=2, replicas=3)
    async with TenancyStore(brokers[0].etcd_url) as store, ClusterAdmin(bootstrap) as admin:
        await new_tenant(store, "ha")
        healthy = await reconcile_topic(admin, store, spec)
        assert (healthy["replicas"], healthy["underReplicated"]) == (3, 0)

        brokers[2].kill()

        async def under_replicated() -> int:
            return int((await reconcile_topic(admin, store, spec))["underReplicated"])

        deadline = time.monotonic() + 20
        while await under_replicated() != 2:
            assert time.monotonic() < deadline, "broker 2 never left the ISR"
            await asyncio.sleep(0.2)
