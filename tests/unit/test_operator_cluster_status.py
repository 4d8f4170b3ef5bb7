"""A Cluster's status from what the operator observed: Ready, starting, or Degraded."""

from __future__ import annotations

from typing import Any

from shoal.operator.cluster_reconcile import STARTING, ClusterHealth, cluster_status
from shoal.operator.endpoints import ClusterEndpoints
from shoal.operator.pods import pod_ready

ENDPOINTS = ClusterEndpoints("http://etcd/shoal", "b0:19092", "gw:9092", "http://gw:8080")
HEALTHY = ClusterHealth(desired=3, ready=3, partitions=12)


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_healthy_cluster_is_ready_with_its_counts() -> None:
    status = cluster_status(HEALTHY, 4, [], ENDPOINTS, "shoal:2", settling=True)
    assert _conditions(status) == {
        "Ready": ("True", "Reconciled"),
        "Reconciling": ("False", "Reconciled"),
        "Degraded": ("False", "Reconciled"),
    }
    assert status["observedGeneration"] == 4
    assert status["brokers"] == {"desired": 3, "ready": 3}
    assert status["partitions"] == {"total": 12, "underReplicated": 0, "offline": 0}
    assert status["bootstrap"] == "gw:9092"
    assert status["image"] == "shoal:2"


def test_the_mutual_tls_bootstrap_is_shown_only_when_the_gateway_runs_that_listener() -> None:
    endpoints = ClusterEndpoints(
        "http://etcd/shoal", "b0:19092", "gw:9092", "http://gw:8080", "gw:9292"
    )
    with_ca = cluster_status(HEALTHY, 1, [], endpoints, None, settling=True, mtls=True)
    assert with_ca["mtlsBootstrap"] == "gw:9292"
    # None: the merge-patch removes a value an earlier spec (with a client CA) left.
    without = cluster_status(HEALTHY, 1, [], endpoints, None, settling=True)
    assert without["mtlsBootstrap"] is None
    assert without["bootstrap"] == "gw:9092"


def test_brokers_still_starting_after_a_change_are_reconciling_not_degraded() -> None:
    starting = ClusterHealth(desired=3, ready=1)
    status = cluster_status(starting, 1, [], ENDPOINTS, "shoal:1", settling=True)
    conditions = _conditions(status)
    assert conditions["Reconciling"] == ("True", STARTING)
    assert conditions["Ready"][0] == "False"
    assert "Degraded" not in conditions
    # The timer keeps it so while they start...
    later = cluster_status(starting, 1, status["conditions"], ENDPOINTS, None, settling=False)
    assert _conditions(later)["Reconciling"] == ("True", STARTING)
    assert "image" not in later
    # ...and makes it Ready once they are.
    done = cluster_status(HEALTHY, 1, later["conditions"], ENDPOINTS, None, settling=False)
    assert _conditions(done)["Ready"] == ("True", "Reconciled")
    assert _conditions(done)["Reconciling"][0] == "False"


def test_a_broker_lost_later_degrades_the_cluster() -> None:
    ready = cluster_status(HEALTHY, 1, [], ENDPOINTS, None, settling=True)["conditions"]
    lost = ClusterHealth(desired=3, ready=2, partitions=12, under_replicated=4)
    status = cluster_status(lost, 1, ready, ENDPOINTS, None, settling=False)
    assert _conditions(status)["Degraded"] == ("True", "BrokersNotReady")
    assert _conditions(status)["Ready"] == ("False", "BrokersNotReady")
    assert status["partitions"]["underReplicated"] == 4


def test_offline_partitions_are_degraded_even_while_settling() -> None:
    offline = ClusterHealth(desired=3, ready=3, partitions=5, offline=2)
    status = cluster_status(offline, 2, [], ENDPOINTS, None, settling=True)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "PartitionsOffline")
    assert "2 partition(s)" in degraded["message"]


def test_unreachable_brokers_leave_the_partition_counts_out() -> None:
    unreachable = ClusterHealth(desired=3, ready=3, unreachable="no answer from b0:19092")
    ready = cluster_status(HEALTHY, 1, [], ENDPOINTS, None, settling=True)
    status = cluster_status(unreachable, 1, ready["conditions"], ENDPOINTS, None, settling=False)
    assert "partitions" not in status
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["message"] == "no answer from b0:19092"


def test_a_pod_is_ready_only_with_ready_true_and_not_terminating() -> None:
    ready = {"metadata": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert pod_ready(ready)
    assert not pod_ready({"metadata": {}, "status": {}})
    assert not pod_ready({**ready, "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    assert not pod_ready(not_ready)
