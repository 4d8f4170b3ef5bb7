"""The broker process: wiring of store, logs, partitions and the Kafka listener.

Start-up order matters: the data directory is locked first (a second broker
on the same directory stops here), then etcd gives the cluster id and the
first image, logs are loaded and recovered with their topic configs, stray
logs are removed, and only then does the listener open and the broker
register, so no client reaches a broker that is still recovering.

After registering, the broker campaigns for controller (see
:mod:`shoal.broker.controller.controller`) and starts the ISR checks.

Shutdown (SIGTERM, Ctrl-C) is Kafka's controlled shutdown: the broker marks
its registration as shutting down, the controller moves leadership to other
in-sync replicas and takes the broker out of every ISR, and only then (or
after ``controlled_shutdown_timeout_ms``) does it deregister, stop accepting,
close connections, fsync and checkpoint every log, and write the
clean-shutdown marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Final

from opentelemetry.sdk.trace import TracerProvider
from shoal.broker.cluster.cache import MetadataCache
from shoal.broker.cluster.etcd_store import EtcdMetadataStore
from shoal.broker.cluster.liveness import PeerProbe
from shoal.broker.cluster.model import BrokerRegistration, ClusterImage, NodeId, TopicName
from shoal.broker.cluster.store import StoreUnavailableError
from shoal.broker.config import BrokerConfig
from shoal.broker.controller.controller import Controller, ControllerSettings
from shoal.broker.controller.forwarding import ControllerForwarder
from shoal.broker.coordinator.consumer_coordinator import TopicsView
from shoal.broker.coordinator.coordinator import GroupCoordinator
from shoal.broker.fetch_sessions import FetchSessionCache
from shoal.broker.handlers import API_VERSIONS, build_handlers
from shoal.broker.handlers.base import BrokerServices
from shoal.broker.log.cleaner.manager import CleanerSettings
from shoal.broker.log.manager import LogManager, LogManagerSettings
from shoal.broker.loop_watch import LoopWatch
from shoal.broker.metrics import BrokerCollector, RequestMetrics, broker_registry
from shoal.broker.partition import NotLeaderError, Partition
from shoal.broker.producer_ids import ProducerIdManager
from shoal.broker.replica_manager import ReplicaManager
from shoal.broker.replication.fetcher import FetcherSettings
from shoal.broker.server.connection import KafkaConnection
from shoal.broker.server.dispatcher import Dispatcher
from shoal.broker.server.tracing import BrokerTracing
from shoal.broker.tasks import cancel_and_wait
from shoal.broker.topic_admin import TopicAdmin
from shoal.broker.txn.coordinator import TransactionCoordinator
from shoal.broker.txn.markers import TxnMarkerSender, write_markers
from shoal.broker.txn.verification import TransactionVerifier

from shoal.descriptor_table import reserve_descriptor_table
from shoal.host_port import split_host_port
from shoal.metrics import serve_metrics
from shoal.startup_heap import freeze_startup_heap
from shoal.wire import load_schemas

log = logging.getLogger(__name__)

_STORE_RETRY_S: Final = 1.0
_STORE_WAIT_S: Final = 60.0


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def monotonic_ms() -> int:
    """For replica lag: immune to wall-clock steps."""
    return int(time.monotonic() * 1000)


async def _connect(store: EtcdMetadataStore) -> None:
    """etcd may start after us (a pod restart, ``shoal dev``): wait a while for it."""
    deadline = time.monotonic() + _STORE_WAIT_S
    while True:
        try:
            await store.connect()
            return
        except StoreUnavailableError as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("event=etcd_unreachable retry_s=%s error=%s", _STORE_RETRY_S, exc)
            await asyncio.sleep(_STORE_RETRY_S)


class Broker:
    def __init__(self, config: BrokerConfig, tracing: TracerProvider | None = None) -> None:
        self.config = config
        self.tracing = None if tracing is None else BrokerTracing(tracing)
        self.node_id = NodeId(config.node_id)
        self._connections: set[KafkaConnection] = set()
        self.exit_code = 0
        """1 when the broker stopped because its log directory failed."""

    async def run(self, stop: asyncio.Event) -> None:
        load_schemas(API_VERSIONS)  # before anything serves: see load_schemas
        reserve_descriptor_table()  # nor grow it while accepting: see the module
        freeze_startup_heap()  # nor walk the schemas in every full collection: the same
        logs = _log_manager(self.config)
        offline = asyncio.create_task(self._stop_when_offline(logs, stop), name="log-dir-watch")
        try:
            await self._run(logs, stop)
        finally:
            offline.cancel()
        log.info("event=broker_stopped node_id=%d exit_code=%d", self.node_id, self.exit_code)

    async def _run(self, logs: LogManager, stop: asyncio.Event) -> None:
        config = self.config
        store = EtcdMetadataStore(config.etcd)
        try:
            await _connect(store)
            cluster_id = await store.ensure_cluster_id()
            logs.check_identity(self.node_id, cluster_id)
            images = store.images()
            first = await anext(images)
            replicas = ReplicaManager(
                self.node_id,
                logs,
                config.topic_defaults,
                monotonic_ms,
                _fetcher_settings(config),
                config.replica_lag_time_max_ms,
                may_lead=lambda: store.session.may_lead(time.monotonic()),
            )
            logs.load_all(lambda topic: replicas.log_config(first.topics.get(TopicName(topic))))
            cache = MetadataCache(first)
            groups = GroupCoordinator(
                replicas,
                config.group_config(),
                wall_clock_ms,
                _partition_exists(cache),
                _topics_view(cache),
            )
            controller = Controller(
                self.node_id,
                store,
                ControllerSettings(
                    config.auto_leader_rebalance_enable,
                    config.leader_imbalance_check_interval_seconds * 1000,
                    config.leader_imbalance_per_broker_percentage,
                ),
                lambda topic: replicas.log_config(topic).unclean_leader_election_enable,
            )
            producer_ids = ProducerIdManager(store)
            markers = TxnMarkerSender(
                self.node_id,
                lambda: cache.image,
                lambda marker: write_markers(
                    _hosted(replicas), groups.complete_transaction, marker
                ),
                config.transaction_config().marker_retry_backoff_ms,
            )
            transactions = TransactionCoordinator(
                replicas,
                config.transaction_config(),
                wall_clock_ms,
                producer_ids.generate,
                markers,
                groups.partition_of,
            )
            replicas.apply(first)
            groups.on_partitions_changed()
            transactions.on_partitions_changed()
            controller.on_image(first)
            cache.add_listener(replicas.apply)
            cache.add_listener(lambda _image: groups.on_partitions_changed())
            cache.add_listener(lambda _image: transactions.on_partitions_changed())
            cache.add_listener(controller.on_image)
            following = asyncio.create_task(_follow(images, cache), name="metadata-follow")
            logs.start()
            groups.start()
            transactions.start()
            producer_ids.start()
            admin = TopicAdmin(
                store,
                cache,
                config.num_partitions,
                config.default_replication_factor,
                config.max_partitions_per_topic,
            )
            services = BrokerServices(
                self.node_id,
                config,
                cache,
                replicas,
                admin,
                groups,
                transactions,
                producer_ids,
                wall_clock_ms,
                controller,
                ControllerForwarder(self.node_id, lambda: cache.image),
                TransactionVerifier(self.node_id, lambda: cache.image, transactions),
                FetchSessionCache(config.max_incremental_fetch_session_cache_slots),
            )
            try:
                await self._serve(services, store, controller, stop)
            finally:
                await services.forwarder.close()
                await services.verifier.close()
                await transactions.close()
                await producer_ids.close()
                await markers.close()
                await groups.close()
                await replicas.close()
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        finally:
            await logs.close()
            await store.close()

    async def _stop_when_offline(self, logs: LogManager, stop: asyncio.Event) -> None:
        """A failed log directory stops the broker as SIGTERM would (leadership moves
        first), with exit code 1 so that a supervisor restarts it: its logs are
        recovered then, once space or the disk is back."""
        await logs.offline.wait()
        self.exit_code = 1
        stop.set()

    async def _serve(
        self,
        services: BrokerServices,
        store: EtcdMetadataStore,
        controller: Controller,
        stop: asyncio.Event,
    ) -> None:
        config = self.config
        cache = services.cache
        requests = RequestMetrics()
        dispatcher = Dispatcher(
            services, build_handlers(), API_VERSIONS, metrics=requests, tracing=self.tracing
        )
        loop = asyncio.get_running_loop()

        def connection() -> KafkaConnection:
            conn = KafkaConnection(
                dispatcher, config.socket_request_max_bytes, dispatcher.may_overtake
            )
            self._connections.add(conn)
            conn.on_close = self._connections.discard
            return conn

        host, port = config.listen_address
        server = await loop.create_server(connection, host, port, reuse_address=True, backlog=1024)
        watch = LoopWatch()
        watching = loop.create_task(watch.run(), name="loop-watch")
        metrics = await self._serve_metrics(services, requests, watch)
        bound_port = server.sockets[0].getsockname()[1]
        advertised_host, advertised_port = config.advertised_address
        if advertised_port == 0 or (config.advertise is None and port == 0):
            advertised_port = bound_port
        registration = BrokerRegistration(
            self.node_id, advertised_host, advertised_port, config.rack
        )
        ttl_s = max(2, math.ceil(config.broker_session_timeout_ms / 1000))
        revision = await store.register_broker(
            registration,
            ttl_s,
            config.broker_heartbeat_interval_ms / 1000,
            config.broker_loop_stall_timeout_ms / 1000,
        )
        await cache.wait_for(revision, timeout_s=10)
        controller.start()
        services.replicas.start()
        probing = None
        if config.broker_peer_probe_interval_ms > 0:
            probe = PeerProbe(self.node_id, store, config.broker_peer_probe_interval_ms / 1000)
            probe.on_image(cache.image)
            cache.add_listener(probe.on_image)
            probing = asyncio.create_task(probe.run(), name="peer-probe")
        log.info(
            "event=broker_ready node_id=%d listen=%s:%d advertised=%s:%d cluster_id=%s",
            self.node_id,
            host,
            bound_port,
            advertised_host,
            advertised_port,
            cache.image.cluster_id,
        )
        try:
            await stop.wait()
            log.info("event=broker_stopping node_id=%d", self.node_id)
            await self._controlled_shutdown(store, cache, registration)
        finally:
            await cancel_and_wait(probing)
            await cancel_and_wait(watching)
            await controller.stop()
            await store.deregister_broker()
            server.close()
            if metrics is not None:
                metrics.close()
            for conn in list(self._connections):
                conn.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)

    async def _serve_metrics(
        self, services: BrokerServices, requests: RequestMetrics, watch: LoopWatch
    ) -> asyncio.Server | None:
        if not self.config.metrics_listen:
            return None
        collector = BrokerCollector(
            self.node_id,
            services.replicas,
            services.cache,
            requests,
            lambda: len(self._connections),
            services.transactions,
            watch,
            services.fetch_sessions,
        )
        host, port = split_host_port(self.config.metrics_listen)
        return await serve_metrics(broker_registry(collector), host, port)

    async def _controlled_shutdown(
        self, store: EtcdMetadataStore, cache: MetadataCache, registration: BrokerRegistration
    ) -> None:
        """Ask for leadership to move away, and wait until it has (or time is up)."""
        try:
            revision = await store.update_registration(replace(registration, shutting_down=True))
        except StoreUnavailableError as exc:
            log.warning("event=controlled_shutdown_skipped error=%s", exc)
            return
        await cache.wait_for(revision, timeout_s=5)
        moved = await cache.wait_until(
            lambda image: _movable_leaderships(image, self.node_id) == 0,
            self.config.controlled_shutdown_timeout_ms / 1000,
        )
        if not moved:
            log.warning(
                "event=controlled_shutdown_incomplete still_leading=%d",
                _movable_leaderships(cache.image, self.node_id),
            )
        else:
            log.info("event=controlled_shutdown_complete node_id=%d", self.node_id)


def _movable_leaderships(image: ClusterImage, node_id: NodeId) -> int:
    """Partitions this broker still leads although another eligible replica is in the ISR."""
    eligible = image.eligible_leaders()
    return sum(
        1
        for topic in image.topics.values()
        for state in topic.partitions.values()
        if state.leader == node_id and any(n != node_id and n in eligible for n in state.isr)
    )


def _log_manager(config: BrokerConfig) -> LogManager:
    return LogManager(
        config.data_dir,
        wall_clock_ms,
        LogManagerSettings(
            retention_check_interval_ms=config.log_retention_check_interval_ms,
            flush_check_interval_ms=config.log_flush_scheduler_interval_ms,
            recovery_checkpoint_interval_ms=config.log_flush_offset_checkpoint_interval_ms,
            hw_checkpoint_interval_ms=config.replica_high_watermark_checkpoint_interval_ms,
            producer_id_expiration_ms=config.producer_id_expiration_ms,
            producer_id_expiration_check_interval_ms=(
                config.producer_id_expiration_check_interval_ms
            ),
            cleaner=CleanerSettings(
                enable=config.log_cleaner_enable,
                threads=config.log_cleaner_threads,
                io_max_bytes_per_second=config.log_cleaner_io_max_bytes_per_second,
                dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size,
                backoff_ms=config.log_cleaner_backoff_ms,
            ),
        ),
    )


def _fetcher_settings(config: BrokerConfig) -> FetcherSettings:
    return FetcherSettings(
        NodeId(config.node_id),
        max_wait_ms=config.replica_fetch_wait_max_ms,
        max_bytes=config.replica_fetch_response_max_bytes,
        partition_max_bytes=config.replica_fetch_max_bytes,
        backoff_ms=config.replica_fetch_backoff_ms,
    )


def _hosted(replicas: ReplicaManager) -> Callable[[str, int], Partition]:
    """The partition this broker hosts; NotLeaderError for one it does not (its
    leader may have moved here meanwhile: the marker sender retries)."""

    def lookup(topic: str, index: int) -> Partition:
        partition = replicas.get(topic, index)
        if partition is None:
            raise NotLeaderError(f"{topic}-{index} is not hosted here")
        return partition

    return lookup


def _partition_exists(cache: MetadataCache) -> Callable[[str, int], bool]:
    def exists(topic: str, partition: int) -> bool:
        known = cache.image.topics.get(TopicName(topic))
        return known is not None and 0 <= partition < known.record.partition_count

    return exists


def _topics_view(cache: MetadataCache) -> TopicsView:
    """Every topic's id and partition count, for KIP-848 assignments (by topic id)."""

    def topics() -> dict[str, tuple[uuid.UUID, int]]:
        return {
            str(name): (t.record.topic_id, t.record.partition_count)
            for name, t in cache.image.topics.items()
        }

    return topics


async def _follow(images: AsyncIterator[ClusterImage], cache: MetadataCache) -> None:
    async for image in images:
        cache.publish(image)
