"""The Helm chart lints and renders, and what it renders is valid Kubernetes.

A real helm binary (Helm 4, fetched by `make helm`; fetched here too when
pytest runs on its own) lints the chart strictly and renders it with each
values file. Core kinds and the CRDs are validated against Kubernetes' own
schemas with kubernetes-validate in strict mode, our Cluster against our CRD
(tests/unit/kube_objects.py); the ServiceMonitor, whose schema belongs to the
Prometheus Operator, is checked for what Prometheus relies on. The operator's
RBAC is checked in tests/unit/test_k8s_manifests.py, beside k8s/base's.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from kube_objects import CHART, ROOT, find, helm_template, tool, validate_all

VALUES = ["values.yaml", "values-dev.yaml", "values-prod.yaml"]


@pytest.fixture(scope="module")
def helm() -> str:
    return tool("helm")


def render(helm: str, values: str, *sets: str) -> list[dict[str, Any]]:
    return helm_template(helm, values, *sets)


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = find(docs, "Deployment", "shoal-operator")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


@pytest.mark.parametrize("values", VALUES)
def test_chart_lints_strictly_with_each_values_file(helm: str, values: str) -> None:
    result = subprocess.run(
        [helm, "lint", "--strict", str(CHART), "-f", str(CHART / values)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES)
def test_every_rendered_object_and_crd_validates_strictly(helm: str, values: str) -> None:
    docs = helm_template(helm, values, crds=True)
    # Shoal's three and kopf's peering CRD.
    assert len(find(docs, "CustomResourceDefinition")) == 4
    assert validate_all(docs) == len(docs)


def test_service_monitor_scrapes_gateway_and_broker_metrics_ports(helm: str) -> None:
    docs = render(helm, "values-prod.yaml")
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"]["app.kubernetes.io/name"] == "shoal"
    (components,) = spec["selector"]["matchExpressions"]
    assert set(components["values"]) == {"gateway", "broker"}
    # Gateways too: on their own metrics port, never the tenants' `http` port.
    assert [(e["port"], e["path"]) for e in spec["endpoints"]] == [("metrics", "/metrics")]


def test_monitoring_is_off_unless_asked(helm: str) -> None:
    kinds = {d["kind"] for d in render(helm, "values-dev.yaml")}
    assert "ServiceMonitor" not in kinds
    assert "ConfigMap" not in kinds


def test_dashboard_config_map_carries_the_dashboard_of_k8s(helm: str) -> None:
    (config_map,) = [d for d in render(helm, "values-prod.yaml") if d["kind"] == "ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(config_map["data"]["shoal.json"])
    assert shipped == json.loads((CHART / "dashboards" / "shoal.json").read_text())
    in_k8s = ROOT / "k8s" / "monitoring" / "grafana-dashboard.json"
    assert shipped == json.loads(in_k8s.read_text())


def test_a_value_the_schema_does_not_know_is_refused(helm: str) -> None:
    result = subprocess.run(
        [helm, "template", "shoal", str(CHART), "--set", "monitoring.serviceMonitr.enabled=true"],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "serviceMonitr" in result.stderr


@pytest.mark.parametrize(
    "bad",
    ["image.pullPolicy=Sometimes", "watchNamespaces={Not_A_Namespace}", "cluster.nme=x"],
)
def test_values_outside_the_schema_are_refused(helm: str, bad: str) -> None:
    result = subprocess.run(
        [helm, "template", "shoal", str(CHART), "--set", bad], capture_output=True, text=True
    )
    assert result.returncode != 0, f"{bad} was accepted"


def test_operator_runs_once_non_root_with_kopf_liveness(helm: str) -> None:
    docs = render(helm, "values.yaml")
    (deployment,) = find(docs, "Deployment", "shoal-operator")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "shoal-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # Clusters' NetworkPolicies admit the operator to brokers and etcd by these labels.
    labels = spec["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "shoal"
    assert labels["app.kubernetes.io/component"] == "operator"

    container = operator_container(docs)
    assert container["args"] == ["operator", "--liveness-port", "8081", "--metrics-listen", ":9404"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe = container["livenessProbe"]["httpGet"]
    assert (probe["path"], ports[probe["port"]]) == ("/healthz", 8081)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"]["memory"]


def test_operator_replicas_elect_one_through_kopf_peering(helm: str) -> None:
    docs = render(helm, "values.yaml", "operator.replicas=3", "operator.peering.lifetimeSeconds=20")
    (deployment,) = find(docs, "Deployment", "shoal-operator")
    assert deployment["spec"]["replicas"] == 3
    # One serves and the others wait, so old and new replicas may overlap.
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    env = env_of(operator_container(docs))
    assert env["SHOAL_OPERATOR_PEERING"] == "shoal-operator"
    assert env["SHOAL_OPERATOR_PEERING_LIFETIME_S"] == "20"
    (peering,) = find(docs, "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert peering["metadata"]["name"] == "shoal-operator"
    (role,) = find(docs, "ClusterRole", "shoal-operator")
    assert {
        "apiGroups": ["kopf.dev"],
        "resources": ["clusterkopfpeerings"],
        "verbs": ["list", "watch", "patch"],
    } in role["rules"]

    standalone = render(helm, "values.yaml")
    assert not find(standalone, "ClusterKopfPeering")
    assert "SHOAL_OPERATOR_PEERING" not in env_of(operator_container(standalone))


def test_operator_replicas_need_a_cluster_wide_operator(helm: str) -> None:
    result = subprocess.run(
        [helm, "template", "shoal", str(CHART), "--set", "operator.replicas=2",
         "--set", "watchNamespaces={team-a}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode != 0
    assert "operator.replicas above 1 needs a cluster-wide operator" in result.stderr


def test_operator_gives_clusters_its_own_image(helm: str) -> None:
    chart_version = render(helm, "values.yaml")
    container = operator_container(chart_version)
    assert container["image"] == "ghcr.io/shoal-dev/shoal:0.1.0"
    assert env_of(container)["SHOAL_OPERATOR_IMAGE"] == container["image"]

    pinned = operator_container(
        render(helm, "values.yaml", "image.repository=registry.local/shoal", "image.tag=e2e")
    )
    assert pinned["image"] == "registry.local/shoal:e2e"
    assert env_of(pinned)["SHOAL_OPERATOR_IMAGE"] == "registry.local/shoal:e2e"


def test_watching_every_namespace_by_default(helm: str) -> None:
    docs = render(helm, "values.yaml")
    assert "SHOAL_WATCH_NAMESPACES" not in env_of(operator_container(docs))
    assert not find(docs, "Role")
    assert not find(docs, "RoleBinding")
    (binding,) = find(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "shoal-operator", "namespace": "shoal-system"}
    ]


def test_watched_namespaces_get_a_role_each(helm: str) -> None:
    docs = render(helm, "values.yaml", "watchNamespaces={team-a,team-b}")
    assert env_of(operator_container(docs))["SHOAL_WATCH_NAMESPACES"] == "team-a,team-b"
    assert {r["metadata"]["namespace"] for r in find(docs, "Role")} == {"team-a", "team-b"}
    for binding in find(docs, "RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == "shoal-system"
    (cluster_role,) = find(docs, "ClusterRole", "shoal-operator")
    resources = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    # Only what is not namespaced stays cluster-wide.
    assert resources == {"customresourcedefinitions", "clusterrolebindings", "nodes"}


def test_no_cluster_unless_enabled(helm: str) -> None:
    assert not find(render(helm, "values.yaml"), "Cluster")


def test_cluster_spec_is_passed_through(helm: str) -> None:
    docs = render(
        helm,
        "values.yaml",
        "cluster.enabled=true",
        "cluster.name=events",
        "cluster.spec.brokers.replicas=5",
        "cluster.spec.image=registry.local/shoal:1",
    )
    (cluster,) = find(docs, "Cluster", "events")
    assert cluster["metadata"]["namespace"] == "shoal-system"
    assert cluster["spec"] == {"brokers": {"replicas": 5}, "image": "registry.local/shoal:1"}


def test_dev_values_make_a_cluster_of_one_of_everything(helm: str) -> None:
    (cluster,) = find(render(helm, "values-dev.yaml"), "Cluster")
    spec = cluster["spec"]
    assert spec["etcd"]["replicas"] == 1
    assert spec["brokers"]["replicas"] == 1
    assert spec["gateway"]["replicas"] == 1
    # One broker cannot hold more in-sync replicas than itself.
    assert spec["topicDefaults"]["min.insync.replicas"] == "1"


def test_prod_values_make_a_zone_spread_cluster_behind_a_load_balancer(helm: str) -> None:
    docs = render(helm, "values-prod.yaml")
    (cluster,) = find(docs, "Cluster")
    spec = cluster["spec"]
    assert spec["etcd"]["replicas"] == 3
    assert spec["brokers"]["replicas"] == 3
    assert spec["brokers"]["rackLabel"] == "topology.kubernetes.io/zone"
    assert spec["gateway"] == spec["gateway"] | {"replicas": 2, "serviceType": "LoadBalancer"}
    assert int(spec["topicDefaults"]["min.insync.replicas"]) < spec["brokers"]["replicas"]
    assert find(docs, "ServiceMonitor")
    # The operator's requests are set for production, not left at the defaults.
    prod = operator_container(docs)["resources"]
    default = operator_container(render(helm, "values.yaml"))["resources"]
    assert prod != default


def test_a_cluster_in_a_namespace_nobody_watches_is_refused(helm: str) -> None:
    result = subprocess.run(
        [
            *(helm, "template", "shoal", str(CHART), "--namespace", "shoal-system"),
            *("--set", "cluster.enabled=true", "--set", "watchNamespaces={team-a}"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "watchNamespaces" in result.stderr


@pytest.mark.parametrize(
    ("values", "cluster", "replicas"),
    [
        ("values-dev.yaml", "dev", 1),
        ("values-prod.yaml", "shoal", 3),
    ],
)
def test_notes_tell_what_to_apply_next(helm: str, values: str, cluster: str, replicas: int) -> None:
    result = subprocess.run(
        [
            *(helm, "install", "shoal", str(CHART), "-f", str(CHART / values)),
            *("--namespace", "shoal-system", "--dry-run=client"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"wait cluster/{cluster} --for=condition=Ready" in notes
    assert "kind: Tenant" in notes
    assert "kind: Topic" in notes
    assert f"cluster: {cluster}" in notes
    # The example topic fits the cluster it is made on.
    assert f"replicas: {replicas}" in notes
    assert "get tenants,topics" in notes
    assert "secret shoal-demo-app" in notes
