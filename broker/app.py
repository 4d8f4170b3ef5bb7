"""The broker process: wiring of store, logs, partitions and the Kafka listener.

Start-up order matters: the data directory is locked first (a second broker
on the same directory stops here), then etcd gives the cluster id and the
first image, logs are loaded and recovered with their topic configs, stray
logs are removed, and only then does the listener open and the broker
register, so no client reaches a broker that is still recovering.

Shutdown (SIGTERM, Ctrl-C) reverses it: deregister, stop accepting, close
connections, fsync and checkpoint every log, write the clean-shutdown marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

from shoal.broker.cluster.cache import MetadataCache
from shoal.broker.cluster.etcd_store import EtcdMetadataStore
from shoal.broker.cluster.model import BrokerRegistration, ClusterImage, NodeId, TopicName
from shoal.broker.cluster.store import StoreUnavailableError
from shoal.broker.config import BrokerConfig
from shoal.broker.coordinator.coordinator import GroupCoordinator
from shoal.broker.handlers import API_VERSIONS, build_handlers
from shoal.broker.handlers.base import BrokerServices
from shoal.broker.log.manager import LogManager, LogManagerSettings
from shoal.broker.producer_ids import ProducerIdManager
from shoal.broker.replica_manager import ReplicaManager
from shoal.broker.server.connection import KafkaConnection
from shoal.broker.server.dispatcher import Dispatcher
from shoal.broker.topic_admin import TopicAdmin

log = logging.getLogger(__name__)

_STORE_RETRY_S: Final = 1.0
_STORE_WAIT_S: Final = 60.0


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


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
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.node_id = NodeId(config.node_id)
        self._connections: set[KafkaConnection] = set()

    async def run(self, stop: asyncio.Event) -> None:
        config = self.config
        logs = LogManager(
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
            ),
        )
        store = EtcdMetadataStore(config.etcd)
        try:
            await _connect(store)
            cluster_id = await store.ensure_cluster_id()
            logs.check_identity(self.node_id, cluster_id)
            images = store.images()
            first = await anext(images)
            replicas = ReplicaManager(self.node_id, logs, config.topic_defaults)
            logs.load_all(lambda topic: replicas.log_config(first.topics.get(TopicName(topic))))
            cache = MetadataCache(first)
            groups = GroupCoordinator(
                replicas, config.group_config(), wall_clock_ms, _partition_exists(cache)
            )
            replicas.apply(first)
            groups.on_partitions_changed()
            cache.add_listener(replicas.apply)
            cache.add_listener(lambda _image: groups.on_partitions_changed())
            following = asyncio.create_task(_follow(images, cache), name="metadata-follow")
            logs.start()
            groups.start()
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
                ProducerIdManager(store),
                wall_clock_ms,
            )
            try:
                await self._serve(services, store, cache, stop)
            finally:
                await groups.close()
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        finally:
            await logs.close()
            await store.close()
        log.info("event=broker_stopped node_id=%d", self.node_id)

    async def _serve(
        self,
        services: BrokerServices,
        store: EtcdMetadataStore,
        cache: MetadataCache,
        stop: asyncio.Event,
    ) -> None:
        config = self.config
        dispatcher = Dispatcher(services, build_handlers(), API_VERSIONS)
        loop = asyncio.get_running_loop()

        def connection() -> KafkaConnection:
            conn = KafkaConnection(dispatcher, config.socket_request_max_bytes)
            self._connections.add(conn)
            conn.on_close = self._connections.discard
            return conn

        host, port = config.listen_address
        server = await loop.create_server(connection, host, port, reuse_address=True, backlog=1024)
        bound_port = server.sockets[0].getsockname()[1]
        advertised_host, advertised_port = config.advertised_address
        if advertised_port == 0 or (config.advertise is None and port == 0):
            advertised_port = bound_port
        registration = BrokerRegistration(
            self.node_id, advertised_host, advertised_port, config.rack
        )
        ttl_s = max(2, math.ceil(config.broker_session_timeout_ms / 1000))
        revision = await store.register_broker(registration, ttl_s)
        await cache.wait_for(revision, timeout_s=10)
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
        finally:
            log.info("event=broker_stopping node_id=%d", self.node_id)
            await store.deregister_broker()
            server.close()
            for conn in list(self._connections):
                conn.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)


def _partition_exists(cache: MetadataCache) -> Callable[[str, int], bool]:
    def exists(topic: str, partition: int) -> bool:
        known = cache.image.topics.get(TopicName(topic))
        return known is not None and 0 <= partition < known.record.partition_count

    return exists


async def _follow(images: AsyncIterator[ClusterImage], cache: MetadataCache) -> None:
    async for image in images:
        cache.publish(image)
