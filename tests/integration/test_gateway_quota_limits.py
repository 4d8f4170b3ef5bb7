"""Byte-rate quotas under load: the limited tenant is held at its quota, the others are not.

Acceptance: a tenant limited to 1 MB/s producing flat out is held within 15%
of 1 MB/s over 20 s while another tenant's throughput is unaffected; the same
for consuming.

Each test runs two tenants on one gateway in front of one broker: A with a
1 MB/s quota in the direction under test, B unlimited. B starts first and is
measured alone for 5 s, then A starts, flat out, and after A's warm-up both
are measured over the same 20 s; A stops and B is measured alone for 5 s
more. B must keep 70% or more of its rate alone (two cores serve the client,
the gateway and the broker, so A's own work costs B something; a throttle
that leaked onto B would cost far more) and three times A's rate or more.

What is counted is payload: the bytes of record values (the records have no
keys) acknowledged to the producer, or handed to the consumer, per second,
with 1 MB = 10^6 bytes. The gateway counts whole produce request and fetch
response frames, which add record, batch and request headers: with 10 kB
values and 100 kB batches that is well under 1%, so payload sits a hair under
the quota when the gateway is exact.

Why these settings: ``batch.size`` of 100 kB makes one produce request a
tenth of a second of A's quota, so the throttle is applied in small steps
rather than one second at a time; a producer queue of 4 MB keeps A's queued
records a few seconds from their request timeout however long the throttle.
Consumers ask for up to 10 MB per partition and wait at most 10 ms for data,
so that B is bounded by the gateway and the broker, not by fetch sizes or
by long polls each time it starts its backlog over; A's fetches are capped
by the gateway at one second of its quota (1 MB) whatever it asks for.
librdkafka does not implement KIP-219 (it reports throttle times but sends
on), so what holds A back is the gateway not reading from A's connections.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import GatewayCluster, start_gateway_cluster
from gateway_env import GatewayProcess, TenantKey
from harness import EtcdServer
from shoal.tenancy.model import Quotas

QUOTA = 1_000_000
"""Bytes per second: 1 MB/s."""
TOLERANCE = 0.15
VALUE_SIZE = 10_000
MEASURE_S = 20.0
WARM_UP_S = 3.0
"""A's first seconds are left out: a tenant with no history gets a burst, then is throttled."""
SOLO_S = 5.0
"""How long B is measured alone before A starts, and again after A stops."""
B_WARM_UP_PRODUCE_S = 10.0
"""How long B produces before it is measured: several GB, enough for the kernel to start writing
back dirty pages, which costs B about a third of its rate from then on (seen at 8-10 s)."""
B_WARM_UP_CONSUME_S = 1.0
B_UNAFFECTED = 0.7
B_OVER_A = 3.0
BACKLOG_BYTES = 40_000_000
"""Each tenant's backlog for the consume test: A needs about 25 MB over warm-up and 20 s."""
TENANCY_POLL_S = 1.0
"""Longer than the gateway's tenancy poll (300 ms in tests): a new tenant is seen by then."""

# Two tenants' rates compared across phases: another test sharing the cores
# would move one phase's figures and not the other's.
pytestmark = pytest.mark.alone

PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)
"""What a stopped producer's dropped records are reported with: not failures."""
PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": "all",
    "linger.ms": 5,
    "batch.size": 100_000,
    "queue.buffering.max.kbytes": 4096,
}
CONSUMER_SETTINGS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "fetch.wait.max.ms": 10,
    "max.partition.fetch.bytes": 10_485_760,
}


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    """One broker behind one gateway: the load tests need the cores, not replicas."""
    root = tmp_path_factory.mktemp("gateway-quota-limits")
    gateway_cluster, started = start_gateway_cluster(etcd, root, brokers=1)
    yield gateway_cluster
    failed = any(
        getattr(item, "report_call", None) is not None and item.report_call.failed
        for item in request.session.items
        if item.module is request.module
    )
    if gateway_cluster.gateway.running:
        gateway_cluster.gateway.stop()
    for broker in started:
        if broker.running:
            broker.kill()
        if failed:
            print(f"\n----- broker {broker.node_id} log -----\n{broker.log_tail()}")
    if failed:
        print(f"\n----- gateway log -----\n{gateway_cluster.gateway.log_tail()}")
    shutil.rmtree(root, ignore_errors=True)


