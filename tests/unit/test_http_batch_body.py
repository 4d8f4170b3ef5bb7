"""A records:batch body is parsed from its raw bytes (not by FastAPI), yet a bad one
is answered in the shape of FastAPI's answer to a bad body, and the document still
describes it."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

import httpx
import pytest
from fastapi.exceptions import RequestValidationError
from shoal.gateway.http.app import build_api
from shoal.gateway.http.encoding import DataType
from shoal.gateway.http.models import DataSize, ProduceBatchSuccess, ProduceResult
from shoal.gateway.http.routes import _parsed_batch

BATCH = "/v3/clusters/c/topics/t/records:batch"


def test_a_valid_batch_is_parsed_from_its_bytes() -> None:
    body = {"entries": [{"id": "a", "value": {"type": "STRING", "data": "x"}}]}
    batch = _parsed_batch(json.dumps(body).encode())
    assert [(e.id, e.value and e.value.data) for e in batch.entries] == [("a", "x")]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"entries": [{"value": {"data": 1}}]}', ("body", "entries", 0, "id")),
        (b'{"entries": []}', ("body", "entries")),
        (b'{"entries": [{"id": "a", "bogus": 1}]}', ("body", "entries", 0, "bogus")),
        (b"not json", ("body",)),
        (b"", ("body",)),
        (b"  ", ("body",)),
    ],
)
def test_a_bad_batch_names_where_it_is_wrong_under_body(
    body: bytes, where: tuple[object, ...]
) -> None:
    with pytest.raises(RequestValidationError) as caught:
        _parsed_batch(body)
    assert [e["loc"] for e in caught.value.errors()] == [where]


def test_the_document_describes_the_bodies_the_routes_parse_themselves() -> None:
    document = build_api().openapi()
    schemas = document["components"]["schemas"]
    paths = document["paths"]
    for path, model in (
        ("/v3/clusters/{cluster_id}/topics/{topic_name}/records", "ProduceRecord"),
        ("/v3/clusters/{cluster_id}/topics/{topic_name}/records:batch", "ProduceBatch"),
    ):
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
        assert model in schemas
    refs = {
        ref.rsplit("/", 1)[1] for ref in _refs(document) if ref.startswith("#/components/schemas/")
    }
    assert refs <= set(schemas)


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_batch_not_sent_as_json_is_refused_before_anything_else(
    content_type: str | None,
) -> None:
    # A browser holding the caller's Basic credentials could post a form: it must
    # not produce. (No services behind this app: the refusal comes first.)
    headers = {} if content_type is None else {"content-type": content_type}
    body = b'{"entries": [{"id": "a", "value": {"data": 1}}]}'
    transport = httpx.ASGITransport(app=build_api())
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        answer = await http.post(BATCH, content=body, headers=headers)
    assert answer.status_code == 400
    assert answer.json()["error_code"] == 40001
    assert "application/json" in answer.json()["message"]


def test_a_batch_success_carries_every_field_of_the_record_s_result() -> None:
    result = ProduceResult(
        error_code=200,
        message="m",
        kafka_error="k",
        cluster_id="c",
        topic_name="t",
        partition_id=3,
        offset=42,
        timestamp=datetime(2026, 1, 2, tzinfo=UTC),
        key=DataSize(type=DataType.STRING, size=1),
        value=DataSize(type=DataType.BINARY, size=2),
    )
    success = ProduceBatchSuccess.of("x", result)
    for field in dataclasses.fields(ProduceResult):
        assert getattr(success, field.name) == getattr(result, field.name), field.name
    assert success.id == "x"
