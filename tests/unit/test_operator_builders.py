"""A Cluster's children, as build_children makes them: valid, owned, named, wired together.

Every manifest is validated against Kubernetes' own schemas (kubernetes-validate,
strict), as the Helm chart's output is. Selectors are checked by matching them
against the pods the same build produces, so a policy or Service that selects
nothing (or the wrong pods) fails here rather than in a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoal.operator import endpoints
from shoal.operator.builders import (
    TEMPLATE_HASH,
    broker_template_hash,
    build_children,
    outdated_brokers,
)
from shoal.operator.cluster_spec import ClusterSpec

from shoal.etcd_address import EtcdAddress

KUBERNETES_VERSION = "1.31"
NAME, NAMESPACE, UID = "demo", "prod", "0b6e1c1e-5b9a-4a43-9d0f-1f3c2b1a0a01"
IMAGE = "ghcr.io/shoal/shoal:0.1.0"
FULL_SPEC: dict[str, Any] = {
    "image": "registry.example/shoal:1.2.3",
    "brokers": {
        "replicas": 5,
        "storage": {"size": "50Gi", "storageClassName": "fast", "deleteClaim": True},
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
        "rackLabel": "topology.kubernetes.io/zone",
        "config": {"replica_lag_time_max_ms": "10000"},
    },
    "etcd": {"replicas": 5, "resources": {"requests": {"cpu": "100m"}}},
    "gateway": {
        "replicas": 3,
        "serviceType": "LoadBalancer",
        "advertiseHost": "kafka.example.com",
        "tls": {"secretName": "gateway-tls", "clientCASecretName": "client-ca"},
        "resources": {"requests": {"cpu": "500m"}},
    },
    "topicDefaults": {"min.insync.replicas": "2", "log.retention.ms": "86400000"},
}


def children(spec: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    return build_children(NAME, NAMESPACE, UID, ClusterSpec.from_spec(spec or {}), IMAGE)


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are built"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def pod_labels(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    kind = "Deployment" if component == "gateway" else "StatefulSet"
    (workload,) = [
        d
        for d in docs
        if d["kind"] == kind and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


@pytest.mark.parametrize("spec", [{}, FULL_SPEC], ids=["defaults", "everything"])
def test_every_child_validates_strictly(spec: dict[str, Any]) -> None:
    for doc in children(spec):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("spec", [{}, FULL_SPEC], ids=["defaults", "everything"])
def test_every_namespaced_child_is_owned_by_the_cluster_and_labelled(spec: dict[str, Any]) -> None:
    for doc in children(spec):
        meta = doc["metadata"]
        component = meta["labels"]["app.kubernetes.io/component"]
        assert meta["labels"] == {
            "app.kubernetes.io/name": "shoal",
            "app.kubernetes.io/instance": NAME,
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/managed-by": "shoal-operator",
        }
        assert component in {"etcd", "broker", "gateway"}
        if doc["kind"] == "ClusterRoleBinding":
            continue  # cluster-scoped: see test_rack_label_*
        assert meta["namespace"] == NAMESPACE
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "shoal.dev/v1alpha1",
                "kind": "Cluster",
                "name": NAME,
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def test_children_are_named_as_endpoints_names_them() -> None:
    docs = children()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {
        ("Service", endpoints.etcd_name(NAME)),
        ("Service", endpoints.etcd_client_name(NAME)),
        ("StatefulSet", endpoints.etcd_name(NAME)),
        ("PodDisruptionBudget", endpoints.etcd_name(NAME)),
        ("ConfigMap", endpoints.config_name(NAME)),
        ("Service", endpoints.broker_name(NAME)),
        ("StatefulSet", endpoints.broker_name(NAME)),
        ("PodDisruptionBudget", endpoints.broker_name(NAME)),
        ("Deployment", endpoints.gateway_name(NAME)),
        ("Service", endpoints.gateway_name(NAME)),
        ("PodDisruptionBudget", endpoints.gateway_name(NAME)),
        ("NetworkPolicy", endpoints.broker_name(NAME)),
        ("NetworkPolicy", endpoints.etcd_name(NAME)),
        ("NetworkPolicy", endpoints.gateway_name(NAME)),
    }


def test_every_selector_selects_its_own_components_pods() -> None:
    docs = children()
    for doc in docs:
        component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
        if doc["kind"] in {"Service", "PodDisruptionBudget", "StatefulSet", "Deployment"}:
            selector = doc["spec"]["selector"]
            if doc["kind"] == "Service":
                selector = {"matchLabels": selector}
            for other in ("etcd", "broker", "gateway"):
                assert matches(selector, pod_labels(docs, other)) == (other == component), (
                    doc["kind"],
                    doc["metadata"]["name"],
                    other,
                )
        if doc["kind"] == "PodDisruptionBudget":
            assert doc["spec"]["maxUnavailable"] == 1


def test_etcd_bootstraps_statically_from_its_pods_dns_names() -> None:
    docs = children({"etcd": {"replicas": 3, "storage": {"size": "3Gi"}}})
    sts = one(docs, "StatefulSet", endpoints.etcd_name(NAME))
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == endpoints.etcd_name(NAME)
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("quay.io/coreos/etcd:v3.5.")
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    peers = f"{endpoints.etcd_name(NAME)}.{NAMESPACE}.svc:2380"
    assert args["initial-cluster"] == ",".join(
        f"demo-etcd-{n}=http://demo-etcd-{n}.{peers}" for n in range(3)
    )
    assert args["initial-cluster-state"] == "new"
    assert args["name"] == "$(POD_NAME)"
    assert args["initial-advertise-peer-urls"] == f"http://$(POD_NAME).{peers}"
    data_mount = next(m for m in container["volumeMounts"] if m["name"] == "data")
    assert args["data-dir"].startswith(data_mount["mountPath"] + "/")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "3Gi"
    assert container["readinessProbe"]["httpGet"]["path"].startswith("/health")
    assert container["livenessProbe"]["httpGet"]["path"].startswith("/health")

    headless = one(docs, "Service", endpoints.etcd_name(NAME))
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert {p["port"] for p in headless["spec"]["ports"]} == {2379, 2380}
    client = one(docs, "Service", endpoints.etcd_client_name(NAME))
    assert client["spec"]["type"] == "ClusterIP"
    assert [p["port"] for p in client["spec"]["ports"]] == [2379]
    # The components' etcd URL names the headless Service, which resolves to every
    # member: a ClusterIP would pin each connection to one member, even a cut-off one.
    etcd_url = endpoints.in_cluster_endpoints(NAMESPACE, NAME, 3).etcd_url
    assert EtcdAddress.parse(etcd_url).host == f"{endpoints.etcd_name(NAME)}.{NAMESPACE}.svc"


def broker_set(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "StatefulSet", endpoints.broker_name(NAME))


def broker_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = broker_set(docs)["spec"]["template"]["spec"]["containers"]
    return container


def test_brokers_are_rolled_by_the_operator_and_keep_their_data_by_default() -> None:
    docs = children()
    spec = broker_set(docs)["spec"]
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["replicas"] == 3
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Delete",
    }
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "storageClassName" not in claim["spec"]
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations[TEMPLATE_HASH] == broker_template_hash(ClusterSpec.from_spec({}), IMAGE)

    full = broker_set(children(FULL_SPEC))["spec"]
    assert full["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    assert full["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"


def test_broker_pods_run_as_the_endpoints_say_they_are_reached() -> None:
    docs = children()
    container = broker_container(docs)
    assert container["image"] == IMAGE
    assert container["command"] == ["shoal", "broker"]
    variables = env(container)
    assert variables["SHOAL_NODE_ID"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }
    assert container["env"][0]["name"] == "POD_NAME"
    assert variables["SHOAL_LISTEN"] == "0.0.0.0:19092"
    # What $(POD_NAME) becomes for broker 1 is its address in endpoints.
    advertised = variables["SHOAL_ADVERTISE"].replace("$(POD_NAME)", endpoints.broker_pod(NAME, 1))
    found = endpoints.in_cluster_endpoints(NAMESPACE, NAME, 3)
    assert advertised == found.brokers_bootstrap.split(",")[1]
    assert variables["SHOAL_ETCD"] == found.etcd_url
    data_mount = next(m for m in container["volumeMounts"] if m["name"] == "data")
    assert variables["SHOAL_DATA_DIR"].startswith(data_mount["mountPath"] + "/")
    assert variables["SHOAL_METRICS_LISTEN"] == "0.0.0.0:9404"
    assert variables["SHOAL_LOG_FORMAT"] == "json"
    assert container["envFrom"] == [{"configMapRef": {"name": endpoints.config_name(NAME)}}]

    pod = broker_set(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["fsGroup"] == 10001
    assert pod["terminationGracePeriodSeconds"] >= 60
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["readinessProbe"]["tcpSocket"]["port"] == "kafka-internal"
    # Log recovery after a crash may take minutes: liveness must not kill it meanwhile.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600

    headless = one(docs, "Service", endpoints.broker_name(NAME))
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert {(p["name"], p["port"]) for p in headless["spec"]["ports"]} == {
        ("kafka-internal", 19092),
        ("metrics", 9404),
    }


def test_user_settings_reach_the_brokers_through_the_config_map() -> None:
    docs = children(FULL_SPEC)
    config = one(docs, "ConfigMap", endpoints.config_name(NAME))["data"]
    assert json.loads(config["SHOAL_TOPIC_DEFAULTS"]) == FULL_SPEC["topicDefaults"]
    assert config["SHOAL_REPLICA_LAG_TIME_MAX_MS"] == "10000"
    container = broker_container(docs)
    assert container["image"] == FULL_SPEC["image"]
    assert container["resources"] == FULL_SPEC["brokers"]["resources"]


def test_rack_label_spreads_brokers_and_reads_the_rack_from_the_node() -> None:
    docs = children(FULL_SPEC)
    pod = broker_set(docs)["spec"]["template"]["spec"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert matches(spread["labelSelector"], pod_labels(docs, "broker"))

    (init,) = pod["initContainers"]
    assert init["command"][:2] == ["shoal", "rack-of-node"]
    args = dict(zip(init["command"][2::2], init["command"][3::2], strict=True))
    assert args["--label"] == "topology.kubernetes.io/zone"
    assert args["--node"] == "$(NODE_NAME)"
    assert env(init)["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # The broker reads the file the init container wrote, on a volume they share.
    container = broker_container(docs)
    assert args["--out"] in container["command"][-1]
    assert "SHOAL_RACK=" in container["command"][-1]
    shared = {m["name"] for m in init["volumeMounts"]} & {
        m["name"] for m in container["volumeMounts"]
    }
    assert shared == {"rack"}
    # Only the init container holds an API token.
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == endpoints.broker_name(NAME)
    account = one(docs, "ServiceAccount", endpoints.broker_name(NAME))
    assert account["metadata"]["namespace"] == NAMESPACE

    binding = one(docs, "ClusterRoleBinding", endpoints.node_reader_binding_name(NAMESPACE, NAME))
    assert "ownerReferences" not in binding["metadata"]
    assert binding["roleRef"]["name"] == "shoal-broker-node-reader"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": endpoints.broker_name(NAME), "namespace": NAMESPACE}
    ]

    plain = children()
    assert "initContainers" not in broker_set(plain)["spec"]["template"]["spec"]
    assert not [d for d in plain if d["kind"] in {"ServiceAccount", "ClusterRoleBinding"}]


def gateway_parts(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = one(docs, "Deployment", endpoints.gateway_name(NAME))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


@pytest.mark.parametrize("brokers", [1, 3, 7])
def test_gateway_service_has_a_port_per_broker(brokers: int) -> None:
    docs = children({"brokers": {"replicas": brokers}})
    service = one(docs, "Service", endpoints.gateway_name(NAME))
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {
        "kafka": 9092,
        **{f"broker-{n}": endpoints.gateway_broker_port(n) for n in range(brokers)},
        "http": 8080,
        "metrics": 9404,
    }
    _, container = gateway_parts(docs)
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == ports
    found = endpoints.in_cluster_endpoints(NAMESPACE, NAME, brokers)
    assert env(container)["SHOAL_UPSTREAM"] == found.brokers_bootstrap


def test_gateway_defaults() -> None:
    deployment, container = gateway_parts(children())
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    variables = env(container)
    assert variables["SHOAL_LISTEN"] == "0.0.0.0:9092"
    assert "SHOAL_TLS_LISTEN" not in variables
    assert variables["SHOAL_ADVERTISE_HOST"] == f"{endpoints.gateway_name(NAME)}.{NAMESPACE}.svc"
    assert variables["SHOAL_ETCD"] == endpoints.in_cluster_endpoints(NAMESPACE, NAME, 3).etcd_url
    assert variables["SHOAL_HTTP_LISTEN"] == "0.0.0.0:8080"
    assert variables["SHOAL_METRICS_LISTEN"] == "0.0.0.0:9404"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = one(children(), "Service", endpoints.gateway_name(NAME))
    assert service["spec"]["type"] == "ClusterIP"


def test_gateway_with_tls_listens_with_the_secrets_certificate() -> None:
    docs = children(FULL_SPEC)
    deployment, container = gateway_parts(docs)
    variables = env(container)
    assert variables["SHOAL_LISTEN"] == ""
    assert variables["SHOAL_TLS_LISTEN"] == "0.0.0.0:9092"
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    (tls_volume,) = [v for v in volumes if v.get("secret", {}).get("secretName") == "gateway-tls"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == tls_volume["name"]]
    assert variables["SHOAL_TLS_CERT"] == f"{mount['mountPath']}/tls.crt"
    assert variables["SHOAL_TLS_KEY"] == f"{mount['mountPath']}/tls.key"
    assert variables["SHOAL_ADVERTISE_HOST"] == "kafka.example.com"
    assert one(docs, "Service", endpoints.gateway_name(NAME))["spec"]["type"] == "LoadBalancer"


def test_gateway_with_a_client_ca_runs_the_mutual_tls_listener() -> None:
    spec = {
        "brokers": {"replicas": 64},
        "gateway": {"tls": {"secretName": "gateway-tls", "clientCASecretName": "client-ca"}},
    }
    docs = children(spec)
    deployment, container = gateway_parts(docs)
    variables = env(container)
    assert variables["SHOAL_TLS_LISTEN"] == "0.0.0.0:9092"
    assert variables["SHOAL_MTLS_LISTEN"] == f"0.0.0.0:{endpoints.GATEWAY_MTLS_PORT}"
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    (ca_volume,) = [v for v in volumes if v.get("secret", {}).get("secretName") == "client-ca"]
    # Only ca.crt: a CA's Secret may hold its private key too, which the gateway must not see.
    assert ca_volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == ca_volume["name"]]
    assert mount["readOnly"] is True
    assert variables["SHOAL_TLS_CLIENT_CA"] == f"{mount['mountPath']}/ca.crt"
    (tls_mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/shoal/tls"]
    assert variables["SHOAL_TLS_CERT"] == f"{tls_mount['mountPath']}/tls.crt"

    service = one(docs, "Service", endpoints.gateway_name(NAME))
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    mtls = {
        "mtls": endpoints.GATEWAY_MTLS_PORT,
        **{f"mtls-broker-{n}": endpoints.gateway_mtls_broker_port(n) for n in range(64)},
    }
    assert mtls.items() <= ports.items()
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == ports
    # Even with the most brokers allowed, no two ports (of any listener) collide.
    assert len(set(ports.values())) == len(ports)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)

    policy = one(docs, "NetworkPolicy", endpoints.gateway_name(NAME))
    tenant = {"app": "some-client"}
    for port in (9292, 9293, 9292 + 64):
        assert admitted(policy, tenant, port, same_ns=True)
    assert not admitted(policy, tenant, 9292 + 65, same_ns=True)


def test_gateway_without_a_client_ca_has_no_mutual_tls_listener() -> None:
    for spec in ({}, {"gateway": {"tls": {"secretName": "gateway-tls"}}}):
        docs = children(spec)
        deployment, container = gateway_parts(docs)
        assert not {"SHOAL_MTLS_LISTEN", "SHOAL_TLS_CLIENT_CA"} & env(container).keys()
        assert not [p for p in container["ports"] if p["name"].startswith("mtls")]
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        assert "client-ca" not in {v.get("secret", {}).get("secretName") for v in volumes}
        policy = one(docs, "NetworkPolicy", endpoints.gateway_name(NAME))
        assert not admitted(policy, {"app": "some-client"}, 9292, same_ns=True)


def admitted(policy: dict[str, Any], peer: Mapping[str, str], port: int, *, same_ns: bool) -> bool:
    """Whether a pod with labels ``peer`` may reach ``port`` of the policy's pods."""
    for rule in policy["spec"]["ingress"]:
        if not any(p["port"] <= port <= p.get("endPort", p["port"]) for p in rule["ports"]):
            continue
        if "from" not in rule:
            return True
        for source in rule["from"]:
            in_namespace = "namespaceSelector" in source or same_ns
            if in_namespace and matches(source["podSelector"], peer):
                return True
    return False