class Meter:
    """(monotonic time, payload bytes) of each acknowledgement or delivery, and rates over spans."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int]] = []

    def add(self, nbytes: int) -> None:
        self.events.append((time.monotonic(), nbytes))

    def rate(self, start: float, end: float) -> float:
        """Payload bytes per second in [start, end)."""
        return sum(n for t, n in list(self.events) if start <= t < end) / (end - start)

    def per_second(self, start: float, end: float) -> list[float]:
        """MB in each whole second of [start, end), for the report."""
        return [self.rate(s, s + 1) / 1e6 for s in _seconds(start, end)]


def _seconds(start: float, end: float) -> list[float]:
    return [start + i for i in range(int(end - start))]


class FlatOutProducer(threading.Thread):
    """Produces VALUE_SIZE-byte records as fast as the client takes them until stopped."""

    def __init__(self, key: TenantKey, topic: str) -> None:
        super().__init__(daemon=True, name=f"produce-{key.tenant}")
        self.config = key.librdkafka(**PRODUCER_SETTINGS)
        self.topic = topic
        self.meter = Meter()
        self.errors: list[str] = []
        self.unflushed = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        producer = Producer(self.config)
        value = os.urandom(VALUE_SIZE)

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                self.meter.add(len(msg.value()))
            elif err.code() not in PURGED:
                self.errors.append(err.str())

        while not self._stopping.is_set():
            try:
                producer.produce(self.topic, value, on_delivery=delivered)
            except BufferError:
                producer.poll(0.01)
            producer.poll(0)
        # What is still queued or in flight would take a throttled tenant
        # seconds to send; B is measured alone again once this returns.
        producer.purge(in_queue=True, in_flight=True)
        self.unflushed = producer.flush(30)

    def stop(self) -> None:
        self._stopping.set()
        self.join(60)


class FlatOutConsumer(threading.Thread):
    """Reads ``partitions`` partitions (0, 1, ...) from the beginning as fast as it can
    until stopped.

    With ``loop`` it starts a partition again from offset 0 whenever it reaches
    its end, so a modest backlog keeps it busy; without, reaching the end is
    noted in ``reached_end`` (the measurement would then be of an idle
    consumer). ``meter`` may be shared by several consumers of one tenant.
    """

    def __init__(
        self,
        key: TenantKey,
        topic: str,
        loop: bool,
        partitions: int = 1,
        meter: Meter | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(daemon=True, name=f"consume-{key.tenant}")
        self.config = key.librdkafka(
            **{"group.id": f"{key.tenant}-reader", **CONSUMER_SETTINGS, **settings}
        )
        self.topic = topic
        self.loop = loop
        self.partitions = partitions
        self.meter = Meter() if meter is None else meter
        self.reached_end = False
        self.errors: list[str] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        consumer = Consumer(self.config)
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        try:
            while not self._stopping.is_set():
                nbytes = 0
                for message in consumer.consume(1000, 0.05):
                    error = message.error()
                    if error is None:
                        nbytes += len(message.value())
                    elif error.code() == KafkaError._PARTITION_EOF:
                        self.reached_end = True
                        if self.loop:
                            consumer.seek(TopicPartition(self.topic, message.partition(), 0))
                    else:
                        self.errors.append(error.str())
                if nbytes:
                    self.meter.add(nbytes)
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stopping.set()
        self.join(60)


def create_topic(key: TenantKey, topic: str) -> None:
    admin = AdminClient(key.librdkafka())
    admin.create_topics([NewTopic(topic, 1)])[topic].result(30)


def fill(key: TenantKey, topic: str, nbytes: int) -> None:
    producer = Producer(key.librdkafka(**PRODUCER_SETTINGS))
    value = os.urandom(VALUE_SIZE)
    for _ in range(nbytes // VALUE_SIZE):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(60) == 0


class Load(Protocol):
    """A flat-out client thread and what it has moved so far."""

    meter: Meter

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class SideBySide:
    """A's and B's payload rates over the same span, and B's while it ran alone."""

    a: float
    b: float
    b_solo: float
    a_warm_up: float

    def check(self, gateway_log: Path) -> None:
        assert abs(self.a - QUOTA) <= TOLERANCE * QUOTA, (
            f"A moved {self.a / 1e6:.3f} MB/s over {MEASURE_S:g} s, outside"
            f" {QUOTA / 1e6:g} MB/s +/- {TOLERANCE:.0%} (gateway log {gateway_log})"
        )
        assert self.b >= B_OVER_A * self.a, (
            f"B {self.b / 1e6:.2f} MB/s is not {B_OVER_A:g}x A's {self.a / 1e6:.3f} MB/s"
        )
        assert self.b >= B_UNAFFECTED * self.b_solo, (
            f"B fell from {self.b_solo / 1e6:.1f} MB/s alone to {self.b / 1e6:.1f} MB/s beside A"
        )


