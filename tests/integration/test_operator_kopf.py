"""The operator as kopf runs it: a fake Kubernetes API, a real Shoal cluster behind it.

One module-wide setup: three real brokers and a real gateway (etcd from the
session), the fake API server (:mod:`kube_fake`, kmock) with its stand-in
StatefulSet controller, and ``run_operator`` in a thread of its own, watching
one namespace. Every Cluster's endpoints resolve to the real local processes, so
the roller and the status ask a real cluster, topics are really created on
the brokers and a Tenant's Secret really works through the gateway. The
Cluster's children live only in the fake API: no pod runs.

Tests use their own Cluster, tenant and topic names; each test's Clusters are
deleted after it.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kopf
import pytest
import pytest_asyncio
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from conftest import GatewayCluster, _teardown, start_gateway_cluster
from harness import BrokerProcess, EtcdServer
from kube_fake import FakeKubeApi, fake_kube_api, run_statefulset_controller
from replicated import REPLICATED_ENV, Cluster
from shoal.operator.builders import TEMPLATE_HASH, broker_template_hash
from shoal.operator.cluster_spec import ClusterSpec
from shoal.operator.context import Intervals, OperatorContext
from shoal.operator.endpoints import ClusterEndpoints, node_reader_binding_name
from shoal.operator.kube import KubeClient
from shoal.operator.runner import run_operator
from shoal.tenancy.store import TenancyStore

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

NS = "streams"
API = "shoal.dev/v1alpha1"
T = TypeVar("T")

INTERVALS = Intervals(
    cluster_status_s=2,
    topic_drift_s=3,
    tenant_drift_s=30,
    retry_s=1,
    roll_safe_timeout_s=2,
    roll_rejoin_timeout_s=4,
    roll_poll_s=0.2,
    pod_ready_timeout_s=10,
    pod_poll_s=0.1,
)


@pytest.fixture(scope="module")
def shoal(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    root = tmp_path_factory.mktemp("operator-kopf")
    cluster, started = start_gateway_cluster(etcd, root, brokers=3, broker_env=REPLICATED_ENV)
    yield cluster
    if cluster.gateway.running:
        cluster.gateway.stop()
    _teardown(started, failed=False)
    shutil.rmtree(root, ignore_errors=True)


@dataclass
class Env:
    api: FakeKubeApi
    kube: KubeClient
    shoal: GatewayCluster


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(shoal: GatewayCluster) -> AsyncIterator[Env]:
    def resolve(namespace: str, cluster: str, brokers: int) -> ClusterEndpoints:
        return ClusterEndpoints(
            etcd_url=shoal.etcd_url,
            brokers_bootstrap=shoal.internal_bootstrap,
            gateway_bootstrap=shoal.gateway.bootstrap,
            gateway_http=shoal.gateway.http_url,
        )

    async with fake_kube_api() as api:
        connection = kopf.ConnectionInfo(server=str(api.url), default_namespace=NS)
        ctx = OperatorContext(
            default_image="shoal:test", resolver=resolve, connection=connection, intervals=INTERVALS
        )
        stop, ready = threading.Event(), threading.Event()
        controller = asyncio.create_task(run_statefulset_controller(api))
        # kopf gets a thread and loop of its own, as an operator process would:
        # when it stops, it cancels every task of its loop it did not start with.
        operator = threading.Thread(
            target=asyncio.run, args=(run_operator(ctx, stop, namespaces=[NS], ready=ready),)
        )
        operator.start()
        assert await asyncio.to_thread(ready.wait, 30)
        async with KubeClient(connection) as kube:
            yield Env(api, kube, shoal)
        stop.set()
        await asyncio.to_thread(operator.join, 30)
        assert not operator.is_alive()
        controller.cancel()


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def clusters_deleted_after(env: Env) -> AsyncIterator[None]:
    """A test's Clusters go when it ends, so their health timers stop asking the brokers."""
    yield
    names = [c["metadata"]["name"] for c in await env.kube.list(API, "Cluster", NS)]
    for name in names:
        await env.kube.delete(API, "Cluster", NS, name)
    for name in names:
        await gone(env, "Cluster", name)


