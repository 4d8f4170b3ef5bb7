"""The operator's server-side apply against a real API server.

A Cluster's children, as the operator's builders make them and
``apply_children`` applies them, through the operator's own client logged in
the way kopf logs in (the admin kubeconfig). Then the Cluster changes (no
rack label, no broker setting) and its children are applied again: what the
builders no longer make must be gone from the server (a JSON merge patch
left it there; whole objects they no longer make are pruned), what another
manager set must stay, and a field another manager changed must be taken
back, and logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from control_plane import ControlPlane
from shoal.operator.cluster_reconcile import apply_children, delete_unowned_children
from shoal.operator.cluster_spec import ClusterSpec
from shoal.operator.endpoints import broker_name, config_name, node_reader_binding_name
from shoal.operator.kube import FIELD_MANAGER, KubeClient

NAME = "apply"
IMAGE = "registry.invalid/shoal:1"
RACKED = {
    "brokers": {
        "replicas": 1,
        "rackLabel": "topology.kubernetes.io/zone",
        "config": {"replica_lag_time_max_ms": "20000"},
    },
    "etcd": {"replicas": 1},
    "gateway": {"replicas": 1},
}
PLAIN = {"brokers": {"replicas": 1}, "etcd": {"replicas": 1}, "gateway": {"replicas": 1}}


@pytest.fixture
async def client(kube: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubeClient]:
    """The operator's client, from the ConnectionInfo kopf's kubeconfig login makes."""
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    info = kopf.login_with_kubeconfig(settings=kopf.OperatorSettings())
    assert info is not None
    async with KubeClient(info) as made:
        yield made


def _cluster(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "shoal.dev/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": spec,
    }


def _managers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """fieldsV1 by manager, of the object's own fields (not a subresource's)."""
    return {
        entry["manager"]: entry["fieldsV1"]
        for entry in obj["metadata"]["managedFields"]
        if not entry.get("subresource")
    }


async def test_a_reapply_removes_what_the_builders_no_longer_make_and_keeps_others_fields(
    kube: ControlPlane,
    crds: list[str],
    namespace: str,
    client: KubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = await client.apply(_cluster(namespace, RACKED))
    uid = cluster["metadata"]["uid"]
    racked = ClusterSpec.from_spec(RACKED)
    try:
        await apply_children(client, NAME, namespace, uid, racked, IMAGE)
        sts = kube.get_json("statefulset", "-n", namespace, broker_name(NAME))
        assert sts["spec"]["template"]["spec"]["initContainers"]
        assert sts["spec"]["template"]["spec"]["topologySpreadConstraints"]
        settings = kube.get_json("configmap", "-n", namespace, config_name(NAME))["data"]
        assert settings["SHOAL_REPLICA_LAG_TIME_MAX_MS"] == "20000"

        # Someone labels the StatefulSet (a field the operator never sets), and
        # someone scales it (a field the operator owns).
        kube.kubectl("label", "statefulset", "-n", namespace, broker_name(NAME), "team=streaming")
        kube.kubectl("scale", "statefulset", "-n", namespace, broker_name(NAME), "--replicas=2")

        await client.apply(_cluster(namespace, PLAIN))
        with caplog.at_level(logging.INFO, logger="shoal.operator.kube"):
            await apply_children(client, NAME, namespace, uid, ClusterSpec.from_spec(PLAIN), IMAGE)

        sts = kube.get_json(
            "statefulset", "-n", namespace, broker_name(NAME), "--show-managed-fields"
        )
        pod = sts["spec"]["template"]["spec"]
        assert "initContainers" not in pod
        assert "topologySpreadConstraints" not in pod
        assert "rack" not in {volume["name"] for volume in pod["volumes"]}
        assert pod["containers"][0]["command"] == ["shoal", "broker"]
        settings = kube.get_json("configmap", "-n", namespace, config_name(NAME))["data"]
        assert "SHOAL_REPLICA_LAG_TIME_MAX_MS" not in settings
        # Whole objects the builders stopped making (only with a rack label) are pruned.
        for gone in (
            ("serviceaccount", broker_name(NAME), "-n", namespace),
            ("clusterrolebinding", node_reader_binding_name(namespace, NAME)),
        ):
            assert kube.kubectl("get", *gone, check=False).returncode != 0, gone
        assert pod["serviceAccountName"] == "default"

        assert sts["metadata"]["labels"]["team"] == "streaming"
        managers = _managers(sts)
        assert "f:spec" in managers[FIELD_MANAGER]
        assert managers["kubectl-label"]["f:metadata"]["f:labels"] == {"f:team": {}}
        assert sts["spec"]["replicas"] == 1  # taken back from kubectl scale
        took = [
            r.getMessage() for r in caplog.records if "apply_took_over_fields" in r.getMessage()
        ]
        assert any("kubectl" in line and ".spec.replicas" in line for line in took), took

        # The status: merge-patched, None removes a field, the rest stays.
        await client.patch_status(
            "shoal.dev/v1alpha1", "Cluster", namespace, NAME, {"bootstrap": "b:9092", "image": "i"}
        )
        await client.patch_status("shoal.dev/v1alpha1", "Cluster", namespace, NAME, {"image": None})
        status = kube.get_json("cluster.shoal.dev", "-n", namespace, NAME).get("status")
        assert status == {"bootstrap": "b:9092"}, json.dumps(status)
    finally:
        # The rack's ClusterRoleBinding is cluster-scoped: the namespace does not take it.
        await delete_unowned_children(client, NAME, namespace, uid, racked, IMAGE)


async def test_an_object_the_merge_patch_client_wrote_is_adopted_by_the_first_apply(
    kube: ControlPlane, namespace: str, client: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    # As the operator's client before server-side apply left it: written with
    # operation Update, under the manager its User-Agent named.
    kube.kubectl(
        "create",
        "configmap",
        "-n",
        namespace,
        "settings",
        "--from-literal=kept=1",
        "--from-literal=gone=1",
        f"--field-manager={FIELD_MANAGER}",
    )
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": namespace},
        "data": {"kept": "1"},
    }
    with caplog.at_level(logging.INFO, logger="shoal.operator.kube"):
        await client.apply(manifest)
        stored = kube.get_json("configmap", "-n", namespace, "settings", "--show-managed-fields")
        assert stored["data"] == {"kept": "1"}
        ours = [e for e in stored["metadata"]["managedFields"] if e["manager"] == FIELD_MANAGER]
        assert [e["operation"] for e in ours] == ["Apply"], ours
        # Adopted once: the next apply finds nothing left to adopt.
        await client.apply(manifest)
    adopted = [r for r in caplog.records if "apply_adopted_merge_patch_fields" in r.getMessage()]
    assert len(adopted) == 1
