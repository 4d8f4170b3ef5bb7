"""Traces across the gateway and the broker, seen by an in-memory span exporter.

A real broker and two real gateways run in this test process, on an event loop
of their own in a background thread (the Kafka clients block, the servers must
keep serving meanwhile): one gateway traces, the other does not. The broker
and the tracing gateway each have an SDK ``TracerProvider`` with their own
resource, both feeding one ``InMemorySpanExporter``, so the test reads what an
OTLP backend would receive. Clients are real ones (confluent-kafka,
kafka-python, httpx) logging in with SASL/PLAIN as a tenant.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from gateway_env import TenantKey, make_tenant
from harness import EtcdServer, free_port, free_port_block, wait_until
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from shoal.broker.app import Broker
from shoal.broker.config import BrokerConfig
from shoal.gateway.config import GatewayConfig
from shoal.gateway.server import Gateway

from shoal.tracing import BROKER_SERVICE, GATEWAY_SERVICE

pytestmark = pytest.mark.slow

DEADLINE_S = 30.0
# A producer's own trace context, in a record header: the gateway and the broker
# must pass it through as the bytes it is.
RECORD_TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
INJECTED_TRACE_ID = int("1" * 32, 16)


@dataclass
class InProcessGateway:
    """What TenantKey needs of a gateway: where clients connect."""

    port: int
    http_port: int | None = None
    tls: None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class TracedCluster:
    exporter: InMemorySpanExporter
    traced: TenantKey
    untraced: TenantKey
    http_url: str
    topic: str

    def spans(self, predicate: Callable[[ReadableSpan], bool]) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if predicate(s)]


def _provider(exporter: InMemorySpanExporter, service: str, instance: str) -> TracerProvider:
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: service, SERVICE_INSTANCE_ID: instance})
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _accepts(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def cluster(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedCluster]:
    root: Path = tmp_path_factory.mktemp("tracing")
    etcd_url = etcd.chroot_url()
    exporter = InMemorySpanExporter()
    broker_port = free_port()
    broker = Broker(
        BrokerConfig(
            node_id=0,
            data_dir=root / "broker-0",
            listen=f"127.0.0.1:{broker_port}",
            etcd=etcd_url,
            offsets_topic_replication_factor=1,
            offsets_topic_num_partitions=1,
            group_initial_rebalance_delay_ms=0,
        ),
        _provider(exporter, BROKER_SERVICE, "0"),
    )
    traced = InProcessGateway(free_port_block(2), free_port_block(1))
    untraced = InProcessGateway(free_port_block(2))

    def gateway(where: InProcessGateway, provider: TracerProvider | None) -> Gateway:
        http = f"127.0.0.1:{where.http_port}" if where.http_port else None
        config = GatewayConfig(
            etcd=etcd_url,
            listen=where.bootstrap,
            http_listen=http,
            upstream=f"127.0.0.1:{broker_port}",
            gateway_id=f"tracing-{where.port}",
            tenancy_poll_interval_ms=300,
        )
        return Gateway(config, provider)

    gateways = [
        gateway(traced, _provider(exporter, GATEWAY_SERVICE, "traced")),
        gateway(untraced, None),
    ]
    loop = asyncio.new_event_loop()
    stops: list[asyncio.Event] = []
    failures: list[BaseException] = []

    async def serve() -> None:
        programs = [broker.run, *(g.run for g in gateways)]
        stops.extend(asyncio.Event() for _ in programs)
        results = await asyncio.gather(
            *(program(stop) for program, stop in zip(programs, stops, strict=True)),
            return_exceptions=True,
        )
        failures.extend(r for r in results if isinstance(r, BaseException))

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: failures or all(_accepts(g.port + 1) for g in (traced, untraced)),
            60,
            "the broker and the gateways to listen",
        )
        assert not failures, failures
        key = make_tenant(etcd_url, traced, "tracing")  # type: ignore[arg-type]
        topic = "traced"
        admin = AdminClient(key.librdkafka())
        admin.create_topics([NewTopic(topic, 1)])[topic].result(DEADLINE_S)
        yield TracedCluster(
            exporter,
            key,
            dataclasses.replace(key, gateway=untraced),  # type: ignore[arg-type]
            f"http://127.0.0.1:{traced.http_port}",
            topic,
        )
    finally:
        for stop in stops:
            loop.call_soon_threadsafe(stop.set)
        thread.join(60)
        loop.close()
    assert not failures, failures


def _produce(key: TenantKey, topic: str, client_id: str, value: bytes) -> None:
    producer = Producer(key.librdkafka(**{"client.id": client_id, "acks": "all"}))
    errors: list[str] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err.str())

    producer.produce(
        topic, value=value, headers=[("traceparent", RECORD_TRACEPARENT)], on_delivery=delivered
    )
    assert producer.flush(DEADLINE_S) == 0
    assert not errors, errors


def _service(span: ReadableSpan) -> Any:
    return span.resource.attributes.get(SERVICE_NAME)


def _only(spans: list[ReadableSpan]) -> ReadableSpan:
    assert len(spans) == 1, [(s.name, s.kind, s.attributes) for s in spans]
    return spans[0]


def _client_id(span: ReadableSpan) -> Any:
    return (span.attributes or {}).get("messaging.client.id")


def test_a_produce_is_one_trace_from_gateway_to_broker(cluster: TracedCluster) -> None:
    _produce(cluster.traced, cluster.topic, "trace-producer", b"linked")

    def produce_spans(service: str, kind: SpanKind) -> list[ReadableSpan]:
        return cluster.spans(
            lambda s: (
                s.name == "Produce"
                and s.kind is kind
                and _service(s) == service
                and _client_id(s) == "trace-producer"
            )
        )

    # A server span ends once its answer is sent: the client may have it first.
    wait_until(
        lambda: (
            produce_spans(BROKER_SERVICE, SpanKind.SERVER)
            and produce_spans(GATEWAY_SERVICE, SpanKind.SERVER)
        ),
        DEADLINE_S,
        "the broker's and the gateway's spans",
    )
    server = _only(produce_spans(GATEWAY_SERVICE, SpanKind.SERVER))
    hop = _only(
        cluster.spans(
            lambda s: (
                s.name == "Produce"
                and s.kind is SpanKind.CLIENT
                and s.parent is not None
                and s.parent.span_id == server.context.span_id
            )
        )
    )
    broker = _only(produce_spans(BROKER_SERVICE, SpanKind.SERVER))

    assert server.parent is None
    assert hop.context.trace_id == server.context.trace_id == broker.context.trace_id
    assert broker.parent is not None and broker.parent.is_remote
    assert broker.parent.span_id == hop.context.span_id
    # The record header's trace context is the producer's, not a parent of anything.
    assert format(server.context.trace_id, "032x") not in RECORD_TRACEPARENT.decode()

    attributes = server.attributes or {}
    assert attributes["shoal.tenant"] == "tracing"
    assert attributes["rpc.system.name"] == "kafka"
    assert attributes["rpc.method"] == "Produce"
    assert attributes["kafka.api_key"] == 0
    assert isinstance(attributes["kafka.api_version"], int)
    assert isinstance(attributes["kafka.correlation_id"], int)
    assert attributes["rpc.response.status_code"] == "NONE"
    assert (broker.attributes or {})["rpc.response.status_code"] == "NONE"


def test_record_headers_and_group_client_ids_come_through_a_tracing_gateway_unchanged(
    cluster: TracedCluster,
) -> None:
    _produce(cluster.traced, cluster.topic, "trace-producer", b"headers")
    group = "trace-group"
    consumer = Consumer(
        cluster.traced.librdkafka(
            **{
                "group.id": group,
                "client.id": "trace-consumer",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
    )
    consumer.subscribe([cluster.topic])
    try:
        got = None
        deadline = time.monotonic() + DEADLINE_S
        while got is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None and msg.value() == b"headers":
                got = msg
        assert got is not None, "the record did not come back"
        assert got.headers() == [("traceparent", RECORD_TRACEPARENT)]

        admin = AdminClient(cluster.traced.librdkafka())
        described = admin.describe_consumer_groups([group])[group].result(DEADLINE_S)
        assert [m.client_id for m in described.members] == ["trace-consumer"]
    finally:
        consumer.close()
    joins = cluster.spans(lambda s: s.name == "JoinGroup" and _service(s) == BROKER_SERVICE)
    assert joins and all(_client_id(s) == "trace-consumer" for s in joins)
    assert all(s.parent is not None for s in joins)


def test_without_gateway_tracing_the_broker_sees_the_clients_id_and_no_parent(
    cluster: TracedCluster,
) -> None:
    from kafka import KafkaProducer

    # A client whose id ends in what the gateway would append: it must not pick
    # the broker's parent, and the broker must see its id as it is.
    forged = "forger\x00" + f"00-{INJECTED_TRACE_ID:032x}-2222222222222222-01"
    for client_id in ("plain-producer", forged):
        producer = KafkaProducer(
            **cluster.untraced.python_client(), client_id=client_id, acks="all"
        )
        try:
            producer.send(cluster.topic, value=b"untraced").get(DEADLINE_S)
        finally:
            producer.close()

        def broker_produces(client_id: str = client_id) -> list[ReadableSpan]:
            return cluster.spans(
                lambda s: (
                    s.name == "Produce"
                    and _service(s) == BROKER_SERVICE
                    and _client_id(s) == client_id
                )
            )

        wait_until(broker_produces, DEADLINE_S, f"the broker's span for {client_id!r}")
        for span in broker_produces():
            assert span.parent is None
            assert span.context.trace_id != INJECTED_TRACE_ID
    assert not cluster.spans(
        lambda s: _service(s) == GATEWAY_SERVICE and _client_id(s) == "plain-producer"
    )


def test_an_http_request_gets_a_gateway_span_and_probes_none(cluster: TracedCluster) -> None:
    with httpx.Client(base_url=cluster.http_url, timeout=DEADLINE_S) as http:
        assert http.get("/openapi.json").status_code == 200
        assert http.get("/healthz").status_code == 200
        assert http.get("/openapi.json").status_code == 200

    def routes() -> list[str]:
        spans = cluster.spans(
            lambda s: (
                s.kind is SpanKind.SERVER
                and _service(s) == GATEWAY_SERVICE
                and (s.attributes or {}).get("http.route") is not None
            )
        )
        return [(s.attributes or {})["http.route"] for s in spans]

    # /healthz came between two /openapi.json: once the second has its span,
    # a span of /healthz would have ended too.
    wait_until(
        lambda: routes().count("/openapi.json") >= 2, DEADLINE_S, "the spans of /openapi.json"
    )
    assert "/healthz" not in routes()


def test_an_http_produce_is_one_trace_from_the_http_request_to_the_broker(
    cluster: TracedCluster,
) -> None:
    auth = (cluster.traced.key_id, cluster.traced.secret)
    with httpx.Client(base_url=cluster.http_url, auth=auth, timeout=DEADLINE_S) as http:
        cluster_id = http.get("/v3/clusters").json()["data"][0]["cluster_id"]
        answer = http.post(
            f"/v3/clusters/{cluster_id}/topics/{cluster.topic}/records",
            json={"value": {"type": "STRING", "data": "traced over HTTP"}},
        )
        assert answer.status_code == 200, answer.text

    def http_requests() -> list[ReadableSpan]:
        return cluster.spans(
            lambda s: (
                s.kind is SpanKind.SERVER
                and _service(s) == GATEWAY_SERVICE
                and (s.attributes or {}).get("http.route", "").endswith("/records")
            )
        )

    # The request's span ends after its answer is sent, and is exported in batches.
    wait_until(http_requests, DEADLINE_S, "the gateway's span of the HTTP request")
    request = _only(http_requests())

    def broker_produce() -> list[ReadableSpan]:
        return cluster.spans(
            lambda s: (
                s.name == "Produce"
                and _service(s) == BROKER_SERVICE
                and s.context.trace_id == request.context.trace_id
            )
        )

    wait_until(broker_produce, DEADLINE_S, "the broker's span of the HTTP produce")
    broker = _only(broker_produce())
    assert broker.parent is not None and broker.parent.is_remote
    assert broker.parent.span_id == request.context.span_id
    # The broker sees the gateway's own client id, with the context stripped off.
    assert _client_id(broker) == "shoal-gateway"
