"""``shoal operator`` as its container runs it: flags, kubeconfig login, probe, metrics, SIGTERM.

The process talks to the fake Kubernetes API (:mod:`kube_fake`) through a
kubeconfig, as on a developer's machine; no Shoal cluster is needed to see it
report on a Topic whose Cluster does not exist.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from harness import free_port
from kube_fake import FakeKubeApi, fake_kube_api

pytestmark = pytest.mark.slow

NS = "streams"


def _kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "operator", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "operator"}}],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(config))
    return path


async def _answers(url: str) -> str | None:
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return await response.text() if response.status == 200 else None
    except aiohttp.ClientError:
        return None


def _ready_reason(api: FakeKubeApi) -> str | None:
    if not api.exists("shoal.dev/v1alpha1", "topics", NS, "orders"):
        return None
    topic = api.stored("shoal.dev/v1alpha1", "topics", NS, "orders")
    for condition in (topic.get("status") or {}).get("conditions") or []:
        if condition["type"] == "Ready":
            return str(condition.get("reason"))
    return None


async def test_the_operator_process_serves_a_namespace_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    liveness, metrics = free_port(), free_port()
    async with fake_kube_api() as api:
        env = {
            **os.environ,
            "KUBECONFIG": str(_kubeconfig(tmp_path / "kubeconfig", str(api.url))),
            "SHOAL_WATCH_NAMESPACES": NS,
        }
        log = (tmp_path / "operator.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "shoal", "operator", "--liveness-port", str(liveness),
            "--metrics-listen", f"127.0.0.1:{metrics}",
            env=env, stdout=log, stderr=log,
        )  # fmt: skip
        try:
            async with asyncio.timeout(60):
                while await _answers(f"http://127.0.0.1:{liveness}/healthz") is None:
                    assert process.returncode is None, (tmp_path / "operator.log").read_text()
                    await asyncio.sleep(0.2)

            # A Topic of a Cluster that does not exist: the operator reads, decides
            # and writes status through the API, and asks no broker.
            topic = {
                "apiVersion": "shoal.dev/v1alpha1",
                "kind": "Topic",
                "metadata": {"name": "orders", "namespace": NS},
                "spec": {"cluster": "absent", "tenant": "acme", "partitions": 1},
            }
            async with api.post(
                f"/apis/shoal.dev/v1alpha1/namespaces/{NS}/topics", json=topic
            ) as response:
                assert response.status == 200
            async with asyncio.timeout(30):
                while True:
                    if _ready_reason(api) == "ClusterNotFound":
                        break
                    await asyncio.sleep(0.2)

            exposition = await _answers(f"http://127.0.0.1:{metrics}/metrics")
            assert exposition is not None
            assert 'shoal_operator_reconciles_total{kind="Topic",result="retry"}' in exposition
        finally:
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), 30)
            log.close()
        assert code == 0, (tmp_path / "operator.log").read_text()[-3000:]
