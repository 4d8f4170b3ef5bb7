"""Metrics without processes: error codes found in responses, histogram buckets, what
the gateway counts per request, group lag with its cap, the broker's gauges and its
tiny HTTP server (and that the tenants' HTTP app serves no metrics)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import yaml
from produce_responses import PRODUCE, produce_response
from prometheus_client import CollectorRegistry, generate_latest
from shoal.broker.cluster.model import (
    BrokerRegistration,
    ClusterImage,
    ControllerLease,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
)
from shoal.broker.log.cleaner.manager import CleanerMetrics
from shoal.broker.metrics import BrokerCollector, RequestMetrics
from shoal.gateway.group_lag import GroupLag, summarize
from shoal.gateway.http.app import create_app
from shoal.gateway.metrics import GatewayCollector, GatewayMetrics
from shoal.gateway.usage import UsageLedger

from shoal.metrics import (
    LabeledCounter,
    LabeledHistogram,
    error_codes,
    error_name,
    http_answer,
    serve_metrics,
)
from shoal.wire import ErrorCode, schema

E = ErrorCode
FETCH = schema(1, 12)


def fetch_response(top: ErrorCode, partitions: list[ErrorCode]) -> Any:
    return FETCH.response(
        throttle_time=0,
        error_code=top,
        session_id=0,
        responses=(
            FETCH.make(
                "FetchableTopicResponse",
                topic="t",
                partitions=tuple(
                    FETCH.make(
                        "PartitionData",
                        partition_index=i,
                        error_code=code,
                        high_watermark=0,
                        last_stable_offset=0,
                        log_start_offset=0,
                        aborted_transactions=(),
                        preferred_read_replica=-1,
                        records=b"\0" * 100,
                    )
                    for i, code in enumerate(partitions)
                ),
            ),
        ),
    )


def test_every_nonzero_error_code_of_a_response_is_found_at_any_depth() -> None:
    response = produce_response(
        ("a", [E.none, E.topic_authorization_failed, E.none]),
        ("b", [E.not_leader_or_follower]),
    )
    assert list(error_codes(response)) == [E.topic_authorization_failed, E.not_leader_or_follower]
    fetch = fetch_response(E.none, [E.offset_out_of_range, E.none])
    assert list(error_codes(fetch)) == [E.offset_out_of_range]
    assert list(error_codes(fetch_response(E.unknown_server_error, []))) == [E.unknown_server_error]


def test_a_response_without_errors_or_already_encoded_yields_nothing() -> None:
    assert list(error_codes(produce_response(("a", [E.none, E.none])))) == []
    assert list(error_codes(b"\x00\x01")) == []


def test_error_names_are_kafkas() -> None:
    assert error_name(E.topic_authorization_failed) == "TOPIC_AUTHORIZATION_FAILED"


def test_histogram_buckets_are_cumulative_and_bounds_inclusive() -> None:
    histogram = LabeledHistogram("x_seconds", "x", ("api",), buckets=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(("Produce",), value)
    (family,) = [histogram.family()]
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("x_seconds_bucket", "0.1")] == 2
    assert samples[("x_seconds_bucket", "1.0")] == 3
    assert samples[("x_seconds_bucket", "+Inf")] == 4
    assert samples[("x_seconds_count", None)] == 4
    assert samples[("x_seconds_sum", None)] == 3.65


def test_a_forwarded_request_counts_at_once_and_its_errors_when_answered() -> None:
    metrics = GatewayMetrics()
    finish = metrics.observing("acme", PRODUCE, 0.0, lambda response: response)
    assert metrics.kafka_requests.values == {("acme", "Produce"): 1}
    assert metrics.kafka_errors.values == {}
    answer = produce_response(("a", [E.topic_authorization_failed] * 2))
    assert finish(answer) is answer
    assert metrics.kafka_errors.values == {("acme", "Produce", "TOPIC_AUTHORIZATION_FAILED"): 2}
    metrics.answered("acme", FETCH, 0.0, fetch_response(E.none, [E.none]))
    assert metrics.kafka_requests.values[("acme", "Fetch")] == 1
    assert set(metrics.kafka_errors.values) == {("acme", "Produce", "TOPIC_AUTHORIZATION_FAILED")}


def test_http_labels_are_bounded_and_401_is_an_authentication_failure() -> None:
    metrics = GatewayMetrics()
    metrics.http_answered("/v3/topics/{topic}", "BREW", 401, 0.01)
    metrics.http_answered("unmatched", "GET", 404, 0.01)
    assert metrics.http_requests.values == {
        ("/v3/topics/{topic}", "other", "4xx"): 1,
        ("unmatched", "GET", "4xx"): 1,
    }
    assert metrics.auth_failures.values == {("http",): 1}


def test_group_lag_is_summed_per_topic_and_capped_per_tenant() -> None:
    committed = {
        "acme.small": {("acme.orders", 0): 9, ("acme.orders", 1): 10},
        "acme.big": {("acme.orders", 0): 0, ("acme.audit", 0): -1},
        "acme.sneaky": {("other.orders", 0): 0},
        "acme.middle": {("acme.orders", 0): 5},
        "ghost.g": {("ghost.t", 0): 0},
        "__internal": {("acme.orders", 0): 0},
    }
    ends = {("acme.orders", 0): 10, ("acme.orders", 1): 12, ("other.orders", 0): 5}
    snapshot = summarize(committed, ends, ["acme", "other"], max_groups=2)
    assert snapshot.lags == (
        GroupLag("acme", "big", "orders", 10),
        GroupLag("acme", "middle", "orders", 5),
    )
    assert snapshot.unreported == {"acme": 2}
    everything = summarize(committed, ends, ["acme"], max_groups=10)
    assert GroupLag("acme", "small", "orders", 3) in everything.lags
    assert not any(lag.group == "sneaky" and lag.lag for lag in everything.lags)


def exposed_samples(collector: Any) -> dict[str, str]:
    """Sample names a collector exposes, with their family's type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    names = {}
    for family in registry.collect():
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",),
        }[family.type]
        for suffix in suffixes:
            names[family.name + suffix] = family.type
    generate_latest(registry)  # and it renders
    return names


