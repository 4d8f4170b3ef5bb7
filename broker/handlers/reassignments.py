"""AlterPartitionReassignments (45) and ListPartitionReassignments (46), KIP-455.

Moving replicas is the controller's decision
(:mod:`shoal.broker.controller.reassignments`): another broker forwards the
request as it is and answers once its own image shows the result, so the
client's next Metadata or ListPartitionReassignments there sees it; with no
controller reachable the answer is NOT_CONTROLLER and the client retries.
Listing reads this broker's image. Operators only: the gateway does not
forward either API, so tenants cannot move partitions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from shoal.broker.cluster.model import ClusterImage, NodeId, TopicName
from shoal.broker.controller.controller import NotControllerError
from shoal.broker.controller.forwarding import ForwardingError
from shoal.broker.controller.reassignments import ReassignmentRequest, ongoing
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext, error

log = logging.getLogger(__name__)

_SETTLE_S: Final = 10.0


def _requests(request: Any) -> list[ReassignmentRequest]:
    return [
        ReassignmentRequest(
            topic.name,
            p.partition_index,
            None if p.replicas is None else tuple(NodeId(n) for n in p.replicas),
        )
        for topic in request.topics
        for p in topic.partitions
    ]


def _settled(asked: list[ReassignmentRequest], response: Any) -> Callable[[ClusterImage], bool]:
    """Whether an image shows what the controller accepted: a target's replicas all
    assigned (moving or arrived), a cancelled partition no longer moving."""
    ok = {
        (topic.name, p.partition_index)
        for topic in response.responses
        for p in topic.partitions
        if p.error_code is E.none
    }
    wanted = [r for r in asked if (r.topic, r.index) in ok]

    def settled(image: ClusterImage) -> bool:
        for r in wanted:
            topic = image.topics.get(TopicName(r.topic))
            state = topic.partitions.get(r.index) if topic is not None else None
            if topic is None or state is None:
                continue
            if r.target is None and state.reassigning:
                return False
            if r.target is not None and not set(r.target) <= set(topic.record.assignment[r.index]):
                return False
        return True

    return settled


async def handle_alter_partition_reassignments(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    asked = _requests(request)
    if not services.forwarder.is_controller():
        try:
            response = await services.forwarder.forward(api, request)
        except ForwardingError as exc:
            log.warning("event=admin_forward_failed api=%d error=%s", api.api_key, exc)
            return _refused(ctx, str(exc))
        await services.cache.wait_until(_settled(asked, response), _SETTLE_S)
        return response
    try:
        results, revision = await services.controller.alter_reassignments(asked)
    except NotControllerError:
        return _refused(ctx, f"broker {services.node_id} is no longer the controller")
    if revision:
        await services.cache.wait_for(revision, _SETTLE_S)
    by_topic: dict[str, list[Any]] = {}
    for result in results:
        by_topic.setdefault(result.request.topic, []).append(
            api.make(
                "ReassignablePartitionResponse",
                partition_index=result.request.index,
                error_code=E.none if result.code is None else error(result.code),
                error_message=result.message,
            )
        )
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=E.none,
        error_message=None,
        responses=tuple(
            api.make("ReassignableTopicResponse", name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()
        ),
    )


def _refused(ctx: RequestContext, message: str) -> Any:
    return ctx.api.response(
        throttle_time=NO_THROTTLE, error_code=E.not_controller, error_message=message, responses=()
    )


async def handle_list_partition_reassignments(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    """Partitions being moved: all of them, or those asked for (unknown ones are left out,
    as in Kafka)."""
    api = ctx.api
    wanted = (
        None
        if request.topics is None
        else {(t.name, i) for t in request.topics for i in t.partition_indexes}
    )
    by_topic: dict[str, list[Any]] = {}
    for name, index, replicas, state in ongoing(services.image):
        if wanted is not None and (name, index) not in wanted:
            continue
        by_topic.setdefault(name, []).append(
            api.make(
                "OngoingPartitionReassignment",
                partition_index=index,
                replicas=replicas,
                adding_replicas=state.adding,
                removing_replicas=state.removing,
            )
        )
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=E.none,
        error_message=None,
        topics=tuple(
            api.make("OngoingTopicReassignment", name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()
        ),
    )
