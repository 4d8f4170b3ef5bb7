"""A tenant's request quota (requestPercentage, Kafka's KIP-124 ``request_percentage``) through
a real gateway.

A noisy tenant limited to a few percent of the gateway's request-handling time floods it
with cheap Metadata requests from several librdkafka clients at once: its clients see
``throttle_time_ms`` (librdkafka's throttle callback), its connections are muted, and the
gateway time charged to it over the flood stays near its limit, whatever the number of
connections. Meanwhile a neighbour tenant's requests on the same gateway are answered at
once and never throttled. The time charged and the throttles are visible in
``shoal_gateway_tenant_request_time_seconds_total``,
``shoal_gateway_tenant_request_throttle_seconds_total`` and
``shoal_gateway_limit_refusals_total{limit="request_rate"}``.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import statistics
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import GatewayCluster, module_gateway_cluster
from gateway_env import GatewayProcess, TenantKey, limit_refusals
from harness import EtcdServer
from raw_kafka import RawConnection, request_class
from shoal.tenancy.model import Quotas

PERCENTAGE = 5.0
"""5% of a thread: 50 ms of gateway time a second."""
CLIENTS = 4
FLOOD_S = 6.0
SPREAD_FLOOD_S = 12.0
"""Long enough that twice the percentage (a split that failed) is well above the bound."""
TENANCY_POLL_S = 1.0
"""Longer than the gateway's tenancy poll (300 ms in tests): a new tenant is seen by then."""


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    """One broker behind one gateway: the limit is the gateway's alone."""
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "request-quota", brokers=1)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def tenant_counter(key: TenantKey, name: str) -> float:
    """A per-tenant counter of the key's gateway's /metrics (0 before it exists)."""
    with urllib.request.urlopen(key.gateway.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(f'{name}{{tenant="{key.tenant}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def request_time(key: TenantKey) -> float:
    return tenant_counter(key, "shoal_gateway_tenant_request_time_seconds_total")


def metadata_request() -> Any:
    return request_class(3, 12)(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )


def throttle_ms(response: Any) -> float:
    return float(response.throttle_time.total_seconds() * 1000)


def timed_metadata(connection: RawConnection, count: int) -> list[tuple[float, float]]:
    """``count`` Metadata requests one after another: (seconds each took, its throttle ms)."""
    request = metadata_request()
    answers = []
    for _ in range(count):
        started = time.monotonic()
        response = connection.call(request)
        answers.append((time.monotonic() - started, throttle_ms(response)))
    return answers


class MetadataFlood:
    """librdkafka clients looping on Metadata, one thread each: client ``i`` signs in with
    ``keys[i % len(keys)]`` (one tenant's key on one gateway replica or several)."""

    def __init__(self, keys: list[TenantKey], clients: int) -> None:
        self.throttles: list[float] = []
        self.requests = [0] * clients
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._clients = [
            Producer(
                keys[i % len(keys)].librdkafka(
                    throttle_cb=lambda event: self.throttles.append(event.throttle_time)
                )
            )
            for i in range(clients)
        ]
        for client in self._clients:
            client.list_topics(timeout=30)  # signed in before the clock starts
        # Daemons: a test that fails mid-flood must not leave pytest waiting on them.
        self._threads = [
            threading.Thread(target=self._flood, args=(n,), daemon=True) for n in range(clients)
        ]

    def _flood(self, number: int) -> None:
        client = self._clients[number]
        try:
            while not self._stop.is_set():
                client.list_topics(timeout=30)  # one Metadata request each
                self.requests[number] += 1
                client.poll(0)  # serves the throttle callback
        except Exception as exc:  # reported by the test
            self.failures.append(exc)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        for client in self._clients:
            client.poll(0.5)


# The neighbour's latency and the time charged are measured against the machine: by
# themselves, after the rest (on two busy cores a Metadata answer alone takes 30 ms).
@pytest.mark.alone
def test_a_metadata_flood_is_throttled_near_its_limit_and_the_neighbour_stays_fast(
    cluster: GatewayCluster,
) -> None:
    noisy = cluster.tenant(unique("noisy"), quotas=Quotas(request_percentage=PERCENTAGE))
    calm = cluster.tenant(unique("calm"))
    flood = MetadataFlood([noisy], CLIENTS)

    with calm.raw() as neighbour:
        alone = timed_metadata(neighbour, 20)
        charged_before = request_time(noisy)
        started = time.monotonic()
        flood.start()
        time.sleep(1.0)  # the flood has run into its limit
        beside = timed_metadata(neighbour, 40)
        time.sleep(max(0.0, FLOOD_S - (time.monotonic() - started)))
        flood.stop()
        elapsed = time.monotonic() - started
        charged = request_time(noisy) - charged_before

    assert flood.failures == []
    # Its clients were told to back off, with Kafka's throttle_time_ms, and kept no more
    # than its share: 5% of elapsed, plus one window of burst and one of debt (0.05 s
    # each), plus the requests in flight when it went over.
    assert flood.throttles and max(flood.throttles) > 0, "librdkafka saw throttle_time_ms"
    assert charged <= PERCENTAGE / 100 * elapsed + 0.15, (charged, elapsed, sum(flood.requests))
    assert charged >= 0.3 * PERCENTAGE / 100 * elapsed, "the flood did reach its limit"
    assert tenant_counter(noisy, "shoal_gateway_tenant_request_throttle_seconds_total") > 0
    assert limit_refusals(noisy, "request_rate") > 0
    # The neighbour, unlimited on the same gateway, was never throttled or held.
    assert all(throttle == 0 for _, throttle in alone + beside)
    alone_p50 = statistics.median(took for took, _ in alone)
    beside_p50 = statistics.median(took for took, _ in beside)
    assert beside_p50 < max(5 * alone_p50, 0.02), (alone_p50, beside_p50)
    assert limit_refusals(calm, "request_rate") == 0


@pytest.mark.alone
def test_a_flood_over_two_gateway_replicas_is_charged_one_budget(
    cluster: GatewayCluster,
) -> None:
    """The replicas split the percentage between them (gateway/quota_shares.py): over
    both, the flood is charged what one replica alone would allow, not twice that."""
    first = cluster.gateway
    second = GatewayProcess(
        first.etcd_url, first.upstream, cluster.root / "second-gateway", brokers=1
    ).start()
    try:
        spread = cluster.tenant(unique("spread"), quotas=Quotas(request_percentage=PERCENTAGE))
        keys = [spread, dataclasses.replace(spread, gateway=second)]
        time.sleep(TENANCY_POLL_S)
        flood = MetadataFlood(keys, CLIENTS)
        charged_before = sum(request_time(key) for key in keys)
        started = time.monotonic()
        flood.start()
        time.sleep(SPREAD_FLOOD_S)
        flood.stop()
        elapsed = time.monotonic() - started
        charged = sum(request_time(key) for key in keys) - charged_before
        throttled_on_both = [limit_refusals(key, "request_rate") > 0 for key in keys]
    finally:
        second.stop()

    allowed = PERCENTAGE / 100 * elapsed
    print(
        f"\ncharged {charged:.3f} s over two replicas in {elapsed:.1f} s ({allowed:.2f} s allowed)"
    )
    assert flood.failures == []
    # 5% of elapsed, plus a window of burst and one of debt per replica (0.05 s each),
    # one round's change in the split, and the requests in flight: 0.3 s of margin. Each
    # replica granting the whole percentage would be charged about twice 5% of elapsed.
    assert charged <= PERCENTAGE / 100 * elapsed + 0.3, (charged, elapsed, sum(flood.requests))
    assert charged >= 0.5 * PERCENTAGE / 100 * elapsed, "the flood did reach its limit"
    assert throttled_on_both == [True, True]


def test_a_muted_connection_is_not_read_until_its_throttle_has_passed(
    cluster: GatewayCluster,
) -> None:
    # 1%: 10 ms a second, 10 ms of burst. Pipelined requests run the tenant into debt;
    # the answer that reports the debt is followed by that long a silence.
    tight = cluster.tenant(unique("tight"), quotas=Quotas(request_percentage=1.0))
    request = metadata_request()
    with tight.raw() as connection:
        owed, told_at = 0.0, 0.0
        for _ in range(20):
            answers = [connection.send(request) for _ in range(20)]
            for _ in answers:
                _, response = connection.receive(type(request))
                if throttle_ms(response) > owed:
                    # The silence starts no later than this answer arrived: timed from
                    # here, a busy machine can only make it look longer.
                    owed, told_at = throttle_ms(response), time.monotonic()
            if owed > 100:
                break
        assert owed > 100, "twenty rounds of twenty Metadata requests took more than 1%"
        connection.call(request)
        assert time.monotonic() - told_at >= owed / 1000 * 0.5, owed


def test_the_http_door_draws_on_the_same_budget(cluster: GatewayCluster) -> None:
    tenant = cluster.tenant(unique("http"), quotas=Quotas(request_percentage=1.0))
    charged_before = request_time(tenant)
    statuses: list[int] = []
    with httpx.Client(
        base_url=cluster.gateway.http_url, auth=(tenant.key_id, tenant.secret), timeout=60
    ) as http:
        cluster_id = http.get("/v3/clusters").json()["data"][0]["cluster_id"]
        started = time.monotonic()
        while time.monotonic() - started < 3.0:  # each a Metadata request to a broker
            statuses.append(http.get(f"/v3/clusters/{cluster_id}/topics").status_code)
    charged = request_time(tenant) - charged_before
    assert charged > 0, "HTTP calls are charged to the tenant's request time"
    # 1% of 3 s, a window of burst and one of debt, and the call in flight.
    assert charged <= 0.01 * 3.0 + 0.05, (charged, len(statuses))
    assert set(statuses) <= {200, 429}, statuses


def test_an_http_record_refused_over_the_byte_rate_says_when_to_come_back(
    cluster: GatewayCluster,
) -> None:
    # 20 KB/s against four clients posting 16 KB records at once: the tenant soon owes
    # more than a window, and the HTTP door answers 429 rather than hold the request.
    tenant = cluster.tenant(unique("posting"), quotas=Quotas(producer_byte_rate=20_000.0))
    admin = AdminClient(tenant.librdkafka())
    admin.create_topics([NewTopic("posts", 1)])["posts"].result(30)
    value = base64.b64encode(os.urandom(12_000)).decode()
    refusals: list[httpx.Response] = []
    stored = 0
    lock = threading.Lock()

    def post(http: httpx.Client, path: str, until: float) -> None:
        nonlocal stored
        while time.monotonic() < until:
            answer = http.post(path, json={"value": {"type": "BINARY", "data": value}})
            with lock:
                if answer.status_code == 429:
                    refusals.append(answer)
                else:
                    assert answer.status_code == 200, answer.text
                    stored += 1

    auth = (tenant.key_id, tenant.secret)
    with httpx.Client(base_url=cluster.gateway.http_url, auth=auth, timeout=60) as http:
        cluster_id = http.get("/v3/clusters").json()["data"][0]["cluster_id"]
        path = f"/v3/clusters/{cluster_id}/topics/posts/records"
        until = time.monotonic() + 3.0
        posters = [threading.Thread(target=post, args=(http, path, until)) for _ in range(4)]
        for poster in posters:
            poster.start()
        for poster in posters:
            poster.join(60)
    assert stored and refusals, (stored, len(refusals))
    for refusal in refusals:
        assert refusal.json()["error_code"] == 42900, refusal.text
        assert int(refusal.headers["Retry-After"]) >= 1, refusal.headers
