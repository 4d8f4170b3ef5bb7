"""The gateway's Prometheus metrics, served at ``/metrics`` on ``--metrics-listen``.

Never on the HTTP port: that is the tenants' door, and these series name
every tenant, their groups and topics. :func:`serve_gateway_metrics` answers
scrapes on a listener of its own (:func:`shoal.metrics.serve_metrics`, as the
broker's), off unless configured; the HTTP app only has its requests counted.

Where each number comes from:

* **Per tenant bytes, requests, throttle** are read at scrape time from
  ``services.usage`` (:class:`~shoal.gateway.usage.UsageLedger`), which both
  doors feed; nothing here counts them a second time, so ``/metrics`` and the
  HTTP usage route cannot disagree.
* **Kafka requests, errors and latency** are counted by the session
  (:meth:`GatewayMetrics.answered` for what the gateway answers itself,
  :meth:`GatewayMetrics.observing` around the finishing step of what it
  forwards): every non-zero error code in the response the client gets, top
  level and per topic/partition/resource, by API and Kafka's error name.
  Latency runs from the request's arrival to its response being ready.
* **HTTP requests and latency** by route template (never the raw path, whose
  names are unbounded), method and status class, by an ASGI middleware.
* **Open connections** per tenant (authenticated Kafka connections) are read
  at scrape time from the sessions the gateway tracks for key revocation.
* **Consumer group lag** comes from :mod:`shoal.gateway.group_lag`.

Labels: ``tenant`` and ``topic`` are the only unbounded ones the issue
allows. ``api`` (Kafka's API names), ``error`` (Kafka's error names),
``method``, ``status`` (a class: 2xx...) and ``route`` (templates of the
app's own routes, or ``unmatched``) are bounded by the code. Latency
histograms are by API only, not by tenant: a histogram is 17 series per label
set, and per tenant that would be the largest cost of a scrape for a
question (which tenant is slow) that the request counters answer well enough.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from shoal.gateway.group_lag import GroupLagReport

from shoal.metrics import (
    LabeledCounter,
    LabeledHistogram,
    api_name,
    error_codes,
    error_name,
    serve_metrics,
)
from shoal.wire import ApiSchema

if TYPE_CHECKING:
    from shoal.gateway.server import GatewayServices

KAFKA: Final = "kafka"
HTTP: Final = "http"
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_UNMATCHED: Final = "unmatched"

Finish = Callable[[Any], Any]
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


class GatewayMetrics:
    """What the gateway counts as requests pass; read by :class:`GatewayCollector`."""

    def __init__(self) -> None:
        self.kafka_requests = LabeledCounter(
            "shoal_gateway_kafka_requests",
            "Kafka requests from a tenant, by API.",
            ("tenant", "api"),
        )
        self.kafka_errors = LabeledCounter(
            "shoal_gateway_kafka_request_errors",
            "Error codes in Kafka responses to a tenant (top level and per partition/resource),"
            " by API and Kafka error name.",
            ("tenant", "api", "error"),
        )
        self.kafka_latency = LabeledHistogram(
            "shoal_gateway_kafka_request_duration_seconds",
            "Time from a Kafka request's arrival to its response being ready, by API.",
            ("api",),
        )
        self.http_requests = LabeledCounter(
            "shoal_gateway_http_requests",
            "HTTP requests, by route template, method and status class.",
            ("route", "method", "status"),
        )
        self.http_latency = LabeledHistogram(
            "shoal_gateway_http_request_duration_seconds",
            "Time to answer an HTTP request, by route template and method.",
            ("route", "method"),
        )
        self.auth_failures = LabeledCounter(
            "shoal_gateway_authentication_failures",
            "Refused logins: bad SASL credentials or client certificates (kafka),"
            " 401 answers (http).",
            ("door",),
        )
        self.limit_refusals = LabeledCounter(
            "shoal_gateway_limit_refusals",
            "Requests or connections of a tenant refused for a limit, by limit.",
            ("tenant", "limit"),
        )
        self._api_names: dict[type[Any], str] = {}
        self.group_lag = GroupLagReport()

    def _api(self, api: ApiSchema) -> str:
        name = self._api_names.get(api.response_class)
        if name is None:
            name = self._api_names[api.response_class] = api_name(api.response_class)
        return name

    def _responded(self, tenant: str, api: str, started: float, response: Any) -> None:
        self.kafka_latency.observe((api,), time.monotonic() - started)
        for code in error_codes(response):
            self.kafka_errors.inc((tenant, api, error_name(code)))

    def answered(self, tenant: str, api: ApiSchema, started: float, response: Any) -> None:
        """A request the gateway answered itself (a refusal, a gateway-only API)."""
        name = self._api(api)
        self.kafka_requests.inc((tenant, name))
        self._responded(tenant, name, started, response)

    def observing(self, tenant: str, api: ApiSchema, started: float, finish: Finish) -> Finish:
        """A request forwarded to a broker: counted now, its answer when ``finish`` runs."""
        name = self._api(api)
        self.kafka_requests.inc((tenant, name))

        def finished(response: Any) -> Any:
            response = finish(response)
            self._responded(tenant, name, started, response)
            return response

        return finished

    def authentication_failed(self, door: str) -> None:
        self.auth_failures.inc((door,))

    def limit_refused(self, tenant: str, limit: str) -> None:
        self.limit_refusals.inc((tenant, limit))

    def http_answered(self, route: str, method: str, status: int, seconds: float) -> None:
        method = method if method in _METHODS else "other"
        self.http_requests.inc((route, method, f"{status // 100}xx"))
        self.http_latency.observe((route, method), seconds)
        if status == 401:
            self.authentication_failed(HTTP)


class GatewayCollector(Collector):
    """Turns the gateway's state into metric families at scrape time."""

    def __init__(self, services: GatewayServices) -> None:
        self.services = services

    def collect(self) -> Iterable[Any]:
        services = self.services
        metrics = services.metrics
        yield from _usage_families(services)
        yield _connections(services)
        yield metrics.kafka_requests.family()
        yield metrics.kafka_errors.family()
        yield metrics.kafka_latency.family()
        yield metrics.http_requests.family()
        yield metrics.http_latency.family()
        yield metrics.auth_failures.family()
        yield metrics.limit_refusals.family()
        yield from metrics.group_lag.families()


