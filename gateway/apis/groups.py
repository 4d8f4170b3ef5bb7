"""Consumer groups and their committed offsets, inside the tenant's namespace.

Group ids are mapped like topic names (``billing`` is ``acme.billing`` on the
brokers). The membership protocol's own bytes (subscriptions, assignments)
pass through untouched: every member of a tenant's group talks through the
gateway, so they all use the tenant's topic names among themselves.

Kafka's checks: joining, syncing, heartbeats, leaving and committing need
READ on the group; committing also READ on each topic; fetching offsets
DESCRIBE on the group and on each topic; deleting DELETE on the group.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.gateway.apis.base import (
    NO_THROTTLE,
    NOT_REQUESTED,
    Answer,
    E,
    Forward,
    RequestContext,
    Step,
    rename_topics,
    replace,
)
from shoal.tenancy.model import Operation, ResourceType

JOIN_GROUP: Final = 11
_MEMBERSHIP_REFUSALS: Final[dict[int, dict[str, Any]]] = {
    JOIN_GROUP: {
        "generation_id": -1,
        "protocol_type": None,
        "protocol_name": None,
        "leader": "",
        "skip_assignment": False,
        "member_id": "",
        "members": (),
    },
    12: {},
    13: {"members": ()},
    14: {"protocol_type": None, "protocol_name": None, "assignment": b""},
}


async def membership(ctx: RequestContext, request: Any) -> Step:
    """JoinGroup, Heartbeat, LeaveGroup and SyncGroup: one group, READ."""
    if not request.group_id or not ctx.access.may_group(request.group_id, Operation.READ):
        refusal = dict(_MEMBERSHIP_REFUSALS[ctx.api.api_key])
        if ctx.api.api_key == JOIN_GROUP and ctx.version < 7:
            refusal["protocol_name"] = ""  # nullable only from v7
        return Answer(
            ctx.api.response(
                throttle_time=NO_THROTTLE, error_code=E.group_authorization_failed, **refusal
            )
        )
    return Forward(replace(request, group_id=ctx.ns.inward(request.group_id)))


def _refused_partitions(
    ctx: RequestContext, topic_class: str, partition_class: str, topic: Any, code: E
) -> Any:
    return ctx.api.make(
        topic_class,
        name=topic.name,
        partitions=tuple(
            ctx.api.make(partition_class, partition_index=p.partition_index, error_code=code)
            for p in topic.partitions
        ),
    )


async def offset_commit(ctx: RequestContext, request: Any) -> Step:
    return _commit(ctx, request, "OffsetCommitResponseTopic", "OffsetCommitResponsePartition")


async def txn_offset_commit(ctx: RequestContext, request: Any) -> Step:
    txn = request.transactional_id
    if not ctx.access.may_transaction(txn, Operation.WRITE):
        return _commit(
            ctx,
            request,
            "TxnOffsetCommitResponseTopic",
            "TxnOffsetCommitResponsePartition",
            refuse_all=E.transactional_id_authorization_failed,
        )
    return _commit(
        ctx,
        replace(request, transactional_id=ctx.ns.inward(txn)),
        "TxnOffsetCommitResponseTopic",
        "TxnOffsetCommitResponsePartition",
    )


def _commit(
    ctx: RequestContext,
    request: Any,
    topic_class: str,
    partition_class: str,
    refuse_all: E | None = None,
) -> Step:
    ns, access = ctx.ns, ctx.access
    if refuse_all is None and not access.may_group(request.group_id, Operation.READ):
        refuse_all = E.group_authorization_failed
    forwarded, refusals = [], []
    for topic in request.topics:
        code = refuse_all
        if code is None and not (topic.name and access.may_topic(topic.name, Operation.READ)):
            code = E.topic_authorization_failed
        if code is None:
            forwarded.append(replace(topic, name=ns.inward(topic.name)))
        else:
            refusals.append(_refused_partitions(ctx, topic_class, partition_class, topic, code))
    if not forwarded:
        return Answer(ctx.api.response(throttle_time=NO_THROTTLE, topics=tuple(refusals)))

    def finish(response: Any) -> Any:
        return replace(response, topics=rename_topics(response.topics, ns) + tuple(refusals))

    return Forward(
        replace(request, group_id=ns.inward(request.group_id), topics=tuple(forwarded)), finish
    )


async def offset_delete(ctx: RequestContext, request: Any) -> Step:
    ns, access = ctx.ns, ctx.access
    if not access.may_group(request.group_id, Operation.DELETE):
        return Answer(
            ctx.api.response(
                error_code=E.group_authorization_failed, throttle_time=NO_THROTTLE, topics=()
            )
        )
    forwarded, refusals = [], []
    for topic in request.topics:
        if topic.name and access.may_topic(topic.name, Operation.READ):
            forwarded.append(replace(topic, name=ns.inward(topic.name)))
        else:
            refusals.append(
                _refused_partitions(
                    ctx,
                    "OffsetDeleteResponseTopic",
                    "OffsetDeleteResponsePartition",
                    topic,
                    E.topic_authorization_failed,
                )
            )

    def finish(response: Any) -> Any:
        return replace(response, topics=rename_topics(response.topics, ns) + tuple(refusals))

    return Forward(
        replace(request, group_id=ns.inward(request.group_id), topics=tuple(forwarded)), finish
    )


async def offset_fetch(ctx: RequestContext, request: Any) -> Step:
    if ctx.version >= 8:
        return _offset_fetch_groups(ctx, request)
    ns, access, api = ctx.ns, ctx.access, ctx.api
    if not access.may_group(request.group_id, Operation.DESCRIBE):
        return Answer(
            api.response(
                throttle_time=NO_THROTTLE,
                error_code=E.group_authorization_failed,
                topics=_refused_fetch_topics(ctx, request.topics or (), "OffsetFetchResponseTopic"),
            )
        )
    topics, refusals = _split_fetch_topics(ctx, request.topics, "OffsetFetchResponseTopic")

    def finish(response: Any) -> Any:
        return replace(response, topics=_visible_topics(ctx, response.topics) + refusals)

    return Forward(replace(request, group_id=ns.inward(request.group_id), topics=topics), finish)


def _offset_fetch_groups(ctx: RequestContext, request: Any) -> Step:
    ns, access, api = ctx.ns, ctx.access, ctx.api
    forwarded, refused_groups = [], []
    refusals_by_group: dict[str, tuple[Any, ...]] = {}
    for group in request.groups:
        if not access.may_group(group.group_id, Operation.DESCRIBE):
            refused_groups.append(
                api.make(
                    "OffsetFetchResponseGroup",
                    group_id=group.group_id,
                    topics=(),
                    error_code=E.group_authorization_failed,
                )
            )
            continue
        topics, refusals = _split_fetch_topics(ctx, group.topics, "OffsetFetchResponseTopics")
        refusals_by_group[ns.inward(group.group_id)] = refusals
        forwarded.append(replace(group, group_id=ns.inward(group.group_id), topics=topics))
    if not forwarded:
        return Answer(api.response(throttle_time=NO_THROTTLE, groups=tuple(refused_groups)))

    def finish(response: Any) -> Any:
        groups = []
        for group in response.groups:
            group_id = ns.outward_id(group.group_id)
            if group_id is None:
                continue
            topics = _visible_topics(ctx, group.topics) + refusals_by_group.get(group.group_id, ())
            groups.append(replace(group, group_id=group_id, topics=topics))
        return replace(response, groups=tuple(groups) + tuple(refused_groups))

    return Forward(replace(request, groups=tuple(forwarded)), finish)


def _split_fetch_topics(
    ctx: RequestContext, topics: Any, topic_class: str
) -> tuple[tuple[Any, ...] | None, tuple[Any, ...]]:
    """(topics to ask the broker for, refused slots); None still means every topic."""
    if topics is None:
        return None, ()
    allowed, refused = [], []
    for topic in topics:
        if topic.name and ctx.access.may_topic(topic.name, Operation.DESCRIBE):
            allowed.append(replace(topic, name=ctx.ns.inward(topic.name)))
        else:
            refused.append(topic)
    return tuple(allowed), _refused_fetch_topics(ctx, refused, topic_class)


def _refused_fetch_topics(ctx: RequestContext, topics: Any, topic_class: str) -> tuple[Any, ...]:
    partition_class = (
        "OffsetFetchResponsePartitions" if ctx.version >= 8 else "OffsetFetchResponsePartition"
    )
    return tuple(
        ctx.api.make(
            topic_class,
            name=topic.name,
            partitions=tuple(
                ctx.api.make(
                    partition_class,
                    partition_index=index,
                    committed_offset=-1,
                    committed_leader_epoch=-1,
                    metadata=None,
                    error_code=E.topic_authorization_failed,
                )
                for index in topic.partition_indexes
            ),
        )
        for topic in topics
    )


def _visible_topics(ctx: RequestContext, topics: Any) -> tuple[Any, ...]:
    """The tenant's topics the key may describe, under the tenant's names."""
    return tuple(
        t for t in rename_topics(topics, ctx.ns) if ctx.access.may_topic(t.name, Operation.DESCRIBE)
    )


async def describe_groups(ctx: RequestContext, request: Any) -> Step:
    ns, access, api = ctx.ns, ctx.access, ctx.api
    want_ops = getattr(request, "include_authorized_operations", False)
    forwarded, refusals = [], []
    for group_id in request.groups:
        if group_id and access.may_group(group_id, Operation.DESCRIBE):
            forwarded.append(ns.inward(group_id))
        else:
            refusals.append(
                api.make(
                    "DescribedGroup",
                    error_code=E.group_authorization_failed,
                    group_id=group_id,
                    group_state="",
                    protocol_type="",
                    protocol_data="",
                    members=(),
                    authorized_operations=NOT_REQUESTED,
                )
            )
    if not forwarded:
        return Answer(api.response(throttle_time=NO_THROTTLE, groups=tuple(refusals)))

    def finish(response: Any) -> Any:
        groups = []
        for group in response.groups:
            group_id = ns.outward_id(group.group_id)
            if group_id is None:
                continue
            changes: dict[str, Any] = {"group_id": group_id}
            if want_ops:
                changes["authorized_operations"] = access.authorized_operations(
                    ResourceType.GROUP, group_id
                )
            groups.append(replace(group, **changes))
        return replace(response, groups=tuple(groups) + tuple(refusals))

    return Forward(replace(request, groups=tuple(forwarded)), finish)


async def list_groups(ctx: RequestContext, request: Any) -> Step:
    ns, access = ctx.ns, ctx.access

    def finish(response: Any) -> Any:
        groups = []
        for group in response.groups:
            group_id = ns.outward_id(group.group_id)
            if group_id is not None and access.may_group(group_id, Operation.DESCRIBE):
                groups.append(replace(group, group_id=group_id))
        return replace(response, groups=tuple(groups))

    return Forward(request, finish)


async def delete_groups(ctx: RequestContext, request: Any) -> Step:
    ns, access, api = ctx.ns, ctx.access, ctx.api
    forwarded, refusals = [], []
    for group_id in request.groups_names:
        if group_id and access.may_group(group_id, Operation.DELETE):
            forwarded.append(ns.inward(group_id))
        else:
            refusals.append(
                api.make(
                    "DeletableGroupResult",
                    group_id=group_id,
                    error_code=E.group_authorization_failed,
                )
            )
    if not forwarded:
        return Answer(api.response(throttle_time=NO_THROTTLE, results=tuple(refusals)))

    def finish(response: Any) -> Any:
        results = []
        for result in response.results:
            group_id = ns.outward_id(result.group_id)
            if group_id is not None:
                results.append(replace(result, group_id=group_id))
        return replace(response, results=tuple(results) + tuple(refusals))

    return Forward(replace(request, groups_names=tuple(forwarded)), finish)