def side_by_side(limited: Load, unlimited: Load, b_warm_up_s: float) -> SideBySide:
    """B alone, then A too, then B alone again; B's solo rate is over both lone spans.

    Measuring B alone on both sides of A's run keeps the machine's drift (page
    cache write-back, the other processes' bursts) out of the comparison.
    """
    unlimited.start()
    before = time.monotonic() + b_warm_up_s
    time.sleep(before + SOLO_S - time.monotonic())
    a_started = time.monotonic()
    limited.start()
    start = a_started + WARM_UP_S
    end = start + MEASURE_S
    time.sleep(end - time.monotonic())
    limited.stop()
    after = time.monotonic() + 0.5
    time.sleep(after + SOLO_S - time.monotonic())
    unlimited.stop()
    b_alone = unlimited.meter.per_second(before, before + SOLO_S)
    b_alone += unlimited.meter.per_second(after, after + SOLO_S)
    figures = SideBySide(
        a=limited.meter.rate(start, end),
        b=unlimited.meter.rate(start, end),
        b_solo=sum(b_alone) * 1e6 / len(b_alone),
        a_warm_up=limited.meter.rate(a_started, start),
    )
    print(
        f"\nA {figures.a / 1e6:.3f} MB/s over {MEASURE_S:g} s"
        f" (warm-up {figures.a_warm_up / 1e6:.3f} MB/s);"
        f" B {figures.b / 1e6:.1f} MB/s beside A, {figures.b_solo / 1e6:.1f} MB/s alone"
        f"\nMB in each second, A: {_listing(limited.meter.per_second(start, end), 2)}"
        f"\nB beside A: {_listing(unlimited.meter.per_second(start, end), 1)}"
        f"\nB alone, before and after: {_listing(b_alone, 1)}"
    )
    return figures


def _listing(values: list[float], digits: int) -> str:
    return " ".join(f"{v:.{digits}f}" for v in values)


def test_a_producer_at_its_quota_is_held_there_and_others_are_not_slowed(
    cluster: GatewayCluster,
) -> None:
    a = cluster.tenant("produce-limited", quotas=Quotas(producer_byte_rate=QUOTA))
    b = cluster.tenant("produce-free")
    time.sleep(TENANCY_POLL_S)
    for key in (a, b):
        create_topic(key, "load")
    producer_a = FlatOutProducer(a, "load")
    producer_b = FlatOutProducer(b, "load")
    try:
        figures = side_by_side(producer_a, producer_b, B_WARM_UP_PRODUCE_S)
    finally:
        for producer in (producer_a, producer_b):
            if producer.is_alive():
                producer.stop()
    for producer in (producer_a, producer_b):
        assert not producer.errors, producer.errors[:3]
        assert producer.unflushed == 0
    figures.check(cluster.gateway.log_path)


def test_a_consumer_at_its_quota_is_held_there_and_others_are_not_slowed(
    cluster: GatewayCluster,
) -> None:
    a = cluster.tenant("consume-limited", quotas=Quotas(consumer_byte_rate=QUOTA))
    b = cluster.tenant("consume-free")
    time.sleep(TENANCY_POLL_S)
    for key in (a, b):
        create_topic(key, "backlog")
        fill(key, "backlog", BACKLOG_BYTES)
    consumer_a = FlatOutConsumer(a, "backlog", loop=False)
    consumer_b = FlatOutConsumer(b, "backlog", loop=True)
    try:
        figures = side_by_side(consumer_a, consumer_b, B_WARM_UP_CONSUME_S)
    finally:
        for consumer in (consumer_a, consumer_b):
            if consumer.is_alive():
                consumer.stop()
    for consumer in (consumer_a, consumer_b):
        assert not consumer.errors, consumer.errors[:3]
    assert not consumer_a.reached_end, "A read its whole backlog: the measurement ran dry"
    figures.check(cluster.gateway.log_path)


# -- one budget per tenant, however many connections -------------------------------

FLOOD_QUOTA = 1_000_000
FLOOD_MEASURE_S = 30.0
FLOOD_WARM_UP_S = 5.0
FLOOD_MOST = 1.1
"""The issue's bound: stored bytes over 30 s at most 1.1 times the quota. The
gateway's own bound is the quota plus two windows (two seconds) over any span."""
FLOOD_LEAST = 0.75
"""And the tenant does get its quota, less record and batch overheads counted
against it, what the last requests still owe, and what two busy cores cost
clients that share one Python process. Not asked of 32 producers: librdkafka
ignores KIP-219's throttle times, so a request waiting behind 31 others (about
a second each) reaches its 30 s request timeout, and the producer reconnects
and backs off; such a tenant gets less than its quota, never more."""
FLOOD_PARTITIONS = 6


