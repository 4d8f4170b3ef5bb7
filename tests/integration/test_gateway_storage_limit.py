"""A tenant's storage limit (``max_storage_bytes``) through the gateway, with real clients.

A tenant whose data (the leader replicas of its partitions, as the gateway's
survey of DescribeLogDirs last saw them) has reached its limit is refused at
both doors: a Kafka Produce gets POLICY_VIOLATION (44) per partition with a
message naming the tenant, the limit and the ways out (confluent-kafka's
delivery report shows the code, kafka-python's error the message); the HTTP door answers
400 with the same message. Nothing more is written. A neighbour is not
affected, deleting records frees the tenant at the next survey, and each
refused request is counted in ``shoal_gateway_limit_refusals_total{limit="storage"}``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import GatewayCluster
from gateway_env import TenantKey, limit_refusals, tenancy
from kafka import KafkaProducer
from kafka.errors import PolicyViolationError
from shoal.tenancy.model import Quotas

LIMIT = 200_000
SURVEY_WAIT_S = 30.0
"""Longer than a few survey periods (5 s each) on a busy machine."""
VALUE = b"x" * 1000


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(key: TenantKey, name: str) -> None:
    admin = AdminClient(key.librdkafka())  # held: a collected client cancels its futures
    admin.create_topics([NewTopic(name, 1)])[name].result(30)


def produce(producer: Producer, topic: str, count: int) -> list[KafkaError | None]:
    """``count`` records of 1 kB, flushed; each record's delivery error (None if stored)."""
    errors: list[KafkaError | None] = []
    for _ in range(count):
        producer.produce(topic, VALUE, on_delivery=lambda err, _msg: errors.append(err))
        producer.poll(0)
    assert producer.flush(30) == 0
    return errors


def produce_one(producer: Producer, topic: str) -> KafkaError | None:
    [error] = produce(producer, topic, 1)
    return error


def wait_for(producer: Producer, topic: str, refused: bool) -> KafkaError | None:
    """Produce a record a second until it is refused (or stored, with ``refused`` False)."""
    deadline = time.monotonic() + SURVEY_WAIT_S
    while True:
        error = produce_one(producer, topic)
        if (error is not None) == refused:
            return error
        assert time.monotonic() < deadline, f"still {'stored' if refused else error}"
        time.sleep(1)


def delete_all_records(key: TenantKey, topic: str) -> None:
    admin = AdminClient(key.librdkafka())
    # OFFSET_END (-1): up to the high watermark.
    futures = admin.delete_records([TopicPartition(topic, 0, -1)])
    for future in futures.values():
        future.result(60)


def producer_for(key: TenantKey) -> Producer:
    # No retries: a refused batch must show in its delivery report, not be retried.
    # A linger long enough that a fill goes in one request, never half before a survey.
    return Producer(key.librdkafka(acks="all", **{"linger.ms": 100, "retries": 0}))


def python_producer(key: TenantKey) -> KafkaProducer:
    return KafkaProducer(**key.python_client(), acks="all", retries=0)


def http_produce(key: TenantKey, topic: str) -> httpx.Response:
    with httpx.Client(
        base_url=key.gateway.http_url, auth=(key.key_id, key.secret), timeout=60
    ) as http:
        cluster_id = http.get("/v3/clusters").json()["data"][0]["cluster_id"]
        return http.post(
            f"/v3/clusters/{cluster_id}/topics/{topic}/records",
            json={"value": {"type": "STRING", "data": "over the limit?"}},
        )


def test_a_full_tenant_is_refused_until_it_deletes_records(
    gateway_cluster: GatewayCluster,
) -> None:
    full = gateway_cluster.tenant(unique("full"), quotas=Quotas(max_storage_bytes=LIMIT))
    neighbour = gateway_cluster.tenant(unique("roomy"), quotas=Quotas(max_storage_bytes=LIMIT))
    create_topic(full, "fill")
    create_topic(neighbour, "fill")
    producer, other = producer_for(full), producer_for(neighbour)

    # 300 kB go in while no survey has seen the tenant over its 200 kB.
    assert produce(producer, "fill", 300) == [None] * 300
    error: Any = wait_for(producer, "fill", refused=True)

    assert error.code() == KafkaError.POLICY_VIOLATION
    # librdkafka's delivery report names the error only; kafka-python's carries the
    # partition's error message.
    kafka_python = python_producer(full)
    try:
        with pytest.raises(PolicyViolationError) as refused:
            kafka_python.send("fill", VALUE).get(timeout=30)
    finally:
        kafka_python.close(timeout=5)
    message = str(refused.value)
    assert f"tenant {full.tenant} stores" in message
    assert "its limit (maxStorageBytes) is 200 KB" in message
    assert "delete records or topics, shorten retention, or ask for a higher limit" in message
    assert f"{full.tenant}.fill" not in message, "the tenant's own names only"
    refused_so_far = limit_refusals(full, "storage")
    assert refused_so_far >= 2

    # The neighbour's bytes are its own: it goes on producing.
    assert produce(other, "fill", 20) == [None] * 20

    # The HTTP door says the same.
    answer = http_produce(full, "fill")
    assert answer.status_code == 400, answer.text
    assert "maxStorageBytes" in answer.json()["message"]
    assert limit_refusals(full, "storage") == refused_so_far + 1

    # Deleting the records frees the tenant once a survey has seen it.
    delete_all_records(full, "fill")
    assert wait_for(producer, "fill", refused=False) is None
    assert http_produce(full, "fill").status_code == 200


def test_a_tenant_without_the_limit_is_never_refused(gateway_cluster: GatewayCluster) -> None:
    free = gateway_cluster.tenant(unique("free"))
    create_topic(free, "fill")
    producer = producer_for(free)

    assert produce(producer, "fill", 300) == [None] * 300
    time.sleep(6)  # a survey period
    assert produce(producer, "fill", 10) == [None] * 10
    assert limit_refusals(free, "storage") == 0


def test_raising_the_limit_lets_a_full_tenant_produce_again(
    gateway_cluster: GatewayCluster,
) -> None:
    full = gateway_cluster.tenant(unique("grown"), quotas=Quotas(max_storage_bytes=LIMIT))
    create_topic(full, "fill")
    producer = producer_for(full)
    assert produce(producer, "fill", 300) == [None] * 300
    wait_for(producer, "fill", refused=True)

    async def raise_limit(store: Any) -> None:
        await store.set_quotas(full.tenant, Quotas(max_storage_bytes=10 * LIMIT))

    tenancy(gateway_cluster.etcd_url, raise_limit)
    assert wait_for(producer, "fill", refused=False) is None