def _usage_families(services: GatewayServices) -> Iterable[Any]:
    usage = services.usage.all()

    def counter(name: str, documentation: str, values: Iterable[tuple[str, float]]) -> Any:
        family = CounterMetricFamily(name, documentation, labels=("tenant",))
        for tenant, value in values:
            family.add_metric((tenant,), value)
        return family

    yield counter(
        "shoal_gateway_tenant_received_bytes",
        "Bytes of produce requests received from a tenant (both doors).",
        ((t, u.bytes_in) for t, u in usage.items()),
    )
    yield counter(
        "shoal_gateway_tenant_sent_bytes",
        "Bytes of fetch responses sent to a tenant (both doors).",
        ((t, u.bytes_out) for t, u in usage.items()),
    )
    yield counter(
        "shoal_gateway_tenant_produce_requests",
        "Produce requests of a tenant (both doors).",
        ((t, u.produce_requests) for t, u in usage.items()),
    )
    yield counter(
        "shoal_gateway_tenant_fetch_requests",
        "Fetch requests of a tenant (both doors).",
        ((t, u.fetch_requests) for t, u in usage.items()),
    )
    yield counter(
        "shoal_gateway_tenant_throttle_seconds",
        "Throttle time a tenant earned by exceeding its byte-rate quotas.",
        ((t, u.throttle_ms / 1000) for t, u in usage.items()),
    )
    yield counter(
        "shoal_gateway_tenant_request_time_seconds",
        "Gateway time spent handling a tenant's requests (both doors), as its request quota"
        " (request_percentage) charges it.",
        ((t, u.request_seconds) for t, u in usage.items()),
    )
    yield counter(
        "shoal_gateway_tenant_request_throttle_seconds",
        "Throttle time a tenant earned by exceeding its request quota (request_percentage).",
        ((t, u.request_throttle_ms / 1000) for t, u in usage.items()),
    )


def _connections(services: GatewayServices) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "shoal_gateway_connections",
        "Open authenticated Kafka connections of a tenant.",
        labels=("tenant",),
    )
    counts: dict[str, int] = {}
    for key_id, sessions in services.sessions_by_key.items():
        access = services.tenancy.access(key_id)
        if access is not None and sessions:
            counts[access.tenant] = counts.get(access.tenant, 0) + len(sessions)
    for tenant, count in counts.items():
        family.add_metric((tenant,), count)
    return family


def gateway_registry(services: GatewayServices) -> CollectorRegistry:
    """A registry of this gateway's metrics and its process's (CPU, memory, files)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(services))
    ProcessCollector(registry=registry)
    return registry


class HttpMetricsMiddleware:
    """Counts HTTP requests by route template; a plain ASGI middleware (no buffering)."""

    def __init__(self, app: Asgi, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            # The router records the matched route in the scope it was given.
            route = getattr(scope.get("route"), "path", None) or _UNMATCHED
            self.metrics.http_answered(route, scope["method"], status, time.monotonic() - started)


def install_metrics(app: FastAPI, services: GatewayServices) -> None:
    """Count the app's requests. The app serves no ``/metrics``: it faces tenants."""
    app.add_middleware(HttpMetricsMiddleware, metrics=services.metrics)


async def serve_gateway_metrics(services: GatewayServices, host: str, port: int) -> asyncio.Server:
    """Answer ``GET /metrics`` on HOST:PORT (unauthenticated, as scrapers expect).

    The collectors run on the event loop, never in a thread beside the
    sessions that change what they read.
    """
    return await serve_metrics(gateway_registry(services), host, port)
