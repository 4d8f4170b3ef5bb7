"""The gateway's basic promise: a tenant's key works with librdkafka, plain and over TLS."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic


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
