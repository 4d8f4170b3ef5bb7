"""Consumer group lag per tenant, group and topic, measured by the gateway.

Why here: lag is a log end offset minus a committed offset, and no single
broker knows both (a group's coordinator has its offsets, each partition's
leader its end). The gateway can ask all brokers, and it is the component
that knows tenants, so it can turn ``acme.billing`` into tenant ``acme``,
group ``billing``. Every ``group_lag_interval_s`` it lists the groups, reads
each group's committed offsets from its coordinator and the latest offsets
(the high watermark: what a consumer can reach) from the partitions'
leaders, over the Kafka protocol on the brokers' internal listeners, with
the gateway's own asyncio connections:

1. ListGroups to every known broker. A broker lists the groups it
   coordinates, so the broker that lists a group is where its offsets are
   asked (no FindCoordinator).
2. OffsetFetch (the multi-group form) to each coordinator for its groups.
3. Metadata for the topics those groups committed to, for their leaders.
4. ListOffsets latest, READ_UNCOMMITTED (the high watermark), to each leader.

Every call is bounded by a timeout, and a broker or group that fails (gone,
frozen, NOT_COORDINATOR while a coordinator moves, COORDINATOR_LOAD_IN_PROGRESS)
is logged and left out of this round; the next round asks again. A round in
which no broker lists its groups keeps the last measurement.

Why not librdkafka's admin client, as this module once did: when a group's
coordinator dies, an admin OffsetFetch answered NOT_COORDINATOR makes
librdkafka call ``rd_kafka_cgrp_op`` on the NULL consumer-group handle of an
admin client (confluentinc/confluent-kafka-javascript#374) and the process
dies of SIGSEGV. A segfault in the gateway takes every tenant down with it,
for the sake of a metric; the four requests above are little code.

Lag of a group on a topic is the sum over the topic's partitions that the
group has committed of ``max(0, end - committed)``.

Cardinality: the issue allows only ``tenant`` and ``topic`` to be unbounded,
and a tenant may create groups without limit (every console consumer makes
one). So ``group`` is bounded per tenant: only the ``group_lag_max_groups``
groups with the largest lag are reported with their name, and
``shoal_consumer_group_lag_unreported_groups`` says how many were left out.
Lag is per topic, not per partition (partitions multiply the series by up
to ``max.partitions``). Every gateway replica reports the same numbers:
aggregate with ``max``, not ``sum``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from prometheus_client.core import GaugeMetricFamily
from shoal.gateway.cluster_view import BrokerAddress
from shoal.gateway.tenant_client import (
    LATEST,
    LIST_GROUPS,
    LIST_OFFSETS,
    METADATA,
    OFFSET_FETCH,
    READ_UNCOMMITTED,
)
from shoal.gateway.upstream import BrokerConnection, UpstreamError

from shoal.wire import ErrorCode, MalformedRequestError, schema

if TYPE_CHECKING:
    from shoal.gateway.server import GatewayServices

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_S: Final = 10.0
"""The longest one call (connecting included) may take before the broker is skipped."""
_GROUPS_PER_OFFSET_FETCH: Final = 100
"""Groups asked in one OffsetFetch, so a tenant with many groups makes no huge request."""

Partition = tuple[str, int]
"""A broker-side topic name and a partition index."""


@dataclass(frozen=True, slots=True)
class GroupLag:
    tenant: str
    group: str
    topic: str
    lag: int


@dataclass(frozen=True, slots=True)
class LagSnapshot:
    lags: tuple[GroupLag, ...] = ()
    unreported: Mapping[str, int] = field(default_factory=dict)
    """Per tenant, how many groups were left out by the cap."""


def _split(name: str) -> tuple[str, str] | None:
    tenant, dot, own = name.partition(".")
    return (tenant, own) if dot and tenant and own else None


def summarize(
    committed: Mapping[str, Mapping[Partition, int]],
    ends: Mapping[Partition, int],
    tenants: Iterable[str],
    max_groups: int,
) -> LagSnapshot:
    """Lag per tenant, group and topic from broker-side names, with the per-tenant cap.

    ``committed`` maps broker-side group ids to their committed offsets;
    groups and topics outside a known tenant's namespace (internal ones) are
    left out, and so are a group's topics of another tenant.
    """
    known = set(tenants)
    per_group: dict[tuple[str, str], dict[str, int]] = {}
    for group_id, offsets in committed.items():
        owner = _split(group_id)
        if owner is None or owner[0] not in known:
            continue
        topics = per_group.setdefault(owner, {})
        for (topic_id, partition), offset in offsets.items():
            topic = _split(topic_id)
            end = ends.get((topic_id, partition))
            if topic is None or topic[0] != owner[0] or end is None or offset < 0:
                continue
            topics[topic[1]] = topics.get(topic[1], 0) + max(0, end - offset)
    by_tenant: dict[str, list[tuple[str, dict[str, int]]]] = {}
    for (tenant, group), topics in per_group.items():
        by_tenant.setdefault(tenant, []).append((group, topics))
    lags: list[GroupLag] = []
    unreported: dict[str, int] = {}
    for tenant, groups in sorted(by_tenant.items()):
        groups.sort(key=lambda item: (-sum(item[1].values()), item[0]))
        unreported[tenant] = max(0, len(groups) - max_groups)
        for group, topics in groups[:max_groups]:
            lags.extend(GroupLag(tenant, group, t, lag) for t, lag in sorted(topics.items()))
    return LagSnapshot(tuple(lags), unreported)


class GroupLagReport:
    """The last lag measured, as metric families."""

    def __init__(self) -> None:
        self.snapshot = LagSnapshot()

    def families(self) -> Iterable[Any]:
        lag = GaugeMetricFamily(
            "shoal_consumer_group_lag",
            "Records a consumer group has yet to read on a topic (sum over its partitions of"
            " high watermark minus committed offset).",
            labels=("tenant", "group", "topic"),
        )
        for item in self.snapshot.lags:
            lag.add_metric((item.tenant, item.group, item.topic), item.lag)
        unreported = GaugeMetricFamily(
            "shoal_consumer_group_lag_unreported_groups",
            "Groups of a tenant left out of shoal_consumer_group_lag by the cap"
            " (group_lag_max_groups; the largest lags are kept).",
            labels=("tenant",),
        )
        for tenant, count in self.snapshot.unreported.items():
            unreported.add_metric((tenant,), count)
        return [lag, unreported]


Offsets = tuple[dict[str, dict[Partition, int]], dict[Partition, int]]
"""Committed offsets per broker-side group id, and the partitions' latest offsets."""


