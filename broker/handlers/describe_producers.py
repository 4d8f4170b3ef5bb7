"""DescribeProducers (61): the active producers of partitions this broker hosts (KIP-664).

What ``kafka-transactions.sh describe-producers`` shows, and where an operator
finds a hanging transaction: a producer whose ``current_txn_start_offset`` is
not -1 has a transaction open in that partition from that offset, which holds
back the last stable offset and so every read_committed consumer.

As Kafka's ``ReplicaManager.activeProducerState``: answered by any replica
with the partition's log, leader or follower (followers rebuild the producer
state from what they replicate), because ``describe-producers --broker-id``
and ``find-hanging --broker-id`` ask one broker about every partition it has a
replica of. NOT_LEADER_OR_FOLLOWER where this broker hosts no replica,
UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist. The answer is
the log's producer state, the entries a snapshot would write. Clients without
``--broker-id`` ask the leader, as Kafka's admin client does.
"""

from __future__ import annotations

from typing import Any

from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext, error
from shoal.broker.partition import PartitionError


async def handle_describe_producers(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    return api.response(
        throttle_time=NO_THROTTLE,
        topics=tuple(
            api.make(
                "TopicResponse",
                name=topic.name,
                partitions=tuple(
                    _describe(services, api, topic.name, index) for index in topic.partition_indexes
                ),
            )
            for topic in request.topics
        ),
    )


def _describe(services: BrokerServices, api: Any, topic: str, index: int) -> Any:
    try:
        partition = services.partition(topic, index)
    except PartitionError as exc:
        return api.make(
            "PartitionResponse",
            partition_index=index,
            error_code=error(exc.code),
            error_message=str(exc),
            active_producers=(),
        )
    producers = partition.log.producer_state.producers
    return api.make(
        "PartitionResponse",
        partition_index=index,
        error_code=E.none,
        error_message=None,
        active_producers=tuple(
            api.make(
                "ProducerState",
                producer_id=entry.producer_id,
                producer_epoch=entry.epoch,
                last_sequence=entry.last_sequence,
                last_timestamp=entry.last_timestamp,
                coordinator_epoch=entry.coordinator_epoch,
                current_txn_start_offset=entry.current_txn_first_offset,
            )
            for entry in sorted(producers.values(), key=lambda e: e.producer_id)
        ),
    )
