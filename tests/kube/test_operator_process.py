"""``shoal operator`` as a process against the real API server, with the chart's RBAC.

The operator runs as the chart runs it (operator_process.py): ``shoal
operator`` watching every namespace, logged in with a token of the chart's
ServiceAccount, so a call its RBAC does not grant fails here as in a real
cluster. A Cluster's pods run on KWOK's nodes, which start nothing; the
Cluster's broker addresses (an endpoints file) lead to two real ``shoal
broker`` processes on loopback with node ids 0 and 1, so the health the
operator reports and the roller's safety checks are asked of real brokers.

The operator runs as a replica of a kopf peering, as the chart runs it with
``operator.replicas`` above one (its ClusterKopfPeering and peering grants).
One operator, one pair of brokers and one control plane serve the module;
each test has its own namespace and Cluster. The replica test kills the
first replica: the one that took over serves the tests after it. The last
test compares what the chart's RBAC grants the operator with what the API
server's audit log says it used (rbac_audit.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
import yaml
from control_plane import ControlPlane
from harness import BrokerProcess, EtcdServer, start_all
from helm_cli import Helm
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod
from operator_process import (
    PEERING,
    SHOAL,
    OperatorIdentity,
    OperatorProcess,
    VolumeProvisioner,
)
from rbac_audit import Grant, table, use_of
from shoal.operator.builders import TEMPLATE_HASH
from shoal.operator.builders.common import MANAGED_BY
from shoal.operator.kafka_admin import ClusterAdmin

NAME = "demo"
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
RACKED: dict[str, Any] = {
    "brokers": {
        "replicas": 2,
        "rackLabel": "topology.kubernetes.io/zone",
        "config": {"replica_lag_time_max_ms": "20000"},
        "storage": {"size": "1Gi"},
    },
    "etcd": {"replicas": 1, "storage": {"size": "1Gi"}},
    "gateway": {"replicas": 1},
}
BROKER_LABELS = {"app.kubernetes.io/instance": NAME, "app.kubernetes.io/component": "broker"}
T = TypeVar("T")


@dataclass
class Operated:
    """What the module's tests share: the operator process(es) and the brokers behind them."""

    kube: ControlPlane
    operator: OperatorProcess
    """The active replica."""
    brokers: list[BrokerProcess]
    identity: OperatorIdentity
    endpoints: Path
    directory: Path
    replicas: list[OperatorProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.replicas.append(self.operator)

    def replica(self, name: str, priority: int) -> OperatorProcess:
        """Another replica of the operator, started."""
        log = self.directory / f"operator-{name}.log"
        started = OperatorProcess(self.identity, self.endpoints, log, name, priority)
        self.replicas.append(started)
        return started.start()

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def wait(self, check: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll ``check`` until it returns something; on timeout, fail with the operator's log."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                pytest.fail(
                    f"timed out after {timeout} s waiting for {what}\n"
                    f"--- operator log ({self.operator.log_path})\n{self.operator.log_tail()}"
                )
            time.sleep(0.3)

    def cluster(self, namespace: str) -> dict[str, Any] | None:
        found = self.kube.kubectl(
            "get", "cluster.shoal.dev", NAME, "-n", namespace, "-o", "json", check=False
        )
        return json.loads(found.stdout) if found.returncode == 0 else None

    def ready_cluster(self, namespace: str, timeout: float = 90) -> dict[str, Any]:
        """The Cluster once its status says Ready for its current generation."""

        def ready() -> dict[str, Any] | None:
            cluster = self.cluster(namespace)
            if cluster is None:
                return None
            status = cluster.get("status") or {}
            generation = cluster["metadata"]["generation"]
            conditions = {c["type"]: c for c in status.get("conditions") or []}
            condition = conditions.get("Ready", {})
            if (
                status.get("observedGeneration") == generation
                and condition.get("status") == "True"
                and condition.get("observedGeneration") == generation
            ):
                return cluster
            return None

        try:
            return self.wait(ready, timeout, f"Cluster {namespace}/{NAME} to be Ready")
        except pytest.fail.Exception as exc:
            status = (self.cluster(namespace) or {}).get("status")
            pods = self.kube.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout
            conditions = {
                p["metadata"]["name"]: (p.get("status") or {}).get("conditions")
                for p in broker_pods(self.kube, namespace)
            }
            raise AssertionError(
                f"status: {json.dumps(status, indent=1)}\npods:\n{pods}\n"
                f"broker pod conditions: {json.dumps(conditions)}\n{exc}"
            ) from None

    def apply(self, namespace: str, spec: dict[str, Any]) -> None:
        cluster = {
            "apiVersion": "shoal.dev/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": NAME, "namespace": namespace},
            "spec": spec,
        }
        self.kube.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(cluster))

    def delete_cluster(self, namespace: str, timeout: float = 30) -> None:
        """Delete the Cluster and wait until it is gone: well within 30 s (a
        health timer running at that moment once held kopf's finalizer a minute)."""
        self.kube.kubectl("delete", "cluster.shoal.dev", NAME, "-n", namespace, "--wait=false")
        self.wait(
            lambda: self.cluster(namespace) is None,
            timeout,
            f"Cluster {namespace}/{NAME} to be deleted",
        )

    def exists(self, *args: str) -> bool:
        return self.kube.kubectl("get", *args, check=False).returncode == 0

    def forbidden(self) -> list[str]:
        """Lines of the operator's log where the API server refused it something."""
        return [
            line
            for line in self.operator.log().splitlines()
            if "forbidden" in line.lower() or " 403" in line
        ]


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    """Two real brokers (node ids 0 and 1) and their etcd, on loopback."""
    root = tmp_path_factory.mktemp("shoal")
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    chroot = etcd.chroot_url()
    started = [BrokerProcess(chroot, root / f"broker-{n}", n) for n in range(2)]
    try:
        start_all(started)
        yield started
    finally:
        for broker in started:
            if broker.running:
                broker.kill()
        etcd.stop()