class ConnectionFlood(threading.Thread):
    """``producers`` confluent-kafka producers of one tenant (each with its own
    connections), all flat out with librdkafka's default batching, and ``http``
    HTTP clients posting records as fast as the gateway answers them. Producer
    ``i`` uses gateway ``keys[i % len(keys)]``; HTTP clients use the first."""

    def __init__(self, keys: list[TenantKey], topic: str, producers: int, http: int = 0) -> None:
        super().__init__(daemon=True, name=f"flood-{keys[0].tenant}")
        self.keys = keys
        self.key = keys[0]
        self.topic = topic
        self.producers = producers
        self.http = http
        self.errors: list[str] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        posters = [threading.Thread(target=self._post, daemon=True) for _ in range(self.http)]
        for poster in posters:
            poster.start()
        producers = [
            Producer(
                self.keys[i % len(self.keys)].librdkafka(**{"queue.buffering.max.kbytes": 4096})
            )
            for i in range(self.producers)
        ]
        value = os.urandom(VALUE_SIZE)

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None and err.code() not in PURGED:
                self.errors.append(err.str())

        while not self._stopping.is_set():
            for producer in producers:
                with contextlib.suppress(BufferError):
                    for _ in range(50):
                        producer.produce(self.topic, value, on_delivery=delivered)
                producer.poll(0)
            time.sleep(0.005)
        for producer in producers:
            producer.purge(in_queue=True, in_flight=True)
            producer.flush(30)
        for poster in posters:
            poster.join(60)

    def _post(self) -> None:
        value = base64.b64encode(os.urandom(VALUE_SIZE)).decode()
        with httpx.Client(
            base_url=self.key.gateway.http_url, auth=(self.key.key_id, self.key.secret), timeout=60
        ) as http:
            cluster = http.get("/v3/clusters").json()["data"][0]["cluster_id"]
            path = f"/v3/clusters/{cluster}/topics/{self.topic}/records"
            while not self._stopping.is_set():
                answer = http.post(path, json={"value": {"type": "BINARY", "data": value}})
                if answer.status_code == 429:
                    self._stopping.wait(float(answer.headers["Retry-After"]))
                elif answer.status_code != 200:
                    self.errors.append(f"HTTP {answer.status_code}: {answer.text}")

    def stop(self) -> None:
        self._stopping.set()
        self.join(120)


def stored_payload(key: TenantKey, topic: str) -> int:
    """Bytes of record values in the topic now, from its end offsets (every value is VALUE_SIZE)."""
    consumer = Consumer(key.librdkafka(**{"group.id": f"{key.tenant}-offsets"}))
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(FLOOD_PARTITIONS)
        ]
    finally:
        consumer.close()
    return sum(ends) * VALUE_SIZE


def test_a_tenant_flooding_from_many_connections_doors_and_replicas_gets_its_quota_once(
    cluster: GatewayCluster,
) -> None:
    """Six tenants with the same producer quota flood at once: from 1, 8 and 32
    producers, from 8 producers and 4 HTTP clients, from 8 producers all on a
    second gateway replica, and from 8 producers spread over both replicas.
    Each stores its quota: more connections, a second door or a second replica
    buy nothing, and a tenant whose clients use one replica of two still gets
    (nearly) all of its quota there."""
    first = cluster.gateway
    second = GatewayProcess(
        first.etcd_url, first.upstream, cluster.root / "second-gateway", brokers=1
    ).start()
    # name: (producers, HTTP clients, the gateway replicas they use)
    shapes = {
        "one": (1, 0, [first]),
        "eight": (8, 0, [first]),
        "thirty-two": (32, 0, [first]),
        "both-doors": (8, 4, [first]),
        "second-replica": (8, 0, [second]),
        "both-replicas": (8, 0, [first, second]),
    }
    keys = {
        name: cluster.tenant(f"flood-{name}", quotas=Quotas(producer_byte_rate=FLOOD_QUOTA))
        for name in shapes
    }
    time.sleep(TENANCY_POLL_S)
    for key in keys.values():
        admin = AdminClient(key.librdkafka())
        admin.create_topics([NewTopic("flood", FLOOD_PARTITIONS)])["flood"].result(30)
    floods = {
        name: ConnectionFlood(
            [dataclasses.replace(keys[name], gateway=g) for g in gateways], "flood", producers, http
        )
        for name, (producers, http, gateways) in shapes.items()
    }
    try:
        for flood in floods.values():
            flood.start()
        time.sleep(FLOOD_WARM_UP_S)
        before = {name: stored_payload(key, "flood") for name, key in keys.items()}
        started = time.monotonic()
        time.sleep(FLOOD_MEASURE_S)
        after = {name: stored_payload(key, "flood") for name, key in keys.items()}
        elapsed = time.monotonic() - started
    finally:
        for flood in floods.values():
            flood.stop()
        second.stop()
    rates = {name: (after[name] - before[name]) / elapsed for name in keys}
    print("\nstored, times the quota, over", f"{elapsed:.1f} s:", {
        name: round(rate / FLOOD_QUOTA, 3) for name, rate in rates.items()
    })  # fmt: skip
    for name, flood in floods.items():
        assert not flood.errors, (name, flood.errors[:3])
    for name, rate in rates.items():
        assert rate <= FLOOD_MOST * FLOOD_QUOTA, (name, rates)
        if name != "thirty-two":
            assert rate >= FLOOD_LEAST * FLOOD_QUOTA, (name, rates)


