"""FindCoordinator (10): which broker coordinates a group or a transactional id
(single and batched forms).

A group's coordinator is the leader of its ``__consumer_offsets`` partition,
a transactional id's the leader of its ``__transaction_state`` partition.
Each topic is created on the first lookup of its kind, with the broker's
``offsets.topic.*`` or ``transaction.state.log.*`` settings, as Kafka
creates them; until it exists, or while the partition has no leader, the
answer is COORDINATOR_NOT_AVAILABLE and clients retry.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from shoal.broker.cluster.model import TopicName
from shoal.broker.coordinator.coordinator import OFFSETS_TOPIC
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext
from shoal.broker.topic_admin import AdminError
from shoal.broker.txn.coordinator import TXN_TOPIC

from shoal.wire import ErrorCode

log = logging.getLogger(__name__)

GROUP: Final = 0
TRANSACTION: Final = 1
BATCHED_VERSION: Final = 4


async def ensure_offsets_topic(services: BrokerServices) -> str | None:
    """Create __consumer_offsets if it is missing; a reason when it cannot be had now."""
    config = services.groups.config
    return await _ensure_internal_topic(
        services,
        OFFSETS_TOPIC,
        config.offsets_topic_num_partitions,
        config.offsets_topic_replication_factor,
        {"segment.bytes": str(config.offsets_topic_segment_bytes)},
        "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR",
    )


async def ensure_transaction_state_topic(services: BrokerServices) -> str | None:
    """Create __transaction_state if it is missing; a reason when it cannot be had now."""
    config = services.transactions.config
    replication = config.transaction_state_log_replication_factor
    return await _ensure_internal_topic(
        services,
        TXN_TOPIC,
        config.transaction_state_log_num_partitions,
        replication,
        {
            "segment.bytes": str(config.transaction_state_log_segment_bytes),
            "min.insync.replicas": str(min(config.transaction_state_log_min_isr, replication)),
        },
        "SHOAL_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
    )


async def _ensure_internal_topic(
    services: BrokerServices,
    name: str,
    partitions: int,
    replication: int,
    configs: dict[str, str],
    setting: str,
) -> str | None:
    if TopicName(name) in services.image.topics:
        return None
    try:
        await services.admin.create(
            name,
            partitions,
            replication,
            {},
            {
                "cleanup.policy": "compact",
                # As Kafka's: a broker-wide compression.type must not make the
                # leader rebuild the coordinator's own batches.
                "compression.type": "producer",
                **configs,
            },
            validate_only=False,
            internal=True,
        )
    except AdminError as exc:
        if exc.code != "topic_already_exists":
            log.warning(
                "event=internal_topic_unavailable topic=%s reason=%s hint=%s",
                name,
                exc.message,
                f"set {setting} to at most the number of brokers",
            )
            return exc.message
    return None


async def _lookup(
    services: BrokerServices, key_type: int, key: str
) -> tuple[ErrorCode, str | None, int, str, int]:
    """(error, message, node id, host, port) for one key."""
    if key_type == GROUP:
        topic_name, index = OFFSETS_TOPIC, services.groups.partition_of(key)
        problem = await ensure_offsets_topic(services)
    elif key_type == TRANSACTION:
        # An empty id has a coordinator too, as in Kafka; InitProducerId refuses it.
        topic_name, index = TXN_TOPIC, services.transactions.partition_of(key)
        problem = await ensure_transaction_state_topic(services)
    else:
        return E.invalid_request, f"Unknown coordinator key type {key_type}.", -1, "", -1
    if problem is not None:
        return E.coordinator_not_available, problem, -1, "", -1
    image = services.image
    topic = image.topics.get(TopicName(topic_name))
    state = topic.partitions.get(index) if topic else None
    broker = image.brokers.get(state.leader) if state else None
    if broker is None:
        return E.coordinator_not_available, f"{topic_name}-{index} has no leader.", -1, "", -1
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
