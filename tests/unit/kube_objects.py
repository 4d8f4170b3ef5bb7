"""Offline validation of Kubernetes objects, shared by the chart's and k8s/'s tests.

Core kinds (and CustomResourceDefinitions themselves) are checked against
Kubernetes' own OpenAPI schemas by kubernetes-validate in strict mode, which
refuses unknown fields. Our own kinds (shoal.dev Cluster, Topic, Tenant) are
checked with jsonschema against the openAPIV3Schema of our CRDs in k8s/crds,
made closed the way the API server's pruning makes them: a field the CRD does
not declare would be silently dropped by a real API server, so here it fails.

What this cannot check: the CRDs' CEL rules (``x-kubernetes-validations``,
e.g. "partitions can only grow") compare an object with its previous version
and need an API server to evaluate; they are dropped, as are the other
``x-kubernetes-*`` markers. ``default`` is an annotation to jsonschema, so
defaults are neither applied nor required.

helm and kubectl are the real binaries, fetched by ``make helm``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "shoal"
K8S = ROOT / "k8s"
CRDS = K8S / "crds"
KUBERNETES_VERSION = "1.31"
FOREIGN_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
"""Kinds whose schema belongs to another project (the Prometheus Operator); not vendored."""

Manifest = dict[str, Any]


def tool(name: str) -> str:
    """The path of helm or kubectl, fetched into the venv by ``make helm`` when missing."""
    binary = Path(sys.prefix) / "bin" / name
    if not binary.exists():
        subprocess.run(
            ["make", "-s", "helm", f"BIN={Path(sys.prefix) / 'bin'}"], cwd=ROOT, check=True
        )
    found = str(binary) if binary.exists() else shutil.which(name)
    assert found, f"{name} is missing and `make helm` did not fetch it"
    return found


def documents(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def helm_template(
    helm: str,
    values: str | None = None,
    *sets: str,
    namespace: str = "shoal-system",
    crds: bool = False,
) -> list[Manifest]:
    """``helm template shoal`` of the chart, as a release named ``shoal`` in ``namespace``."""
    args = [helm, "template", "shoal", str(CHART), "--namespace", namespace]
    if values:
        args += ["-f", str(CHART / values)]
    if crds:
        args.append("--include-crds")
    for item in sets:
        args += ["--set", item]
    return documents(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def kustomize(kubectl: str, directory: Path) -> list[Manifest]:
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    return documents(out)


def _closed(schema: Any) -> Any:
    """The CRD schema as jsonschema reads it: x-kubernetes-* dropped, objects closed."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
    out = {k: _closed(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if out.get("type") == "object" and "properties" in out and not preserve:
        out.setdefault("additionalProperties", False)
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], Mapping[str, Any]]:
    """(apiVersion, kind) -> closed openAPIV3Schema, for every version of our CRDs."""
    schemas: dict[tuple[str, str], Mapping[str, Any]] = {}
    for path in sorted(CRDS.glob("*.shoal.dev.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
            schemas[key] = _closed(version["schema"]["openAPIV3Schema"])
    return schemas


def validate(doc: Manifest) -> None:
    """Raise if ``doc`` is not a valid object of its kind (see the module docstring)."""
    key = (doc["apiVersion"], doc["kind"])
    own = crd_schemas().get(key)
    if own is not None:
        jsonschema.validate(doc, own, cls=jsonschema.Draft7Validator)
        name = doc["metadata"]["name"]
        assert isinstance(name, str)
        assert name, f"{key} without a name"
    elif key not in FOREIGN_KINDS:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def validate_all(docs: Iterable[Manifest]) -> int:
    """Validate each document; the count, so a test can tell it checked something."""
    count = 0
    for doc in docs:
        validate(doc)
        count += 1
    return count


def rbac_grants(rules: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (apiGroup, resource, verb) the rules grant."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def find(docs: Iterable[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