def write_endpoints(path: Path, etcd_url: str, bootstrap: str) -> Path:
    """Every Cluster's brokers are the real ones; no gateway runs."""
    path.write_text(
        json.dumps(
            {
                "*": {
                    "etcd_url": etcd_url,
                    "brokers_bootstrap": bootstrap,
                    "gateway_bootstrap": "127.0.0.1:9092",
                    "gateway_http": "http://127.0.0.1:8080",
                }
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def operated(
    kube: ControlPlane,
    helm: Helm,
    crds: list[str],
    brokers: list[BrokerProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operated]:
    directory = tmp_path_factory.mktemp("operator")
    identity = OperatorIdentity(kube, helm, "shoal-operator-test", directory)
    provisioner = VolumeProvisioner(kube).start()
    endpoints = write_endpoints(
        directory / "endpoints.json", brokers[0].etcd_url, ",".join(b.bootstrap for b in brokers)
    )
    operator = OperatorProcess(identity, endpoints, directory / "operator-a.log", "a", 200)
    operated = Operated(kube, operator, brokers, identity, endpoints, directory)
    try:
        operator.start()
        yield operated
    finally:
        for replica in operated.replicas:
            replica.stop()
        provisioner.stop()
        identity.remove()
        kube.kubectl(
            "delete", "pv", "-l", "shoal.dev/test-volume=true", "--wait=false", check=False
        )


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(
        ref["uid"] == uid and ref.get("controller") for ref in obj["metadata"]["ownerReferences"]
    )


def broker_pods(kube: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in BROKER_LABELS.items())
    items: list[dict[str, Any]] = kube.get_json("pods", "-n", namespace, "-l", selector)["items"]
    return items


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def rack_of_node(kube: ControlPlane, namespace: str, node: str, directory: Path) -> Path:
    """Runs ``shoal rack-of-node`` as broker pod's init container would, with its token."""
    account = directory / "serviceaccount"
    account.mkdir()
    token = kube.kubectl("create", "token", "demo-broker", "-n", namespace).stdout.strip()
    (account / "token").write_text(token)
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
    (account / "ca.crt").write_bytes(base64.b64decode(ca))
    out = directory / "rack"
    subprocess.run(
        [
            str(SHOAL), "rack-of-node", "--label", "topology.kubernetes.io/zone",
            "--node", node, "--out", str(out),
            "--api-server", kube.server, "--service-account-dir", str(account),
        ],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return out


def test_a_cluster_becomes_its_children_ready_and_is_deleted_through_the_finalizer(
    operated: Operated, namespace: str, tmp_path: Path
) -> None:
    kube = operated.kube
    operated.apply(namespace, RACKED)
    cluster = operated.ready_cluster(namespace)
    uid = cluster["metadata"]["uid"]

    assert KOPF_FINALIZER in cluster["metadata"]["finalizers"]
    status = cluster["status"]
    assert status["brokers"] == {"desired": 2, "ready": 2}
    assert status["partitions"]["offline"] == 0
    assert status["image"] == "registry.invalid/shoal:test"

    children = kube.get_json(
        "statefulsets,deployments,services,configmaps,poddisruptionbudgets,networkpolicies",
        "-n", namespace, "-l", f"app.kubernetes.io/instance={NAME}",
    )["items"]  # fmt: skip
    made = {(c["kind"], c["metadata"]["name"]) for c in children}
    assert {
        ("StatefulSet", "demo-etcd"),
        ("StatefulSet", "demo-broker"),
        ("Deployment", "demo-gateway"),
        ("Service", "demo-etcd"),
        ("Service", "demo-etcd-client"),
        ("Service", "demo-broker"),
        ("Service", "demo-gateway"),
        ("ConfigMap", "demo-config"),
        ("PodDisruptionBudget", "demo-broker"),
    } <= made, made
    assert all(owned_by(c, uid) for c in children)
    binding = f"shoal-{namespace}-{NAME}-broker-node-reader"
    assert operated.exists("clusterrolebinding", binding)

    # The controllers made the pods, the scheduler put them on KWOK's nodes, KWOK runs them.
    pods = broker_pods(kube, namespace)
    assert sorted(p["metadata"]["name"] for p in pods) == ["demo-broker-0", "demo-broker-1"]
    assert all(p["spec"]["nodeName"].startswith("kwok-node-") and pod_ready(p) for p in pods)
    claims = kube.get_json("pvc", "-n", namespace)["items"]
    assert {c["status"]["phase"] for c in claims} == {"Bound"}

    # The brokers' init container, as KWOK does not run it: `shoal rack-of-node`
    # with a token of the brokers' ServiceAccount, which the operator's binding
    # (a grant the API server let the operator make) lets read its Node.
    node = pods[0]["spec"]["nodeName"]
    rack_file = rack_of_node(kube, namespace, node, tmp_path)
    zone = kube.get_json("node", node)["metadata"]["labels"]["topology.kubernetes.io/zone"]
    assert rack_file.read_text() == zone

    operated.delete_cluster(namespace)
    # Only the operator's finalizer removes the cluster-scoped binding; the
    # garbage collector takes the owned children and, through them, the pods.
    assert not operated.exists("clusterrolebinding", binding)
    children = "statefulsets,deployments,services,configmaps,poddisruptionbudgets,pods"
    selector = f"app.kubernetes.io/instance={NAME}"
    operated.wait(
        lambda: not kube.get_json(children, "-n", namespace, "-l", selector)["items"],
        60,
        "the garbage collector to delete the Cluster's children",
    )
    assert operated.forbidden() == []


@dataclass(frozen=True)
class PodEvent:
    kind: str  # ADDED, MODIFIED, DELETED
    name: str
    uid: str
    ready: bool
    terminating: bool


class PodWatch:
    """Every event of the broker pods of a namespace, as the API server sends them."""

    def __init__(self, kube: ControlPlane, namespace: str) -> None:
        self.client = Client(KubeConfig.from_file(str(kube.kubeconfig)))
        self.namespace = namespace
        self.events: list[PodEvent] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._watch()
        except httpx2.HTTPError:
            return  # the API server went away (a later test restarts it): the watch is over

    def _watch(self) -> None:
        labels: dict[str, Any] = dict(BROKER_LABELS)
        for kind, pod in self.client.watch(Pod, namespace=self.namespace, labels=labels):
            meta = pod.metadata
            assert meta is not None and meta.name and meta.uid
            conditions = (pod.status.conditions if pod.status else None) or []
            self.events.append(
                PodEvent(
                    kind,
                    meta.name,
                    meta.uid,
                    any(c.type == "Ready" and c.status == "True" for c in conditions),
                    meta.deletionTimestamp is not None,
                )
            )


def stale_children(namespace: str, uid: str) -> list[dict[str, Any]]:
    """One object of each kind the operator prunes, as an earlier operator that built
    more would have left them: the Cluster's labels and owner, a name no builder uses.

    Pruning is how an upgrade removes what the new builders no longer make, for
    every kind the operator makes; its rack-less ServiceAccount is the only
    object today's builders drop by themselves.
    """
    name, stale = f"{NAME}-stale", {"shoal.dev/test": "stale"}
    meta = {
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/instance": NAME, "app.kubernetes.io/managed-by": MANAGED_BY},
        "ownerReferences": [
            {"apiVersion": "shoal.dev/v1alpha1", "kind": "Cluster", "name": NAME, "uid": uid}
        ],
    }
    template = {
        "metadata": {"labels": stale},
        "spec": {"containers": [{"name": "stale", "image": "registry.invalid/stale"}]},
    }
    workload = {"replicas": 0, "selector": {"matchLabels": stale}, "template": template}
    return [
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
         "spec": {**workload, "serviceName": name}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": workload},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta,
         "spec": {"selector": stale, "ports": [{"port": 80}]}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta,
         "spec": {"maxUnavailable": 1, "selector": {"matchLabels": stale}}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta,
         "spec": {"podSelector": {"matchLabels": stale}, "policyTypes": ["Ingress"]}},
    ]  # fmt: skip


def unavailable_at_once(events: list[PodEvent], names: list[str]) -> int:
    """The most broker pods that were missing, terminating or not Ready at one time."""
    state: dict[str, PodEvent | None] = dict.fromkeys(names)
    worst = 0
    for event in events:
        state[event.name] = None if event.kind == "DELETED" else event
        down = sum(1 for e in state.values() if e is None or e.terminating or not e.ready)
        worst = max(worst, down)
    return worst


def test_a_changed_cluster_rolls_brokers_one_at_a_time_and_drops_what_it_no_longer_builds(
    operated: Operated, namespace: str
) -> None:
    kube = operated.kube
    operated.apply(namespace, RACKED)
    uid = operated.ready_cluster(namespace)["metadata"]["uid"]
    stale = stale_children(namespace, uid)
    kube.kubectl(
        "apply", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": stale}),
    )  # fmt: skip
    before = {p["metadata"]["name"]: p for p in broker_pods(kube, namespace)}
    old_hash = before["demo-broker-0"]["metadata"]["annotations"][TEMPLATE_HASH]
    watch = PodWatch(kube, namespace).start()
    operated.wait(lambda: len(watch.events) >= 2, 10, "the pod watch to list the broker pods")

    # The roller's order: brokers by id descending, the controller last.
    async def controller() -> int | None:
        async with ClusterAdmin(operated.bootstrap) as admin:
            return await admin.controller_id()

    controller_id = asyncio.run(controller())
    expected = sorted([0, 1], key=lambda n: (n == controller_id, -n))

    # No rack label any more, and a different broker setting.
    plain = json.loads(json.dumps(RACKED))
    del plain["brokers"]["rackLabel"]
    plain["brokers"]["config"] = {"log_retention_ms": "3600000"}
    operated.apply(namespace, plain)
    cluster = operated.ready_cluster(namespace, timeout=120)

    after = {p["metadata"]["name"]: p for p in broker_pods(kube, namespace)}
    for name, pod in after.items():
        assert pod["metadata"]["uid"] != before[name]["metadata"]["uid"], name
        assert pod["metadata"]["annotations"][TEMPLATE_HASH] != old_hash
    deleted = [e.name for e in watch.events if e.kind == "DELETED"]
    assert deleted == [f"demo-broker-{n}" for n in expected], watch.events
    assert unavailable_at_once(watch.events, sorted(before)) == 1, watch.events
    # Each broker came back before the next went.
    first_back = next(
        i
        for i, e in enumerate(watch.events)
        if e.name == deleted[0] and e.uid != before[deleted[0]]["metadata"]["uid"] and e.ready
    )
    second_gone = next(
        i for i, e in enumerate(watch.events) if e.name == deleted[1] and e.terminating
    )
    assert first_back < second_gone, watch.events

    # What the builders stopped making is gone from the live objects: fields
    # (server-side apply) and whole objects (pruned).
    sts = kube.get_json("statefulset", "demo-broker", "-n", namespace)
    template = sts["spec"]["template"]["spec"]
    assert "initContainers" not in template
    assert "rack" not in {v["name"] for v in template["volumes"]}
    settings = kube.get_json("configmap", "demo-config", "-n", namespace)["data"]
    assert "SHOAL_REPLICA_LAG_TIME_MAX_MS" not in settings
    assert settings["SHOAL_LOG_RETENTION_MS"] == "3600000"
    assert not operated.exists("serviceaccount", "demo-broker", "-n", namespace)
    assert not operated.exists("clusterrolebinding", f"shoal-{namespace}-{NAME}-broker-node-reader")
    left = [
        f"{c['kind']}/{c['metadata']['name']}"
        for c in stale
        if operated.exists(c["kind"].lower(), c["metadata"]["name"], "-n", namespace)
    ]
    assert left == []
    assert cluster["status"]["brokers"] == {"desired": 2, "ready": 2}

    operated.delete_cluster(namespace)
    assert operated.forbidden() == []


def ready_resource(operated: Operated, kind: str, namespace: str, name: str) -> dict[str, Any]:
    """A Topic or Tenant once its status says Ready for its current generation."""

    def ready() -> dict[str, Any] | None:
        found = operated.kube.kubectl(
            "get", f"{kind}.shoal.dev", name, "-n", namespace, "-o", "json", check=False
        )
        if found.returncode != 0:
            return None
        obj: dict[str, Any] = json.loads(found.stdout)
        status = obj.get("status") or {}
        condition = {c["type"]: c for c in status.get("conditions") or []}.get("Ready", {})
        generation = obj["metadata"]["generation"]
        if condition.get("status") == "True" and status.get("observedGeneration") == generation:
            return obj
        return None

    return operated.wait(ready, 60, f"{kind} {namespace}/{name} to be Ready")


def broker_topics(operated: Operated) -> dict[str, int]:
    """Partitions per topic, as the real brokers report them."""

    async def ask() -> dict[str, int]:
        async with ClusterAdmin(operated.bootstrap) as admin:
            found: dict[str, int] = {}
            for partition in await admin.partitions():
                found[partition.topic] = found.get(partition.topic, 0) + 1
            return found

    return asyncio.run(ask())


def test_a_tenant_gets_its_key_secret_and_a_topic_its_partitions_on_the_brokers(
    operated: Operated, namespace: str
) -> None:
    kube = operated.kube
    operated.apply(namespace, RACKED)
    operated.ready_cluster(namespace)
    tenant = f"t{namespace[2:]}"  # a tenant per test: the brokers are shared
    resources = [
        {
            "apiVersion": "shoal.dev/v1alpha1",
            "kind": "Tenant",
            "metadata": {"name": tenant, "namespace": namespace},
            "spec": {"cluster": NAME, "keys": [{"name": "app", "role": "default"}]},
        },
        *(
            {
                "apiVersion": "shoal.dev/v1alpha1",
                "kind": "Topic",
                "metadata": {"name": topic, "namespace": namespace},
                "spec": {"cluster": NAME, "tenant": tenant, "partitions": 2, "replicas": 2},
            }
            for topic in ("events", "orders")
        ),
    ]
    kube.kubectl(
        "apply", "--server-side", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": resources}),
    )  # fmt: skip

    owner = ready_resource(operated, "tenant", namespace, tenant)
    secret = kube.get_json("secret", f"shoal-{tenant}-app", "-n", namespace)
    assert owned_by(secret, owner["metadata"]["uid"])
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["bootstrap"] == "127.0.0.1:9092"
    assert data["username"] and data["password"]
    assert f'username="{data["username"]}"' in data["sasl.jaas.config"]

    topic = ready_resource(operated, "topic", namespace, "events")
    assert topic["status"]["partitions"] == 2
    assert broker_topics(operated)[f"{tenant}.events"] == 2

    # More partitions: the brokers grow the topic.
    kube.kubectl(
        "patch", "topic.shoal.dev", "events", "-n", namespace,
        "--type=merge", "-p", '{"spec": {"partitions": 3}}',
    )  # fmt: skip
    assert ready_resource(operated, "topic", namespace, "events")["status"]["partitions"] == 3
    assert broker_topics(operated)[f"{tenant}.events"] == 3

    # Deleting the Topic deletes the topic on the brokers (its finalizer), then the resource.
    kube.kubectl("delete", "topic.shoal.dev", "events", "-n", namespace, "--timeout=60s")
    assert f"{tenant}.events" not in broker_topics(operated)
    ready_resource(operated, "topic", namespace, "orders")
    assert broker_topics(operated)[f"{tenant}.orders"] == 2

    # A Tenant deleted while its Cluster runs takes its Topic resources (whose
    # finalizers delete the topics on the brokers) and its key Secrets with it.
    leaving = f"u{namespace[2:]}"
    kube.kubectl(
        "apply", "--server-side", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "shoal.dev/v1alpha1", "kind": "Tenant",
             "metadata": {"name": leaving, "namespace": namespace},
             "spec": {"cluster": NAME, "keys": [{"name": "app", "role": "default"}]}},
            {"apiVersion": "shoal.dev/v1alpha1", "kind": "Topic",
             "metadata": {"name": "logs", "namespace": namespace},
             "spec": {"cluster": NAME, "tenant": leaving, "partitions": 1, "replicas": 2}},
        ]}),
    )  # fmt: skip
    ready_resource(operated, "tenant", namespace, leaving)
    ready_resource(operated, "topic", namespace, "logs")
    assert operated.exists("secret", f"shoal-{leaving}-app", "-n", namespace)
    kube.kubectl("delete", "tenant.shoal.dev", leaving, "-n", namespace, "--timeout=60s")
    assert not operated.exists("secret", f"shoal-{leaving}-app", "-n", namespace)
    operated.wait(
        lambda: not operated.exists("topic.shoal.dev", "logs", "-n", namespace),
        60,
        "the leaving Tenant's Topic resource to go with it",
    )
    assert not any(t.startswith(f"{leaving}.") for t in broker_topics(operated))

    # The Cluster deleted before its Tenant and Topic (docs/kubernetes.md,
    # "Deleting"): it goes; they stay, and when deleted later their
    # finalizers find no cluster and release them instead of hanging.
    operated.delete_cluster(namespace)
    assert operated.exists("topic.shoal.dev", "orders", "-n", namespace)
    kube.kubectl("delete", "topic.shoal.dev", "orders", "-n", namespace, "--timeout=60s")
    kube.kubectl("delete", "tenant.shoal.dev", tenant, "-n", namespace, "--timeout=60s")
    operated.wait(
        lambda: not operated.exists("secret", f"shoal-{tenant}-app", "-n", namespace),
        60,
        "the Tenant's Secret to go with it",
    )
    assert operated.forbidden() == []


