"""The gateway's basic promise: a tenant's key works with librdkafka, plain and over TLS."""

from __future__ import annotations

import struct
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import start_gateway_cluster
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, frame, request_class


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


def test_api_versions_answers_each_version_asked_the_same_every_time(gateway_cluster) -> None:  # type: ignore[no-untyped-def]
    # The answer is encoded once per version and kept: each later connection must get
    # the same bytes under its own correlation id, and a version the gateway does not
    # serve still gets UNSUPPORTED_VERSION with the offered range, in v0.
    bootstrap = gateway_cluster.tenant("versions").bootstrap()
    answers = []
    for correlation_id in (7, 8):
        with RawConnection(bootstrap) as conn:
            conn.send_raw(frame(struct.pack(">hhih", 18, 99, correlation_id, -1) + b"\0" * 4))
            unsupported = conn.read_frame()
            conn.send_raw(
                frame(struct.pack(">hhih", 18, 3, correlation_id, -1) + b"\0\x02a\x021\0")
            )
            answers.append(conn.read_frame())
        got_id, error_code, count = struct.unpack_from(">ihi", unsupported)
        assert (got_id, error_code) == (correlation_id, ErrorCode.unsupported_version)
        offered = {struct.unpack_from(">h", unsupported, 10 + 6 * i)[0] for i in range(count)}
        assert {0, 1, 3, 18, 36} <= offered
    first, second = answers
    assert struct.unpack_from(">i", first) == (7,) and struct.unpack_from(">i", second) == (8,)
    assert first[4:] == second[4:]
    assert struct.unpack_from(">h", first, 4)[0] == ErrorCode.none  # header v0 in every version
