"""Transactions with confluent-kafka (librdkafka): on three brokers, and through the gateway.

What a user of Kafka's exactly-once checks: a read_committed consumer sees committed
records once and aborted ones never, read_uncommitted sees both, and no marker reaches the
application; offsets sent with a transaction commit with it; a second producer with the
same transactional id fences the first; a transaction left open is aborted at its timeout
and stops holding back read_committed consumers; and through the gateway, two tenants'
equal transactional ids are two different ids, and a tenant's transactional produce is
metered and throttled like any produce while the markers the brokers write are not.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import GatewayCluster, module_gateway_cluster
from harness import EtcdServer, wait_until
from replicated import REPLICATED_ENV
from shoal.tenancy.model import Quotas
from test_gateway_http_keys_usage import http

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TXN_ENV = {
    **REPLICATED_ENV,
    # Few state partitions, so the first FindCoordinator does not wait on 50 leaders.
    "SHOAL_TRANSACTION_STATE_LOG_NUM_PARTITIONS": "6",
    # The coordinator looks for timed-out transactions twice a second, not every 10 s.
    "SHOAL_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS": "500",
}
PARTITIONS = 3
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "transactions", TXN_ENV)


@dataclass
class Route:
    """How a client reaches the cluster: straight to the brokers or as a tenant via the gateway."""

    name: str
    settings: dict[str, Any]

    def producer(self, transactional_id: str, **extra: Any) -> Producer:
        return Producer({**self.settings, "transactional.id": transactional_id, **extra})

    def consumer(self, isolation: str, **extra: Any) -> Consumer:
        return Consumer(
            {
                **self.settings,
                "group.id": f"check-{uuid.uuid4().hex[:8]}",
                "isolation.level": isolation,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                **extra,
            }
        )

    def create_topic(self, partitions: int = PARTITIONS) -> str:
        name = f"txn-{uuid.uuid4().hex[:8]}"
        admin = AdminClient(self.settings)
        for future in admin.create_topics([NewTopic(name, partitions)]).values():
            future.result(30)
        wait_until(
            lambda: len(admin.list_topics(name, timeout=10).topics[name].partitions) == partitions,
            30,
            f"metadata for {name}",
        )
        return name


def direct(cluster: GatewayCluster) -> Route:
    return Route("direct", {"bootstrap.servers": cluster.internal_bootstrap})


def tenant(cluster: GatewayCluster, name: str | None = None) -> Route:
    key = cluster.tenant(name or f"t{uuid.uuid4().hex[:6]}")
    return Route("gateway", key.librdkafka())


ROUTES: dict[str, Callable[[GatewayCluster], Route]] = {"direct": direct, "gateway": tenant}


@pytest.fixture(params=list(ROUTES))
def route(request: pytest.FixtureRequest, cluster: GatewayCluster) -> Route:
    return ROUTES[request.param](cluster)


def read_messages(
    consumer: Consumer, topic: str, expected: int, settle_s: float = 2.0
) -> list[Message]:
    """Every record from the start of each partition: until ``expected`` came, then
    ``settle_s`` more to catch any extra one. Closes the consumer."""
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    messages: list[Message] = []
    deadline = time.monotonic() + TIMEOUT_S
    quiet_until: float | None = None
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                if error is None:
                    messages.append(message)
            if len(messages) >= expected:
                quiet_until = quiet_until or time.monotonic() + settle_s
                if time.monotonic() >= quiet_until:
                    break
    finally:
        consumer.close()
    return messages


def read_all(consumer: Consumer, topic: str, expected: int, settle_s: float = 2.0) -> list[str]:
    """Every value from the start of each partition (see :func:`read_messages`)."""
    return [m.value().decode() for m in read_messages(consumer, topic, expected, settle_s)]


def produce_in_transaction(producer: Producer, topic: str, values: list[str], commit: bool) -> None:
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value=value.encode(), partition=i % PARTITIONS)
    if commit:
        producer.commit_transaction(TIMEOUT_S)
    else:
        producer.flush(TIMEOUT_S)
        producer.abort_transaction(TIMEOUT_S)


def test_read_committed_sees_committed_records_once_and_aborted_ones_never(route: Route) -> None:
    topic = route.create_topic()
    producer = route.producer(f"writer-{uuid.uuid4().hex[:6]}")
    producer.init_transactions(TIMEOUT_S)
    first = [f"first-{i}" for i in range(12)]
    aborted = [f"aborted-{i}" for i in range(7)]
    last = [f"last-{i}" for i in range(5)]
    produce_in_transaction(producer, topic, first, commit=True)
    produce_in_transaction(producer, topic, aborted, commit=False)
    produce_in_transaction(producer, topic, last, commit=True)

    committed = read_all(route.consumer("read_committed"), topic, len(first) + len(last))
    assert sorted(committed) == sorted(first + last), "each committed record once, no aborted"
    everything = read_all(route.consumer("read_uncommitted"), topic, 24)
    # The markers take offsets but never reach the application.
    assert sorted(everything) == sorted(first + aborted + last)


def test_offsets_sent_with_a_transaction_commit_with_it(route: Route) -> None:
    """Consume-transform-produce: the output and the group's offsets move together."""
    source, sink = route.create_topic(), route.create_topic()
    plain = Producer(route.settings)
    inputs = [f"in-{i}" for i in range(30)]
    for i, value in enumerate(inputs):
        plain.produce(source, value=value.encode(), partition=i % PARTITIONS)
    assert plain.flush(TIMEOUT_S) == 0

    group = f"transform-{uuid.uuid4().hex[:6]}"
    consumer = route.consumer("read_committed", **{"group.id": group})
    consumer.subscribe([source])
    producer = route.producer(f"transform-{uuid.uuid4().hex[:6]}")
    producer.init_transactions(TIMEOUT_S)

    def one_round(commit: bool) -> int:
        messages = consumer.consume(10, 5)
        messages = [m for m in messages if m.error() is None]
        if not messages:
            return 0
        producer.begin_transaction()
        for message in messages:
            output = message.value().decode().replace("in-", "out-")
            if not commit:
                output = "discarded-" + output
            producer.produce(sink, value=output.encode(), partition=message.partition())
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()),
            consumer.consumer_group_metadata(),
            TIMEOUT_S,
        )
        if commit:
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.abort_transaction(TIMEOUT_S)
        return len(messages)

    done = 0
    deadline = time.monotonic() + TIMEOUT_S
    while done < len(inputs) and time.monotonic() < deadline:
        done += one_round(commit=True)
    assert done == len(inputs)
    committed = consumer.committed(
        [TopicPartition(source, p) for p in range(PARTITIONS)], timeout=TIMEOUT_S
    )
    assert sum(tp.offset for tp in committed) == len(inputs), committed
    consumer.close()

    # An aborted round moves neither the output nor the offsets.
    extra = [f"in-extra-{i}" for i in range(6)]
    for i, value in enumerate(extra):
        plain.produce(source, value=value.encode(), partition=i % PARTITIONS)
    assert plain.flush(TIMEOUT_S) == 0
    consumer = route.consumer("read_committed", **{"group.id": group})
    consumer.subscribe([source])
    deadline = time.monotonic() + TIMEOUT_S
    while one_round(commit=False) == 0 and time.monotonic() < deadline:
        pass
    after = consumer.committed(
        [TopicPartition(source, p) for p in range(PARTITIONS)], timeout=TIMEOUT_S
    )
    assert [tp.offset for tp in after] == [tp.offset for tp in committed]
    consumer.close()

    outputs = read_all(route.consumer("read_committed"), sink, len(inputs))
    assert sorted(outputs) == sorted(v.replace("in-", "out-") for v in inputs)


