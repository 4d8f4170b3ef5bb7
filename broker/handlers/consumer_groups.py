"""ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69): KIP-848 consumer groups.

The handlers translate between kio's entities and
:class:`~shoal.broker.coordinator.consumer_coordinator.ConsumerCoordinator`,
which holds the rules. Partitions travel by topic id; ConsumerGroupDescribe
adds each topic's name from the metadata image (a deleted topic's partitions
are left out, as Kafka leaves them out).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shoal.broker.coordinator.assignors import Partitions, TopicId
from shoal.broker.coordinator.consumer_coordinator import Heartbeat
from shoal.broker.coordinator.consumer_group import ConsumerGroup
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext
from shoal.broker.handlers.groups import client_host

CONSUMER_MEMBER_TYPE = 1
"""ConsumerGroupDescribe v1's member type: 0 classic, 1 consumer (KIP-1099)."""


def _ms(value: timedelta) -> int:
    return round(value.total_seconds() * 1000)


async def handle_consumer_group_heartbeat(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    owned = (
        None
        if request.topic_partitions is None
        else {
            tp.topic_id: frozenset(tp.partitions)
            for tp in request.topic_partitions
            if tp.topic_id is not None
        }
    )
    result = await services.groups.consumer.heartbeat(
        Heartbeat(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout_ms=_ms(request.rebalance_timeout),
            subscribed_topic_names=(
                None
                if request.subscribed_topic_names is None
                else tuple(request.subscribed_topic_names)
            ),
            subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
            server_assignor=request.server_assignor,
            owned=owned,
            client_id=ctx.header.client_id or "",
            client_host=client_host(ctx),
            version=ctx.version,
        )
    )
    api = ctx.api
    assignment = None
    if result.assignment is not None:
        assignment = api.make(
            "Assignment", topic_partitions=_topic_partitions(api, result.assignment)
        )
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        error_message=result.message,
        member_id=result.member_id,
        member_epoch=result.member_epoch,
        heartbeat_interval=_timedelta(result.heartbeat_interval_ms),
        assignment=assignment,
    )


def _timedelta(ms: int) -> timedelta:
    return timedelta(milliseconds=ms)


def _topic_partitions(api: Any, partitions: Partitions) -> tuple[Any, ...]:
    return tuple(
        api.make("TopicPartitions", topic_id=topic_id, partitions=tuple(sorted(numbers)))
        for topic_id, numbers in sorted(partitions.items())
        if numbers
    )


async def handle_consumer_group_describe(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    consumer = services.groups.consumer
    names = consumer.topic_names()
    described = []
    for group_id in request.group_ids:
        found = consumer.describe(group_id)
        if not isinstance(found, ConsumerGroup):
            described.append(
                api.make(
                    "DescribedGroup",
                    error_code=found,
                    error_message=(
                        f"Group {group_id} not found." if found is E.group_id_not_found else None
                    ),
                    group_id=group_id,
                    group_state="",
                    group_epoch=0,
                    assignment_epoch=0,
                    assignor_name="",
                    members=(),
                )
            )
            continue
        described.append(_described(api, found, names))
    return api.response(throttle_time=NO_THROTTLE, groups=tuple(described))


def _described(api: Any, group: ConsumerGroup, names: dict[TopicId, str]) -> Any:
    def assignment(partitions: Partitions) -> Any:
        return api.make(
            "Assignment",
            topic_partitions=tuple(
                api.make(
                    "TopicPartitions",
                    topic_id=topic_id,
                    topic_name=names[topic_id],
                    partitions=tuple(sorted(numbers)),
                )
                for topic_id, numbers in sorted(partitions.items())
                if numbers and topic_id in names
            ),
        )

    return api.make(
        "DescribedGroup",
        error_code=E.none,
        group_id=group.group_id,
        group_state=group.state.value,
        group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        assignor_name=group.preferred_assignor(),
        members=tuple(
            api.make(
                "Member",
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=m.rack_id,
                member_epoch=m.member_epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=m.subscribed_topic_names,
                subscribed_topic_regex=m.subscribed_topic_regex,
                assignment=assignment(m.assigned),
                target_assignment=assignment(group.target.get(m.member_id, {})),
                member_type=CONSUMER_MEMBER_TYPE,
            )
            for m in group.members.values()
        ),
    )
