"""KubeClient: its path table, and its verbs against the fake API server (kmock)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kopf
import pytest
from kube_fake import FakeKubeApi, fake_kube_api
from shoal.operator.kube import KubeClient, KubeError, resource_path

NS = "team-a"


def test_paths_of_core_grouped_and_shoal_kinds() -> None:
    assert resource_path("v1", "Secret", NS, "s") == f"/api/v1/namespaces/{NS}/secrets/s"
    assert resource_path("apps/v1", "StatefulSet", NS, None) == (
        f"/apis/apps/v1/namespaces/{NS}/statefulsets"
    )
    assert resource_path("shoal.dev/v1alpha1", "Topic", None, None) == (
        "/apis/shoal.dev/v1alpha1/topics"
    )
    assert resource_path("v1", "Namespace", None, "x") == "/api/v1/namespaces/x"


def test_unknown_kinds_and_namespaced_cluster_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="does not handle"):
        resource_path("v1", "Node", None, "n")
    with pytest.raises(ValueError, match="cluster-scoped"):
        resource_path("v1", "Namespace", NS, "x")


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    async with fake_kube_api() as server:
        yield server


@pytest.fixture
async def kube(api: FakeKubeApi) -> AsyncIterator[KubeClient]:
    async with KubeClient(kopf.ConnectionInfo(server=str(api.url), token="t")) as client:
        yield client


def _config_map(data: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": NS, "labels": labels or {}},
        "data": data,
    }


async def test_apply_creates_then_patches(api: FakeKubeApi, kube: KubeClient) -> None:
    assert await kube.get("v1", "ConfigMap", NS, "cm") is None
    created = await kube.apply(_config_map({"a": "1"}))
    assert created["data"] == {"a": "1"}
    assert created["metadata"]["uid"]
    patched = await kube.apply(_config_map({"b": "2"}))
    assert patched["data"] == {"a": "1", "b": "2"}  # a merge-patch keeps what it does not name
    assert patched["metadata"]["uid"] == created["metadata"]["uid"]
    assert int(patched["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert api.stored("v1", "configmaps", NS, "cm")["data"] == {"a": "1", "b": "2"}


async def test_list_filters_by_label_selector(kube: KubeClient) -> None:
    await kube.apply(_config_map({}, labels={"app": "shoal"}))
    other = _config_map({}, labels={"app": "other"})
    other["metadata"]["name"] = "cm2"  # type: ignore[index]
    await kube.apply(other)
    names = {o["metadata"]["name"] for o in await kube.list("v1", "ConfigMap", NS, "app=shoal")}
    assert names == {"cm"}
    assert len(await kube.list("v1", "ConfigMap", NS)) == 2


async def test_delete_reports_whether_it_deleted(kube: KubeClient) -> None:
    await kube.apply(_config_map({}))
    assert await kube.delete("v1", "ConfigMap", NS, "cm") is True
    assert await kube.delete("v1", "ConfigMap", NS, "cm") is False
    assert await kube.get("v1", "ConfigMap", NS, "cm") is None


async def test_status_is_a_subresource_and_generation_follows_spec(kube: KubeClient) -> None:
    topic = {
        "apiVersion": "shoal.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": "t", "namespace": NS},
        "spec": {"cluster": "c", "tenant": "acme", "partitions": 1},
        "status": {"partitions": 99},
    }
    created = await kube.apply(topic)
    assert created["metadata"]["generation"] == 1
    assert "status" not in created
    topic["spec"] = {**topic["spec"], "partitions": 2}
    grown = await kube.apply(topic)
    assert grown["metadata"]["generation"] == 2
    relabelled = await kube.apply(
        {**topic, "metadata": {**topic["metadata"], "labels": {"x": "y"}}}
    )
    assert relabelled["metadata"]["generation"] == 2


async def test_errors_carry_the_api_status_and_message(api: FakeKubeApi, kube: KubeClient) -> None:
    api[f"get /api/v1/namespaces/{NS}/configmaps/cm"] << 403 << {"message": "forbidden here"}
    with pytest.raises(KubeError) as caught:
        await kube.get("v1", "ConfigMap", NS, "cm")
    assert caught.value.status == 403
    assert "forbidden here" in str(caught.value)