def _name(code: int) -> str:
    return ErrorCode(code).name.upper()


# -- the answers, read without a socket -------------------------------------------


def coordinated_groups(listed: Mapping[int, Any]) -> dict[int, list[str]]:
    """Node id -> the groups it coordinates, from each broker's ListGroups answer.

    A broker that answered with an error counts as one that did not answer:
    its groups wait for the next round. A group two brokers list (its
    coordinator moving) is asked of the lower node id; if that one has let
    it go, its OffsetFetch says NOT_COORDINATOR and the group waits too.
    """
    coordinator: dict[str, int] = {}
    for node_id in sorted(listed):
        answer = listed[node_id]
        if answer.error_code != ErrorCode.none:
            log.info(
                "event=group_lag_list_failed broker=%d error=%s",
                node_id,
                _name(answer.error_code),
            )
            continue
        for group in answer.groups:
            coordinator.setdefault(group.group_id, node_id)
    groups: dict[int, list[str]] = {}
    for group_id, node_id in sorted(coordinator.items()):
        groups.setdefault(node_id, []).append(group_id)
    return groups


def committed_offsets(fetched: Any, coordinator: int) -> dict[str, dict[Partition, int]]:
    """Group id -> committed offsets, from a (multi-group, v8+) OffsetFetch answer.

    A group answered with an error (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS)
    is left out, and so are partitions with an error or no committed offset.
    """
    committed: dict[str, dict[Partition, int]] = {}
    for group in fetched.groups:
        if group.error_code != ErrorCode.none:
            log.info(
                "event=group_lag_offsets_failed broker=%d group=%s error=%s",
                coordinator,
                group.group_id,
                _name(group.error_code),
            )
            continue
        offsets = committed[group.group_id] = {}
        for topic in group.topics:
            for part in topic.partitions:
                if part.error_code == ErrorCode.none and part.committed_offset >= 0:
                    offsets[topic.name, part.partition_index] = part.committed_offset
    return committed


