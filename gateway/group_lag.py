"""Consumer group lag per tenant, group and topic, measured by the gateway.

Why here: lag is a log end offset minus a committed offset, and no single
broker knows both (a group's coordinator has its offsets, each partition's
leader its end). The gateway can ask all brokers, and it is the component
that knows tenants, so it can turn ``acme.billing`` into tenant ``acme``,
group ``billing``. Every ``group_lag_interval_s`` it lists the groups, reads
each group's committed offsets from its coordinator and the latest offsets
(the high watermark: what a consumer can reach) from the partitions'
leaders, through librdkafka's admin client on the brokers' internal
listeners, in a worker thread so the event loop never waits on it.

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
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from shoal.gateway.server import GatewayServices

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_S: Final = 10.0

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


class LagReader:
    """Blocking reads of committed and latest offsets; one admin client, reused."""

    def __init__(self, bootstrap: str) -> None:
        self._admin = AdminClient(
            {"bootstrap.servers": bootstrap, "client.id": "shoal-gateway-group-lag"}
        )
        self.closed = threading.Event()
        """Set when the gateway stops: a read under way gives up at the next group."""

    def read(self) -> tuple[dict[str, dict[Partition, int]], dict[Partition, int]]:
        listed = self._admin.list_consumer_groups(request_timeout=_REQUEST_TIMEOUT_S)
        groups = [g.group_id for g in listed.result(_REQUEST_TIMEOUT_S).valid]
        committed: dict[str, dict[Partition, int]] = {}
        for group in groups:
            if self.closed.is_set():
                break
            # librdkafka asks one group per call.
            future = self._admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)], request_timeout=_REQUEST_TIMEOUT_S
            )[group]
            try:
                partitions = future.result(_REQUEST_TIMEOUT_S).topic_partitions or []
            except KafkaException as exc:
                log.info("event=group_lag_offsets_failed group=%s error=%s", group, exc)
                continue
            committed[group] = {(tp.topic, tp.partition): tp.offset for tp in partitions}
        wanted = {tp for offsets in committed.values() for tp in offsets}
        ends: dict[Partition, int] = {}
        if wanted:
            futures = self._admin.list_offsets(
                {TopicPartition(t, p): OffsetSpec.latest() for t, p in wanted},
                request_timeout=_REQUEST_TIMEOUT_S,
            )
            for tp, future in futures.items():
                try:
                    ends[(tp.topic, tp.partition)] = future.result(_REQUEST_TIMEOUT_S).offset
                except KafkaException as exc:
                    log.info(
                        "event=group_lag_end_failed topic=%s partition=%d error=%s",
                        tp.topic,
                        tp.partition,
                        exc,
                    )
        return committed, ends


async def poll_group_lag(services: GatewayServices) -> None:
    """Measure lag every ``group_lag_interval_s`` until cancelled (0 turns it off)."""
    config = services.config
    if config.group_lag_interval_s <= 0:
        return
    reader = LagReader(config.upstream)
    report = services.metrics.group_lag
    try:
        while True:
            # Sleep first: a gateway that just started has groups to serve before lag to report.
            await asyncio.sleep(config.group_lag_interval_s)
            try:
                committed, ends = await asyncio.to_thread(reader.read)
            except KafkaException as exc:
                log.warning("event=group_lag_failed error=%s", exc)
                continue
            report.snapshot = summarize(
                committed, ends, services.tenancy.snapshot.tenants, config.group_lag_max_groups
            )
    finally:
        reader.closed.set()