def gateway_collector() -> GatewayCollector:
    usage = UsageLedger()
    usage.produced("acme", 100, 5)
    services = SimpleNamespace(
        usage=usage,
        metrics=GatewayMetrics(),
        sessions_by_key={"k1": {object(), object()}},
        tenancy=SimpleNamespace(access=lambda key: SimpleNamespace(tenant="acme")),
    )
    return GatewayCollector(services)  # type: ignore[arg-type]


def broker_collector(node: int, leader: int) -> BrokerCollector:
    record = TopicRecord(TopicName("acme.t"), uuid.uuid4(), ((NodeId(0), NodeId(1)),))
    image = ClusterImage.build(
        "cluster",
        1,
        {NodeId(0): BrokerRegistration(NodeId(0), "127.0.0.1", 1, None)},
        {
            TopicName("acme.t"): TopicImage(
                record, {0: PartitionState(NodeId(leader), 1, (NodeId(0),))}, 1
            )
        },
        ControllerLease(NodeId(0), 1),
    )
    partition = SimpleNamespace(
        topic="acme.t",
        is_leader=leader == node,
        state=image.topics[TopicName("acme.t")].partitions[0],
        replicas=(NodeId(0), NodeId(1)),
        log=SimpleNamespace(size=1234, high_watermark=10, last_stable_offset=7),
    )
    replicas = SimpleNamespace(
        partitions={("acme.t", 0): partition},
        isr_changes=SimpleNamespace(applied={"isr_shrink": 2}),
        logs=SimpleNamespace(
            data_dir="/data",
            cleaner=SimpleNamespace(metrics=CleanerMetrics(0.75, last_clean_monotonic=0.0)),
        ),
    )
    return BrokerCollector(
        NodeId(node),
        replicas,  # type: ignore[arg-type]
        SimpleNamespace(image=image),  # type: ignore[arg-type]
        RequestMetrics(),
        lambda: 3,
        SimpleNamespace(  # type: ignore[arg-type]
            txns={},
            clock=lambda: 0,
            decided=LabeledCounter("shoal_txn_decided", "", ("result", "reason")),
            durations=LabeledHistogram("shoal_txn_duration_seconds", "", ("result",)),
        ),
    )


def test_the_broker_reports_under_replicated_offline_and_log_sizes() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(broker_collector(node=0, leader=0))
    value = registry.get_sample_value
    assert value("shoal_broker_partitions") == 1
    assert value("shoal_broker_leader_partitions") == 1
    assert value("shoal_broker_under_replicated_partitions") == 1
    assert value("shoal_broker_log_size_bytes", {"topic": "acme.t"}) == 1234
    assert value("shoal_broker_last_stable_offset_lag", {"topic": "acme.t"}) == 3
    assert value("shoal_broker_isr_shrinks_total") == 2
    assert value("shoal_broker_active_controller") == 1
    assert value("shoal_cluster_offline_partitions") == 0
    assert value("shoal_log_cleaner_max_dirty_ratio", {"log_dir": "/data"}) == 0.75
    assert value("shoal_log_cleaner_errors_total") == 0
    assert value("shoal_log_cleaner_bytes_recopied_total") == 0
    assert value("shoal_log_cleaner_seconds_since_last_clean") > 0
    offline = CollectorRegistry(auto_describe=False)
    offline.register(broker_collector(node=0, leader=1))  # broker 1 is not registered
    assert offline.get_sample_value("shoal_cluster_offline_partitions") == 1
    assert offline.get_sample_value("shoal_broker_leader_partitions") == 0