def partition_leaders(metadata: Any, wanted: Iterable[Partition]) -> dict[int, list[Partition]]:
    """Leader node id -> the wanted partitions it leads, from a Metadata answer.

    A topic answered with an error (deleted since the group committed) and a
    partition with no leader right now are left out.
    """
    asked = set(wanted)
    leaders: dict[int, list[Partition]] = {}
    for topic in metadata.topics:
        if topic.error_code != ErrorCode.none:
            log.info(
                "event=group_lag_topic_failed topic=%s error=%s",
                topic.name,
                _name(topic.error_code),
            )
            continue
        for part in sorted(topic.partitions, key=lambda p: p.partition_index):
            tp = (topic.name, part.partition_index)
            if tp in asked and part.leader_id >= 0:
                leaders.setdefault(part.leader_id, []).append(tp)
    return leaders


def end_offsets(listed: Any, leader: int) -> dict[Partition, int]:
    """(topic, partition) -> latest offset, from a ListOffsets answer; errors left out."""
    ends: dict[Partition, int] = {}
    for topic in listed.topics:
        for part in topic.partitions:
            if part.error_code != ErrorCode.none:
                log.info(
                    "event=group_lag_end_failed broker=%d topic=%s partition=%d error=%s",
                    leader,
                    topic.name,
                    part.partition_index,
                    _name(part.error_code),
                )
                continue
            ends[topic.name, part.partition_index] = part.offset
    return ends


# -- the calls ----------------------------------------------------------------------


