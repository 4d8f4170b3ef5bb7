"""The gateway's basic promise: a tenant's key works with librdkafka, plain and over TLS."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import start_gateway_cluster
from raw_kafka import request_class


def test_produce_and_consume_through_the_gateway(gateway_cluster) -> None:  # type: ignore[no-untyped-def]
    key = gateway_cluster.tenant("smoke")
    for tls in (False, True):
        admin = AdminClient(key.librdkafka(tls))
        topic = f"orders-{int(tls)}"
        for future in admin.create_topics([NewTopic(topic, 3)]).values():
            future.result(30)
        producer = Producer(key.librdkafka(tls, acks="all"))
        for i in range(30):
            producer.produce(topic, key=str(i).encode(), value=b"v%d" % i)
        assert producer.flush(30) == 0
        consumer = Consumer(
            key.librdkafka(tls, **{"group.id": f"g{int(tls)}", "auto.offset.reset": "earliest"})
        )
        consumer.subscribe([topic])
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 30 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value())
        consumer.close()
        assert sorted(seen) == sorted(b"v%d" % i for i in range(30))
        listed = admin.list_topics(timeout=10)
        assert set(listed.topics) == {"orders-0"} | ({"orders-1"} if tls else set())
        assert all(b.host == "127.0.0.1" for b in listed.brokers.values())


def test_bootstrap_connections_skip_a_broker_that_just_died(etcd, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Until the brokers' Metadata drops a dead broker (its lease expires), the
    # gateway still knows it: a bootstrap connection must go to one that answers.
    cluster, brokers = start_gateway_cluster(etcd, tmp_path, brokers=3)
    try:
        key = cluster.tenant("bootstrap")
        brokers[2].kill()
        metadata = request_class(3, 12)
        for _ in range(12):
            with key.raw() as connection:
                connection.send(metadata(topics=(), allow_auto_topic_creation=False,
                                         include_topic_authorized_operations=False))  # fmt: skip
                _, answer = connection.receive(metadata)
            assert len(answer.brokers) >= 2
    finally:
        cluster.gateway.stop()
        for broker in brokers:
            if broker.running:
                broker.kill()