def test_only_the_active_controller_reports_offline_partitions() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(broker_collector(node=1, leader=1))
    assert registry.get_sample_value("shoal_broker_active_controller") == 0
    assert registry.get_sample_value("shoal_cluster_offline_partitions") is None


def test_gateway_usage_and_connections_come_from_the_ledger_and_sessions() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(gateway_collector())
    value = registry.get_sample_value
    assert value("shoal_gateway_tenant_received_bytes_total", {"tenant": "acme"}) == 100
    assert value("shoal_gateway_tenant_throttle_seconds_total", {"tenant": "acme"}) == 0.005
    assert value("shoal_gateway_connections", {"tenant": "acme"}) == 2


def test_the_metrics_server_answers_only_get_metrics() -> None:
    registry = CollectorRegistry(auto_describe=False)
    assert http_answer(b"GET /metrics HTTP/1.1", registry).startswith(b"HTTP/1.1 200 OK\r\n")
    assert http_answer(b"GET /metrics?x=1 HTTP/1.1", registry).startswith(b"HTTP/1.1 200")
    assert http_answer(b"GET / HTTP/1.1", registry).startswith(b"HTTP/1.1 404")
    assert http_answer(b"POST /metrics HTTP/1.1", registry).startswith(b"HTTP/1.1 405")
    assert http_answer(b"garbage", registry).startswith(b"HTTP/1.1 405")


async def test_the_metrics_server_serves_a_registry_on_its_own_port() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(gateway_collector())
    server = await serve_metrics(registry, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await reader.read()
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b'shoal_gateway_connections{tenant="acme"} 2.0' in answer


async def test_the_tenant_facing_http_app_serves_no_metrics() -> None:
    services = SimpleNamespace(metrics=GatewayMetrics(), tracing=None, cluster=None, storage=None)
    app = create_app(services)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        answer = await client.get("/metrics")
    assert answer.status_code == 404
    assert answer.json() == {"error_code": 40400, "message": "Not Found"}
    # The middleware still counts the app's requests, for the metrics port.
    assert services.metrics.http_requests.values == {("unmatched", "GET", "4xx"): 1}


MONITORING = Path(__file__).resolve().parents[2] / "k8s" / "monitoring"


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    expressions = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    variables = dashboard["templating"]["list"]
    expressions += [v["definition"] for v in variables if v["type"] == "query"]
    return expressions


def test_the_dashboard_uses_only_metrics_the_code_exposes() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    exposed = exposed_samples(gateway_collector()) | exposed_samples(broker_collector(0, 0))
    used = {
        name
        for expr in dashboard_expressions()
        for name in re.findall(r"\b(shoal_[a-z0-9_]+)", expr)
    }
    assert used, "the dashboard queries shoal metrics"
    assert used - set(exposed) == set()
    # The main panels of the issue are all there.
    for wanted in (
        "shoal_gateway_tenant_received_bytes_total",
        "shoal_gateway_tenant_sent_bytes_total",
        "shoal_gateway_kafka_request_errors_total",
        "shoal_gateway_kafka_request_duration_seconds_bucket",
        "shoal_gateway_tenant_throttle_seconds_total",
        "shoal_broker_under_replicated_partitions",
        "shoal_cluster_offline_partitions",
        "shoal_broker_log_size_bytes",
        "shoal_broker_isr_shrinks_total",
        "shoal_consumer_group_lag",
    ):
        assert wanted in used


def test_the_service_monitors_select_the_gateway_and_broker_services() -> None:
    documents = list(yaml.safe_load_all((MONITORING / "servicemonitor.yaml").read_text()))
    ports = {}
    for document in documents:
        assert document["apiVersion"] == "monitoring.coreos.com/v1"
        assert document["kind"] == "ServiceMonitor"
        labels = document["spec"]["selector"]["matchLabels"]
        assert labels["app.kubernetes.io/name"] == "shoal"
        (endpoint,) = document["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        ports[labels["app.kubernetes.io/component"]] = endpoint["port"]
    # The gateway's too: its own port, never the tenant-facing `http` one.
    assert ports == {"gateway": "metrics", "broker": "metrics"}
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["servicemonitor.yaml"]
    (generator,) = kustomization["configMapGenerator"]
    assert generator["files"] == ["grafana-dashboard.json"]
