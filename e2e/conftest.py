"""Fixtures for the end-to-end tests: a real Kubernetes cluster made by e2e/run.sh.

Everything runs for real: kind, the image built from this repository, the
chart, the operator, the Cluster `demo` of k8s/examples with its etcd,
brokers and gateway. The tests reach the gateway as a tenant's client would,
with the key Secret the operator wrote, through `kubectl port-forward`.

Where Docker or kind is missing (as on the machines that run tests/), every
test here is skipped, and the reason is printed at the end of the run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from base64 import b64decode
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from shoal.operator.endpoints import (
    GATEWAY_KAFKA_PORT,
    gateway_broker_port,
    gateway_name,
    key_secret_name,
)

KIND_CLUSTER = os.environ.get("SHOAL_E2E_KIND_CLUSTER", "shoal-e2e")
NAMESPACE = os.environ.get("SHOAL_E2E_NAMESPACE", "shoal-e2e")
CLUSTER = "demo"
TENANT = "demo"


def _missing() -> str | None:
    """Why this machine cannot run the e2e tests, or None when it can."""
    absent = [tool for tool in ("docker", "kind") if shutil.which(tool) is None]
    if absent:
        return f"needs Docker and kind: {' and '.join(absent)} not on PATH"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "needs Docker and kind: the Docker daemon does not answer `docker info`"
    clusters = subprocess.run(
        ["kind", "get", "clusters"], capture_output=True, text=True, check=False
    ).stdout.split()
    if KIND_CLUSTER not in clusters:
        return f"needs the kind cluster {KIND_CLUSTER!r}: run e2e/run.sh, which makes it"
    return None


SKIP_REASON = _missing()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if SKIP_REASON:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SKIP_REASON:
        terminalreporter.write_line(f"e2e skipped: {SKIP_REASON}", yellow=True, bold=True)


def kubectl_binary() -> str:
    venv = Path(sys.prefix) / "bin" / "kubectl"
    found = str(venv) if venv.exists() else shutil.which("kubectl")
    assert found, "kubectl is missing: `make helm` fetches it into .venv"
    return found


def kubectl(*args: str) -> str:
    """Run kubectl against the kind cluster, in the e2e namespace; its stdout."""
    command = [kubectl_binary(), "--context", f"kind-{KIND_CLUSTER}", "-n", NAMESPACE, *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def get(kind: str, name: str) -> dict[str, Any]:
    resource: dict[str, Any] = json.loads(kubectl("get", kind, name, "-o", "json"))
    return resource


def key_secret(key: str) -> dict[str, str]:
    """The Secret the operator wrote for one of tenant demo's keys, decoded."""
    secret = get("secret", key_secret_name(TENANT, key))
    return {k: b64decode(v).decode() for k, v in secret["data"].items()}


def condition(resource: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for entry in resource.get("status", {}).get("conditions", []):
        if entry["type"] == kind:
            return dict(entry)
    return None


def is_ready(resource: dict[str, Any]) -> bool:
    ready = condition(resource, "Ready")
    return ready is not None and ready["status"] == "True"


def wait_for(what: str, check: Callable[[], bool], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(1.0)


def _port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session")
def gateway() -> Iterator[str]:
    """The gateway's bootstrap on 127.0.0.1, its per-broker ports forwarded too.

    run.sh makes the gateway advertise 127.0.0.1, so the broker addresses in
    its Metadata answers are these forwarded ports.
    """
    brokers = get("cluster", CLUSTER)["spec"]["brokers"]["replicas"]
    ports = [GATEWAY_KAFKA_PORT, *(gateway_broker_port(n) for n in range(brokers))]
    command = [
        kubectl_binary(),
        *("--context", f"kind-{KIND_CLUSTER}", "-n", NAMESPACE, "port-forward"),
        f"svc/{gateway_name(CLUSTER)}",
        *(f"{port}:{port}" for port in ports),
    ]
    forward = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for("kubectl port-forward", lambda: all(_port_open(p) for p in ports), 60.0)
        yield f"127.0.0.1:{GATEWAY_KAFKA_PORT}"
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def client_config(key: str, bootstrap: str) -> dict[str, str]:
    """librdkafka settings from the key Secret's client.properties, through the forward."""
    config: dict[str, str] = {}
    for raw in key_secret(key)["client.properties"].splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            config[name.strip()] = value.strip()
    config["bootstrap.servers"] = bootstrap
    return config