def test_two_replicas_one_acts_and_the_other_takes_over_when_it_is_killed(
    operated: Operated, namespace: str
) -> None:
    kube = operated.kube
    active = operated.operator
    standby = operated.replica("b", priority=100)

    # Both replicas keep a record in the peering object; the lower priority
    # one starts paused and stays so (kopf logs nothing while it does).
    def peers() -> list[int] | None:
        status = kube.get_json("clusterkopfpeering", PEERING).get("status") or {}
        priorities = sorted(peer["priority"] for peer in status.values())
        return priorities if priorities == [100, 200] else None

    operated.wait(peers, 30, "both replicas in the peering object")

    operated.apply(namespace, RACKED)
    operated.ready_cluster(namespace)
    # Only the active replica ran handlers; the standby watched.
    assert "cluster_changed" not in standby.log()
    standby_lines = len(standby.log().splitlines())

    # The active replica dies without a word; its peering record expires and
    # the standby resumes, and reconciles a change made after the kill.
    active.kill()
    changed = json.loads(json.dumps(RACKED))
    changed["gateway"]["replicas"] = 2
    operated.apply(namespace, changed)
    operated.operator = standby
    operated.wait(
        lambda: (
            kube.get_json("deployment", "demo-gateway", "-n", namespace)["spec"]["replicas"] == 2
        ),
        60,
        "the standby to take over and scale the gateway",
    )
    operated.ready_cluster(namespace)
    taken_over = standby.log().splitlines()[standby_lines:]
    assert any("Resuming operations" in line for line in taken_over), taken_over
    assert any("cluster_changed" in line for line in taken_over), taken_over
    operated.delete_cluster(namespace)
    assert operated.forbidden() == []