def test_a_second_producer_with_the_same_id_fences_the_first(route: Route) -> None:
    topic = route.create_topic()
    transactional_id = f"fenced-{uuid.uuid4().hex[:6]}"
    zombie = route.producer(transactional_id)
    zombie.init_transactions(TIMEOUT_S)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie", partition=0)
    zombie.flush(TIMEOUT_S)

    successor = route.producer(transactional_id)
    successor.init_transactions(TIMEOUT_S)
    produce_in_transaction(successor, topic, ["successor"], commit=True)

    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(TIMEOUT_S)
    error = raised.value.args[0]
    assert error.fatal(), error
    assert error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), error
    assert read_all(route.consumer("read_committed"), topic, 1) == ["successor"]


def test_a_transaction_left_open_is_aborted_at_its_timeout(route: Route) -> None:
    topic = route.create_topic(partitions=1)
    stalled = route.producer(f"stalled-{uuid.uuid4().hex[:6]}", **{"transaction.timeout.ms": 2000})
    stalled.init_transactions(TIMEOUT_S)
    stalled.begin_transaction()
    stalled.produce(topic, value=b"never", partition=0)
    stalled.flush(TIMEOUT_S)

    # Records after the open transaction: read_committed gets them only once the
    # coordinator has aborted it (the last stable offset stops at its first record).
    plain = Producer(route.settings)
    plain.produce(topic, value=b"after", partition=0)
    assert plain.flush(TIMEOUT_S) == 0
    began = time.monotonic()
    consumer = route.consumer("read_committed")
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    while not got and time.monotonic() - began < TIMEOUT_S:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    assert got == [b"after"]

    with pytest.raises(KafkaException) as raised:
        stalled.commit_transaction(TIMEOUT_S)
    assert raised.value.args[0].code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.INVALID_TXN_STATE,
    ), raised.value


