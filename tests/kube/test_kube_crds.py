"""Shoal's CRDs on a real API server: accepted, served, and their schemas
refuse what they promise to refuse, with the message a user sees from
`kubectl apply`.

Each invalid object is a valid example of k8s/examples with one thing broken,
so a failure here points at that one constraint of the schema.
"""

from __future__ import annotations

import copy
import json
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import pytest
import yaml
from control_plane import ROOT, ControlPlane

EXAMPLES = ROOT / "k8s" / "examples"
DELETE = object()
"""A value that removes the field instead of setting it."""

Path = Sequence[str | int]


def example(kind: str) -> dict[str, Any]:
    """A fresh copy of the first example of ``kind`` in k8s/examples."""
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == kind:
                return copy.deepcopy(doc)
    raise LookupError(kind)


def changed(obj: dict[str, Any], path: Path, value: object) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    parent: Any = obj
    for key in path[:-1]:
        parent = parent.setdefault(key, {}) if isinstance(key, str) else parent[key]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj


def field_at(obj: dict[str, Any], path: Path) -> Any:
    value: Any = obj
    for key in path:
        value = value[key]
    return value


def apply(kube: ControlPlane, namespace: str, obj: dict[str, Any]) -> tuple[int, str]:
    result = kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False)
    return result.returncode, result.stdout + result.stderr


