"""JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13), ListGroups (16),
DescribeGroups (15), DeleteGroups (42): the group coordinator's requests.

These handlers translate between the wire (every version's fields) and
:class:`~shoal.broker.coordinator.coordinator.GroupCoordinator`, which holds
the rules.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from shoal.broker.coordinator.coordinator import JoinResult
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext

REQUIRE_MEMBER_ID_VERSION: Final = 4
NULLABLE_PROTOCOL_NAME_VERSION: Final = 7


def _ms(value: timedelta) -> int:
    return round(value.total_seconds() * 1000)


def client_host(ctx: RequestContext) -> str:
    """Kafka's form: the peer address with a leading slash."""
    return "/" + ctx.connection.peer.rsplit(":", 1)[0]


async def handle_join_group(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    session_ms = _ms(request.session_timeout)
    rebalance = getattr(request, "rebalance_timeout", None)
    result = await services.groups.join_group(
        request.group_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        ctx.header.client_id or "",
        client_host(ctx),
        session_ms,
        session_ms if rebalance is None else _ms(rebalance),
        request.protocol_type,
        [(p.name, p.metadata) for p in request.protocols],
        ctx.version >= REQUIRE_MEMBER_ID_VERSION,
    )
    return _join_response(ctx, result)


def _join_response(ctx: RequestContext, result: JoinResult) -> Any:
    api = ctx.api
    nullable = ctx.version >= NULLABLE_PROTOCOL_NAME_VERSION
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        generation_id=result.generation,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name if nullable else (result.protocol_name or ""),
        leader=result.leader,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=tuple(
            api.make(
                "JoinGroupResponseMember",
                member_id=member_id,
                group_instance_id=instance,
                metadata=metadata,
            )
            for member_id, instance, metadata in result.members
        ),
    )


async def handle_sync_group(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    result = await services.groups.sync_group(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        getattr(request, "protocol_type", None),
        getattr(request, "protocol_name", None),
        {a.member_id: a.assignment for a in request.assignments},
    )
    return ctx.api.response(
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


async def handle_heartbeat(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    code = services.groups.heartbeat(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
    )
    return ctx.api.response(throttle_time=NO_THROTTLE, error_code=code)


async def handle_leave_group(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    batched = hasattr(request, "members")
    leaving = (
        [(m.member_id, m.group_instance_id) for m in request.members]
        if batched
        else [(request.member_id, None)]
    )
    code, results = services.groups.leave_group(request.group_id, leaving)
    if not batched:
        if code is E.none and results:
            code = results[0][2]
        return api.response(throttle_time=NO_THROTTLE, error_code=code)
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=code,
        members=tuple(
            api.make(
                "MemberResponse",
                member_id=member_id,
                group_instance_id=instance,
                error_code=error,
            )
            for member_id, instance, error in results
        ),
    )


async def handle_list_groups(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    groups = services.groups.list_groups(
        set(getattr(request, "states_filter", ()) or ()),
        set(getattr(request, "types_filter", ()) or ()),
    )
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=E.none,
        groups=tuple(
            api.make(
                "ListedGroup",
                group_id=g.group_id,
                protocol_type=g.protocol_type,
                group_state=g.state,
                group_type=g.group_type,
            )
            for g in groups
        ),
    )


async def handle_describe_groups(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    described = []
    for group_id in request.groups:
        group = services.groups.describe_group(group_id)
        described.append(
            api.make(
                "DescribedGroup",
                error_code=group.error,
                group_id=group.group_id,
                group_state=group.state,
                protocol_type=group.protocol_type,
                protocol_data=group.protocol_name,
                members=tuple(
                    api.make(
                        "DescribedGroupMember",
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata_for(group.protocol_name),
                        member_assignment=m.assignment,
                    )
                    for m in group.members
                ),
                authorized_operations=-(2**31),
            )
        )
    return api.response(throttle_time=NO_THROTTLE, groups=tuple(described))


async def handle_delete_groups(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    results = []
    for group_id in request.groups_names:
        code = await services.groups.delete_group(group_id)
        results.append(api.make("DeletableGroupResult", group_id=group_id, error_code=code))
    return api.response(throttle_time=NO_THROTTLE, results=tuple(results))
