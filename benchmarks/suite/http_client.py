"""Load for the gateway's HTTP door, measured as :mod:`shoal.cli.loadgen` measures Kafka.

Records go in batched requests (``POST .../records:batch``, Confluent REST
v3's shape) of :data:`BATCH` records, :data:`IN_FLIGHT` requests at a time,
each on its own keep-alive connection. A record's latency runs from its
request's start to the request's answer, as a pipelined Redis XADD's does;
a record counts only when the answer lists it among the successes.

Every request carries the same records (a fresh payload per record would
measure the client's base64, not the gateway), so one body is encoded once.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import httpx

from shoal.cli.loadgen import LatencyRecorder, ProduceResult, make_payload

BATCH = 200
IN_FLIGHT = 4
TIMEOUT_S = 60.0


def batch_body(payload: bytes, count: int) -> bytes:
    value = {"type": "BINARY", "data": base64.b64encode(payload).decode()}
    entries = [{"id": str(i), "value": value} for i in range(count)]
    return json.dumps({"entries": entries}, separators=(",", ":")).encode()


class _Requests:
    """Sends batches, at most IN_FLIGHT at once, and counts what each answer acknowledges."""

    def __init__(self, client: httpx.AsyncClient, url: str, expected: int) -> None:
        self.client = client
        self.url = url
        self.latencies = LatencyRecorder(expected)
        self.slots = asyncio.Semaphore(IN_FLIGHT)
        self.tasks: set[asyncio.Task[None]] = set()
        self.acked = 0
        self.failed = 0
        self.errors: dict[str, int] = {}

    async def send(self, body: bytes, count: int) -> None:
        await self.slots.acquire()
        task = asyncio.create_task(self._send(body, count))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _error(self, message: str, count: int) -> None:
        self.failed += count
        self.errors[message] = self.errors.get(message, 0) + count

    async def _send(self, body: bytes, count: int) -> None:
        try:
            sent = time.perf_counter()
            response = await self.client.post(
                self.url, content=body, headers={"Content-Type": "application/json"}
            )
            now = time.perf_counter()
            # 207: the answer lists each record as a success or a failure.
            if response.status_code not in (200, 207):
                self._error(f"HTTP {response.status_code}: {response.text[:200]}", count)
                return
            answer = response.json()
            for failure in answer.get("failures", []):
                self._error(str(failure.get("message", failure))[:200], 1)
            for _ in answer.get("successes", []):
                self.acked += 1
                self.latencies.add(now - sent)
        except httpx.HTTPError as exc:
            self._error(f"{type(exc).__name__}: {exc}", count)
        finally:
            self.slots.release()

    async def drain(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks))


async def _send_all(requests: _Requests, records: int, body: bytes) -> None:
    sent = 0
    while sent < records:
        await requests.send(body, BATCH)
        sent += BATCH
    await requests.drain()


async def produce(
    connection: dict[str, Any], topic: str, records: int, record_size: int, warmup_records: int = 0
) -> ProduceResult:
    """Produce ``records`` (a multiple of :data:`BATCH`) as fast as the door takes them;
    ``warmup_records`` go first on the same connections, unmeasured."""
    http = connection["http"]
    auth = (http["username"], http["password"])
    limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
    async with httpx.AsyncClient(
        base_url=http["url"], auth=auth, limits=limits, timeout=TIMEOUT_S
    ) as client:
        clusters = (await client.get("/v3/clusters")).raise_for_status().json()
        cluster_id = clusters["data"][0]["cluster_id"]
        url = f"/v3/clusters/{cluster_id}/topics/{topic}/records:batch"
        body = batch_body(make_payload(record_size), BATCH)
        if warmup_records:
            await _send_all(_Requests(client, url, warmup_records), warmup_records, body)
        requests = _Requests(client, url, records)
        start = time.perf_counter()
        await _send_all(requests, records, body)
        return ProduceResult(
            records=requests.acked,
            bytes=requests.acked * record_size,
            seconds=time.perf_counter() - start,
            latency=requests.latencies.summary(),
            failed=requests.failed,
            errors=requests.errors,
        )
