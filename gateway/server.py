"""The gateway process: listeners, the views it serves from, and its lifecycle.

Startup: connect to etcd (tenancy records, membership), ask the brokers what
they are (addresses, API versions), then open each listener's bootstrap port
and one port per broker. Brokers that join later get their ports at the next
metadata refresh. The versions offered to clients are, per API, the
intersection of what the gateway can rewrite and what the brokers serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry.sdk.trace import TracerProvider
from shoal.gateway.admission import Admission
from shoal.gateway.apis import DECODED_VERSIONS, GATEWAY_ONLY, REWRITERS
from shoal.gateway.cluster_view import ClusterView
from shoal.gateway.config import GatewayConfig
from shoal.gateway.group_lag import poll_group_lag
from shoal.gateway.http.app import create_app
from shoal.gateway.http.auth import TokenAuthority
from shoal.gateway.http.serving import EmbeddedServer, embedded_server
from shoal.gateway.login_turns import ACCEPTS_PER_ROUND, LoginTurns, listen_deeply
from shoal.gateway.membership import GatewayMembership
from shoal.gateway.metrics import GatewayMetrics, serve_gateway_metrics
from shoal.gateway.oauth.authority import gateway_tokens
from shoal.gateway.oauth.keystore import SigningKeyStore
from shoal.gateway.quota_shares import QuotaShares, TrafficLedger
from shoal.gateway.quotas import QuotaConfig, QuotaManager
from shoal.gateway.session import ClientSession
from shoal.gateway.storage import StorageSurveyor
from shoal.gateway.storage_limit import StorageLimits
from shoal.gateway.tenancy_view import StoreAcls, StoreQuotas, TenancyView
from shoal.gateway.tracing import GatewayTracing
from shoal.gateway.upstream import UpstreamError
from shoal.gateway.usage import UsageLedger
from shoal.tenancy.store import TenancySnapshot, TenancyStore, TenancyStoreError

from shoal.descriptor_table import reserve_descriptor_table
from shoal.host_port import split_host_port
from shoal.startup_heap import freeze_startup_heap
from shoal.wire import ErrorCode, load_schemas

log = logging.getLogger(__name__)

_STARTUP_RETRY_S: Final = 1.0
_STARTUP_TIMEOUT_S: Final = 120.0
_HTTP_TASK: Final = "gateway-http"
_METRICS_CLOSE_S: Final = 5.0
_GONE_AFTER_ANSWERS: Final = 2


def offered_versions(
    broker_versions: Mapping[int, tuple[int, int]],
) -> dict[int, tuple[int, int]]:
    """Per API, what both the gateway can rewrite and the brokers serve."""
    offered = dict(GATEWAY_ONLY)
    for key, ((ours_low, ours_high), _) in REWRITERS.items():
        if key in GATEWAY_ONLY:
            continue
        theirs = broker_versions.get(key)
        if theirs is None:
            continue
        low, high = max(ours_low, theirs[0]), min(ours_high, theirs[1])
        if low <= high:
            offered[key] = (low, high)
    return offered


class ListenerLookups:
    """The rewriters' lookups, for clients that came in through one listener."""

    def __init__(self, cluster: ClusterView, listener: Listener) -> None:
        self._cluster = cluster
        self._listener = listener

    async def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return await self._cluster.topic_name(topic_id)

    async def topic_partitions(self) -> Mapping[str, int]:
        return await self._cluster.topic_partitions()

    async def created_partitions(self, request: Any, version: int) -> Mapping[str, int]:
        sizes: dict[str, int] = {}
        unknown = []
        for topic in request.topics:
            if topic.num_partitions > 0:
                sizes[topic.name] = topic.num_partitions
            elif topic.assignments:
                sizes[topic.name] = len(topic.assignments)
            else:
                unknown.append(topic.name)
        if unknown:
            sizes.update(await self._cluster.default_partitions(unknown))
        return sizes

    def remember_topic_ids(self, ids: Mapping[uuid.UUID, str]) -> None:
        self._cluster.remember_topic_ids(ids)

    def gateway_address(self, node_id: int) -> tuple[str, int] | None:
        if node_id < 0:
            return None
        # A broker that joined since the last refresh gets its port within moments.
        self._cluster.notice_broker(node_id)
        return self._listener.advertised_host, self._listener.broker_port(node_id)


