"""The operator run outside a pod, or as several replicas: its endpoints file, its
intervals from the environment, kopf's peering settings, and API errors that
a retry may cure (what `make test-kube` runs it with)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest
from shoal.operator.context import Intervals
from shoal.operator.endpoints import (
    ClusterEndpoints,
    EndpointsFileError,
    endpoints_file,
    in_cluster_endpoints,
)
from shoal.operator.handlers import Peering, operator_settings
from shoal.operator.kube import UNREACHABLE, KubeError, _api_errors

LOCAL = {
    "etcd_url": "http://127.0.0.1:2379/shoal",
    "brokers_bootstrap": "127.0.0.1:19092",
    "gateway_bootstrap": "127.0.0.1:9092",
    "gateway_http": "http://127.0.0.1:8080",
}


def test_the_endpoints_file_names_clusters_then_any_then_falls_back_to_service_names(
    tmp_path: Path,
) -> None:
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps({"streaming/demo": LOCAL}))
    resolve = endpoints_file(path)
    assert resolve("streaming", "demo", 3) == ClusterEndpoints(**LOCAL)
    assert resolve("other", "demo", 3) == in_cluster_endpoints("other", "demo", 3)

    # Read at each use: an entry added while the operator runs counts.
    path.write_text(json.dumps({"*": {**LOCAL, "brokers_bootstrap": "127.0.0.1:1"}}))
    assert resolve("other", "demo", 3).brokers_bootstrap == "127.0.0.1:1"

    # The mutual-TLS bootstrap is optional in the file; Service names always have one.
    assert resolve("other", "demo", 3).gateway_mtls_bootstrap is None
    path.write_text(json.dumps({"*": {**LOCAL, "gateway_mtls_bootstrap": "127.0.0.1:9292"}}))
    assert resolve("other", "demo", 3).gateway_mtls_bootstrap == "127.0.0.1:9292"
    found = in_cluster_endpoints("streaming", "demo", 3)
    assert found.gateway_mtls_bootstrap == "demo-gateway.streaming.svc:9292"


def test_an_unreadable_endpoints_file_is_not_an_invalid_spec(tmp_path: Path) -> None:
    # Handlers turn ValueError into a permanent InvalidSpec; this one is retried.
    resolve = endpoints_file(tmp_path / "missing.json")
    with pytest.raises(EndpointsFileError, match=r"missing\.json") as raised:
        resolve("streaming", "demo", 1)
    assert not isinstance(raised.value, ValueError)


def test_intervals_come_from_the_environment_in_seconds() -> None:
    assert Intervals.from_environment({}) == Intervals()
    intervals = Intervals.from_environment(
        {"SHOAL_OPERATOR_CLUSTER_STATUS_S": "2", "SHOAL_OPERATOR_ROLL_POLL_S": "0.5"}
    )
    assert intervals.cluster_status_s == 2
    assert intervals.roll_poll_s == 0.5
    assert intervals.retry_s == Intervals().retry_s
    with pytest.raises(ValueError, match="SHOAL_OPERATOR_RETRY_S must be a number"):
        Intervals.from_environment({"SHOAL_OPERATOR_RETRY_S": "soon"})


def test_one_replica_is_standalone_and_replicas_peer_with_distinct_priorities() -> None:
    alone = operator_settings(namespaced=False)
    assert alone.peering.standalone
    # A deleted Cluster whose timer was running is released within seconds.
    assert alone.background.cancellation_polling <= 2

    peered = operator_settings(namespaced=False, peering=Peering("shoal", 7, lifetime_s=10))
    assert not peered.peering.standalone
    assert peered.peering.mandatory
    assert (peered.peering.name, peered.peering.priority, peered.peering.lifetime) == (
        "shoal",
        7,
        10,
    )


def test_no_answer_from_the_api_server_is_a_transient_kube_error() -> None:
    request = httpx2.Request("GET", "https://127.0.0.1:6443/api")
    with pytest.raises(KubeError) as raised, _api_errors():
        raise httpx2.ConnectError("connection refused", request=request)
    assert raised.value.status == UNREACHABLE
    assert raised.value.transient
    assert not KubeError(404, "not found").transient
    assert KubeError(409, "conflict").transient
