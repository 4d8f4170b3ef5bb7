"""`shoal rack-of-node` reads its Node's label from the Kubernetes API (faked by kmock).

The command runs as the brokers' init container does: a real process, the
service account token in a directory, the API server's URL given.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import kmock
import pytest
from shoal.operator.rack import InClusterApi, RackError, rack_of, rack_of_node

ZONE = "topology.kubernetes.io/zone"
NODES = kmock.resource("", "v1", "nodes")
TOKEN = "pod-token"


def node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def test_rack_is_the_labels_value() -> None:
    assert rack_of(node("n1", {ZONE: "eu-west-1a", "other": "x"}), ZONE) == "eu-west-1a"
    with pytest.raises(RackError, match=re.escape(f"node 'n1' has no label '{ZONE}'")):
        rack_of(node("n1", {"other": "x"}), ZONE)
    with pytest.raises(RackError, match="has no label"):
        rack_of(node("n1", {ZONE: ""}), ZONE)


@pytest.fixture
def account_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text(TOKEN + "\n")
    return directory


async def test_reads_the_node_with_the_pods_token(account_dir: Path) -> None:
    async with kmock.KubernetesEmulator() as api, kmock.Server(api):
        api.objects[NODES, None, "worker-1"] = node("worker-1", {ZONE: "zone-b"})
        pod_api = InClusterApi.from_pod(account_dir, str(api.url))
        assert await rack_of_node(pod_api, "worker-1", ZONE) == "zone-b"
        (request,) = list(api)
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        with pytest.raises(RackError, match="HTTP 404"):
            await rack_of_node(pod_api, "worker-2", ZONE)


def test_outside_a_pod_there_is_no_api(account_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RackError, match="KUBERNETES_SERVICE_HOST"):
        InClusterApi.from_pod(account_dir)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert InClusterApi.from_pod(account_dir).server == "https://[fd00::1]:443"
    with pytest.raises(RackError, match="no service account token"):
        InClusterApi.from_pod(account_dir / "missing")


async def run_command(*args: str) -> tuple[int, str]:
    shoal = str(Path(sys.prefix) / "bin" / "shoal")
    process = await asyncio.create_subprocess_exec(
        shoal,
        "rack-of-node",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_command_writes_the_rack_file(account_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "rack"
    async with kmock.KubernetesEmulator() as api, kmock.Server(api):
        api.objects[NODES, None, "worker-1"] = node("worker-1", {ZONE: "zone-c"})
        api.objects[NODES, None, "bare"] = node("bare", {})
        common = ["--label", ZONE, "--out", str(out), "--api-server", str(api.url)]
        common += ["--service-account-dir", str(account_dir)]

        code, output = await run_command("--node", "worker-1", *common)
        assert code == 0, output
        assert out.read_text() == "zone-c"

        out.unlink()
        code, output = await run_command("--node", "bare", *common)
        assert code == 1
        assert "has no label" in output
        assert not out.exists()
