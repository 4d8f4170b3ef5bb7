"""AlterPartition (56): leaders ask the controller to change their ISR.

An inter-broker API, as in Kafka: only the controller answers (others say
NOT_CONTROLLER); the checks are :func:`shoal.broker.controller.decisions.alter_isr`.
Tenants never reach it: the gateway does not forward it.
"""

from __future__ import annotations

from typing import Any

from shoal.broker.cluster.model import NodeId
from shoal.broker.controller.controller import NotControllerError
from shoal.broker.controller.decisions import IsrChangeRequest
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext, error


async def handle_alter_partition(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    asked = [
        IsrChangeRequest(
            NodeId(request.broker_id),
            topic.topic_id,
            p.partition_index,
            p.leader_epoch,
            p.partition_epoch,
            tuple(NodeId(b.broker_id) for b in p.new_isr_with_epochs),
        )
        for topic in request.topics
        for p in topic.partitions
    ]
    try:
        results = await services.controller.alter_partitions(asked)
    except NotControllerError:
        return api.response(throttle_time=NO_THROTTLE, error_code=E.not_controller, topics=())
    by_topic: dict[Any, list[Any]] = {}
    for result in results:
        state = result.state
        by_topic.setdefault(result.request.topic_id, []).append(
            api.make(
                "PartitionData",
                partition_index=result.request.index,
                error_code=E.none if result.code is None else error(result.code),
                leader_id=state.leader if state else -1,
                leader_epoch=state.leader_epoch if state else -1,
                isr=state.isr if state else (),
                leader_recovery_state=0,
                partition_epoch=state.partition_epoch if state else -1,
            )
        )
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=E.none,
        topics=tuple(
            api.make("TopicData", topic_id=topic_id, partitions=tuple(parts))
            for topic_id, parts in by_topic.items()
        ),
    )
