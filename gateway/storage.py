"""How many bytes each tenant's topics keep on the brokers, for the usage route.

The brokers know sizes per partition replica (DescribeLogDirs, API 35) and
nothing of tenants; the gateway knows which topics are whose. One survey asks
every known broker for its log dirs (a short-lived control connection each)
and asks Metadata who leads each partition. A tenant's storage is then, per
topic and in total:

* ``leader_bytes``: the sum over its partitions of the leader replica's size,
  what the tenant's data takes once;
* ``replica_bytes``: the sum over every replica, what it takes on disk.

A survey covers every tenant at once and is kept for ``ttl_s`` seconds, and
concurrent askers share one survey in flight, so however often tenants poll
their usage, the brokers see at most one round of requests per period. A
broker that does not answer leaves its replicas out and marks the survey
incomplete rather than failing the whole answer.

:func:`tenant_storage` is the pure part: survey in, one tenant's view out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from shoal.gateway.cluster_view import METADATA_VERSION, BrokerAddress, ClusterView
from shoal.gateway.namespace import Namespace
from shoal.gateway.upstream import BrokerConnection, UpstreamError

from shoal.wire import ErrorCode, schema

log = logging.getLogger(__name__)

DESCRIBE_LOG_DIRS: Final = 35
DESCRIBE_LOG_DIRS_VERSION: Final = 4
DEFAULT_TTL_S: Final = 5.0
_CALL_TIMEOUT_S: Final = 5.0

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Survey:
    """Sizes as the brokers reported them, broker-side names, at one moment."""

    taken_at: float
    """Wall-clock seconds."""
    leaders: Mapping[TopicPartition, int]
    sizes: Mapping[int, Mapping[TopicPartition, int]]
    """Per broker that answered, its replicas' sizes."""
    complete: bool


@dataclass(frozen=True, slots=True)
class TopicStorage:
    leader_bytes: int = 0
    replica_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TenantStorage:
    topics: Mapping[str, TopicStorage] = field(default_factory=dict)
    """By the tenant's own topic names."""

    @property
    def leader_bytes(self) -> int:
        return sum(t.leader_bytes for t in self.topics.values())

    @property
    def replica_bytes(self) -> int:
        return sum(t.replica_bytes for t in self.topics.values())


def tenant_storage(survey: Survey, namespace: Namespace) -> TenantStorage:
    """The tenant's topics' bytes: the leader's copy and all copies, per topic.

    A topic appears once Metadata lists one of its partitions, with zeros if
    no broker reported a size for it yet.
    """
    totals: dict[str, list[int]] = {}
    for topic, _ in survey.leaders:
        name = namespace.outward(topic)
        if name is not None:
            totals.setdefault(name, [0, 0])
    for node, sizes in survey.sizes.items():
        for (topic, partition), size in sizes.items():
            name = namespace.outward(topic)
            if name is None:
                continue
            entry = totals.setdefault(name, [0, 0])
            entry[1] += size
            if survey.leaders.get((topic, partition)) == node:
                entry[0] += size
    return TenantStorage({name: TopicStorage(*totals[name]) for name in sorted(totals)})


def log_dir_sizes(response: Any) -> dict[TopicPartition, int]:
    """One broker's DescribeLogDirs answer as (topic, partition) -> bytes."""
    sizes: dict[TopicPartition, int] = {}
    for result in response.results:
        if result.error_code != ErrorCode.none:
            continue
        for topic in result.topics:
            for p in topic.partitions:
                if not p.is_future_key:
                    sizes[(str(topic.name), int(p.partition_index))] = int(p.partition_size)
    return sizes


class StorageSurveyor:
    """Surveys the brokers' storage, at most once per ``ttl_s`` (see the module doc)."""

    def __init__(
        self,
        cluster: ClusterView,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cluster = cluster
        self.ttl_s = ttl_s
        self._clock = clock
        self._survey: Survey | None = None
        self._taken = 0.0
        self._lock = asyncio.Lock()

    async def survey(self) -> Survey:
        async with self._lock:
            if self._survey is None or self._clock() - self._taken >= self.ttl_s:
                self._survey = await self._take()
                self._taken = self._clock()
            return self._survey

    async def _take(self) -> Survey:
        metadata = await self._cluster.call(
            3,
            METADATA_VERSION,
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        leaders = {
            (str(t.name), int(p.partition_index)): int(p.leader_id)
            for t in metadata.topics
            if t.error_code == ErrorCode.none
            for p in t.partitions
        }
        brokers = [BrokerAddress(b.node_id, b.host, b.port) for b in metadata.brokers] or list(
            self._cluster.brokers.values()
        )
        answers = await asyncio.gather(*(self._log_dirs(b) for b in brokers))
        sizes = {b.node_id: s for b, s in zip(brokers, answers, strict=True) if s is not None}
        return Survey(time.time(), leaders, sizes, complete=len(sizes) == len(brokers))

    async def _log_dirs(self, broker: BrokerAddress) -> dict[TopicPartition, int] | None:
        api = schema(DESCRIBE_LOG_DIRS, DESCRIBE_LOG_DIRS_VERSION)
        try:
            connection = await BrokerConnection.open(broker.host, broker.port, _CALL_TIMEOUT_S)
        except UpstreamError as exc:
            log.warning("event=storage_survey_failed broker=%d error=%s", broker.node_id, exc)
            return None
        try:
            response = await connection.call(api, api.request(topics=None), _CALL_TIMEOUT_S)
        except UpstreamError as exc:
            log.warning("event=storage_survey_failed broker=%d error=%s", broker.node_id, exc)
            return None
        finally:
            connection.close()
        return log_dir_sizes(response)