INVALID = [
    # Topic
    pytest.param("Topic", ("spec", "partitions"), 0,
                 ['spec.partitions: Invalid value: 0', "should be greater than or equal to 1"],
                 id="topic-without-partitions"),
    pytest.param("Topic", ("spec", "partitions"), 10001,
                 ["spec.partitions: Invalid value: 10001", "should be less than or equal to 10000"],
                 id="topic-too-many-partitions"),
    pytest.param("Topic", ("spec", "replicas"), 17,
                 ["spec.replicas: Invalid value: 17", "should be less than or equal to 16"],
                 id="topic-too-many-replicas"),
    pytest.param("Topic", ("spec", "partitions"), DELETE,
                 ["spec.partitions: Required value"], id="topic-missing-partitions"),
    pytest.param("Topic", ("spec", "tenant"), DELETE,
                 ["spec.tenant: Required value"], id="topic-missing-tenant"),
    pytest.param("Topic", ("spec", "tenant"), "Demo_Team",
                 ['spec.tenant: Invalid value: "Demo_Team"', "should match"],
                 id="topic-tenant-not-a-dns-label"),
    pytest.param("Topic", ("spec", "topicName"), "orders/eu",
                 ['spec.topicName: Invalid value: "orders/eu"', "should match"],
                 id="topic-name-with-a-slash"),
    # The commonest slip in a topic's config: a number where Kafka wants a string.
    pytest.param("Topic", ("spec", "config", "retention.ms"), 604800000,
                 ["spec.config.retention.ms", "must be of type string"],
                 id="topic-config-value-not-a-string"),
    pytest.param("Topic", ("spec", "partition"), 3,
                 ['unknown field "spec.partition"'], id="topic-misspelt-field"),
    # Cluster
    pytest.param("Cluster", ("spec",), DELETE, ["spec: Required value"], id="cluster-without-spec"),
    pytest.param("Cluster", ("spec", "etcd", "replicas"), 2,
                 ["spec.etcd.replicas: Unsupported value: 2",
                  'supported values: "1", "3", "5"'],
                 id="cluster-even-etcd"),
    pytest.param("Cluster", ("spec", "brokers", "replicas"), 0,
                 ["spec.brokers.replicas: Invalid value: 0",
                  "should be greater than or equal to 1"],
                 id="cluster-no-brokers"),
    pytest.param("Cluster", ("spec", "brokers", "storage", "size"), "2GB",
                 ['spec.brokers.storage.size: Invalid value: "2GB"', "should match"],
                 id="cluster-storage-size-not-a-quantity"),
    pytest.param("Cluster", ("spec", "gateway", "serviceType"), "Ingress",
                 ['spec.gateway.serviceType: Unsupported value: "Ingress"',
                  '"ClusterIP", "NodePort", "LoadBalancer"'],
                 id="cluster-unknown-service-type"),
    pytest.param("Cluster", ("spec", "gateway", "tls"), {},
                 ["spec.gateway.tls.secretName: Required value"], id="cluster-tls-without-secret"),
    pytest.param("Cluster", ("spec", "gateway", "tls"), {"clientCASecretName": "client-ca"},
                 ["spec.gateway.tls.secretName: Required value"],
                 id="cluster-client-ca-without-secret"),
    pytest.param("Cluster", ("spec", "imagePullPolicy"), "Sometimes",
                 ['spec.imagePullPolicy: Unsupported value: "Sometimes"'],
                 id="cluster-pull-policy"),
    pytest.param("Cluster", ("spec", "topicDefaults", "min.insync.replicas"), 2,
                 ["spec.topicDefaults.min.insync.replicas", "must be of type string"],
                 id="cluster-topic-default-not-a-string"),
    # Tenant
    pytest.param("Tenant", ("spec", "cluster"), DELETE,
                 ["spec.cluster: Required value"], id="tenant-without-cluster"),
    pytest.param("Tenant", ("spec", "keys", 0, "role"), "admin",
                 ['spec.keys[0].role: Unsupported value: "admin"',
                  '"default", "read-only", "none"'],
                 id="tenant-key-unknown-role"),
    pytest.param("Tenant", ("spec", "keys", 1, "name"), "app",
                 ["spec.keys[1]: Duplicate value"], id="tenant-two-keys-one-name"),
    pytest.param("Tenant", ("spec", "keys", 0, "name"), "App",
                 ['spec.keys[0].name: Invalid value: "App"', "should match"],
                 id="tenant-key-name-uppercase"),
    pytest.param("Tenant", ("spec", "keys", 0, "certificateSubject"), "",
                 ['spec.keys[0].certificateSubject: Invalid value: ""',
                  "should be at least 1 chars long"],
                 id="tenant-key-empty-certificate-subject"),
    pytest.param("Tenant", ("spec", "quotas", "producerByteRate"), 0,
                 ["spec.quotas.producerByteRate: Invalid value: 0",
                  "should be greater than or equal to 1"],
                 id="tenant-zero-produce-quota"),
    pytest.param("Tenant", ("spec", "quotas", "controllerMutationRate"), 0,
                 ["spec.quotas.controllerMutationRate",
                  "controllerMutationRate must be greater than 0"],
                 id="tenant-zero-mutation-rate"),
    pytest.param("Tenant", ("spec", "quotas", "controllerMutationRate"), "fast",
                 ["spec.quotas.controllerMutationRate", "must be of type number"],
                 id="tenant-mutation-rate-not-a-number"),
    pytest.param("Tenant", ("spec", "quotas", "maxStorageBytes"), 0,
                 ["spec.quotas.maxStorageBytes: Invalid value: 0",
                  "should be greater than or equal to 1"],
                 id="tenant-zero-storage-limit"),
    pytest.param("Tenant", ("spec", "quotas", "maxConnectionRate"), 0,
                 ["spec.quotas.maxConnectionRate",
                  "maxConnectionRate must be greater than 0"],
                 id="tenant-zero-connection-rate"),
    pytest.param("Tenant", ("spec", "quotas", "requestPercentage"), 0,
                 ["spec.quotas.requestPercentage",
                  "requestPercentage must be greater than 0"],
                 id="tenant-zero-request-percentage"),
    pytest.param("Tenant", ("spec", "acls"),
                 [{"key": "app", "resourceType": "TOPIC", "resourceName": "events"}],
                 ["spec.acls[0].operation: Required value"], id="tenant-acl-without-operation"),
    pytest.param("Tenant", ("spec", "acls"),
                 [{"key": "app", "resourceType": "SCHEMA", "resourceName": "x",
                   "operation": "READ"}],
                 ['spec.acls[0].resourceType: Unsupported value: "SCHEMA"'],
                 id="tenant-acl-unknown-resource-type"),
]  # fmt: skip


