"""Metadata (3) and DescribeCluster (60): who the brokers are and where partitions lead.

kio encodes large Metadata responses slowly, and clients ask the same
question over and over (librdkafka refreshes every few seconds per topic
set). Encoded bodies are cached per (image revision, version, question), and
the whole cache is dropped when the image changes.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from typing import Any, Final

from shoal.broker.cluster.model import ClusterImage, NodeId, TopicImage, TopicName
from shoal.broker.handlers.base import (
    NO_THROTTLE,
    BrokerServices,
    E,
    Encoded,
    RequestContext,
)
from shoal.broker.topic_admin import AdminError, validate_topic_name

log = logging.getLogger(__name__)

ZERO_UUID: Final = uuid.UUID(int=0)
OPERATIONS_OMITTED: Final = -(2**31)
_CACHE_SIZE: Final = 256

# AclOperation codes (Kafka's): READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7,
# DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11,
# IDEMPOTENT_WRITE 12. The broker has no authorizer (the gateway does), so
# whoever reaches it may do everything a resource supports.
TOPIC_OPERATIONS: Final = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
CLUSTER_OPERATIONS: Final = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))


class MetadataResponder:
    def __init__(self) -> None:
        self._revision = -1
        self._cache: OrderedDict[tuple[Any, ...], Encoded] = OrderedDict()

    async def handle(self, services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
        names = _requested_names(ctx.version, request, services.image)
        if (
            names is not None
            and services.config.auto_create_topics_enable
            and getattr(request, "allow_auto_topic_creation", True)
        ):
            missing = [n for n in names if isinstance(n, str) and n not in services.image.topics]
            await _auto_create(services, missing)
        image = services.image
        if image.revision != self._revision:
            self._cache.clear()
            self._revision = image.revision
        include_ops = getattr(request, "include_topic_authorized_operations", False)
        key = (ctx.version, None if names is None else tuple(names), include_ops)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        body = Encoded(ctx.api.encode_body(_build(ctx, image, names, include_ops)))
        self._cache[key] = body
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return body


TopicRef = str | uuid.UUID
"""A topic asked for by name, or by an id this cluster does not know."""


def _requested_names(version: int, request: Any, image: ClusterImage) -> list[TopicRef] | None:
    """Topics asked for, or None for every topic (v0: an empty list; v1+: null)."""
    topics = request.topics
    if topics is None or (version == 0 and not topics):
        return None
    refs: list[TopicRef] = []
    for topic in topics:
        if topic.name is not None:
            refs.append(topic.name)
            continue
        topic_id = getattr(topic, "topic_id", None) or ZERO_UUID
        found = image.topic_ids.get(topic_id)
        refs.append(found if found is not None else topic_id)
    return refs


async def _auto_create(services: BrokerServices, missing: list[str]) -> None:
    for name in missing:
        try:
            await services.admin.create(name, -1, -1, {}, {}, validate_only=False)
            log.info("event=topic_auto_created topic=%s", name)
        except AdminError as exc:
            log.info("event=topic_auto_create_refused topic=%s reason=%s", name, exc.message)


def _build(
    ctx: RequestContext, image: ClusterImage, names: list[TopicRef] | None, include_ops: bool
) -> Any:
    api = ctx.api
    brokers = tuple(
        api.make("MetadataResponseBroker", node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
        for b in sorted(image.brokers.values(), key=lambda b: b.node_id)
    )
    wanted: list[TopicRef] = list(sorted(image.topics)) if names is None else names
    topics = []
    for name in wanted:
        if isinstance(name, uuid.UUID):
            topics.append(_unknown_topic_id(ctx, name))
            continue
        topic = image.topics.get(TopicName(name))
        if topic is None:
            topics.append(_unknown_topic(ctx, name))
        else:
            topics.append(_topic(ctx, image, topic, include_ops))
    return api.response(
        throttle_time=NO_THROTTLE,
        brokers=brokers,
        cluster_id=image.cluster_id,
        controller_id=image.controller_id,
        topics=tuple(topics),
        cluster_authorized_operations=OPERATIONS_OMITTED,
        error_code=E.none,
    )


def _unknown_topic_id(ctx: RequestContext, topic_id: uuid.UUID) -> Any:
    return ctx.api.make(
        "MetadataResponseTopic",
        error_code=E.unknown_topic_id,
        name=None,
        topic_id=topic_id,
        is_internal=False,
        partitions=(),
    )


def _unknown_topic(ctx: RequestContext, name: str) -> Any:
    code = E.unknown_topic_or_partition
    try:
        validate_topic_name(name)
    except AdminError:
        code = E.invalid_topic_exception
    return ctx.api.make(
        "MetadataResponseTopic",
        error_code=code,
        name=name,
        topic_id=ZERO_UUID,
        is_internal=False,
        partitions=(),
    )


def _topic(ctx: RequestContext, image: ClusterImage, topic: TopicImage, include_ops: bool) -> Any:
    api = ctx.api
    record = topic.record
    live = image.brokers
    partitions = []
    for index, replicas in enumerate(record.assignment):
        state = topic.partitions.get(index)
        leader = state.leader if state is not None else NodeId(-1)
        available = leader in live
        partitions.append(
            api.make(
                "MetadataResponsePartition",
                error_code=E.none if available else E.leader_not_available,
                partition_index=index,
                leader_id=leader if available else -1,
                leader_epoch=state.leader_epoch if state is not None else -1,
                replica_nodes=replicas,
                isr_nodes=state.isr if state is not None else (),
                offline_replicas=tuple(r for r in replicas if r not in live),
            )
        )
    return api.make(
        "MetadataResponseTopic",
        error_code=E.none,
        name=record.name,
        topic_id=record.topic_id,
        is_internal=record.name.startswith("__"),
        partitions=tuple(partitions),
        topic_authorized_operations=TOPIC_OPERATIONS if include_ops else OPERATIONS_OMITTED,
    )


async def handle_describe_cluster(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    image = services.image
    if getattr(request, "endpoint_type", 1) != 1:
        return api.response(
            throttle_time=NO_THROTTLE,
            error_code=E.mismatched_endpoint_type,
            error_message="This is a broker; ask it for brokers (endpoint type 1).",
            endpoint_type=request.endpoint_type,
            cluster_id=image.cluster_id,
            controller_id=-1,
            brokers=(),
        )
    brokers = tuple(
        api.make(
            "DescribeClusterBroker", broker_id=b.node_id, host=b.host, port=b.port, rack=b.rack
        )
        for b in sorted(image.brokers.values(), key=lambda b: b.node_id)
    )
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=E.none,
        error_message=None,
        endpoint_type=1,
        cluster_id=image.cluster_id,
        controller_id=image.controller_id,
        brokers=brokers,
        cluster_authorized_operations=(
            CLUSTER_OPERATIONS
            if request.include_cluster_authorized_operations
            else OPERATIONS_OMITTED
        ),
    )