class LagReader:
    """Committed and latest offsets of every group, asked of the brokers each round.

    One connection per broker address, opened when first needed and kept
    between rounds. A call that fails or runs out of time closes its
    connection (an answer may still be on its way, and the next call must not
    read it as its own); the next call to that broker opens a new one.

    Its own connections, not the HTTP door's :class:`BrokerPool`: that pool
    exists only when the HTTP door is on, and its slots are meant for HTTP
    callers.
    """

    def __init__(self, timeout_s: float = _REQUEST_TIMEOUT_S) -> None:
        self._timeout_s = timeout_s
        self._connections: dict[BrokerAddress, BrokerConnection] = {}

    async def read(self, brokers: Mapping[int, BrokerAddress]) -> Offsets | None:
        """One round over ``brokers`` (node id -> address); None if no broker listed its groups."""
        for address in set(self._connections) - set(brokers.values()):
            self._drop(address)
        nodes = sorted(brokers.values(), key=lambda b: b.node_id)
        answers = await asyncio.gather(
            *(self._ask(broker, LIST_GROUPS, states_filter=()) for broker in nodes)
        )
        listed = {b.node_id: a for b, a in zip(nodes, answers, strict=True) if a is not None}
        if not any(a.error_code == ErrorCode.none for a in listed.values()):
            return None
        committed: dict[str, dict[Partition, int]] = {}
        coordinated = coordinated_groups(listed)
        for found in await asyncio.gather(
            *(self._committed(brokers[node], groups) for node, groups in coordinated.items())
        ):
            committed.update(found)
        wanted = {tp for offsets in committed.values() for tp in offsets}
        if not wanted:
            return committed, {}
        # Brokers that just answered are the likeliest to answer Metadata.
        alive = [brokers[node] for node in listed]
        return committed, await self._ends(wanted, alive, brokers)

    async def _committed(
        self, coordinator: BrokerAddress, groups: list[str]
    ) -> dict[str, dict[Partition, int]]:
        api = schema(*OFFSET_FETCH)
        committed: dict[str, dict[Partition, int]] = {}
        for start in range(0, len(groups), _GROUPS_PER_OFFSET_FETCH):
            chunk = groups[start : start + _GROUPS_PER_OFFSET_FETCH]
            fetched = await self._ask(
                coordinator,
                OFFSET_FETCH,
                groups=tuple(
                    api.make_request("OffsetFetchRequestGroup", group_id=group, topics=None)
                    for group in chunk
                ),
                require_stable=False,
            )
            if fetched is None:
                # Gone or frozen: asking for its other groups would only wait again.
                log.info(
                    "event=group_lag_groups_skipped broker=%d groups=%s",
                    coordinator.node_id,
                    ",".join(groups[start:]),
                )
                break
            committed.update(committed_offsets(fetched, coordinator.node_id))
        return committed

    async def _ends(
        self,
        wanted: set[Partition],
        alive: list[BrokerAddress],
        brokers: Mapping[int, BrokerAddress],
    ) -> dict[Partition, int]:
        api = schema(*METADATA)
        topics = tuple(
            api.make_request("MetadataRequestTopic", name=topic, topic_id=None)
            for topic in sorted({topic for topic, _ in wanted})
        )
        metadata = None
        for broker in alive:
            metadata = await self._ask(
                broker,
                METADATA,
                topics=topics,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
            if metadata is not None:
                break
        if metadata is None:
            return {}
        addresses = dict(brokers)
        addresses.update(
            (b.node_id, BrokerAddress(b.node_id, b.host, b.port)) for b in metadata.brokers
        )
        leaders = {
            leader: partitions
            for leader, partitions in partition_leaders(metadata, wanted).items()
            if leader in addresses
        }
        answers = await asyncio.gather(
            *(
                self._ask(
                    addresses[leader],
                    LIST_OFFSETS,
                    replica_id=-1,
                    isolation_level=READ_UNCOMMITTED,
                    topics=_latest(partitions),
                )
                for leader, partitions in leaders.items()
            )
        )
        ends: dict[Partition, int] = {}
        for leader, listed in zip(leaders, answers, strict=True):
            if listed is not None:
                ends.update(end_offsets(listed, leader))
        return ends

    async def _ask(self, broker: BrokerAddress, api_version: tuple[int, int], **fields: Any) -> Any:
        """The broker's answer, or None (logged) if it could not be had in time."""
        api = schema(*api_version)
        try:
            return await asyncio.wait_for(
                self._exchange(broker, api, api.request(**fields)), self._timeout_s
            )
        except (UpstreamError, MalformedRequestError, TimeoutError) as exc:
            self._drop(broker)
            log.info(
                "event=group_lag_call_failed broker=%d api=%s error=%s",
                broker.node_id,
                api.name,
                str(exc) or f"no answer within {self._timeout_s:g} s",
            )
            return None
        except asyncio.CancelledError:
            self._drop(broker)
            raise

    async def _exchange(self, broker: BrokerAddress, api: Any, body: Any) -> Any:
        connection = self._connections.get(broker)
        if connection is None or connection.closed:
            connection = await BrokerConnection.open(broker.host, broker.port, self._timeout_s)
            self._connections[broker] = connection
        return await connection.call(api, body, self._timeout_s)

    def _drop(self, broker: BrokerAddress) -> None:
        connection = self._connections.pop(broker, None)
        if connection is not None:
            connection.close()

    def close(self) -> None:
        for broker in list(self._connections):
            self._drop(broker)


def _latest(partitions: Iterable[Partition]) -> tuple[Any, ...]:
    """ListOffsets topics asking the latest offset of each partition."""
    api = schema(*LIST_OFFSETS)
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return tuple(
        api.make_request(
            "ListOffsetsTopic",
            name=topic,
            partitions=tuple(
                api.make_request(
                    "ListOffsetsPartition",
                    partition_index=partition,
                    current_leader_epoch=-1,
                    timestamp=LATEST,
                )
                for partition in indexes
            ),
        )
        for topic, indexes in by_topic.items()
    )


async def poll_group_lag(services: GatewayServices) -> None:
    """Measure lag every ``group_lag_interval_s`` until cancelled (0 turns it off)."""
    config = services.config
    if config.group_lag_interval_s <= 0:
        return
    reader = LagReader()
    report = services.metrics.group_lag
    try:
        while True:
            # Sleep first: a gateway that just started has groups to serve before lag to report.
            await asyncio.sleep(config.group_lag_interval_s)
            brokers = dict(services.cluster.brokers)
            try:
                measured = await reader.read(brokers)
            except Exception:
                # A metric is not worth the poller: the next round starts afresh.
                log.exception("event=group_lag_failed")
                continue
            if measured is None:
                continue
            committed, ends = measured
            report.snapshot = summarize(
                committed, ends, services.tenancy.snapshot.tenants, config.group_lag_max_groups
            )
    finally:
        reader.close()
