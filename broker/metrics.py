"""The broker's Prometheus metrics, served at ``/metrics`` on ``--metrics-listen``.

Gauges are computed at scrape time from the broker's own state (the
partitions it hosts, the cluster image), not kept up to date on the hot
path: a scrape every 15-30 s costs one pass over the hosted partitions,
while a produce costs nothing extra. Only what happens per request (count,
latency, error codes: :class:`RequestMetrics`, fed by the dispatcher) and
per ISR change (counted by the AlterPartition sender) is counted as it
happens.

Kafka's names, in Prometheus spelling: ``UnderReplicatedPartitions`` is
``shoal_broker_under_replicated_partitions`` (partitions this broker leads
whose ISR is smaller than their replica set), ``OfflinePartitionsCount`` is
``shoal_cluster_offline_partitions`` and, as in Kafka, only the active
controller reports it (partitions with no live leader), so a ``sum`` over
brokers counts each once. ``topic`` labels carry the brokers' names
(``<tenant>.<topic>``); the broker knows nothing of tenants.

Serving: :func:`shoal.metrics.serve_metrics`, on the broker's own event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from shoal.broker.cluster.cache import MetadataCache
from shoal.broker.cluster.model import NO_LEADER, NodeId
from shoal.broker.fetch_sessions import FetchSessionCache
from shoal.broker.loop_watch import LoopWatch
from shoal.broker.replica_manager import ReplicaManager
from shoal.broker.txn.coordinator import TransactionCoordinator
from shoal.broker.txn.metadata import TxnState

from shoal.metrics import (
    LabeledCounter,
    LabeledHistogram,
    api_name,
    error_codes,
    error_name,
)
from shoal.wire import ApiSchema


class RequestMetrics:
    """Requests, their latency and the error codes in their responses, by API."""

    def __init__(self) -> None:
        self.requests = LabeledCounter(
            "shoal_broker_requests", "Kafka requests handled, by API.", ("api",)
        )
        self.errors = LabeledCounter(
            "shoal_broker_request_errors",
            "Error codes in responses (top level and per partition/resource), by API and"
            " Kafka error name.",
            ("api", "error"),
        )
        self.latency = LabeledHistogram(
            "shoal_broker_request_duration_seconds",
            "Time from a decoded request to its response, by API (fetches include their"
            " long-poll wait).",
            ("api",),
        )
        self._names: dict[type[Any], str] = {}

    def observe(self, api: ApiSchema, seconds: float, response: Any) -> None:
        name = self._names.get(api.response_class)
        if name is None:
            name = self._names[api.response_class] = api_name(api.response_class)
        self.requests.inc((name,))
        self.latency.observe((name,), seconds)
        if response is not None:
            for code in error_codes(response):
                self.errors.inc((name, error_name(code)))

    def families(self) -> Iterable[Any]:
        return [self.requests.family(), self.errors.family(), self.latency.family()]


class BrokerCollector(Collector):
    def __init__(
        self,
        node_id: NodeId,
        replicas: ReplicaManager,
        cache: MetadataCache,
        requests: RequestMetrics,
        connections: Callable[[], int],
        transactions: TransactionCoordinator,
        loop_watch: LoopWatch | None = None,
        fetch_sessions: FetchSessionCache | None = None,
    ) -> None:
        self.node_id = node_id
        self.loop_watch = loop_watch
        self.fetch_sessions = fetch_sessions
        self.replicas = replicas
        self.cache = cache
        self.requests = requests
        self.connections = connections
        self.transactions = transactions

    def collect(self) -> Iterable[Any]:
        hosted = leaders = under_replicated = 0
        sizes: dict[str, int] = {}
        held_back: dict[str, int] = {}
        for partition in self.replicas.partitions.values():
            hosted += 1
            if partition.is_leader:
                leaders += 1
                if len(partition.state.isr) < len(partition.replicas):
                    under_replicated += 1
                plog = partition.log
                lag = plog.high_watermark - plog.last_stable_offset
                held_back[partition.topic] = max(held_back.get(partition.topic, 0), lag)
            sizes[partition.topic] = sizes.get(partition.topic, 0) + partition.log.size
        yield _gauge("shoal_broker_partitions", "Partition replicas hosted here.", hosted)
        if self.loop_watch is not None:
            yield _gauge(
                "shoal_broker_event_loop_stall_max_seconds",
                "The longest the broker's event loop stalled since it started; one past"
                " SHOAL_BROKER_LOOP_STALL_TIMEOUT_MS ends the broker's session.",
                self.loop_watch.longest_s,
            )
            yield _counter(
                "shoal_broker_event_loop_stalls",
                "Event loop stalls of half a second or more.",
                self.loop_watch.stalls,
            )
        yield _gauge("shoal_broker_leader_partitions", "Partitions this broker leads.", leaders)
        if self.fetch_sessions is not None:
            yield from _fetch_sessions(self.fetch_sessions)
        yield _gauge(
            "shoal_broker_under_replicated_partitions",
            "Partitions led here whose ISR is smaller than their replica set.",
            under_replicated,
        )
        log_size = GaugeMetricFamily(
            "shoal_broker_log_size_bytes",
            "Bytes of log segments on this broker, per topic (all its hosted partitions).",
            labels=("topic",),
        )
        for topic, size in sorted(sizes.items()):
            log_size.add_metric((topic,), size)
        yield log_size
        lso_lag = GaugeMetricFamily(
            "shoal_broker_last_stable_offset_lag",
            "Offsets between the high watermark and the last stable offset (what open"
            " transactions hold back from read_committed consumers), the largest of the"
            " partitions of each topic led here.",
            labels=("topic",),
        )
        for topic, lag in sorted(held_back.items()):
            lso_lag.add_metric((topic,), lag)
        yield lso_lag
        yield from self._transactions()
        yield from self._cluster()
        changes = self.replicas.isr_changes.applied
        yield _counter(
            "shoal_broker_isr_shrinks",
            "ISR shrinks of partitions led here (a follower fell behind).",
            changes.get("isr_shrink", 0),
        )
        yield _counter(
            "shoal_broker_isr_expands",
            "ISR expansions of partitions led here (a follower caught up).",
            changes.get("isr_expand", 0),
        )
        yield _gauge("shoal_broker_connections", "Open Kafka connections.", self.connections())
        yield from self._cleaner()
        yield from self.requests.families()

    def _cleaner(self) -> Iterable[Any]:
        """Kafka's LogCleaner metrics: max-dirty-percent per log dir, bytes, errors, last run."""
        logs = self.replicas.logs
        metrics = logs.cleaner.metrics
        ratio = GaugeMetricFamily(
            "shoal_log_cleaner_max_dirty_ratio",
            "Largest dirty ratio of the compacted logs in a log dir at the cleaner's last look.",
            labels=("log_dir",),
        )
        ratio.add_metric((str(logs.data_dir),), metrics.max_dirty_ratio)
        yield ratio
        yield _gauge(
            "shoal_log_cleaner_max_compaction_delay_seconds",
            "How far past max.compaction.lag.ms the most overdue compacted log is.",
            metrics.max_compaction_delay_ms / 1000,
        )
        yield _counter(
            "shoal_log_cleaner_bytes_read",
            "Bytes of log the cleaner read (offset maps and cleaning).",
            metrics.bytes_read,
        )
        yield _counter(
            "shoal_log_cleaner_bytes_recopied",
            "Bytes the cleaner wrote into cleaned segments.",
            metrics.bytes_recopied,
        )
        yield _counter("shoal_log_cleaner_cleans", "Logs cleaned.", metrics.cleans)
        yield _counter(
            "shoal_log_cleaner_errors",
            "Cleans that failed; the log is left alone for a while (uncleanable).",
            metrics.errors,
        )
        yield _gauge(
            "shoal_log_cleaner_uncleanable_partitions",
            "Compacted logs left alone after a failed clean.",
            metrics.uncleanable_partitions,
        )
        if metrics.last_clean_monotonic is not None:
            yield _gauge(
                "shoal_log_cleaner_seconds_since_last_clean",
                "Time since the cleaner last finished cleaning a log.",
                time.monotonic() - metrics.last_clean_monotonic,
            )

    def _transactions(self) -> Iterable[Any]:
        """The transactional ids this broker coordinates, by state, and the oldest open one."""
        coordinator = self.transactions
        states = GaugeMetricFamily(
            "shoal_txn_transactional_ids",
            "Transactional ids this broker coordinates, by the state of their transaction.",
            labels=("state",),
        )
        counts = {state: 0 for state in TxnState}
        now = coordinator.clock()
        oldest = 0.0
        for metadata in coordinator.txns.values():
            counts[metadata.state] += 1
            if metadata.pending_transaction and metadata.start_timestamp >= 0:
                oldest = max(oldest, (now - metadata.start_timestamp) / 1000)
        for state, count in counts.items():
            states.add_metric((state.kafka_name,), count)
        yield states
        yield _gauge(
            "shoal_txn_oldest_open_seconds",
            "Age of the oldest transaction this broker coordinates that is not complete"
            " (0 when none): a hanging transaction shows here.",
            oldest,
        )
        yield coordinator.decided.family()
        yield coordinator.durations.family()

    def _cluster(self) -> Iterable[Any]:
        image = self.cache.image
        active = image.controller is not None and image.controller.node_id == self.node_id
        yield _gauge(
            "shoal_broker_active_controller",
            "1 on the broker that is the elected controller, else 0.",
            int(active),
        )
        if not active:
            return
        live = set(image.brokers)
        offline = sum(
            1
            for topic in image.topics.values()
            for state in topic.partitions.values()
            if state.leader == NO_LEADER or state.leader not in live
        )
        yield _gauge(
            "shoal_cluster_offline_partitions",
            "Partitions with no live leader (reported by the active controller only).",
            offline,
        )


def _fetch_sessions(cache: FetchSessionCache) -> Iterable[Any]:
    sessions = cache.sessions.values()
    yield _gauge("shoal_broker_fetch_sessions", "Fetch sessions (KIP-227) cached.", len(sessions))
    yield _gauge(
        "shoal_broker_fetch_session_partitions",
        "Partitions in the cached fetch sessions.",
        sum(len(session.partitions) for session in sessions),
    )
    yield _counter(
        "shoal_broker_fetch_session_evictions",
        "Fetch sessions evicted to make room for another.",
        cache.evictions,
    )


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def broker_registry(collector: BrokerCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry
