"""The chart's life on a real API server, once per environment's values file:
`helm install` into a fresh namespace (the operator's pod scheduled and Running
on a KWOK node, its RBAC granting what the operator uses and no more),
`helm upgrade` with a changed value (seen in the objects), `helm uninstall`
(every object gone).

The chart ships a ClusterRole under a fixed name (shoal-broker-node-reader),
so one release exists at a time: each test uninstalls its release, even when
it fails.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from control_plane import ROOT, ControlPlane
from harness import wait_until
from helm_cli import Helm

CHART = ROOT / "helm" / "shoal"
RELEASE = "shoal"
OPERATOR = "shoal-operator"


def manifest_json(objects: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


@pytest.fixture
def release(
    kube: ControlPlane,
    helm: Helm,
    crds: list[str],
    service_monitor_crd: None,
    namespace: str,
) -> Iterator[str]:
    """The namespace the test installs RELEASE into; the release is gone afterwards."""
    yield namespace
    if helm("status", RELEASE, "-n", namespace, check=False).returncode == 0:
        helm("uninstall", RELEASE, "-n", namespace, "--wait", "--timeout=2m", check=False)


def install(helm: Helm, namespace: str, values: str, *sets: str, command: str = "install") -> None:
    helm(
        command, RELEASE, str(CHART), "-n", namespace, "-f", str(CHART / values),
        *(a for s in sets for a in ("--set", s)), "--wait", "--timeout=2m",
    )  # fmt: skip


def operator_container(kube: ControlPlane, namespace: str) -> dict[str, Any]:
    deployment = kube.get_json("deployment", OPERATOR, "-n", namespace)
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def operator_pod(kube: ControlPlane, namespace: str) -> dict[str, Any]:
    selector = "app.kubernetes.io/component=operator"
    (pod,) = kube.get_json("pods", "-n", namespace, "-l", selector)["items"]
    return dict(pod)


@pytest.mark.parametrize("values", ["values.yaml", "values-dev.yaml", "values-prod.yaml"])
def test_install_upgrade_uninstall(
    kube: ControlPlane, helm: Helm, release: str, values: str
) -> None:
    namespace = release
    chart_values = _values(values)

    install(helm, namespace, values)

    objects = helm.manifest(RELEASE, namespace)
    on_server = kube.kubectl(
        "get", "-n", namespace, "-f", "-", "-o", "name", input=manifest_json(objects)
    ).stdout.split()
    assert len(on_server) == len(objects)
    pod = operator_pod(kube, namespace)
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeName"].startswith("kwok-node-")
    assert pod["spec"]["serviceAccountName"] == OPERATOR
    cluster = chart_values.get("cluster", {})
    clusters = kube.get_json("clusters", "-n", namespace)["items"]
    if cluster.get("enabled"):
        (stored,) = clusters
        assert stored["metadata"]["name"] == cluster["name"]
        assert stored["spec"]["brokers"]["replicas"] == cluster["spec"]["brokers"]["replicas"]
    else:
        assert clusters == []

    sets = ["operator.resources.requests.cpu=250m"]
    if cluster.get("enabled"):
        sets.append("cluster.spec.brokers.replicas=5")
    install(helm, namespace, values, *sets, command="upgrade")

    assert operator_container(kube, namespace)["resources"]["requests"]["cpu"] == "250m"
    # Recreate: the old pod went before the new one, which runs the new template.
    pod = operator_pod(kube, namespace)
    assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "250m"
    assert pod["status"]["phase"] == "Running"
    if cluster.get("enabled"):
        stored = kube.get_json("cluster", cluster["name"], "-n", namespace)
        assert stored["spec"]["brokers"]["replicas"] == 5
        assert stored["metadata"]["generation"] == 2
    history = json.loads(helm("history", RELEASE, "-n", namespace, "-o", "json").stdout)
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "deployed")]

    helm("uninstall", RELEASE, "-n", namespace, "--wait", "--timeout=2m")

    left = kube.kubectl(
        "get", "-n", namespace, "-f", "-", "--ignore-not-found", "-o", "name",
        input=manifest_json(objects),
    ).stdout  # fmt: skip
    assert left == ""
    # The garbage collector removes the ReplicaSet, and KWOK the pod, after
    # the Deployment is gone.
    wait_until(
        lambda: kube.get_json("pods", "-n", namespace)["items"] == [],
        60,
        "the operator's pod to be gone",
        interval=0.5,
    )
    assert helm("list", "-n", namespace, "-q").stdout.strip() == ""


def test_operator_rbac_grants_what_it_uses_and_no_more(
    kube: ControlPlane, helm: Helm, release: str
) -> None:
    """Checked by the API server's own RBAC authorizer, as the operator's
    service account; and the escalation check lets it bind brokers to the
    node reader role, which it can only do while it holds what that role grants."""
    namespace = release
    install(helm, namespace, "values.yaml")
    operator = f"system:serviceaccount:{namespace}:{OPERATOR}"

    def can(verb: str, resource: str, *where: str) -> bool:
        result = kube.kubectl(
            "auth", "can-i", verb, resource, f"--as={operator}", *where, check=False
        )
        return result.stdout.strip() == "yes"

    assert can("watch", "clusters.shoal.dev", "--all-namespaces")
    assert can("patch", "topics.shoal.dev/status", "-n", "default")
    assert can("create", "statefulsets.apps", "-n", "default")
    assert can("delete", "pods", "-n", "default")
    assert can("get", "nodes")
    assert not can("delete", "clusters.shoal.dev", "-n", "default")
    assert not can("create", "pods", "-n", "default")
    assert not can("list", "nodes")
    assert not can("create", "clusterroles.rbac.authorization.k8s.io")

    def bind_brokers_to(role: str) -> subprocess.CompletedProcess[str]:
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "shoal-demo-broker-node-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "shoal-demo-broker", "namespace": namespace}
            ],
        }
        return kube.kubectl(
            "create", "-f", "-", f"--as={operator}", "--dry-run=server", "-o", "name",
            input=json.dumps(binding), check=False,
        )  # fmt: skip

    created = bind_brokers_to("shoal-broker-node-reader")
    assert created.returncode == 0, created.stderr
    assert (
        created.stdout.strip()
        == "clusterrolebinding.rbac.authorization.k8s.io/shoal-demo-broker-node-reader"
    )
    # A role granting more than the operator holds is refused.
    refused = bind_brokers_to("cluster-admin")
    assert refused.returncode != 0
    assert "forbidden" in refused.stderr


def _values(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / name).read_text())
    return loaded
