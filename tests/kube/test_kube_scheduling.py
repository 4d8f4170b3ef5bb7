"""The control plane schedules and runs: a Deployment applied with kubectl
becomes a ReplicaSet (controller manager), its pods are bound to KWOK's nodes
(scheduler) and reported Running and Ready (KWOK), each with a service-account
token mounted (the ServiceAccount admission plugin and the token signer)."""

from __future__ import annotations

import json
from typing import Any

from control_plane import ControlPlane
from harness import wait_until

REPLICAS = 4


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.invalid/never-pulled:1",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                        }
                    ]
                },
            },
        },
    }


def test_every_pod_of_a_deployment_is_scheduled_on_a_kwok_node_and_runs(
    kube: ControlPlane, namespace: str
) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(deployment("web")))

    kube.kubectl("rollout", "status", "-n", namespace, "deployment/web", "--timeout=90s")

    nodes = {n["metadata"]["name"] for n in kube.get_json("nodes", "-l", "type=kwok")["items"]}
    pods = kube.get_json("pods", "-n", namespace, "-l", "app=web")["items"]
    assert len(pods) == REPLICAS
    for pod in pods:
        assert pod["spec"]["nodeName"] in nodes
        assert pod["status"]["phase"] == "Running"
        conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert conditions["Ready"] == "True"
        assert pod["status"]["podIP"]
        assert pod["spec"]["serviceAccountName"] == "default"
        assert any(v["name"].startswith("kube-api-access-") for v in pod["spec"]["volumes"])
    # The scheduler spreads a Deployment's pods over the nodes it can use.
    assert len({pod["spec"]["nodeName"] for pod in pods}) == len(nodes)


def test_scaling_down_deletes_pods_for_real(kube: ControlPlane, namespace: str) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(deployment("api")))
    kube.kubectl("rollout", "status", "-n", namespace, "deployment/api", "--timeout=90s")

    kube.kubectl("scale", "-n", namespace, "deployment/api", "--replicas=1")

    # KWOK finalises deleted pods as a kubelet would: they go, rather than
    # hang in Terminating.
    def one_pod_left() -> bool:
        return len(kube.get_json("pods", "-n", namespace, "-l", "app=api")["items"]) == 1

    wait_until(one_pod_left, 60, "the scaled-down pods to be gone", interval=0.5)