def test_chart_crds_are_established(kube: ControlPlane, crds: list[str]) -> None:
    for name in crds:
        crd = kube.get_json("crd", name)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions["Established"] == "True"
        assert conditions["NamesAccepted"] == "True"
        # A structural schema: nothing the API server had to give up on.
        assert "NonStructuralSchema" not in conditions


def test_k8s_crds_are_the_chart_crds(kube: ControlPlane, crds: list[str]) -> None:
    """k8s/crds, applied over the chart's, changes nothing on the server."""
    output = kube.kubectl("apply", "-k", str(ROOT / "k8s" / "crds")).stdout
    lines = output.strip().splitlines()
    assert len(lines) == len(crds)
    assert all(line.endswith(" unchanged") for line in lines), output


def test_schemas_are_published_for_kubectl_explain(
    kube: ControlPlane, crds: list[str], tmp_path: pathlib.Path
) -> None:
    # The API server publishes a new CRD's OpenAPI a moment after it is Established,
    # and kubectl keeps the discovery it made before the CRDs existed in its cache:
    # a cache of this test's own, and a few tries.
    def explain(field: str) -> str:
        deadline = time.monotonic() + 30
        while True:
            done = kube.kubectl("explain", field, f"--cache-dir={tmp_path}", check=False)
            if done.returncode == 0 or time.monotonic() > deadline:
                assert done.returncode == 0, done.stderr
                return done.stdout
            time.sleep(1)

    assert "Number of brokers" in explain("clusters.spec.brokers.replicas")
    assert "tenant" in explain("topics.spec")


@pytest.mark.parametrize(("kind", "path", "value", "fragments"), INVALID)
def test_schema_rejects_invalid_object(
    kube: ControlPlane,
    crds: list[str],
    namespace: str,
    kind: str,
    path: Path,
    value: object,
    fragments: list[str],
) -> None:
    status, output = apply(kube, namespace, changed(example(kind), path, value))

    assert status != 0, output
    for fragment in fragments:
        assert fragment in output
    # Nothing was stored.
    assert kube.kubectl("get", kind.lower(), "-n", namespace, "-o", "name").stdout == ""


@pytest.mark.parametrize(
    ("kind", "path", "value", "message"),
    [
        pytest.param("Topic", ("spec", "partitions"), 2, "partitions can only grow",
                     id="topic-shrink"),
        pytest.param("Topic", ("spec", "replicas"), 2, "replicas cannot be changed",
                     id="topic-replicas"),
        pytest.param("Topic", ("spec", "tenant"), "other", "tenant cannot be changed",
                     id="topic-tenant"),
        pytest.param("Topic", ("spec", "cluster"), "other", "cluster cannot be changed",
                     id="topic-cluster"),
        pytest.param("Tenant", ("spec", "cluster"), "other", "cluster cannot be changed",
                     id="tenant-cluster"),
    ],
)  # fmt: skip
def test_update_rules_refuse_what_cannot_change(
    kube: ControlPlane,
    crds: list[str],
    namespace: str,
    kind: str,
    path: Path,
    value: object,
    message: str,
) -> None:
    """The CEL transition rules (self vs oldSelf) hold on update, and only there."""
    original = example(kind)
    assert apply(kube, namespace, original)[0] == 0

    status, output = apply(kube, namespace, changed(original, path, value))

    assert status != 0, output
    assert message in output
    field = ".".join(str(p) for p in path)
    assert f"{field}: Invalid value" in output
    stored = kube.get_json(kind.lower(), original["metadata"]["name"], "-n", namespace)
    assert field_at(stored, path) == field_at(original, path)
    assert stored["metadata"]["generation"] == 1


def test_topic_partitions_can_grow(kube: ControlPlane, crds: list[str], namespace: str) -> None:
    topic = example("Topic")
    assert apply(kube, namespace, topic)[0] == 0
    status, output = apply(kube, namespace, changed(topic, ("spec", "partitions"), 12))
    assert status == 0, output
    stored = kube.get_json("topic", topic["metadata"]["name"], "-n", namespace)
    assert stored["spec"]["partitions"] == 12
