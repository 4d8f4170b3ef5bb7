"""KubeClient: its configuration from kopf's login, and its verbs against the fake API (kmock)."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from kube_fake import FakeKubeApi, fake_kube_api
from shoal.operator.builders import build_children
from shoal.operator.cluster_spec import ClusterSpec
from shoal.operator.endpoints import broker_name, config_name
from shoal.operator.kube import FIELD_MANAGER, KubeClient, KubeError, kube_config
from shoal.operator.pods import TemplateNotSeen, template_seen

NS = "team-a"
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_the_config_carries_kopfs_server_token_and_namespace() -> None:
    config = kube_config(
        kopf.ConnectionInfo(
            server="https://k8s:6443", scheme="Bearer", token="t", default_namespace="ns"
        )
    ).get()
    assert config is not None
    assert config.cluster.server == "https://k8s:6443"
    assert config.user is not None and config.user.token == "t"
    assert config.namespace == "ns"


def test_certificate_data_in_pem_is_passed_on_as_base64(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = kube_config(
        kopf.ConnectionInfo(
            server="https://k8s:6443",
            ca_data=PEM,
            certificate_path="client.crt",
            private_key_data=base64.b64encode(b"key").decode(),
        )
    ).get()
    assert config is not None and config.user is not None
    assert config.cluster.certificate_auth_data is not None
    assert base64.b64decode(config.cluster.certificate_auth_data).decode() == PEM
    # kopf reads a relative path from the working directory, and so does the client.
    assert config.user.client_cert == str(tmp_path / "client.crt")
    assert config.user.client_key_data == base64.b64encode(b"key").decode()


def test_insecure_skips_verification_even_with_a_ca() -> None:
    config = kube_config(
        kopf.ConnectionInfo(server="https://k8s:6443", ca_data=PEM, insecure=True)
    ).get()
    assert config is not None
    assert config.cluster.insecure
    assert config.cluster.certificate_auth_data is None


def test_authorization_schemes_other_than_bearer_are_refused() -> None:
    with pytest.raises(ValueError, match="scheme"):
        kube_config(kopf.ConnectionInfo(server="https://k8s", scheme="Digest", token="t"))


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    async with fake_kube_api() as server:
        yield server


@pytest.fixture
async def kube(api: FakeKubeApi) -> AsyncIterator[KubeClient]:
    async with KubeClient(kopf.ConnectionInfo(server=str(api.url), token="t")) as client:
        yield client


def _config_map(data: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": NS, "labels": labels or {"app": "shoal"}},
        "data": data,
    }


async def _send(api: FakeKubeApi, path: str, patch: Any, manager: str) -> None:
    """A merge patch from another client (as ``kubectl label`` or ``kubectl edit`` sends one)."""
    headers = {"Content-Type": "application/merge-patch+json"}
    async with api.servers[0].client.patch(
        path, json=patch, params={"fieldManager": manager}, headers=headers
    ) as response:
        response.raise_for_status()


def _managers(obj: dict[str, Any]) -> dict[str, str]:
    return {e["manager"]: e["operation"] for e in obj["metadata"].get("managedFields") or []}


async def test_unknown_kinds_are_refused(kube: KubeClient) -> None:
    with pytest.raises(ValueError, match="does not handle"):
        await kube.get("example.com/v1", "Widget", NS, "w")


async def test_apply_creates_then_replaces_what_it_applied(
    api: FakeKubeApi, kube: KubeClient
) -> None:
    assert await kube.get("v1", "ConfigMap", NS, "cm") is None
    created = await kube.apply(_config_map({"a": "1"}))
    assert created["data"] == {"a": "1"}
    assert created["metadata"]["uid"]
    assert _managers(created) == {FIELD_MANAGER: "Apply"}
    applied = await kube.apply(_config_map({"b": "2"}))
    assert applied["data"] == {"b": "2"}  # "a" was ours, and we no longer set it
    assert applied["metadata"]["uid"] == created["metadata"]["uid"]
    assert int(applied["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert api.stored("v1", "configmaps", NS, "cm")["data"] == {"b": "2"}


def _broker_children(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The broker StatefulSet and settings ConfigMap the builders make for Cluster ``c``."""
    children = build_children("c", NS, "uid-c", ClusterSpec.from_spec(spec), "shoal:1")
    by_name = {(child["kind"], child["metadata"]["name"]): child for child in children}
    return by_name["StatefulSet", broker_name("c")], by_name["ConfigMap", config_name("c")]