def test_two_tenants_equal_transactional_ids_do_not_fence_each_other(
    cluster: GatewayCluster,
) -> None:
    acme, globex = tenant(cluster), tenant(cluster)
    acme_topic, globex_topic = acme.create_topic(), globex.create_topic()
    first = acme.producer("shared-id")
    first.init_transactions(TIMEOUT_S)
    first.begin_transaction()
    first.produce(acme_topic, value=b"acme", partition=0)
    first.flush(TIMEOUT_S)

    other = globex.producer("shared-id")
    other.init_transactions(TIMEOUT_S)
    produce_in_transaction(other, globex_topic, ["globex"], commit=True)

    first.commit_transaction(TIMEOUT_S)
    assert read_all(acme.consumer("read_committed"), acme_topic, 1) == ["acme"]
    assert read_all(globex.consumer("read_committed"), globex_topic, 1) == ["globex"]


def test_transactional_produce_is_charged_like_any_produce_and_markers_are_not(
    cluster: GatewayCluster,
) -> None:
    """Two tenants send the same records, one record a request: one in transactions
    (committed and aborted) under a producer quota it goes over, the other with a plain
    idempotent producer. The gateway charges them the same Produce requests, the
    transactional ones longer only by the transactional id they carry; the markers the
    brokers wrote (one per transaction) reach no tenant's usage, and the quota throttles
    the transactional producer as it would any producer."""
    metered = cluster.tenant(f"q{uuid.uuid4().hex[:6]}", quotas=Quotas(producer_byte_rate=4000))
    unmetered = cluster.tenant(f"q{uuid.uuid4().hex[:6]}")
    txn_route = Route("gateway", metered.librdkafka())
    plain_route = Route("gateway", unmetered.librdkafka())
    # Equal lengths: the topic names are in every Produce request the gateway measures.
    txn_topic, plain_topic = txn_route.create_topic(), plain_route.create_topic()
    assert len(txn_topic) == len(plain_topic)
    throttles: list[float] = []
    transactional_id = f"metered-{uuid.uuid4().hex[:6]}"
    producer = txn_route.producer(
        transactional_id, throttle_cb=lambda event: throttles.append(event.throttle_time)
    )
    producer.init_transactions(TIMEOUT_S)
    idempotent = Producer({**plain_route.settings, "enable.idempotence": True})
    values = [bytes([i]) * 1000 for i in range(8)]
    for i, value in enumerate(values):
        producer.begin_transaction()
        producer.produce(txn_topic, value=value, partition=i % PARTITIONS)
        assert producer.flush(TIMEOUT_S) == 0  # its own Produce request
        if i % 2:
            producer.abort_transaction(TIMEOUT_S)
        else:
            producer.commit_transaction(TIMEOUT_S)
        idempotent.produce(plain_topic, value=value, partition=i % PARTITIONS)
        assert idempotent.flush(TIMEOUT_S) == 0
    producer.poll(0)  # serves the last throttle callbacks

    with http(metered) as client:
        charged = client.get("/v3/usage").json()
    with http(unmetered) as client:
        baseline = client.get("/v3/usage").json()
    assert charged["produce_requests"] == baseline["produce_requests"] == len(values)
    # The same bytes, but for the transactional id each transactional Produce names: no
    # marker, no EndTxn or AddPartitionsToTxn is counted as produce.
    assert charged["bytes_in"] - baseline["bytes_in"] == len(values) * len(transactional_id)
    assert charged["bytes_in"] > sum(map(len, values))
    # The markers are there all the same: a record and a marker per transaction.
    consumer = txn_route.consumer("read_uncommitted")
    ends = [
        consumer.get_watermark_offsets(TopicPartition(txn_topic, p), TIMEOUT_S)[1]
        for p in range(PARTITIONS)
    ]
    consumer.close()
    assert sum(ends) == 2 * len(values)
    # 8.6 KB at 4 KB/s: throttled, as any producer would be; the other tenant is not.
    assert charged["throttle_ms"] > 0
    assert throttles and max(throttles) > 0, throttles
    assert baseline["throttle_ms"] == 0
