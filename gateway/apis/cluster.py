"""Metadata, DescribeCluster and FindCoordinator: where things are, as the tenant sees them.

Every broker address becomes this gateway's address for that broker (one
port per broker on the listener the client came in through), so clients
never learn, and never need, the brokers' own addresses. Topic listings show
the tenant's topics only; internal topics and other tenants' topics are not
mentioned. A topic named explicitly that the key may not describe is
answered with TOPIC_AUTHORIZATION_FAILED, as Kafka answers it.

Topics are never auto-created through the gateway: creation goes through
CreateTopics, where ACLs and the partition limit are checked.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.gateway.apis.base import (
    NO_THROTTLE,
    NOT_REQUESTED,
    ZERO_UUID,
    Answer,
    E,
    Forward,
    RequestContext,
    Step,
    has_field,
    replace,
)
from shoal.tenancy.model import Operation, ResourceType

GROUP_KEY: Final = 0
TRANSACTION_KEY: Final = 1


def _brokers(ctx: RequestContext, brokers: Any, id_field: str) -> tuple[Any, ...]:
    out = []
    for broker in brokers:
        address = ctx.lookups.gateway_address(getattr(broker, id_field))
        if address is not None:
            out.append(replace(broker, host=address[0], port=address[1]))
    return tuple(out)


async def metadata(ctx: RequestContext, request: Any) -> Step:
    api, ns, access = ctx.api, ctx.ns, ctx.access
    want_ops = getattr(request, "include_topic_authorized_operations", False)
    # v0 asks for every topic with an empty list; later versions with null.
    listing = request.topics is None or (ctx.version == 0 and not request.topics)
    forwarded, refused = [], []
    for topic in request.topics or ():
        name = topic.name
        topic_id = getattr(topic, "topic_id", None)
        if not name and topic_id not in (None, ZERO_UUID):
            # By id (v10+): only an id of the tenant's own topic is looked up.
            name = ns.outward(await ctx.lookups.topic_name(topic_id))
            if name is None:
                refused.append((None, topic_id, E.unknown_topic_id))
                continue
        if name and access.may_topic(name, Operation.DESCRIBE):
            forwarded.append(
                api.make_request("MetadataRequestTopic", name=ns.inward(name), topic_id=None)
            )
        else:
            refused.append((name, topic_id, E.topic_authorization_failed))
    refusals = tuple(
        api.make(
            "MetadataResponseTopic",
            error_code=code,
            name=name,
            topic_id=topic_id or ZERO_UUID,
            is_internal=False,
            partitions=(),
            topic_authorized_operations=NOT_REQUESTED,
        )
        for name, topic_id, code in refused
    )
    # v0 cannot say null: its empty list is "every topic".
    every_topic = () if ctx.version == 0 else None
    changes: dict[str, Any] = {"topics": every_topic if listing else tuple(forwarded)}
    if has_field(request, "allow_auto_topic_creation"):
        changes["allow_auto_topic_creation"] = False

    asked = {t.name for t in forwarded}

    def finish(response: Any) -> Any:
        ctx.lookups.remember_topic_ids(
            {t.topic_id: t.name for t in response.topics if getattr(t, "topic_id", None)}
        )
        topics = []
        for topic in response.topics:
            name = ns.outward(topic.name)
            if name is None or not (listing or topic.name in asked):
                continue
            if listing and not access.may_topic(name, Operation.DESCRIBE):
                continue
            changes: dict[str, Any] = {"name": name}
            if has_field(topic, "is_internal"):
                changes["is_internal"] = False
            if want_ops:
                changes["topic_authorized_operations"] = access.authorized_operations(
                    ResourceType.TOPIC, name
                )
            topics.append(replace(topic, **changes))
        out: dict[str, Any] = {
            "brokers": _brokers(ctx, response.brokers, "node_id"),
            "topics": tuple(topics) + refusals,
        }
        if getattr(request, "include_cluster_authorized_operations", False):
            out["cluster_authorized_operations"] = access.authorized_operations(
                ResourceType.CLUSTER, ""
            )
        return replace(response, **out)

    if not listing and not forwarded:
        # Nothing to ask about, but the client still needs the brokers: ask for none.
        changes["topics"] = ()
    return Forward(replace(request, **changes), finish)


async def describe_cluster(ctx: RequestContext, request: Any) -> Step:
    # Kafka answers DescribeCluster to every authenticated principal and checks
    # DESCRIBE on the cluster only for the authorized operations it was asked
    # for (0 when refused): its Admin client sends DescribeCluster before every
    # describeTopics, so a refusal here breaks Kafka Streams and the CLI tools.
    def finish(response: Any) -> Any:
        changes: dict[str, Any] = {"brokers": _brokers(ctx, response.brokers, "broker_id")}
        if request.include_cluster_authorized_operations:
            changes["cluster_authorized_operations"] = (
                ctx.access.authorized_operations(ResourceType.CLUSTER, "")
                if ctx.access.may_cluster(Operation.DESCRIBE)
                else 0
            )
        return replace(response, **changes)

    return Forward(request, finish)


def _may_find(ctx: RequestContext, key_type: int, key: str) -> E | None:
    if key_type == GROUP_KEY:
        allowed = ctx.access.may_group(key, Operation.DESCRIBE)
        return None if allowed else E.group_authorization_failed
    if key_type == TRANSACTION_KEY:
        allowed = ctx.access.may_transaction(key, Operation.DESCRIBE)
        return None if allowed else E.transactional_id_authorization_failed
    return E.invalid_request


async def find_coordinator(ctx: RequestContext, request: Any) -> Step:
    api, ns = ctx.api, ctx.ns
    key_type = getattr(request, "key_type", GROUP_KEY)
    if ctx.version < 4:
        refusal = _may_find(ctx, key_type, request.key)
        if refusal is not None:
            return Answer(
                api.response(
                    throttle_time=NO_THROTTLE,
                    error_code=refusal,
                    error_message=None,
                    node_id=-1,
                    host="",
                    port=-1,
                )
            )

        def finish_one(response: Any) -> Any:
            address = ctx.lookups.gateway_address(response.node_id)
            if response.error_code != E.none or address is None:
                return response
            return replace(response, host=address[0], port=address[1])

        return Forward(replace(request, key=ns.inward(request.key)), finish_one)

    forwarded, refusals = [], []
    for key in request.coordinator_keys:
        refusal = _may_find(ctx, key_type, key)
        if refusal is None:
            forwarded.append(ns.inward(key))
        else:
            refusals.append(
                api.make(
                    "Coordinator",
                    key=key,
                    node_id=-1,
                    host="",
                    port=-1,
                    error_code=refusal,
                    error_message=None,
                )
            )
    if not forwarded:
        return Answer(api.response(throttle_time=NO_THROTTLE, coordinators=tuple(refusals)))

    def finish(response: Any) -> Any:
        found = []
        for coordinator in response.coordinators:
            key = ns.outward_id(coordinator.key)
            if key is None:
                continue
            address = ctx.lookups.gateway_address(coordinator.node_id)
            changes: dict[str, Any] = {"key": key}
            if coordinator.error_code == E.none and address is not None:
                changes.update(host=address[0], port=address[1])
            found.append(replace(coordinator, **changes))
        return replace(response, coordinators=tuple(found) + tuple(refusals))

    return Forward(replace(request, coordinator_keys=tuple(forwarded)), finish)