@dataclass
class Listener:
    """A bootstrap port and the ports after it, one per broker."""

    name: str
    host: str
    port: int
    advertised_host: str
    tls: ssl.SSLContext | None
    client_certificates: bool = False
    """Mutual TLS: clients sign in with a certificate, not SASL. The session makes the
    handshake itself (:class:`ClientSession`), so that a refused certificate is
    counted and logged as a refused login."""
    lookups: ListenerLookups = field(init=False)
    servers: dict[int | None, asyncio.Server] = field(default_factory=dict)

    def broker_port(self, node_id: int) -> int:
        return self.port + 1 + node_id


@dataclass
class GatewayServices:
    """What every session shares."""

    config: GatewayConfig
    tenancy: TenancyView
    cluster: ClusterView
    admission: Admission
    """Every tenant's byte budgets, and the waits in front of its produce and fetch requests."""
    shares: QuotaShares
    """This replica's part of each tenant's quotas."""
    membership: GatewayMembership
    quota_store: StoreQuotas
    acl_store: StoreAcls
    versions: dict[int, tuple[int, int]] = field(default_factory=dict)
    api_versions_answers: (
        tuple[dict[int, tuple[int, int]], dict[tuple[int, ErrorCode], bytes]] | None
    ) = None
    """Encoded ApiVersions bodies by (version, error), and the ``versions`` they list."""
    usage: UsageLedger = field(default_factory=UsageLedger)
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    tokens: TokenAuthority | None = None
    """Checks Bearer tokens (HTTP) and OAUTHBEARER logins (Kafka); None accepts none."""
    sessions_by_key: dict[str, set[ClientSession]] = field(default_factory=dict)
    login_turns: LoginTurns = field(default_factory=LoginTurns)
    """Keeps a storm of logins from crowding out the sessions already in."""
    tracing: GatewayTracing | None = None
    """Spans per request (shoal.tracing); None when tracing is not configured."""
    storage: StorageSurveyor = field(init=False)
    """The one survey of the brokers' storage: the usage route and the storage limits
    share it, so the brokers see one round of DescribeLogDirs per period."""
    storage_limits: StorageLimits = field(init=False)
    """Limited tenants' stored bytes, kept fresh by a background task."""

    def __post_init__(self) -> None:
        self.storage = StorageSurveyor(self.cluster)
        self.storage_limits = StorageLimits(self.storage, lambda: self.tenancy.snapshot.tenants)


def _advertised(host: str, configured: str | None) -> str:
    if configured:
        return configured
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - comparing, not binding
        return socket.getfqdn()
    return host


