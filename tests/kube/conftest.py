"""Fixtures of the tests against a real Kubernetes control plane (`make test-kube`).

One control plane for the whole session (control_plane.py): starting it
takes seconds, and every test works in namespaces of its own. `make test`
does not collect this folder; `make test-kube` runs only it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from control_plane import ROOT, ControlPlane, binaries_dir
from helm_cli import Helm

START_SECONDS = pytest.StashKey[float]()


@pytest.fixture(scope="session")
def kube(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """The control plane: ``kubeconfig`` (an admin's), ``server``,
    ``kubectl(*args)`` and ``env`` (KUBECONFIG and the matching kubectl on
    PATH) for subprocesses such as helm."""
    plane = ControlPlane(tmp_path_factory.mktemp("kube"), binaries_dir())
    plane.start()
    request.config.stash[START_SECONDS] = plane.start_seconds
    try:
        yield plane
    finally:
        plane.stop()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    seconds = config.stash.get(START_SECONDS, None)
    if seconds is not None:
        terminalreporter.write_line(f"kube control plane started in {seconds:.1f} s")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report ends with the tail of each component's log."""
    report = yield
    plane = getattr(item, "funcargs", {}).get("kube")
    if report.failed and isinstance(plane, ControlPlane):
        report.sections.append(("kube control plane logs", plane.log_tails()))
    return report


@pytest.fixture
def namespace(kube: ControlPlane) -> Iterator[str]:
    """A fresh namespace, deleted afterwards (without waiting: the namespace
    controller empties it in the background)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def helm(kube: ControlPlane) -> Helm:
    return Helm(ROOT / ".venv" / "bin" / "helm", kube.env)


CRDS = ROOT / "helm" / "shoal" / "crds"
# Shoal's, and kopf's peering CRD that the chart ships for operator replicas.
CRD_NAMES = [
    "clusters.shoal.dev",
    "topics.shoal.dev",
    "tenants.shoal.dev",
    "clusterkopfpeerings.kopf.dev",
]


@pytest.fixture(scope="session")
def crds(kube: ControlPlane) -> list[str]:
    """Shoal's CRDs, applied from the chart and Established (served)."""
    kube.kubectl("apply", "-f", str(CRDS))
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", *CRD_NAMES)
    return CRD_NAMES


# The Prometheus Operator's ServiceMonitor, reduced to its name: its real CRD
# is not a package any registry here serves. What the tests using it prove is
# that the manifests are well-formed and that the objects beside the
# ServiceMonitor (a ConfigMap, the chart's release) are accepted; the
# ServiceMonitor's own fields are checked in tests/unit/test_helm_chart.py.
SERVICE_MONITOR_STAND_IN = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "kind": "ServiceMonitor",
            "plural": "servicemonitors",
            "listKind": "ServiceMonitorList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="session")
def service_monitor_crd(kube: ControlPlane) -> None:
    kube.kubectl("apply", "-f", "-", input=json.dumps(SERVICE_MONITOR_STAND_IN))
    kube.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd",
        "servicemonitors.monitoring.coreos.com",
    )
