"""The Helm chart lints and renders, and what it renders is valid Kubernetes.

A real helm binary (Helm 4, fetched by `make helm`; fetched here too when
pytest runs on its own) lints the chart strictly and renders it with each
values file. Core kinds are validated against Kubernetes' own schemas with
kubernetes-validate in strict mode; the ServiceMonitor, whose schema belongs
to the Prometheus Operator, is checked for what Prometheus relies on.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "shoal"
VALUES = ["values.yaml", "values-dev.yaml", "values-prod.yaml"]
KUBERNETES_VERSION = "1.31"
OWN_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


@pytest.fixture(scope="module")
def helm() -> str:
    binary = Path(sys.prefix) / "bin" / "helm"
    if not binary.exists():
        subprocess.run(
            ["make", "-s", "helm", f"BIN={Path(sys.prefix) / 'bin'}"], cwd=ROOT, check=True
        )
    found = str(binary) if binary.exists() else shutil.which("helm")
    assert found, "helm is missing and `make helm` did not fetch it"
    return found


def render(helm: str, values: str, *sets: str) -> list[dict[str, Any]]:
    args = [helm, "template", "shoal", str(CHART), "-f", str(CHART / values)]
    for item in sets:
        args += ["--set", item]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("values", VALUES)
def test_chart_lints_strictly_with_each_values_file(helm: str, values: str) -> None:
    result = subprocess.run(
        [helm, "lint", "--strict", str(CHART), "-f", str(CHART / values)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES)
def test_every_rendered_core_object_validates_strictly(helm: str, values: str) -> None:
    for doc in render(helm, values):
        if (doc["apiVersion"], doc["kind"]) in OWN_KINDS:
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


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
