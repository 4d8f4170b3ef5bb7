"""Bodies are bounded before anyone is authenticated: no client can make the
gateway hold a body bigger than :data:`MAX_BODY_BYTES` (the streamed produce
route reads its records one at a time and is exempt; the OAuth token endpoint
reads its form with a bound of its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from shoal.gateway.http.app import MAX_BODY_BYTES, build_api

JSON = {"content-type": "application/json"}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_api())
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        yield http


@pytest.mark.parametrize(
    "path", ["/v3/clusters/c/topics", "/v3/clusters/c/topics/t/records:batch", "/v3/api-keys"]
)
async def test_a_declared_oversized_body_is_refused_unread(
    client: httpx.AsyncClient, path: str
) -> None:
    answer = await client.post(path, content=b"x" * (MAX_BODY_BYTES + 1), headers=JSON)
    assert answer.status_code == 413


async def test_a_chunked_body_is_cut_off_at_the_limit(client: httpx.AsyncClient) -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(4 * MAX_BODY_BYTES // 2**20):
            sent += 2**20
            yield b"x" * 2**20

    answer = await client.post("/v3/clusters/c/topics", content=chunks(), headers=JSON)
    assert answer.status_code == 413
    assert answer.json()["error_code"] == 41300
    assert sent <= MAX_BODY_BYTES + 2 * 2**20
