"""Everything in k8s/ is valid Kubernetes, and agrees with the chart and the Spark jobs.

Every YAML file in k8s/ and every kustomize build (base, both overlays, the
CRDs, monitoring) validates as tests/unit/kube_objects.py explains; the
chart's CRDs are byte-identical copies of k8s/crds; k8s/base is the chart's
operator with default values (so neither drifts); the operator's RBAC grants
exactly what it uses, in either install, with no wildcard; the examples
agree with each other and with spark-operator-jobs/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_objects import (
    CHART,
    CRDS,
    K8S,
    ROOT,
    Manifest,
    documents,
    find,
    helm_template,
    kustomize,
    rbac_grants,
    tool,
    validate_all,
)
from shoal.operator.builders import NODE_READER_ROLE
from shoal.operator.endpoints import key_secret_name

MANIFEST_FILES = sorted(
    p.relative_to(K8S) for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml"
)
BUILDS = ["base", "overlays/dev", "overlays/prod", "crds", "monitoring"]
OPERATOR_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment")

# What the operator calls, in the namespaces it serves (kopf, its handlers, the
# roller), as the API server's audit log shows it (tests/kube/test_operator_process.py).
NAMESPACED_NEEDS = {
    *(
        ("shoal.dev", r, v)
        for r in ("clusters", "topics", "tenants")
        for v in ("list", "watch", "patch")
    ),
    # A Topic or Tenant reads its Cluster.
    ("shoal.dev", "clusters", "get"),
    # A deleted Tenant takes its Topic resources with it.
    ("shoal.dev", "topics", "delete"),
    *(("shoal.dev", f"{r}/status", "patch") for r in ("clusters", "topics", "tenants")),
    *(
        (g, r, v)
        for g, r in (
            ("apps", "statefulsets"),
            ("apps", "deployments"),
            ("", "services"),
            ("", "configmaps"),
            ("", "serviceaccounts"),
            ("", "secrets"),
            ("policy", "poddisruptionbudgets"),
            ("networking.k8s.io", "networkpolicies"),
        )
        for v in ("list", "create", "patch", "delete")
    ),
    *(("", "pods", v) for v in ("get", "list", "delete")),
    # The roller waits until the broker StatefulSet's controller saw its template.
    ("apps", "statefulsets", "get"),
    # kopf posts a failed handler's warnings as Events.
    ("", "events", "create"),
}
# ...and outside any namespace.
CLUSTER_NEEDS = {
    *(("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")),
    # The brokers' binding to the node reader role, and what that role grants.
    *(
        ("rbac.authorization.k8s.io", "clusterrolebindings", v)
        for v in ("get", "create", "patch", "delete")
    ),
    ("", "nodes", "get"),
}


@pytest.fixture(scope="module")
def helm() -> str:
    return tool("helm")


@pytest.fixture(scope="module")
def kubectl() -> str:
    return tool("kubectl")


@pytest.fixture(scope="module")
def base(kubectl: str) -> list[Manifest]:
    return kustomize(kubectl, K8S / "base")


def operator_objects(docs: list[Manifest]) -> dict[tuple[str, str], Manifest]:
    return {
        (d["kind"], d["metadata"]["name"]): d
        for d in docs
        if d["kind"] in OPERATOR_KINDS and d["metadata"]["name"] == "shoal-operator"
    }


def operator_rules(docs: list[Manifest], kind: str) -> list[dict[str, Any]]:
    return [
        rule
        for role in find(docs, kind)
        if role["metadata"]["name"] != NODE_READER_ROLE
        for rule in role["rules"]
    ]


def example(name: str) -> list[Manifest]:
    return documents((K8S / "examples" / name).read_text())


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=str)
def test_every_file_in_k8s_validates(path: Path) -> None:
    assert validate_all(documents((K8S / path).read_text())) > 0


@pytest.mark.parametrize("build", BUILDS)
def test_every_kustomize_build_renders_valid_objects(kubectl: str, build: str) -> None:
    assert validate_all(kustomize(kubectl, K8S / build)) > 0


def test_chart_crds_are_byte_identical_to_k8s_crds() -> None:
    ours = {p.name: p.read_bytes() for p in CRDS.glob("*.*.dev.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").iterdir()}
    assert set(ours) == {
        "clusters.shoal.dev.yaml",
        "topics.shoal.dev.yaml",
        "tenants.shoal.dev.yaml",
        # kopf's, for operator replicas in a peering (the chart's operator.replicas).
        "clusterkopfpeerings.kopf.dev.yaml",
    }
    assert chart == ours


def test_base_installs_the_crds_and_the_operator_in_shoal_system(base: list[Manifest]) -> None:
    (namespace,) = find(base, "Namespace")
    assert namespace["metadata"]["name"] == "shoal-system"
    assert {d["metadata"]["name"] for d in find(base, "CustomResourceDefinition")} == {
        p.stem for p in CRDS.glob("*.*.dev.yaml")
    }
    for doc in operator_objects(base).values():
        if doc["kind"] in ("ServiceAccount", "Deployment"):
            assert doc["metadata"]["namespace"] == "shoal-system"


def test_base_is_what_the_chart_renders_with_default_values(
    helm: str, base: list[Manifest]
) -> None:
    chart = operator_objects(helm_template(helm))
    ours = operator_objects(base)
    assert set(ours) == set(chart) == {(kind, "shoal-operator") for kind in OPERATOR_KINDS}

    def same(kind: str) -> tuple[Any, Any]:
        return ours[kind, "shoal-operator"], chart[kind, "shoal-operator"]

    ours_role, chart_role = same("ClusterRole")
    assert ours_role["rules"] == chart_role["rules"]
    ours_binding, chart_binding = same("ClusterRoleBinding")
    assert ours_binding["roleRef"] == chart_binding["roleRef"]
    assert ours_binding["subjects"] == chart_binding["subjects"]
    ours_deployment, chart_deployment = same("Deployment")
    # Everything but the metadata, where Helm adds its own labels.
    assert ours_deployment["spec"] == chart_deployment["spec"]


@pytest.mark.parametrize("source", ["k8s/base", "chart", "chart watching two namespaces"])
def test_rbac_grants_exactly_what_the_operator_uses(
    helm: str, base: list[Manifest], source: str
) -> None:
    if source == "k8s/base":
        docs, namespaced = base, False
    elif source == "chart":
        docs, namespaced = helm_template(helm), False
    else:
        docs, namespaced = helm_template(helm, None, "watchNamespaces={team-a,team-b}"), True
    cluster_rules = operator_rules(docs, "ClusterRole")
    for rule in cluster_rules + operator_rules(docs, "Role"):
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard {field} in {rule}"
        assert "resourceNames" not in rule or rule["resourceNames"]
    if namespaced:
        assert rbac_grants(cluster_rules) == CLUSTER_NEEDS
        roles = find(docs, "Role")
        assert {r["metadata"]["namespace"] for r in roles} == {"team-a", "team-b"}
        for role in roles:
            assert rbac_grants(role["rules"]) == NAMESPACED_NEEDS
    else:
        assert rbac_grants(cluster_rules) == CLUSTER_NEEDS | NAMESPACED_NEEDS


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_overlays_size_the_operator_as_the_chart_values_do(
    helm: str, kubectl: str, base: list[Manifest], env: str
) -> None:
    overlay = operator_objects(kustomize(kubectl, K8S / "overlays" / env))
    (deployment,) = [d for (kind, _), d in overlay.items() if kind == "Deployment"]
    (base_deployment,) = find(base, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (base_container,) = base_deployment["spec"]["template"]["spec"]["containers"]
    # Only the resources differ from the base's container...
    assert {k: v for k, v in container.items() if k != "resources"} == {
        k: v for k, v in base_container.items() if k != "resources"
    }
    # ...and they are the chart's for the same environment.
    (chart_deployment,) = find(helm_template(helm, f"values-{env}.yaml"), "Deployment")
    assert (
        container["resources"]
        == chart_deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    )


def test_examples_name_one_cluster_that_exists() -> None:
    (cluster,) = example("cluster.yaml")
    assert cluster["kind"] == "Cluster"
    assert cluster["metadata"]["name"] == "demo"
    for doc in example("tenant.yaml") + example("topics.yaml"):
        assert doc["spec"]["cluster"] == "demo"


def test_example_topics_belong_to_the_example_tenant_and_fit_the_cluster() -> None:
    (cluster,) = example("cluster.yaml")
    (tenant,) = example("tenant.yaml")
    topics = example("topics.yaml")
    assert len(topics) == 2
    brokers = cluster["spec"]["brokers"]["replicas"]
    min_isr = int(cluster["spec"]["topicDefaults"]["min.insync.replicas"])
    for topic in topics:
        assert topic["spec"]["tenant"] == tenant["metadata"]["name"] == "demo"
        # Enough replicas for acks=all to survive one broker restarting, and
        # no more than the cluster has brokers.
        assert min_isr < topic["spec"]["replicas"] <= brokers


def test_example_tenant_has_the_keys_the_spark_jobs_mount() -> None:
    (tenant,) = example("tenant.yaml")
    tenant_id = tenant["spec"].get("name", tenant["metadata"]["name"])
    roles = {key["name"]: key.get("role", "default") for key in tenant["spec"]["keys"]}
    assert roles == {"app": "default", "spark": "read-only"}
    topics = {t["spec"].get("topicName", t["metadata"]["name"]) for t in example("topics.yaml")}

    jobs = sorted((ROOT / "spark-operator-jobs" / "manifests").glob("*.yaml"))
    assert jobs
    for path in jobs:
        template = yaml.safe_load(path.read_text())["spec"]["template"]
        secrets = {v["secret"]["secretName"] for v in template["volumes"] if "secret" in v}
        assert secrets == {key_secret_name(tenant_id, "spark")}, path.name
        args = template["arguments"]
        assert args[args.index("--topic") + 1] in topics, path.name


@pytest.mark.parametrize("source", ["k8s/base", "chart"])
def test_brokers_node_reader_role_exists_and_reads_only_nodes(
    helm: str, base: list[Manifest], source: str
) -> None:
    docs = base if source == "k8s/base" else helm_template(helm)
    (role,) = find(docs, "ClusterRole", NODE_READER_ROLE)
    assert rbac_grants(role["rules"]) == {("", "nodes", "get")}
