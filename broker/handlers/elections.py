"""ElectLeaders (43): an admin asks for preferred or unclean leader elections, KIP-460.

Leadership is the controller's decision
(:func:`shoal.broker.controller.decisions.elect_requested`): another broker
forwards the request as it is and answers once its own image shows the new
leaders, so the client's next Metadata there sees them; with no controller
reachable every partition is answered NOT_CONTROLLER and the client retries.
Version 0 knows only preferred elections and has no top-level error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from shoal.broker.cluster.model import NO_LEADER, ClusterImage, TopicName
from shoal.broker.controller.controller import NotControllerError
from shoal.broker.controller.decisions import PREFERRED_ELECTION, ElectionOutcome
from shoal.broker.controller.forwarding import ForwardingError
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext, error

log = logging.getLogger(__name__)

_SETTLE_S: Final = 10.0


def _wanted(request: Any) -> list[tuple[str, int]] | None:
    if request.topic_partitions is None:
        return None
    return [(t.topic, p) for t in request.topic_partitions for p in t.partitions]


def _election_type(request: Any) -> int:
    return int(getattr(request, "election_type", PREFERRED_ELECTION))


def _settled(election_type: int, response: Any) -> Callable[[ClusterImage], bool]:
    """Whether an image shows the leaders the controller elected."""
    elected = [
        (result.topic, p.partition_id)
        for result in response.replica_election_results
        for p in result.partition_result
        if p.error_code is E.none
    ]

    def settled(image: ClusterImage) -> bool:
        for name, index in elected:
            topic = image.topics.get(TopicName(name))
            state = topic.partitions.get(index) if topic is not None else None
            if topic is None or state is None:
                continue
            if election_type == PREFERRED_ELECTION:
                if state.leader != topic.record.assignment[index][0]:
                    return False
            elif state.leader == NO_LEADER:
                return False
        return True

    return settled


async def handle_elect_leaders(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    election_type = _election_type(request)
    if not services.forwarder.is_controller():
        try:
            response = await services.forwarder.forward(ctx.api, request)
        except ForwardingError as exc:
            log.warning("event=admin_forward_failed api=%d error=%s", ctx.api.api_key, exc)
            return _everyone(ctx, request, E.not_controller, str(exc))
        await services.cache.wait_until(_settled(election_type, response), _SETTLE_S)
        return response
    try:
        outcomes, revision = await services.controller.elect(_wanted(request), election_type)
    except NotControllerError:
        message = f"broker {services.node_id} is no longer the controller"
        return _everyone(ctx, request, E.not_controller, message)
    if revision:
        await services.cache.wait_for(revision, _SETTLE_S)
    return _response(ctx, E.none, outcomes)


def _response(ctx: RequestContext, code: E, outcomes: list[ElectionOutcome]) -> Any:
    api = ctx.api
    by_topic: dict[str, list[Any]] = {}
    for outcome in outcomes:
        by_topic.setdefault(outcome.topic, []).append(
            api.make(
                "PartitionResult",
                partition_id=outcome.index,
                error_code=E.none if outcome.code is None else error(outcome.code),
                error_message=outcome.message,
            )
        )
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=code,
        replica_election_results=tuple(
            api.make("ReplicaElectionResult", topic=name, partition_result=tuple(parts))
            for name, parts in by_topic.items()
        ),
    )


def _everyone(ctx: RequestContext, request: Any, code: E, message: str) -> Any:
    """Every partition asked for refused with ``code`` (none listed when all were asked)."""
    outcomes = [
        ElectionOutcome(name, index, None, code.name, message)
        for name, index in _wanted(request) or []
    ]
    return _response(ctx, E.none, outcomes)
