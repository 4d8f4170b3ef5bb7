"""A tenant's clients on a real Kubernetes: the operator's resources are Ready and its
key Secret connects a Kafka client through the gateway.

Needs the kind cluster e2e/run.sh makes (see conftest.py); skipped elsewhere.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from conftest import CLUSTER, NAMESPACE, TENANT, client_config, get, is_ready, key_secret
from shoal.operator.endpoints import GATEWAY_KAFKA_PORT, gateway_name

pytestmark = pytest.mark.timeout(600)


def test_cluster_tenant_and_topics_report_ready_with_their_health() -> None:
    cluster = get("cluster", CLUSTER)
    status = cluster["status"]
    assert is_ready(cluster)
    assert status["observedGeneration"] == cluster["metadata"]["generation"]
    assert status["brokers"]["ready"] == status["brokers"]["desired"] == 3
    assert status["partitions"]["offline"] == 0

    tenant = get("tenant", TENANT)
    assert is_ready(tenant)
    assert {k["name"] for k in tenant["status"]["keys"]} == {"app", "spark"}

    for name, partitions in (("events", 6), ("orders", 3)):
        topic = get("topic", name)
        assert is_ready(topic)
        assert topic["status"]["partitions"] == partitions
        assert topic["status"]["underReplicated"] == 0


def test_key_secret_holds_a_ready_client_configuration() -> None:
    secret = key_secret("app")
    host, _, port = secret["bootstrap"].rpartition(":")
    # The gateway Service's name, or the host run.sh tells the gateway to advertise.
    assert host in (f"{gateway_name(CLUSTER)}.{NAMESPACE}.svc", "127.0.0.1")
    assert int(port) == GATEWAY_KAFKA_PORT
    properties = secret["client.properties"]
    assert f"sasl.username={secret['username']}" in properties
    assert f"sasl.password={secret['password']}" in properties


def test_produce_and_consume_through_the_gateway_with_the_key_secret(gateway: str) -> None:
    config = client_config("app", gateway)
    run = uuid.uuid4().hex
    sent = [f"{run}-{n}".encode() for n in range(200)]
    producer = Producer({**config, "acks": "all", "enable.idempotence": True})
    for value in sent:
        producer.produce("events", value=value)
    assert producer.flush(60) == 0

    consumer = Consumer({**config, "group.id": f"e2e-{run}", "auto.offset.reset": "earliest"})
    consumer.subscribe(["events"])
    received: set[bytes] = set()
    try:
        for _ in range(120):
            for message in consumer.consume(num_messages=500, timeout=1.0):
                if message.error():
                    raise KafkaException(message.error())
                if message.value().startswith(run.encode()):
                    received.add(message.value())
            if received >= set(sent):
                break
    finally:
        consumer.close()
    assert received == set(sent)


def test_read_only_key_cannot_produce(gateway: str) -> None:
    failures: list[str] = []
    producer = Producer(
        {**client_config("spark", gateway), "acks": "all", "message.timeout.ms": 20000}
    )
    producer.produce(
        "events", value=b"refused", on_delivery=lambda err, _msg: failures.append(str(err))
    )
    producer.flush(30)
    assert len(failures) == 1
    assert "AUTHORIZATION" in failures[0].upper()
