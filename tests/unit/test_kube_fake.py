"""The fake Kubernetes API's shim: what kopf relies on and kmock alone does not do."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kube_fake import FakeKubeApi, fake_kube_api

CM = "/api/v1/namespaces/ns/configmaps"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    async with fake_kube_api() as server:
        yield server


async def _send(api: FakeKubeApi, method: str, path: str, body: Any, **headers: str) -> Any:
    async with api.servers[0].client.request(method, path, json=body, headers=headers) as r:
        return r.status, await r.json()


async def _events(api: FakeKubeApi, query: str, count: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with api.servers[0].client.get(f"{CM}?watch=true{query}") as response:
        async for line in response.content:
            if line.strip():
                events.append(json.loads(line))
                if len(events) == count:
                    break
    return events


async def test_a_watch_from_a_version_streams_only_what_changed_after_it(api: FakeKubeApi) -> None:
    _, created = await _send(api, "POST", CM, {"metadata": {"name": "a"}, "data": {"x": "1"}})
    version = created["metadata"]["resourceVersion"]
    await _send(api, "PATCH", f"{CM}/a", {"data": {"x": "2"}}, **MERGE)

    since = await asyncio.wait_for(_events(api, f"&resourceVersion={version}", 1), 5)
    assert [(e["type"], e["object"]["data"]["x"]) for e in since] == [("MODIFIED", "2")]
    current = await asyncio.wait_for(_events(api, "", 1), 5)
    assert [(e["type"], e["object"]["data"]["x"]) for e in current] == [("ADDED", "2")]


async def test_json_patch_tests_the_resource_version(api: FakeKubeApi) -> None:
    _, created = await _send(api, "POST", CM, {"metadata": {"name": "a"}})
    stale = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "stale"},
        {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
    ]
    status, _ = await _send(
        api, "PATCH", f"{CM}/a", stale, **{"Content-Type": "application/json-patch+json"}
    )
    assert status == 422
    fresh = [{**stale[0], "value": created["metadata"]["resourceVersion"]}, stale[1]]
    status, patched = await _send(
        api, "PATCH", f"{CM}/a", fresh, **{"Content-Type": "application/json-patch+json"}
    )
    assert status == 200
    assert patched["metadata"]["finalizers"] == ["f"]


async def test_finalizers_hold_a_deleted_object_until_they_are_removed(api: FakeKubeApi) -> None:
    await _send(api, "POST", CM, {"metadata": {"name": "a", "finalizers": ["f"]}})
    await _send(api, "DELETE", f"{CM}/a", None)
    held = api.stored("v1", "configmaps", "ns", "a")
    assert held["metadata"]["deletionTimestamp"]
    await _send(api, "PATCH", f"{CM}/a", {"metadata": {"finalizers": None}}, **MERGE)
    assert not api.exists("v1", "configmaps", "ns", "a")
    assert ("configmaps", "ns", "a") in api.deletions


async def test_secret_string_data_is_stored_as_base64_data(api: FakeKubeApi) -> None:
    secret = {"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}}
    status, created = await _send(api, "POST", "/api/v1/namespaces/ns/secrets", secret)
    assert status == 200
    assert "stringData" not in created
    assert base64.b64decode(created["data"]["password"]) == b"hunter2"


APPLY = {"Content-Type": "application/apply-patch+yaml"}


async def _apply(api: FakeKubeApi, body: Any, manager: str, force: bool = False) -> Any:
    params = {"fieldManager": manager, **({"force": "true"} if force else {})}
    path = f"{CM}/{body['metadata']['name']}"
    async with api.servers[0].client.patch(path, json=body, params=params, headers=APPLY) as r:
        return r.status, await r.json()


def _owned(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"]["managedFields"]}


async def test_an_apply_creates_and_later_removes_what_it_no_longer_applies(
    api: FakeKubeApi,
) -> None:
    first = {"metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "v", "old": "o"}}
    status, created = await _apply(api, first, "op")
    assert status == 200
    assert created["data"] == {"k": "v", "old": "o"}
    assert _owned(created) == {
        ("op", "Apply"): {
            "f:metadata": {"f:labels": {"f:x": {}}},
            "f:data": {"f:k": {}, "f:old": {}},
        }
    }
    _, applied = await _apply(api, {"metadata": {"name": "a"}, "data": {"k": "v"}}, "op")
    assert applied["data"] == {"k": "v"}
    assert "labels" not in applied["metadata"]  # emptied maps go too


async def test_an_apply_keeps_fields_of_other_managers(api: FakeKubeApi) -> None:
    await _apply(api, {"metadata": {"name": "a"}, "data": {"k": "v"}}, "op")
    label = {"metadata": {"labels": {"team": "t"}}}
    await _send(api, "PATCH", f"{CM}/a?fieldManager=kubectl-label", label, **MERGE)
    # Another applier's field, and one both set to the same value (shared, not a conflict).
    status, _ = await _apply(api, {"metadata": {"name": "a"}, "data": {"k": "v", "o": "1"}}, "ci")
    assert status == 200
    _, applied = await _apply(api, {"metadata": {"name": "a"}, "data": {"n": "2"}}, "op")
    assert applied["metadata"]["labels"] == {"team": "t"}
    assert applied["data"] == {"k": "v", "o": "1", "n": "2"}


async def test_an_apply_that_changes_another_managers_field_conflicts_unless_forced(
    api: FakeKubeApi,
) -> None:
    await _apply(api, {"metadata": {"name": "a"}, "data": {"k": "v"}}, "op")
    await _send(api, "PATCH", f"{CM}/a?fieldManager=kubectl-edit", {"data": {"k": "e"}}, **MERGE)
    status, refused = await _apply(api, {"metadata": {"name": "a"}, "data": {"k": "v"}}, "op")
    assert status == 409
    assert refused["reason"] == "Conflict"
    assert refused["details"]["causes"] == [
        {
            "reason": "FieldManagerConflict",
            "message": 'conflict with "kubectl-edit" using v1',
            "field": ".data.k",
        }
    ]
    assert api.stored("v1", "configmaps", "ns", "a")["data"] == {"k": "e"}
    body = {"metadata": {"name": "a"}, "data": {"k": "v"}}
    status, forced = await _apply(api, body, "op", force=True)
    assert status == 200
    assert forced["data"] == {"k": "v"}
    assert _owned(forced) == {("op", "Apply"): {"f:data": {"f:k": {}}}}


async def test_an_apply_needs_a_field_manager_and_reads_yaml(api: FakeKubeApi) -> None:
    async with api.servers[0].client.patch(
        f"{CM}/a", data=b"metadata:\n  name: a\ndata:\n  k: v\n", headers=APPLY
    ) as response:
        assert response.status == 422
    async with api.servers[0].client.patch(
        f"{CM}/a",
        data=b"metadata:\n  name: a\ndata:\n  k: v\n",
        params={"fieldManager": "op"},
        headers=APPLY,
    ) as response:
        assert response.status == 200
    assert api.stored("v1", "configmaps", "ns", "a")["data"] == {"k": "v"}
