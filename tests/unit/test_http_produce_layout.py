"""The topic layout a produce request read on arrival serves its first send only,
and only while it is fresh; a stream's later sends ask for the layout again."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from types import SimpleNamespace
from typing import Any, cast

import pytest
from shoal.gateway.access import TenantAccess
from shoal.gateway.http import records
from shoal.gateway.http.models import ProduceRecord, RecordData
from shoal.gateway.http.records import RecordsController
from shoal.gateway.tenant_client import KafkaCallError, PartitionProduced, TenantClient, TopicLayout
from shoal.tenancy.model import Quotas

from shoal.wire import ErrorCode as KafkaCode

TOPIC = TopicLayout("t", {0: 1, 1: 2}, {0: (1, 2), 1: (2, 1)}, {0: (1, 2), 1: (2, 1)})


class RecordingClient:
    """Answers every produce; keeps the layout each one was given."""

    def __init__(self) -> None:
        self.known: list[TopicLayout | None] = []

    async def produce(
        self, topic: str, batches: Mapping[int, bytes], known: TopicLayout | None = None
    ) -> dict[int, PartitionProduced]:
        self.known.append(known)
        return {p: PartitionProduced(KafkaCode.none, base_offset=0) for p in batches}


def _record(n: int) -> ProduceRecord:
    return ProduceRecord(partition_id=n % 2, value=RecordData(data=n))


def _controller(client: RecordingClient) -> RecordsController:
    return RecordsController(client, "c", TOPIC)  # type: ignore[arg-type]


async def test_a_request_s_first_send_uses_the_layout_it_read_and_later_sends_ask_again() -> None:
    client = RecordingClient()
    controller = _controller(client)

    async def chunks() -> AsyncIterator[bytes]:
        for n in range(3):
            yield b'{"value": {"data": %d}}\n' % n

    lines = [line async for line in controller.produce_stream(chunks())]
    assert len(lines) == 3
    assert client.known == [TOPIC, None, None]


async def test_a_layout_read_too_long_ago_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    client = RecordingClient()
    controller = _controller(client)
    now = records.time.monotonic()
    monkeypatch.setattr(records.time, "monotonic", lambda: now + records.KNOWN_LAYOUT_S + 0.1)
    results = await controller.produce([_record(0), _record(1)])
    assert [r.error_code for r in results] == [200, 200]
    assert client.known == [None]


def _tenant_client() -> TenantClient:
    """A tenant's client with no quota to wait for and no broker behind it."""
    services = SimpleNamespace(
        admission=SimpleNamespace(try_produce=lambda tenant, nbytes, quota: 0),
        usage=SimpleNamespace(produced=lambda tenant, nbytes, throttle: None),
    )
    access = TenantAccess(tenant="acme", key_id="K", bindings=(), quotas=Quotas())
    none = cast(Any, None)
    return TenantClient(cast(Any, services), access, none, none, none)


async def test_the_client_sends_to_a_known_layout_and_reads_afresh_only_to_retry() -> None:
    client = _tenant_client()
    reads: list[str] = []
    sent: list[tuple[int, tuple[int, ...]]] = []
    moved = TopicLayout("t", {0: 3, 1: 2}, TOPIC.replicas, TOPIC.isr)

    async def topic(name: str, node_id: int | None = None) -> TopicLayout:
        reads.append(name)
        return moved

    async def produce_to(
        leader: int, topic: str, batches: Mapping[int, bytes]
    ) -> dict[int, PartitionProduced]:
        sent.append((leader, tuple(batches)))
        if leader == 1:  # partition 0's leader has moved
            return {p: PartitionProduced(KafkaCode.not_leader_or_follower) for p in batches}
        return {p: PartitionProduced(KafkaCode.none, base_offset=5) for p in batches}

    client.topic = topic  # type: ignore[method-assign]
    client._produce_to = produce_to  # type: ignore[method-assign]
    answers = await client.produce("t", {0: b"a", 1: b"b"}, known=TOPIC)
    assert {p: a.error for p, a in answers.items()} == {0: KafkaCode.none, 1: KafkaCode.none}
    assert sorted(sent) == [(1, (0,)), (2, (1,)), (3, (0,))]
    assert reads == ["t"]  # only for the retry


async def test_a_leader_the_gateway_no_longer_knows_is_retried_like_a_moved_one() -> None:
    client = _tenant_client()
    moved = TopicLayout("t", {0: 3}, {0: (3,)}, {0: (3,)})

    async def topic(name: str, node_id: int | None = None) -> TopicLayout:
        return moved

    async def send(api: Any, node_id: int | None, **fields: Any) -> Any:
        if node_id == 1:
            raise KafkaCallError(KafkaCode.leader_not_available, "broker 1 is not known")
        part = SimpleNamespace(
            index=0, error_code=0, error_message=None, base_offset=9, log_append_time=None
        )
        return SimpleNamespace(responses=[SimpleNamespace(name="t", partition_responses=[part])])

    client.topic = topic  # type: ignore[method-assign]
    client.send = send  # type: ignore[method-assign]
    answers = await client.produce("t", {0: b"a"}, known=TOPIC)
    assert answers[0].error == KafkaCode.none and answers[0].base_offset == 9