def test_the_operator_survives_an_api_server_restart(operated: Operated, namespace: str) -> None:
    kube = operated.kube
    operated.apply(namespace, RACKED)
    operated.ready_cluster(namespace)

    # A change, and the API server goes away while the operator reconciles it.
    one_more = json.loads(json.dumps(RACKED))
    one_more["gateway"]["replicas"] = 2
    operated.apply(namespace, one_more)
    kube.restart_apiserver(down_s=3)
    operated.ready_cluster(namespace)
    assert kube.get_json("deployment", "demo-gateway", "-n", namespace)["spec"]["replicas"] == 2

    # A change made after the restart reaches the operator: its watch resumed.
    three = json.loads(json.dumps(one_more))
    three["gateway"]["replicas"] = 3
    operated.apply(namespace, three)
    operated.wait(
        lambda: (
            kube.get_json("deployment", "demo-gateway", "-n", namespace)["spec"]["replicas"] == 3
        ),
        60,
        "the gateway Deployment to have 3 replicas",
    )
    operated.ready_cluster(namespace)
    assert operated.operator.running
    operated.delete_cluster(namespace)


EXPECTED_UNUSED: dict[Grant, str] = {
    Grant("", "nodes", "get"): (
        "never asked: held so that the API server lets the operator bind brokers to "
        "shoal-broker-node-reader (RBAC grants only what the granter holds)"
    ),
}
"""Grants the operator needs that no request of its shows, each with the reason."""
USED_ON_FAILURE: dict[Grant, str] = {
    Grant("", "events", "create"): (
        "kopf posts a handler's warnings and errors as Events (posting.level WARNING in "
        "operator_settings): only when a handler fails, which a test may or may not see"
    ),
}
"""Grants for failure paths: used or not, either is fine."""