async def test_what_a_changed_cluster_no_longer_builds_is_removed(
    api: FakeKubeApi, kube: KubeClient
) -> None:
    racked = {
        "brokers": {
            "replicas": 1,
            "rackLabel": "topology.kubernetes.io/zone",
            "config": {"replica_lag_time_max_ms": "20000"},
        }
    }
    for child in _broker_children(racked):
        await kube.apply(child)
    stored = api.stored("apps/v1", "statefulsets", NS, broker_name("c"))
    assert stored["spec"]["template"]["spec"]["initContainers"]
    assert stored["spec"]["template"]["spec"]["topologySpreadConstraints"]

    for child in _broker_children({"brokers": {"replicas": 1}}):
        await kube.apply(child)
    pod = api.stored("apps/v1", "statefulsets", NS, broker_name("c"))["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert "topologySpreadConstraints" not in pod
    assert "rack" not in {volume["name"] for volume in pod["volumes"]}
    settings = api.stored("v1", "configmaps", NS, config_name("c"))["data"]
    assert "SHOAL_REPLICA_LAG_TIME_MAX_MS" not in settings


async def test_fields_other_managers_set_stay(api: FakeKubeApi, kube: KubeClient) -> None:
    await kube.apply(_config_map({"a": "1"}))
    path = f"/api/v1/namespaces/{NS}/configmaps/cm"
    await _send(api, path, {"metadata": {"labels": {"team": "streaming"}}}, "kubectl-label")
    again = await kube.apply(_config_map({"a": "2"}))
    assert again["metadata"]["labels"] == {"app": "shoal", "team": "streaming"}
    assert _managers(again) == {FIELD_MANAGER: "Apply", "kubectl-label": "Update"}


async def test_a_field_someone_else_changed_is_taken_back_and_logged(
    api: FakeKubeApi, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    await kube.apply(_config_map({"a": "1"}))
    path = f"/api/v1/namespaces/{NS}/configmaps/cm"
    await _send(api, path, {"data": {"a": "edited"}}, "kubectl-edit")
    with caplog.at_level(logging.INFO, logger="shoal.operator.kube"):
        reverted = await kube.apply(_config_map({"a": "1"}))
    assert reverted["data"] == {"a": "1"}
    assert _managers(reverted) == {FIELD_MANAGER: "Apply"}
    [record] = [r for r in caplog.records if "apply_took_over_fields" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert "kubectl-edit:.data.a" in record.getMessage()


async def test_fields_the_merge_patch_client_set_are_adopted_then_removed(
    api: FakeKubeApi, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    # As the client before server-side apply wrote it: a create (operation Update)
    # under the manager its User-Agent named.
    old = _config_map({"a": "1", "gone": "x"})
    async with api.servers[0].client.post(
        f"/api/v1/namespaces/{NS}/configmaps", json=old, params={"fieldManager": FIELD_MANAGER}
    ) as response:
        response.raise_for_status()
    with caplog.at_level(logging.INFO, logger="shoal.operator.kube"):
        applied = await kube.apply(_config_map({"a": "1"}))
    assert applied["data"] == {"a": "1"}
    assert _managers(applied) == {FIELD_MANAGER: "Apply"}
    assert any("apply_adopted_merge_patch_fields" in r.getMessage() for r in caplog.records)


async def test_list_filters_by_label_selector(kube: KubeClient) -> None:
    await kube.apply(_config_map({}, labels={"app": "shoal", "tier": "a"}))
    other = _config_map({}, labels={"app": "other"})
    other["metadata"]["name"] = "cm2"
    await kube.apply(other)
    names = {o["metadata"]["name"] for o in await kube.list("v1", "ConfigMap", NS, "app=shoal")}
    assert names == {"cm"}
    assert len(await kube.list("v1", "ConfigMap", NS, "app=shoal,tier==a")) == 1
    assert len(await kube.list("v1", "ConfigMap", NS)) == 2
    assert len(await kube.list("v1", "ConfigMap", None)) == 2  # every namespace
    with pytest.raises(ValueError, match="equality"):
        await kube.list("v1", "ConfigMap", NS, "app!=shoal")


async def test_delete_reports_whether_it_deleted(kube: KubeClient) -> None:
    await kube.apply(_config_map({}))
    assert await kube.delete("v1", "ConfigMap", NS, "cm") is True
    assert await kube.delete("v1", "ConfigMap", NS, "cm") is False
    assert await kube.get("v1", "ConfigMap", NS, "cm") is None


def _topic(partitions: int) -> dict[str, Any]:
    return {
        "apiVersion": "shoal.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": "t", "namespace": NS},
        "spec": {"cluster": "c", "tenant": "acme", "partitions": partitions},
        "status": {"partitions": 99},
    }


async def test_status_is_a_subresource_and_generation_follows_spec(kube: KubeClient) -> None:
    created = await kube.apply(_topic(1))
    assert created["metadata"]["generation"] == 1
    assert "status" not in created
    grown = await kube.apply(_topic(2))
    assert grown["metadata"]["generation"] == 2
    labelled = _topic(2)
    labelled["metadata"]["labels"] = {"x": "y"}
    relabelled = await kube.apply(labelled)
    assert relabelled["metadata"]["generation"] == 2


async def test_status_is_merge_patched_and_none_removes_a_field(kube: KubeClient) -> None:
    await kube.apply(_topic(1))
    api_version = "shoal.dev/v1alpha1"
    await kube.patch_status(api_version, "Topic", NS, "t", {"lastError": "boom", "partitions": 1})
    await kube.patch_status(api_version, "Topic", NS, "t", {"conditions": []})
    status = await kube.patch_status(api_version, "Topic", NS, "t", {"lastError": None})
    assert status["status"] == {"partitions": 1, "conditions": []}
    topic = await kube.get(api_version, "Topic", NS, "t")
    assert topic is not None and topic["spec"]["partitions"] == 1
    with pytest.raises(ValueError, match="Shoal kinds only"):
        await kube.patch_status("v1", "ConfigMap", NS, "cm", {})


async def test_errors_carry_the_api_status_and_message(api: FakeKubeApi, kube: KubeClient) -> None:
    api[f"get /api/v1/namespaces/{NS}/configmaps/cm"] << 403 << {"message": "forbidden here"}
    with pytest.raises(KubeError) as caught:
        await kube.get("v1", "ConfigMap", NS, "cm")
    assert caught.value.status == 403
    assert "forbidden here" in str(caught.value)


async def _observe(api: FakeKubeApi, name: str, generation: int) -> None:
    """What the StatefulSet controller writes once it has taken up ``generation``."""
    path = f"/apis/apps/v1/namespaces/{NS}/statefulsets/{name}/status"
    headers = {"Content-Type": "application/merge-patch+json"}
    async with api.servers[0].client.patch(
        path,
        json={"status": {"replicas": 1, "observedGeneration": generation}},
        headers=headers,
    ) as response:
        response.raise_for_status()


async def test_the_roller_waits_until_the_controller_has_seen_the_applied_template(
    api: FakeKubeApi, kube: KubeClient
) -> None:
    name = broker_name("c")
    statefulset, _ = _broker_children({"brokers": {"replicas": 1}})
    await kube.apply(statefulset)
    await _observe(api, name, 1)
    await template_seen(kube, NS, name, timeout_s=1, poll_s=0.01)

    changed, _ = _broker_children({"brokers": {"replicas": 1, "config": {"a": "b"}}})
    changed["spec"]["template"]["metadata"]["annotations"]["changed"] = "yes"
    applied = await kube.apply(changed)
    assert applied["metadata"]["generation"] == 2
    # Not seen yet: a pod deleted now would come back from the old template.
    with pytest.raises(TemplateNotSeen, match="generation 2"):
        await template_seen(kube, NS, name, timeout_s=0.2, poll_s=0.01)
    waiting = asyncio.create_task(template_seen(kube, NS, name, timeout_s=5, poll_s=0.01))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await _observe(api, name, 2)
    await asyncio.wait_for(waiting, 2)


async def test_a_missing_statefulset_is_not_waited_for(kube: KubeClient) -> None:
    with pytest.raises(TemplateNotSeen, match="gone"):
        await template_seen(kube, NS, broker_name("nope"), timeout_s=5, poll_s=0.01)
