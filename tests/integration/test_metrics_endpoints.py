"""Prometheus metrics after a known workload: what an operator's dashboard would show.

One broker (with ``--metrics-listen``) behind one gateway (with its own
``--metrics-listen``). Two tenants write and read known amounts with
confluent-kafka; the gateway's ``/metrics`` must
show each tenant its own bytes (the records plus no more than the protocol's
framing), a refused produce under its Kafka error name, a failed login, and
a consumer group's lag; the broker's ``/metrics`` must show the partitions it
hosts and leads. The tenants' HTTP port serves no ``/metrics``: its series name
every tenant.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import GatewayCluster, start_gateway_cluster
from gateway_env import TenantKey, sasl_login
from harness import free_port, wait_until
from prometheus_client.parser import text_string_to_metric_families
from raw_kafka import RawConnection
from shoal.tenancy.acl import read_only_bindings

PARTITIONS = 3
# Per record: the record's own header (length, attributes, deltas, key and
# header counts: under 32 bytes with no key); per request or response: the
# batch header (61 bytes), topic and partition framing, the Kafka header.
RECORD_OVERHEAD = 32
REQUEST_OVERHEAD = 200


class Cluster:
    def __init__(self, gateway_cluster: GatewayCluster, broker_metrics: str) -> None:
        self.gateway_cluster = gateway_cluster
        self.broker_metrics = broker_metrics

    @property
    def gateway_metrics(self) -> str:
        return self.gateway_cluster.gateway.metrics_url


@pytest.fixture(scope="module")
def cluster(etcd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("metrics-cluster")
    metrics_port = free_port()
    gateway_cluster, brokers = start_gateway_cluster(
        etcd,
        root,
        brokers=1,
        gateway_env={"SHOAL_GROUP_LAG_INTERVAL_S": "0.5"},
        broker_env={"SHOAL_METRICS_LISTEN": f"127.0.0.1:{metrics_port}"},
    )
    try:
        yield Cluster(gateway_cluster, f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        if gateway_cluster.gateway.running:
            gateway_cluster.gateway.stop()
        for broker in brokers:
            broker.kill()
        shutil.rmtree(root, ignore_errors=True)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    answer = httpx.get(url, timeout=10)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def create_topic(key: TenantKey, topic: str) -> None:
    admin = AdminClient(key.librdkafka())
    for future in admin.create_topics([NewTopic(topic, PARTITIONS)]).values():
        future.result(30)


def produce(key: TenantKey, topic: str, count: int, size: int) -> None:
    """Write ``count`` records round-robin over the partitions.

    Explicit partitions, because lag counts only partitions the group has
    committed (as ``kafka-consumer-groups`` does), and librdkafka's sticky
    partitioner may put a whole quick burst in one partition: ten later
    records landing in a partition the group never read would then show no lag.
    """
    producer = Producer(key.librdkafka(acks="all", **{"linger.ms": 20}))
    for i in range(count):
        producer.produce(topic, value=bytes([i % 251]) * size, partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def consume(key: TenantKey, topic: str, count: int, group: str) -> int:
    """Read ``count`` records as ``group`` and commit; the bytes of their values."""
    consumer = Consumer(
        key.librdkafka(
            **{"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
        )
    )
    consumer.subscribe([topic])
    got = 0
    total = 0
    deadline = time.monotonic() + 30
    while got < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got += 1
            total += len(message.value() or b"")
    consumer.commit(asynchronous=False)
    consumer.close()
    assert got == count
    return total


def test_tenant_bytes_errors_and_group_lag_after_a_known_workload(cluster: Cluster) -> None:
    gateway = cluster.gateway_cluster
    workloads = {"metrics-a": (120, 1000), "metrics-b": (40, 3000)}
    keys = {tenant: gateway.tenant(tenant) for tenant in workloads}
    for tenant, (count, size) in workloads.items():
        create_topic(keys[tenant], "events")
        produce(keys[tenant], "events", count, size)
    for tenant, (count, size) in workloads.items():
        assert consume(keys[tenant], "events", count, "readers") == count * size

    samples = scrape(cluster.gateway_metrics)
    for tenant, (count, size) in workloads.items():
        payload = count * size
        slack = count * RECORD_OVERHEAD
        received = value(samples, "shoal_gateway_tenant_received_bytes_total", tenant=tenant)
        sent = value(samples, "shoal_gateway_tenant_sent_bytes_total", tenant=tenant)
        produces = value(samples, "shoal_gateway_tenant_produce_requests_total", tenant=tenant)
        fetches = value(samples, "shoal_gateway_tenant_fetch_requests_total", tenant=tenant)
        assert produces >= 1
        assert fetches >= 1
        assert payload <= received <= payload + slack + produces * REQUEST_OVERHEAD
        assert payload <= sent <= payload + slack + fetches * REQUEST_OVERHEAD
        kafka_produces = value(
            samples, "shoal_gateway_kafka_requests_total", tenant=tenant, api="Produce"
        )
        assert kafka_produces == produces
        assert not any(
            name == "shoal_gateway_kafka_request_errors_total"
            and ("tenant", tenant) in labels
            and ("api", "Produce") in labels
            for name, labels in samples
        )
    assert value(samples, "shoal_gateway_kafka_request_duration_seconds_count", api="Produce") >= (
        value(samples, "shoal_gateway_tenant_produce_requests_total", tenant="metrics-a")
        + value(samples, "shoal_gateway_tenant_produce_requests_total", tenant="metrics-b")
    )

    # The group has read everything: no lag. Ten more records: lag ten.
    def lag() -> float | None:
        labels = frozenset({"tenant": "metrics-a", "group": "readers", "topic": "events"}.items())
        return scrape(cluster.gateway_metrics).get(("shoal_consumer_group_lag", labels))

    wait_until(lambda: lag() == 0, 20, "the group's lag to be measured")
    produce(keys["metrics-a"], "events", 10, 100)
    wait_until(lambda: lag() == 10, 20, "the group's lag to show the ten new records")


def test_a_refused_produce_and_a_failed_login_are_counted(cluster: Cluster) -> None:
    gateway = cluster.gateway_cluster
    owner = gateway.tenant("metrics-c")
    create_topic(owner, "locked")
    reader = gateway.tenant("metrics-c", bindings=read_only_bindings("metrics-c", "KEY"))
    producer = Producer(reader.librdkafka(acks="all", **{"message.timeout.ms": 10000}))
    outcome: list[Any] = []
    producer.produce("locked", value=b"no", on_delivery=lambda err, _msg: outcome.append(err))
    assert producer.flush(20) == 0
    assert outcome[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    before = value(
        scrape(cluster.gateway_metrics), "shoal_gateway_authentication_failures_total", door="kafka"
    )
    with RawConnection(owner.bootstrap()) as connection:
        assert sasl_login(connection, owner.key_id, "wrong").error_code != 0

    samples = scrape(cluster.gateway_metrics)
    errors = {
        dict(labels)["error"]: count
        for (name, labels), count in samples.items()
        if name == "shoal_gateway_kafka_request_errors_total"
        and ("tenant", "metrics-c") in labels
        and ("api", "Produce") in labels
    }
    assert errors == {"TOPIC_AUTHORIZATION_FAILED": 1}
    assert value(samples, "shoal_gateway_authentication_failures_total", door="kafka") == before + 1


def test_http_requests_are_counted_by_route_template(cluster: Cluster) -> None:
    url = cluster.gateway_cluster.gateway.http_url
    assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{url}/no/such/thing", timeout=10).status_code == 404
    samples = scrape(cluster.gateway_metrics)
    labels = {"route": "/healthz", "method": "GET", "status": "2xx"}
    assert value(samples, "shoal_gateway_http_requests_total", **labels) >= 1
    unmatched = {"route": "unmatched", "method": "GET", "status": "4xx"}
    assert value(samples, "shoal_gateway_http_requests_total", **unmatched) >= 1
    assert not any("/no/such/thing" in str(labels) for _, labels in samples)


def test_the_tenant_facing_http_port_serves_no_metrics(cluster: Cluster) -> None:
    owner = cluster.gateway_cluster.tenant("metrics-e")
    create_topic(owner, "private")
    produce(owner, "private", 5, 100)
    consume(owner, "private", 5, "secret-readers")
    scraped = httpx.get(cluster.gateway_metrics, timeout=10).text
    assert 'tenant="metrics-e"' in scraped, "the series do name the tenant, on their own port"
    answer = httpx.get(f"{cluster.gateway_cluster.gateway.http_url}/metrics", timeout=10)
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"error_code": 40400, "message": "Not Found"}
    for name in ("metrics-e", "metrics-a", "metrics-b", "metrics-c", "private", "secret-readers"):
        assert name not in answer.text
    assert "shoal_" not in answer.text


def test_the_broker_shows_its_partitions_and_log_sizes(cluster: Cluster) -> None:
    owner = cluster.gateway_cluster.tenant("metrics-d")
    create_topic(owner, "sized")
    produce(owner, "sized", 20, 500)
    samples = scrape(cluster.broker_metrics)
    # One broker: it hosts and leads every partition, the offsets topic's included.
    hosted = value(samples, "shoal_broker_partitions")
    assert hosted >= PARTITIONS
    assert value(samples, "shoal_broker_leader_partitions") == hosted
    assert value(samples, "shoal_broker_under_replicated_partitions") == 0
    assert value(samples, "shoal_broker_active_controller") == 1
    assert value(samples, "shoal_cluster_offline_partitions") == 0
    assert value(samples, "shoal_broker_log_size_bytes", topic="metrics-d.sized") >= 20 * 500
    assert value(samples, "shoal_broker_requests_total", api="Produce") >= 1
    assert value(samples, "shoal_broker_request_duration_seconds_count", api="Produce") >= 1
    assert httpx.get(cluster.broker_metrics.replace("/metrics", "/"), timeout=10).status_code == 404