def test_the_operator_used_every_grant_of_the_chart_and_was_refused_nothing(
    operated: Operated, request: pytest.FixtureRequest
) -> None:
    """The chart grants the operator what it uses, and nothing more.

    Last in the file, so it runs after every other test of the module (pytest
    keeps a module's order), and reads what they made the operator do from
    the API server's audit log. A test rather than a check in the module
    fixture's teardown: a failure there would show as an error in the
    teardown of whichever test ran last, not as a test named for what it
    protects. With part of the module selected the log shows part of the
    operator's work: then only what any part must hold is checked (no
    wildcard, no refusal, nothing used beyond the chart's grants), not that
    every grant was used.

    The operator runs as the chart runs it with ``operator.replicas`` above
    one, so its peering grants (``clusterkopfpeerings.kopf.dev``) are checked
    too.
    """
    module = request.node.module
    everything = {n for n in vars(module) if n.startswith("test_")}
    selected = {
        i.originalname
        for i in request.session.items
        if isinstance(i, pytest.Function) and i.module is module
    }
    whole_module = selected == everything

    identity = operated.identity
    roles = identity.chart_roles()
    use = use_of(operated.kube.audit_events(), identity.user, operated.kube.starting)
    used = use.grants
    print(f"{use.requests} requests by {identity.user}\n{table(roles.grants, used)}")
    print(f"refused while the API server started: {use.refused_starting}")
    failed = request.session.testsfailed
    note = f" ({failed} earlier test(s) failed: their paths may not have run)" if failed else ""

    assert roles.wildcards == [], "the chart's operator rules have wildcards"
    assert use.refused == [], f"the API server refused the operator {len(use.refused)} request(s)"
    beyond = sorted(str(g) for g in used - roles.grants)
    assert beyond == [], "used, allowed by something other than the chart's operator rules"
    if not whole_module:
        print(f"not every grant's use checked; not selected: {sorted(everything - selected)}")
        return
    allowed = EXPECTED_UNUSED.keys()
    unused = sorted(str(g) for g in roles.grants - used - allowed - USED_ON_FAILURE.keys())
    assert unused == [], f"granted, never used{note}:\n{table(roles.grants, used)}"
    ungranted = sorted(str(g) for g in (allowed | USED_ON_FAILURE.keys()) - roles.grants)
    assert ungranted == [], "allowed unused, but not granted: drop them from the lists above"
    needless = sorted(str(g) for g in allowed & used)
    assert needless == [], "used after all: drop them from EXPECTED_UNUSED"
