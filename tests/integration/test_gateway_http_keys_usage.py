"""API keys and usage over the gateway's HTTP door, checked with real Kafka clients.

A key made over HTTP works with confluent-kafka at once and stops working when
revoked over HTTP; keys of other tenants are invisible (404, like a missing
one); a read-only key cannot mint a full one; usage counts the bytes a real
producer sent and the bytes the brokers store for the tenant's topic.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from gateway_env import TenantKey
from harness import wait_until

RECORDS, VALUE_BYTES = 50, 1000
# Per request: frame, request and batch headers (~150 bytes); per record: its
# length, attributes and varint deltas (under 20 bytes with no key or headers).
REQUEST_OVERHEAD, RECORD_OVERHEAD = 300, 20


def http(key: TenantKey, secret: str | None = None, key_id: str | None = None) -> httpx.Client:
    return httpx.Client(
        base_url=key.gateway.http_url,
        auth=(key_id or key.key_id, secret or key.secret),
        timeout=30,
    )


KEY_FIELDS = {"id", "description", "created", "revoked", "revoked_at", "scram_mechanisms"}
"""All a listing shows of a key: never its hash nor its SCRAM credentials."""


def as_key(owner: TenantKey, created: dict[str, Any]) -> TenantKey:
    return TenantKey(owner.tenant, created["id"], created["secret"], owner.gateway)


def create_key(key: TenantKey, **body: Any) -> dict[str, Any]:
    with http(key) as client:
        answer = client.post("/v3/api-keys", json=body)
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


@pytest.fixture(scope="module")
def acme(gateway_cluster: Any) -> TenantKey:
    key: TenantKey = gateway_cluster.tenant(f"acme-{uuid.uuid4().hex[:6]}")
    return key


@pytest.fixture(scope="module")
def globex(gateway_cluster: Any) -> TenantKey:
    key: TenantKey = gateway_cluster.tenant(f"globex-{uuid.uuid4().hex[:6]}")
    return key


def test_a_key_made_over_http_serves_kafka_until_revoked_over_http(acme: TenantKey) -> None:
    created = create_key(acme, description="orders service")
    assert created["description"] == "orders service" and created["revoked"] is False
    made = as_key(acme, created)
    with http(acme) as client:
        listed = client.get("/v3/api-keys").json()["data"]
    assert created["id"] in {k["id"] for k in listed}
    assert all(set(k) == KEY_FIELDS for k in listed)

    admin = AdminClient(made.librdkafka())
    admin.create_topics([NewTopic("orders", 1)])["orders"].result(30)
    errors: list[KafkaError] = []
    outcomes: list[KafkaError | None] = []
    producer = Producer(
        made.librdkafka(
            acks="all",
            error_cb=errors.append,
            **{"message.timeout.ms": 4000, "reconnect.backoff.max.ms": 500},
        )
    )
    producer.produce("orders", b"before", on_delivery=lambda err, _msg: outcomes.append(err))
    assert producer.flush(30) == 0
    assert outcomes == [None]

    with http(acme) as client:
        assert client.delete(f"/v3/api-keys/{made.key_id}").status_code == 204
        described = client.get(f"/v3/api-keys/{made.key_id}").json()
    assert described["revoked"] is True and described["revoked_at"] is not None
    with http(made) as client:
        assert client.get("/v3/api-keys").status_code == 401

    producer.produce("orders", b"after", on_delivery=lambda err, _msg: outcomes.append(err))
    producer.flush(15)
    assert len(outcomes) == 2
    assert outcomes[1] is not None, "a record was accepted from a revoked key"
    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}, [e.str() for e in errors]


def test_another_tenants_key_ids_answer_as_missing_ones(acme: TenantKey, globex: TenantKey) -> None:
    with http(globex) as client:
        foreign = client.get(f"/v3/api-keys/{acme.key_id}")
        missing = client.get("/v3/api-keys/KNOSUCHKEY0000000")
        revoke = client.delete(f"/v3/api-keys/{acme.key_id}")
        listed = client.get("/v3/api-keys").json()["data"]
    assert foreign.status_code == missing.status_code == revoke.status_code == 404
    assert foreign.json()["error_code"] == missing.json()["error_code"] == 40400
    assert acme.key_id not in {k["id"] for k in listed}
    with http(acme) as client:
        assert client.get(f"/v3/api-keys/{acme.key_id}").json()["revoked"] is False


def test_bad_requests_get_json_errors(acme: TenantKey) -> None:
    with httpx.Client(base_url=acme.gateway.http_url, timeout=30) as anonymous:
        unauthenticated = anonymous.get("/v3/api-keys")
    with http(acme) as client:
        too_long = client.post("/v3/api-keys", json={"description": "x" * 257})
        not_json = client.post(
            "/v3/api-keys", content=b"{", headers={"content-type": "application/json"}
        )
        listed = client.get("/v3/api-keys").json()["data"]
    assert unauthenticated.status_code == 401
    assert unauthenticated.json()["error_code"] == 40100
    assert (too_long.status_code, too_long.json()["error_code"]) == (400, 40001)
    assert (not_json.status_code, not_json.json()["error_code"]) == (400, 40001)
    assert "x" * 257 not in {k["description"] for k in listed}


def test_a_read_only_key_cannot_make_or_revoke_a_full_key(acme: TenantKey) -> None:
    reader = as_key(acme, create_key(acme, description="dashboards", read_only=True))
    with http(reader) as client:
        full = client.post("/v3/api-keys", json={"description": "escalate"})
        revoke = client.delete(f"/v3/api-keys/{acme.key_id}")
        another_reader = client.post("/v3/api-keys", json={"read_only": True})
    assert full.status_code == 403, full.text
    assert full.json()["error_code"] == 40300
    assert revoke.status_code == 403, revoke.text
    assert another_reader.status_code == 201, another_reader.text
    with http(acme) as client:
        assert client.get(f"/v3/api-keys/{acme.key_id}").json()["revoked"] is False


def test_usage_counts_produced_bytes_and_the_topics_storage(
    gateway_cluster: Any, globex: TenantKey
) -> None:
    tenant: TenantKey = gateway_cluster.tenant(f"usage-{uuid.uuid4().hex[:6]}")
    admin = AdminClient(tenant.librdkafka())
    admin.create_topics([NewTopic("metrics", 1)])["metrics"].result(30)
    producer = Producer(tenant.librdkafka(acks="all", **{"linger.ms": 50}))
    for i in range(RECORDS):
        producer.produce("metrics", bytes([i % 256]) * VALUE_BYTES)
    assert producer.flush(30) == 0
    produced = RECORDS * VALUE_BYTES

    with http(tenant) as client:
        usage = client.get("/v3/usage").json()
    assert usage["tenant"] == tenant.tenant
    assert usage["produce_requests"] >= 1
    assert (
        produced
        <= usage["bytes_in"]
        <= (produced + usage["produce_requests"] * REQUEST_OVERHEAD + RECORDS * RECORD_OVERHEAD)
    )

    def stored() -> dict[str, Any]:
        with http(tenant) as client:
            storage: dict[str, Any] = client.get("/v3/usage").json()["storage"]
        return storage

    # Storage is surveyed every few seconds; wait for a survey after the produce.
    wait_until(lambda: stored()["leader_bytes"] >= produced, 30, "storage to count the records")
    wait_until(
        lambda: stored()["replica_bytes"] == 3 * stored()["leader_bytes"],
        30,
        "every replica to hold the records",
    )
    storage = stored()
    assert [t["topic"] for t in storage["topics"]] == ["metrics"]
    assert storage["complete"] is True
    with http(globex) as client:
        other = client.get("/v3/usage").json()
    assert "metrics" not in {t["topic"] for t in other["storage"]["topics"]}
    assert other["bytes_in"] == 0