def test_network_policies_keep_brokers_and_etcd_private() -> None:
    docs = children()
    etcd_pod, broker_pod, gateway_pod = (pod_labels(docs, c) for c in ("etcd", "broker", "gateway"))
    operator = {"app.kubernetes.io/name": "shoal", "app.kubernetes.io/component": "operator"}
    tenant: dict[str, str] = {"app": "some-client"}
    other_cluster = {**broker_pod, "app.kubernetes.io/instance": "other"}
    brokers = one(docs, "NetworkPolicy", endpoints.broker_name(NAME))
    etcd = one(docs, "NetworkPolicy", endpoints.etcd_name(NAME))
    gateway = one(docs, "NetworkPolicy", endpoints.gateway_name(NAME))
    for policy, component in ((brokers, "broker"), (etcd, "etcd"), (gateway, "gateway")):
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for other in ("etcd", "broker", "gateway"):
            assert matches(policy["spec"]["podSelector"], pod_labels(docs, other)) == (
                other == component
            )

    def reach(policy: dict[str, Any], peer: Mapping[str, str], port: int) -> bool:
        return admitted(policy, peer, port, same_ns=True)

    assert reach(brokers, broker_pod, 19092)
    assert reach(brokers, gateway_pod, 19092)
    assert admitted(brokers, operator, 19092, same_ns=False)
    assert not reach(brokers, tenant, 19092)
    assert not reach(brokers, etcd_pod, 19092)
    assert not reach(brokers, other_cluster, 19092)
    assert reach(brokers, tenant, 9404)

    for peer in (broker_pod, gateway_pod, etcd_pod):
        assert reach(etcd, peer, 2379)
    assert admitted(etcd, operator, 2379, same_ns=False)
    assert not reach(etcd, tenant, 2379)
    assert reach(etcd, etcd_pod, 2380)
    assert not reach(etcd, broker_pod, 2380)
    assert not reach(etcd, tenant, 9404)

    for port in (9092, 9093, 9095, 8080, 9404):
        assert reach(gateway, tenant, port)
    assert not reach(gateway, tenant, 9096)  # no fourth broker