class ReaderFlood:
    """``consumers`` flat-out consumers of one tenant (:class:`FlatOutConsumer`), each
    reading every partition of ``topic`` over and over, one meter between them.
    Consumer ``i`` uses gateway ``keys[i % len(keys)]``."""

    def __init__(self, keys: list[TenantKey], topic: str, consumers: int) -> None:
        self.meter = Meter()
        # A small prefetch queue: what a consumer holds unread at either end of the
        # measurement is then a rounding error beside 30 s of the quota.
        self.consumers = [
            FlatOutConsumer(
                keys[i % len(keys)],
                topic,
                loop=True,
                partitions=FLOOD_PARTITIONS,
                meter=self.meter,
                **{"queued.max.messages.kbytes": 1024},
            )
            for i in range(consumers)
        ]

    @property
    def errors(self) -> list[str]:
        return [error for consumer in self.consumers for error in consumer.errors]

    def start(self) -> None:
        for consumer in self.consumers:
            consumer.start()

    def stop(self) -> None:
        for consumer in self.consumers:
            consumer.stop()


FLOOD_BACKLOG_BYTES = 6_000_000
"""Each reader tenant's backlog, read again and again: six seconds of its quota."""


def test_a_tenant_reading_from_many_connections_and_replicas_gets_its_quota_once(
    cluster: GatewayCluster,
) -> None:
    """Four tenants with the same consumer quota read flat out at once: from 1, 8
    and 32 consumers on one gateway, and from 8 consumers spread over two gateway
    replicas. Each is handed its quota over 30 s, no more: a fetch budget is the
    tenant's, not a connection's or a replica's. (Consumers have one door: the
    HTTP API produces but does not consume.)"""
    first = cluster.gateway
    second = GatewayProcess(
        first.etcd_url, first.upstream, cluster.root / "second-reader-gateway", brokers=1
    ).start()
    # name: (consumers, the gateway replicas they use)
    shapes = {
        "one": (1, [first]),
        "eight": (8, [first]),
        "thirty-two": (32, [first]),
        "both-replicas": (8, [first, second]),
    }
    keys = {
        name: cluster.tenant(f"readers-{name}", quotas=Quotas(consumer_byte_rate=FLOOD_QUOTA))
        for name in shapes
    }
    time.sleep(TENANCY_POLL_S)
    for key in keys.values():
        admin = AdminClient(key.librdkafka())
        admin.create_topics([NewTopic("backlog", FLOOD_PARTITIONS)])["backlog"].result(30)
        fill(key, "backlog", FLOOD_BACKLOG_BYTES)
    floods = {
        name: ReaderFlood(
            [dataclasses.replace(keys[name], gateway=g) for g in gateways], "backlog", consumers
        )
        for name, (consumers, gateways) in shapes.items()
    }
    try:
        for flood in floods.values():
            flood.start()
        start = time.monotonic() + FLOOD_WARM_UP_S
        end = start + FLOOD_MEASURE_S
        time.sleep(end - time.monotonic())
    finally:
        for flood in floods.values():
            flood.stop()
        second.stop()
    rates = {name: flood.meter.rate(start, end) for name, flood in floods.items()}
    print("\nread, times the quota, over", f"{FLOOD_MEASURE_S:g} s:", {
        name: round(rate / FLOOD_QUOTA, 3) for name, rate in rates.items()
    })  # fmt: skip
    for name, flood in floods.items():
        assert not flood.errors, (name, flood.errors[:3])
    for name, rate in rates.items():
        assert rate <= FLOOD_MOST * FLOOD_QUOTA, (name, rates)
        assert rate >= FLOOD_LEAST * FLOOD_QUOTA, (name, rates)