def _tls_context(config: GatewayConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    assert config.tls_cert is not None
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


def _mtls_context(config: GatewayConfig) -> ssl.SSLContext:
    # Not create_default_context: for client authentication it would trust the
    # system's CAs too, and any certificate they ever signed would be a candidate.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    assert config.tls_cert is not None and config.tls_client_ca is not None
    context.load_cert_chain(config.tls_cert, config.tls_key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=config.tls_client_ca)
    return context


class Gateway:
    def __init__(self, config: GatewayConfig, tracing: TracerProvider | None = None) -> None:
        self.config = config
        self.tracing = None if tracing is None else GatewayTracing(tracing)
        self.listeners: list[Listener] = []
        if config.listen:
            host, port = split_host_port(config.listen)
            self.listeners.append(
                Listener(
                    "SASL_PLAINTEXT", host, port, _advertised(host, config.advertise_host), None
                )
            )
        if config.tls_listen:
            host, port = split_host_port(config.tls_listen)
            self.listeners.append(
                Listener(
                    "SASL_SSL",
                    host,
                    port,
                    _advertised(host, config.advertise_host),
                    _tls_context(config),
                )
            )
        if config.mtls_listen:
            host, port = split_host_port(config.mtls_listen)
            self.listeners.append(
                Listener(
                    "SSL",
                    host,
                    port,
                    _advertised(host, config.advertise_host),
                    _mtls_context(config),
                    client_certificates=True,
                )
            )
        self._sessions: set[asyncio.Task[None]] = set()
        self._sessions_by_broker: dict[int, set[ClientSession]] = {}
        self._missing_brokers: dict[int, int] = {}
        """How many answers in a row have not counted each broker that has clients."""

    async def run(self, stop: asyncio.Event) -> None:
        config = self.config
        load_schemas(DECODED_VERSIONS)  # before anything serves: see load_schemas
        reserve_descriptor_table()  # nor grow it while accepting: see the module
        freeze_startup_heap()  # nor walk the schemas in every full collection: the same
        async with TenancyStore(config.etcd) as store, SigningKeyStore(config.etcd) as key_store:
            tenancy = TenancyView(store, config.tenancy_poll_interval_ms / 1000)
            traffic, shares = TrafficLedger(), QuotaShares(config.gateway_id)
            membership = GatewayMembership(
                config.etcd, config.gateway_id, config.membership_ttl_s, traffic, shares
            )
            cluster = ClusterView(config.upstream_addresses())
            services = GatewayServices(
                config=config,
                tenancy=tenancy,
                cluster=cluster,
                admission=Admission(
                    QuotaManager(QuotaConfig(window_s=config.quota_window_size_s)),
                    traffic,
                    shares=shares,
                ),
                shares=shares,
                membership=membership,
                quota_store=StoreQuotas(tenancy),
                acl_store=StoreAcls(tenancy),
                tracing=self.tracing,
            )
            tokens = gateway_tokens(config, tenancy, key_store, time.time)
            services.tokens = tokens
            tenancy.on_change.append(lambda snapshot: self._close_revoked(services, snapshot))
            background: list[asyncio.Task[None]] = []
            http: EmbeddedServer | None = None
            metrics: asyncio.Server | None = None
            try:
                await self._start(services, stop)
                if stop.is_set():
                    return
                await tokens.start()
                background = [
                    asyncio.create_task(tokens.keeper.run()),
                    asyncio.create_task(tenancy.poll()),
                    asyncio.create_task(membership.keep_alive()),
                    asyncio.create_task(self._refresh_brokers(services)),
                    asyncio.create_task(poll_group_lag(services)),
                    asyncio.create_task(services.storage_limits.run()),
                ]
                ports = ", ".join(
                    f"{listener.name} {listener.host}:{listener.port}"
                    for listener in self.listeners
                )
                if config.http_listen:
                    http = await self._start_http(services, config.http_listen, background)
                    ports += f", HTTP {config.http_listen}"
                if config.metrics_listen:
                    host, port = split_host_port(config.metrics_listen)
                    metrics = await serve_gateway_metrics(services, host, port)
                    ports += f", metrics {config.metrics_listen}"
                log.info("event=gateway_ready listeners=%s", ports.replace(" ", "_"))
                await stop.wait()
            finally:
                if http is not None:
                    http.should_exit = True
                if metrics is not None:
                    metrics.close()
                for task in background:
                    if task.get_name() != _HTTP_TASK:
                        task.cancel()
                for listener in self.listeners:
                    for server in listener.servers.values():
                        server.close()
                for session in self._sessions:
                    session.cancel()
                await asyncio.gather(*self._sessions, *background, return_exceptions=True)
                if metrics is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(metrics.wait_closed(), _METRICS_CLOSE_S)
                cluster.close()
                await membership.close()

    async def _start_http(
        self, services: GatewayServices, address: str, background: list[asyncio.Task[None]]
    ) -> EmbeddedServer:
        host, port = split_host_port(address)
        # HTTP callers act through the rewriters like clients of the first listener.
        server = embedded_server(create_app(services, self.listeners[0].lookups), host, port)
        task = asyncio.create_task(server.serve(), name=_HTTP_TASK)
        background.append(task)
        while not server.started:
            if task.done():
                # uvicorn reports a port it cannot bind by exiting.
                raise OSError(f"the HTTP API could not listen on {address}")
            await asyncio.sleep(0.01)
        log.info("event=gateway_listening listener=HTTP port=%d", port)
        return server

    async def _start(self, services: GatewayServices, stop: asyncio.Event) -> None:
        """Wait for etcd and the brokers, then open the ports."""
        async with asyncio.timeout(_STARTUP_TIMEOUT_S):
            while not stop.is_set():
                try:
                    await services.tenancy.load()
                    await services.membership.register()
                    await services.cluster.refresh()
                    services.versions = offered_versions(await services.cluster.api_versions())
                    break
                except (UpstreamError, TenancyStoreError, OSError) as exc:
                    log.info("event=gateway_waiting reason=%s", str(exc).replace(" ", "_"))
                    await asyncio.sleep(_STARTUP_RETRY_S)
        for listener in self.listeners:
            listener.lookups = ListenerLookups(services.cluster, listener)
            await self._bind(services, listener, None)
        await self._bind_brokers(services)

    async def _bind_brokers(self, services: GatewayServices) -> None:
        for listener in self.listeners:
            for node_id in services.cluster.brokers:
                if node_id not in listener.servers:
                    await self._bind(services, listener, node_id)

    async def _bind(
        self, services: GatewayServices, listener: Listener, node_id: int | None
    ) -> None:
        port = listener.port if node_id is None else listener.broker_port(node_id)

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            session = ClientSession(services, listener, node_id, reader, writer)
            task = asyncio.current_task()
            assert task is not None
            self._sessions.add(task)
            of_broker = (
                None if node_id is None else self._sessions_by_broker.setdefault(node_id, set())
            )
            if of_broker is not None:
                of_broker.add(session)
            try:
                await session.run()
            finally:
                self._sessions.discard(task)
                if of_broker is not None:
                    of_broker.discard(session)

        handshake_here = listener.tls is not None and not listener.client_certificates
        listener.servers[node_id] = server = await asyncio.start_server(
            accept,
            listener.host,
            port,
            ssl=listener.tls if handshake_here else None,
            # A client that never starts TLS is as unauthenticated as one that never logs in.
            ssl_handshake_timeout=(
                self.config.authentication_timeout_ms / 1000 if handshake_here else None
            ),
            limit=2**20,
            reuse_address=True,
            backlog=ACCEPTS_PER_ROUND,
        )
        listen_deeply(server)
        log.info(
            "event=gateway_listening listener=%s port=%d broker=%s",
            listener.name,
            port,
            "bootstrap" if node_id is None else node_id,
        )

    async def _refresh_brokers(self, services: GatewayServices) -> None:
        """Every broker check interval (a quarter second), which brokers are live; every
        metadata refresh interval (or when an answer names a broker without a port), the
        whole cluster."""
        cluster = services.cluster
        full_every_s = self.config.metadata_refresh_interval_ms / 1000
        last_full = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    cluster.brokers_changed.wait(), self.config.broker_check_interval_ms / 1000
                )
            try:
                if cluster.brokers_changed.is_set() or time.monotonic() - last_full >= full_every_s:
                    cluster.brokers_changed.clear()
                    last_full = time.monotonic()
                    await cluster.refresh()
                else:
                    await cluster.refresh_brokers()
            except (UpstreamError, OSError) as exc:
                log.warning("event=gateway_refresh_failed error=%s", exc)
                continue
            self._close_sessions_of_gone_brokers(cluster.brokers.keys())
            await self._bind_brokers(services)

    def _close_sessions_of_gone_brokers(self, live: Collection[int]) -> None:
        """A broker the cluster no longer counts (its etcd session expired: dead, frozen or
        cut off) has been fenced and its partitions led elsewhere: its clients' requests
        would wait on it until it woke. Closing their connections makes clients ask for
        metadata again and retry where the partitions are led now. Two answers in a row
        must leave it out: one broker's view may lag etcd's for a moment."""
        for node_id, sessions in self._sessions_by_broker.items():
            if node_id in live or not sessions:
                self._missing_brokers.pop(node_id, None)
                continue
            self._missing_brokers[node_id] = self._missing_brokers.get(node_id, 0) + 1
            if self._missing_brokers[node_id] >= _GONE_AFTER_ANSWERS:
                log.warning(
                    "event=gateway_broker_gone broker=%d connections_closed=%d",
                    node_id,
                    len(sessions),
                )
                for session in list(sessions):
                    session.close()
                sessions.clear()
                del self._missing_brokers[node_id]

    def _close_revoked(self, services: GatewayServices, snapshot: TenancySnapshot) -> None:
        del snapshot
        for key_id, sessions in list(services.sessions_by_key.items()):
            # Per session: one principal name may log in by key and by external token.
            revoked = [session for session in sessions if session.current_access() is None]
            if revoked:
                log.info("event=gateway_key_revoked key=%s connections=%d", key_id, len(revoked))
                for session in revoked:
                    session.close()
                    sessions.discard(session)
            if not sessions:
                with contextlib.suppress(KeyError):
                    del services.sessions_by_key[key_id]