def test_template_hash_follows_what_broker_pods_run() -> None:
    base = ClusterSpec.from_spec({})
    digest = broker_template_hash(base, IMAGE)
    assert broker_template_hash(ClusterSpec.from_spec({}), IMAGE) == digest
    changed = [
        ({}, "ghcr.io/shoal/shoal:0.2.0"),
        ({"image": "registry.example/shoal:9"}, IMAGE),
        ({"imagePullPolicy": "Always"}, IMAGE),
        ({"topicDefaults": {"min.insync.replicas": "2"}}, IMAGE),
        ({"brokers": {"config": {"replica_lag_time_max_ms": "10000"}}}, IMAGE),
        ({"brokers": {"resources": {"limits": {"memory": "1Gi"}}}}, IMAGE),
        ({"brokers": {"rackLabel": "topology.kubernetes.io/zone"}}, IMAGE),
    ]
    for spec, image in changed:
        assert broker_template_hash(ClusterSpec.from_spec(spec), image) != digest, spec
    unchanged = [
        {"brokers": {"replicas": 7}},
        {"gateway": {"replicas": 5, "serviceType": "NodePort", "advertiseHost": "k.example"}},
        {"gateway": {"tls": {"secretName": "tls"}, "resources": {"requests": {"cpu": "1"}}}},
        {"etcd": {"replicas": 5, "resources": {"requests": {"cpu": "1"}}}},
    ]
    for spec in unchanged:
        assert broker_template_hash(ClusterSpec.from_spec(spec), IMAGE) == digest, spec


