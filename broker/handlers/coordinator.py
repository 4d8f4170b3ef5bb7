"""FindCoordinator (10): which broker coordinates a group (single and batched forms).

A group's coordinator is the leader of its ``__consumer_offsets`` partition.
The topic is created on the first lookup, with the broker's
``offsets.topic.*`` settings, as Kafka creates it; until it exists, or while
its partition has no leader, the answer is COORDINATOR_NOT_AVAILABLE and
clients retry. Transactional ids get a final refusal instead, with the
reason in the error message: there is no transaction coordinator yet.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from shoal.broker.cluster.model import TopicName
from shoal.broker.coordinator.coordinator import OFFSETS_TOPIC
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext
from shoal.broker.topic_admin import AdminError

from shoal.wire import ErrorCode

log = logging.getLogger(__name__)

GROUP: Final = 0
TRANSACTION: Final = 1
BATCHED_VERSION: Final = 4
NO_TRANSACTIONS: Final = "Shoal does not support transactions yet."


async def ensure_offsets_topic(services: BrokerServices) -> str | None:
    """Create __consumer_offsets if it is missing; a reason when it cannot be had now."""
    if TopicName(OFFSETS_TOPIC) in services.image.topics:
        return None
    config = services.groups.config
    try:
        await services.admin.create(
            OFFSETS_TOPIC,
            config.offsets_topic_num_partitions,
            config.offsets_topic_replication_factor,
            {},
            {
                "cleanup.policy": "compact",
                "segment.bytes": str(config.offsets_topic_segment_bytes),
                # As Kafka's: a broker-wide compression.type must not make the
                # leader rebuild the coordinator's own batches.
                "compression.type": "producer",
            },
            validate_only=False,
            internal=True,
        )
    except AdminError as exc:
        if exc.code != "topic_already_exists":
            log.warning(
                "event=offsets_topic_unavailable reason=%s hint=%s",
                exc.message,
                "set SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR to at most the number of brokers",
            )
            return exc.message
    return None


async def _lookup(
    services: BrokerServices, key_type: int, key: str
) -> tuple[ErrorCode, str | None, int, str, int]:
    """(error, message, node id, host, port) for one key."""
    if key_type == TRANSACTION:
        # The one answer every client treats as final at once: librdkafka keeps
        # asking on any other error until its timeout runs out.
        return E.transactional_id_authorization_failed, NO_TRANSACTIONS, -1, "", -1
    if key_type != GROUP:
        return E.invalid_request, f"Unknown coordinator key type {key_type}.", -1, "", -1
    problem = await ensure_offsets_topic(services)
    if problem is not None:
        return E.coordinator_not_available, problem, -1, "", -1
    image = services.image
    topic = image.topics.get(TopicName(OFFSETS_TOPIC))
    state = topic.partitions.get(services.groups.partition_of(key)) if topic else None
    broker = image.brokers.get(state.leader) if state else None
    if broker is None:
        return E.coordinator_not_available, "The group's partition has no leader.", -1, "", -1
    return E.none, None, broker.node_id, broker.host, broker.port


async def handle_find_coordinator(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    key_type = getattr(request, "key_type", GROUP)
    if ctx.version >= BATCHED_VERSION:
        coordinators = []
        for key in request.coordinator_keys:
            code, message, node, host, port = await _lookup(services, key_type, key)
            coordinators.append(
                api.make(
                    "Coordinator",
                    key=key,
                    node_id=node,
                    host=host,
                    port=port,
                    error_code=code,
                    error_message=message,
                )
            )
        return api.response(throttle_time=NO_THROTTLE, coordinators=tuple(coordinators))
    code, message, node, host, port = await _lookup(services, key_type, request.key)
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=code,
        error_message=message,
        node_id=node,
        host=host,
        port=port,
    )