async def eventually(
    check: Callable[[], Awaitable[T | None]], within_s: float, what: str, interval: float = 0.1
) -> T:
    """The first truthy result of ``check``, polled for up to ``within_s`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            raise TimeoutError(f"timed out after {within_s}s waiting for {what}")
        await asyncio.sleep(interval)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


async def ready_at_generation(kube: KubeClient, kind: str, name: str, within_s: float = 60) -> Any:
    """The object once Ready is True for its current generation."""

    async def check() -> dict[str, Any] | None:
        obj = await kube.get(API, kind, NS, name)
        if obj is None:
            return None
        ready = condition(obj, "Ready")
        generation = obj["metadata"]["generation"]
        fresh = (obj.get("status") or {}).get("observedGeneration") == generation
        return obj if fresh and ready.get("status") == "True" else None

    return await eventually(check, within_s, f"{kind} {name} Ready")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def cluster_manifest(name: str, image: str = "shoal:1", brokers: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"image": image, "brokers": {"replicas": brokers}},
    }


def broker_topics(env: Env) -> dict[str, int]:
    """Broker-side topic names -> partition counts, as confluent-kafka sees them."""
    found = AdminClient({"bootstrap.servers": env.shoal.internal_bootstrap}).list_topics(timeout=10)
    return {name: len(t.partitions) for name, t in found.topics.items()}


async def ensure_cluster(env: Env, name: str) -> dict[str, Any]:
    await env.kube.apply(cluster_manifest(name))
    return await ready_at_generation(env.kube, "Cluster", name)


async def broker_pods(env: Env, cluster: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={cluster},app.kubernetes.io/component=broker"
    return await env.kube.list("v1", "Pod", NS, selector)


# --- Cluster ---------------------------------------------------------------------------------


async def test_a_cluster_gets_its_children_owned_and_reports_ready(env: Env) -> None:
    name = unique("c")
    await env.kube.apply(cluster_manifest(name))
    cluster = await ready_at_generation(env.kube, "Cluster", name)
    uid = cluster["metadata"]["uid"]

    expected = {
        ("apps/v1", "statefulsets", f"{name}-etcd"),
        ("apps/v1", "statefulsets", f"{name}-broker"),
        ("v1", "services", f"{name}-etcd"),
        ("v1", "services", f"{name}-etcd-client"),
        ("v1", "services", f"{name}-broker"),
        ("v1", "services", f"{name}-gateway"),
        ("apps/v1", "deployments", f"{name}-gateway"),
    }
    for api_version, plural, child in expected:
        assert env.api.exists(api_version, plural, NS, child), (plural, child)
    kinds_owned = {}
    for api_version, plural in [
        ("apps/v1", "statefulsets"),
        ("apps/v1", "deployments"),
        ("v1", "services"),
        ("v1", "configmaps"),
        ("policy/v1", "poddisruptionbudgets"),
        ("networking.k8s.io/v1", "networkpolicies"),
    ]:
        children = [
            o
            for o in env.api.all_of(api_version, plural, NS)
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == name
        ]
        assert children, plural
        for child in children:
            (owner,) = child["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"]) == ("Cluster", name, uid)
            assert owner["controller"] is True
        kinds_owned[plural] = len(children)
    assert kinds_owned["poddisruptionbudgets"] >= 2  # etcd and brokers at least

    status = cluster["status"]
    assert status["brokers"] == {"desired": 3, "ready": 3}
    assert status["partitions"]["offline"] == 0
    assert status["bootstrap"] == env.shoal.gateway.bootstrap
    assert status["image"] == "shoal:1"
    assert condition(cluster, "Reconciling")["status"] == "False"
    assert condition(cluster, "Degraded")["status"] == "False"
    # It said Reconciling before it said Ready.
    history = env.api.objects[f"{API}/clusters", NS, name].history
    seen = [
        (condition(dict(v), "Reconciling").get("status"), condition(dict(v), "Ready").get("status"))
        for v in history
        if v is not None
    ]
    assert ("True", "False") in seen
    assert seen.index(("True", "False")) < seen.index(("False", "True"))


async def test_deleting_a_cluster_removes_its_cluster_scoped_node_reader_binding(
    env: Env,
) -> None:
    racked = unique("racked")
    manifest = cluster_manifest(racked)
    manifest["spec"]["brokers"]["rackLabel"] = "topology.kubernetes.io/zone"
    await env.kube.apply(manifest)
    cluster = await ready_at_generation(env.kube, "Cluster", racked)
    binding = node_reader_binding_name(NS, racked)
    assert env.api.exists("rbac.authorization.k8s.io/v1", "clusterrolebindings", None, binding)
    assert cluster["metadata"].get("finalizers")  # held until the operator removed it

    assert await env.kube.delete(API, "Cluster", NS, racked)
    await gone(env, "Cluster", racked)
    assert not env.api.exists("rbac.authorization.k8s.io/v1", "clusterrolebindings", None, binding)


async def test_a_new_image_rolls_every_broker_one_at_a_time(env: Env) -> None:
    name = unique("roll")
    cluster = await ensure_cluster(env, name)
    before = {
        p["metadata"]["name"]: p
        for p in await env.kube.list(
            "v1", "Pod", NS, f"app.kubernetes.io/instance={name},app.kubernetes.io/component=broker"
        )
    }
    assert len(before) == 3
    old_hash = {p["metadata"]["annotations"][TEMPLATE_HASH] for p in before.values()}

    await env.kube.apply(cluster_manifest(name, image="shoal:2"))
    rolled = await ready_at_generation(env.kube, "Cluster", name, within_s=90)
    assert rolled["metadata"]["generation"] == cluster["metadata"]["generation"] + 1
    assert rolled["status"]["image"] == "shoal:2"

    after = {
        p["metadata"]["name"]: p
        for p in await env.kube.list(
            "v1", "Pod", NS, f"app.kubernetes.io/instance={name},app.kubernetes.io/component=broker"
        )
    }
    assert after.keys() == before.keys()
    new_hash = {p["metadata"]["annotations"][TEMPLATE_HASH] for p in after.values()}
    assert len(new_hash) == 1 and new_hash != old_hash
    for pod_name, pod in after.items():
        assert pod["metadata"]["uid"] != before[pod_name]["metadata"]["uid"]

    # One at a time: each deletion comes after the previous pod's successor was Ready.
    deletions = [pod for plural, _, pod in env.api.deletions if plural == "pods" and pod in before]
    assert sorted(deletions) == sorted(before)
    progress = [
        condition(dict(v), "Reconciling").get("message", "")
        for v in env.api.objects[f"{API}/clusters", NS, name].history
        if v is not None
    ]
    announced = [m for m in dict.fromkeys(progress) if m.startswith("restarting broker")]
    assert [m.split()[2] for m in announced] == [pod.rsplit("-", 1)[1] for pod in deletions]


async def test_a_roll_waits_while_a_restart_would_take_a_partition_below_min_isr(
    env: Env,
) -> None:
    name = unique("safe")
    await ensure_cluster(env, name)
    real = Cluster(env.shoal.brokers)
    topic = await asyncio.to_thread(real.create_topic, unique("guarded"), 3)
    await asyncio.to_thread(real.wait_full_isr, topic)
    # Broker 2 is down, as if its pod had been restarted with the new template
    # and its broker had not come back: the roller has brokers 0 and 1 left,
    # and either restart would leave the topic's ISR below min.insync.replicas=2.
    changed = cluster_manifest(name, image="shoal:safe")
    new_hash = broker_template_hash(ClusterSpec.from_spec(changed["spec"]), "shoal:test")
    await env.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-broker-2",
                "namespace": NS,
                "annotations": {TEMPLATE_HASH: new_hash},
            },
        }
    )
    down = env.shoal.brokers[2]
    await asyncio.to_thread(down.kill)

    async def shrunk() -> bool:
        views = (await asyncio.to_thread(real.partitions, topic)).values()
        return all(2 not in v.isr and v.leader >= 0 for v in views)

    await eventually(shrunk, 30, "broker 2 to leave the ISRs")
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await broker_pods(env, name)}

    await env.kube.apply(changed)
    refused = await degraded_because(env, name, "RollBlocked")
    assert "min.insync.replicas=2" in condition(refused, "Degraded")["message"]
    assert {
        p["metadata"]["name"]: p["metadata"]["uid"] for p in await broker_pods(env, name)
    } == before

    await asyncio.to_thread(down.start)
    rolled = await ready_at_generation(env.kube, "Cluster", name, within_s=60)
    assert rolled["status"]["image"] == "shoal:safe"
    after = {p["metadata"]["name"]: p for p in await broker_pods(env, name)}
    for index in (0, 1):
        pod = after[f"{name}-broker-{index}"]
        assert pod["metadata"]["uid"] != before[f"{name}-broker-{index}"]
        assert pod["metadata"]["annotations"][TEMPLATE_HASH] == new_hash


def replicas_on(env: Env, broker: int) -> int:
    """How many partition replicas broker ``broker`` holds, as Metadata reports."""
    found = AdminClient({"bootstrap.servers": env.shoal.internal_bootstrap}).list_topics(timeout=10)
    return sum(broker in p.replicas for t in found.topics.values() for p in t.partitions.values())


async def test_scaling_moves_partitions_onto_new_brokers_and_off_leaving_ones(
    env: Env, tmp_path: Path
) -> None:
    name = unique("scale")
    await ensure_cluster(env, name)
    await asyncio.to_thread(Cluster(env.shoal.brokers).create_topic, unique("spread"), 6)
    # The fourth broker's pod exists only in the fake API; its process runs here.
    fourth = BrokerProcess(
        env.shoal.brokers[0].etcd_url, tmp_path / "broker-3", 3, env=dict(REPLICATED_ENV)
    )
    await asyncio.to_thread(fourth.start)
    try:
        await env.kube.apply(cluster_manifest(name, brokers=4))
        grown = await ready_at_generation(env.kube, "Cluster", name, within_s=90)
        assert grown["status"]["brokers"] == {"desired": 4, "ready": 4}
        assert (
            env.api.stored("apps/v1", "statefulsets", NS, f"{name}-broker")["spec"]["replicas"] == 4
        )
        ports = {
            p["port"]
            for p in env.api.stored("v1", "services", NS, f"{name}-gateway")["spec"]["ports"]
        }
        assert {9093, 9094, 9095, 9096} <= ports
        assert replicas_on(env, 3) > 0

        await env.kube.apply(cluster_manifest(name, brokers=3))
        shrunk = await ready_at_generation(env.kube, "Cluster", name, within_s=90)
        assert shrunk["status"]["brokers"] == {"desired": 3, "ready": 3}
        assert replicas_on(env, 3) == 0
        assert (
            env.api.stored("apps/v1", "statefulsets", NS, f"{name}-broker")["spec"]["replicas"] == 3
        )
        ports = {
            p["port"]
            for p in env.api.stored("v1", "services", NS, f"{name}-gateway")["spec"]["ports"]
        }
        assert 9096 not in ports
        assert not env.api.exists("v1", "pods", NS, f"{name}-broker-3")
    finally:
        await asyncio.to_thread(fourth.stop)

    # Two brokers cannot hold three replicas: refused, and the brokers stay.
    await env.kube.apply(cluster_manifest(name, brokers=2))
    refused = await degraded_because(env, name, "ScaleDownImpossible")
    assert "keeping 3" in condition(refused, "Degraded")["message"]
    assert env.api.stored("apps/v1", "statefulsets", NS, f"{name}-broker")["spec"]["replicas"] == 3


async def degraded_because(env: Env, name: str, reason: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        obj = await env.kube.get(API, "Cluster", NS, name)
        degraded = condition(obj or {}, "Degraded")
        return (
            obj if degraded.get("status") == "True" and degraded.get("reason") == reason else None
        )

    return await eventually(check, 30, f"Cluster {name} Degraded because {reason}")


# --- Topic and Tenant ------------------------------------------------------------------------


def tenant_manifest(name: str, cluster: str, keys: tuple[str, ...] = ("app",)) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Tenant",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"cluster": cluster, "keys": [{"name": k} for k in keys]},
    }


def topic_manifest(name: str, cluster: str, tenant: str, partitions: int) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Topic",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"cluster": cluster, "tenant": tenant, "partitions": partitions, "replicas": 3},
    }


async def not_ready_because(env: Env, kind: str, name: str, reason: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        obj = await env.kube.get(API, kind, NS, name)
        ready = condition(obj or {}, "Ready")
        return obj if ready.get("status") == "False" and ready.get("reason") == reason else None

    return await eventually(check, 30, f"{kind} {name} not Ready because {reason}")


async def gone(env: Env, kind: str, name: str, within_s: float = 30) -> None:
    async def check() -> bool:
        return await env.kube.get(API, kind, NS, name) is None

    await eventually(check, within_s, f"{kind} {name} to be deleted")


async def test_a_topic_waits_for_its_cluster_and_tenant_then_lives_on_the_brokers(
    env: Env,
) -> None:
    cluster, tenant, topic = unique("late"), unique("acme"), unique("orders")
    await env.kube.apply(topic_manifest(topic, cluster, tenant, partitions=2))
    waiting = await not_ready_because(env, "Topic", topic, "ClusterNotFound")
    assert cluster in condition(waiting, "Ready")["message"]

    await ensure_cluster(env, cluster)
    waiting = await not_ready_because(env, "Topic", topic, "TopicError")
    assert tenant in condition(waiting, "Ready")["message"]
    assert tenant in waiting["status"]["lastError"]

    await env.kube.apply(tenant_manifest(tenant, cluster))
    await ready_at_generation(env.kube, "Tenant", tenant)
    created = await ready_at_generation(env.kube, "Topic", topic)
    on_brokers = f"{tenant}.{topic}"
    assert broker_topics(env).get(on_brokers) == 2
    assert created["status"]["partitions"] == 2
    assert created["status"]["replicas"] == 3
    assert created["status"]["topicName"] == topic
    assert "lastError" not in created["status"]

    # Deleted behind the operator's back: the drift timer makes it again.
    admin = AdminClient({"bootstrap.servers": env.shoal.internal_bootstrap})
    await asyncio.to_thread(admin.delete_topics([on_brokers])[on_brokers].result, 10)

    async def recreated() -> bool:
        again = await env.kube.get(API, "Topic", NS, topic)
        new_id = (again or {}).get("status", {}).get("topicId")
        return new_id not in (None, created["status"]["topicId"])

    await eventually(recreated, 3 * INTERVALS.topic_drift_s + 5, f"{on_brokers} to be recreated")
    assert (await asyncio.to_thread(broker_topics, env)).get(on_brokers) == 2

    await env.kube.apply(topic_manifest(topic, cluster, tenant, partitions=4))
    grown = await ready_at_generation(env.kube, "Topic", topic)
    assert grown["status"]["partitions"] == 4
    assert grown["status"]["observedGeneration"] == created["metadata"]["generation"] + 1
    assert broker_topics(env).get(on_brokers) == 4

    assert await env.kube.delete(API, "Topic", NS, topic)
    await gone(env, "Topic", topic)
    assert on_brokers not in broker_topics(env)


async def test_a_tenant_key_secret_works_through_the_gateway_and_deletion_revokes_it(
    env: Env,
) -> None:
    cluster, tenant, topic = unique("home"), unique("team"), "events"
    await ensure_cluster(env, cluster)
    await env.kube.apply(tenant_manifest(tenant, cluster))
    ready = await ready_at_generation(env.kube, "Tenant", tenant)
    (key,) = ready["status"]["keys"]
    assert ready["status"]["tenant"] == tenant
    assert ready["status"]["keyCount"] == 1

    secret = await env.kube.get("v1", "Secret", NS, key["secretName"])
    assert secret is not None
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Tenant",
        tenant,
        ready["metadata"]["uid"],
    )
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert values["username"] == key["keyId"]
    assert values["bootstrap"] == env.shoal.gateway.bootstrap
    assert f"sasl.username={key['keyId']}" in values["client.properties"]

    async with TenancyStore(env.shoal.etcd_url) as store:
        assert await store.get_tenant(tenant) is not None
        stored_key = await store.get_key(key["keyId"])
        assert stored_key is not None and not stored_key.revoked

    await env.kube.apply(topic_manifest(topic, cluster, tenant, partitions=1))
    await ready_at_generation(env.kube, "Topic", topic)
    client = {
        "bootstrap.servers": values["bootstrap"],
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": values["username"],
        "sasl.password": values["password"],
    }
    await asyncio.to_thread(_produce_and_consume, client, topic)
    assert not await asyncio.to_thread(_refused, client)

    assert await env.kube.delete(API, "Tenant", NS, tenant)
    await gone(env, "Tenant", tenant)
    await gone(env, "Topic", topic)
    assert f"{tenant}.{topic}" not in broker_topics(env)
    assert await env.kube.get("v1", "Secret", NS, key["secretName"]) is None
    async with TenancyStore(env.shoal.etcd_url) as store:
        revoked = await store.get_key(key["keyId"])
        assert revoked is None or revoked.revoked
        assert await store.get_tenant(tenant) is None

    async def key_refused() -> bool:
        return await asyncio.to_thread(_refused, client)

    await eventually(key_refused, 15, "the gateway to refuse the deleted tenant's key")


def _refused(client: dict[str, str]) -> bool:
    try:
        AdminClient(client).list_topics(timeout=3)
    except KafkaException:
        return True
    return False


def _produce_and_consume(client: dict[str, str], topic: str) -> None:
    producer = Producer(client)
    producer.produce(topic, b"hello from the operator's Secret")
    assert producer.flush(30) == 0
    consumer = Consumer({**client, "group.id": "operator-test", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        for _ in range(60):
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                assert message.value() == b"hello from the operator's Secret"
                return
        raise AssertionError("nothing consumed through the gateway")
    finally:
        consumer.close()
