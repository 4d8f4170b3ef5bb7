"""Every manifest of k8s/ goes through a real API server.

The kustomize base and overlays install cluster-wide objects under fixed
names (namespace shoal-system, ClusterRole shoal-broker-node-reader) that the
chart's release installs too, so they are applied as a server-side dry run:
the API server decodes, defaults, validates and admits every object exactly
as for a real apply, and stores nothing. The monitoring kustomization and the
examples are namespaced: they are applied for real, in a namespace of their
own, the way their comments tell a user to.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from control_plane import ROOT, ControlPlane

K8S = ROOT / "k8s"


def kustomize(kube: ControlPlane, directory: str) -> list[dict[str, Any]]:
    text = kube.kubectl("kustomize", str(K8S / directory)).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def server_dry_run(kube: ControlPlane, directory: str) -> list[dict[str, Any]]:
    """The objects as the API server would store them."""
    listing = kube.kubectl_json("apply", "-k", str(K8S / directory), "--dry-run=server")
    return list(listing["items"]) if listing.get("kind") == "List" else [listing]


def operator_deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = (o for o in objects if o["kind"] == "Deployment")
    return deployment


def requests(deployment: dict[str, Any]) -> dict[str, str]:
    return dict(deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"])


@pytest.fixture(scope="module")
def shoal_system(kube: ControlPlane) -> Iterator[None]:
    """The namespace of k8s/base, created for real: a dry run does not store
    the Namespace it creates, so the objects in it would find none."""
    kube.kubectl("create", "namespace", "shoal-system")
    yield
    kube.kubectl("delete", "namespace", "shoal-system", "--wait=false")


@pytest.mark.parametrize("directory", ["base", "overlays/dev", "overlays/prod"])
def test_kustomization_is_accepted_by_the_server(
    kube: ControlPlane, crds: list[str], shoal_system: None, directory: str
) -> None:
    built = kustomize(kube, directory)
    stored = server_dry_run(kube, directory)

    def key(obj: dict[str, Any]) -> tuple[str, str, str]:
        return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]

    assert sorted(map(key, stored)) == sorted(map(key, built))
    deployment = operator_deployment(stored)
    wanted = operator_deployment(built)
    # The overlay's patch survives the server's defaulting.
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert (
        container["resources"] == wanted["spec"]["template"]["spec"]["containers"][0]["resources"]
    )
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


def test_overlays_differ_only_in_what_they_patch(
    kube: ControlPlane, crds: list[str], shoal_system: None
) -> None:
    base, dev, prod = (
        operator_deployment(server_dry_run(kube, d))
        for d in ("base", "overlays/dev", "overlays/prod")
    )

    assert requests(dev) == {"cpu": "20m", "memory": "96Mi"}
    assert requests(prod) == {"cpu": "100m", "memory": "256Mi"}
    assert prod["spec"]["revisionHistoryLimit"] == 5
    for overlay in (dev, prod):
        assert (
            overlay["spec"]["template"]["spec"]["containers"][0]["image"]
            == (base["spec"]["template"]["spec"]["containers"][0]["image"])
        )


def test_monitoring_applies_as_its_comment_says(
    kube: ControlPlane, service_monitor_crd: None, namespace: str
) -> None:
    kube.kubectl("apply", "-n", namespace, "-k", str(K8S / "monitoring"))

    names = kube.kubectl("get", "servicemonitors", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(names) == [
        "servicemonitor.monitoring.coreos.com/shoal-broker",
        "servicemonitor.monitoring.coreos.com/shoal-gateway",
    ]
    dashboard = kube.get_json("configmap", "shoal-grafana-dashboard", "-n", namespace)
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["grafana-dashboard.json"].startswith("{")


def test_examples_apply_and_get_the_schema_defaults(
    kube: ControlPlane, crds: list[str], namespace: str
) -> None:
    output = kube.kubectl("apply", "-n", namespace, "-f", str(K8S / "examples")).stdout

    assert sorted(output.split("\n")[:-1]) == [
        "cluster.shoal.dev/demo created",
        "tenant.shoal.dev/demo created",
        "topic.shoal.dev/events created",
        "topic.shoal.dev/orders created",
    ]
    cluster = kube.get_json("cluster", "demo", "-n", namespace)["spec"]
    # What the example leaves out, the CRD's defaults fill in.
    assert cluster["imagePullPolicy"] == "IfNotPresent"
    assert cluster["gateway"]["serviceType"] == "ClusterIP"
    assert cluster["brokers"]["storage"]["deleteClaim"] is False
    assert cluster["etcd"]["replicas"] == 1
    tenant = kube.get_json("tenant", "demo", "-n", namespace)["spec"]
    assert {k["name"]: k["role"] for k in tenant["keys"]} == {
        "app": "default",
        "spark": "read-only",
    }
    topics = kube.get_json("topics", "-n", namespace)["items"]
    assert {t["metadata"]["name"]: t["spec"]["partitions"] for t in topics} == {
        "events": 6,
        "orders": 3,
    }
    # Applying them again is a no-op: nothing fights the defaults.
    again = kube.kubectl("apply", "-n", namespace, "-f", str(K8S / "examples")).stdout
    assert all(line.endswith(" unchanged") for line in again.strip().splitlines()), again