@given(
    st.dictionaries(
        st.sampled_from(["min.insync.replicas", "log.retention.ms", "log.segment.bytes"]),
        st.integers(min_value=1, max_value=10**9).map(str),
    ),
    st.integers(min_value=1, max_value=64),
)
def test_template_hash_changes_exactly_when_the_broker_pods_would(
    defaults: dict[str, str], brokers: int
) -> None:
    """Whatever the spec, the hash differs from the default's iff a broker pod would differ."""
    base = children()
    spec = {"topicDefaults": defaults, "brokers": {"replicas": brokers}}
    other = children(spec)

    def pod_content(docs: list[dict[str, Any]]) -> Any:
        template = json.loads(json.dumps(broker_set(docs)["spec"]["template"]))
        del template["metadata"]["annotations"]
        return template, one(docs, "ConfigMap", endpoints.config_name(NAME))["data"]

    differs = pod_content(base) != pod_content(other)
    assert differs == bool(defaults)
    hashes = {broker_template_hash(ClusterSpec.from_spec(s), IMAGE) for s in ({}, spec)}
    assert (len(hashes) == 2) == differs


def pod(node_id: int, digest: str | None, *, index_label: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": endpoints.broker_pod(NAME, node_id), "labels": {}}
    if index_label:
        meta["labels"]["apps.kubernetes.io/pod-index"] = str(node_id)
    if digest is not None:
        meta["annotations"] = {TEMPLATE_HASH: digest}
    return {"metadata": meta}


def test_outdated_brokers_are_listed_highest_first() -> None:
    current = broker_template_hash(ClusterSpec.from_spec({}), IMAGE)
    pods = [
        pod(0, "old"),
        pod(1, current),
        pod(2, None),
        pod(10, "old", index_label=False),
        pod(3, current),
    ]
    assert outdated_brokers(pods, current) == [10, 2, 0]
    assert outdated_brokers([pod(0, current), pod(1, current)], current) == []
