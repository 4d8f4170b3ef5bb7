"""Topic administration inside the tenant's namespace, with the partition limit.

CreateTopics needs CREATE on the cluster or on the topic, DeleteTopics DELETE,
CreatePartitions ALTER, DescribeConfigs DESCRIBE_CONFIGS and AlterConfigs and
IncrementalAlterConfigs ALTER_CONFIGS on the topic. Broker and logger configs
are the platform's: only a platform admin's key may change them or read them
whole. A tenant with DESCRIBE_CONFIGS on its cluster may read a few broker
configs its clients need (:mod:`shoal.gateway.apis.broker_configs`); anything
else about brokers gets CLUSTER_AUTHORIZATION_FAILED.

A tenant with ``max_partitions`` may not hold more partitions than that in
total: a CreateTopics or CreatePartitions that would pass it is refused with
POLICY_VIOLATION for the topics that do not fit, checked in request order.
The count is read from the brokers just before the check, so two requests
racing from two connections can both pass it; the limit is a guard against
mistakes and runaway scripts, not a hard reservation.

A tenant with ``controller_mutation_rate`` (Kafka's KIP-599 quota) is charged
the partitions each topic creates or deletes, in request order, after the
checks above (:mod:`shoal.gateway.mutation_quota`): at CreateTopics v6+,
CreatePartitions v3+ and DeleteTopics v5+ a topic over the quota is refused
with THROTTLING_QUOTA_EXCEEDED; older versions are let through and throttled.
Either way the answer's ``throttle_time_ms`` says how long until the quota has
room again, and the connection is muted that long (KIP-219). validate_only
requests are charged too, as Kafka 4.3 (KRaft) charges them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final

from shoal.gateway.apis.base import (
    NO_THROTTLE,
    ZERO_UUID,
    Answer,
    E,
    Forward,
    RequestContext,
    Step,
    rename_topics,
    replace,
    scrubbed,
)
from shoal.gateway.apis.broker_configs import tenant_view
from shoal.gateway.mutation_quota import MutationVerdict
from shoal.tenancy.model import Operation

TOPIC_RESOURCE: Final = 2
STRICT_CREATE_TOPICS: Final = 6
STRICT_CREATE_PARTITIONS: Final = 3
STRICT_DELETE_TOPICS: Final = 5
"""The first versions of each API whose clients know THROTTLING_QUOTA_EXCEEDED (KIP-599)."""
BROKER_RESOURCE: Final = 4
BROKER_LOGGER_RESOURCE: Final = 8


async def _tenant_partitions(ctx: RequestContext) -> Mapping[str, int]:
    """The tenant's topics (its own names) and their partition counts."""
    counts = await ctx.lookups.topic_partitions()
    return {
        name: count
        for broker_name, count in counts.items()
        if (name := ctx.ns.outward(broker_name)) is not None
    }


def _over_limit(limit: int, held: int, adding: int) -> str:
    return (
        f"the tenant may hold at most {limit} partitions; it holds {held}"
        f" and this would add {adding}"
    )


def _over_mutation_quota(rate: float, throttle_ms: int) -> str:
    return (
        f"the tenant's controller_mutation_rate quota ({rate:g} partitions/s) is used up;"
        f" retry in {throttle_ms} ms"
    )


def _charge_mutations(
    ctx: RequestContext, costs: list[int], strict_since: int
) -> tuple[MutationVerdict, str]:
    """Charge the topics' partition counts; the verdict and the refusals' message."""
    verdict = ctx.charge_mutations(costs, ctx.version >= strict_since)
    rate = ctx.access.quotas.controller_mutation_rate or 0.0
    return verdict, _over_mutation_quota(rate, verdict.throttle_ms)


async def create_topics(ctx: RequestContext, request: Any) -> Step:
    api, ns, access = ctx.api, ctx.ns, ctx.access
    may_create_any = access.may_cluster(Operation.CREATE)
    allowed: list[Any] = []
    refused: list[tuple[str | None, E, str | None]] = []
    for topic in request.topics:
        if not topic.name:
            refused.append((topic.name, E.invalid_topic_exception, "a topic needs a name"))
        elif may_create_any or access.may_topic(topic.name, Operation.CREATE):
            allowed.append(replace(topic, name=ns.inward(topic.name)))
        else:
            refused.append((topic.name, E.topic_authorization_failed, None))
    limit = access.quotas.max_partitions
    metered = access.quotas.controller_mutation_rate is not None
    sizes: Mapping[str, int] = {}
    if allowed and (limit is not None or metered):
        sizes = await ctx.lookups.created_partitions(
            replace(request, topics=tuple(allowed)), ctx.version
        )
    if limit is not None and allowed:
        held = sum((await _tenant_partitions(ctx)).values())
        fitting = []
        for topic in allowed:
            adding = sizes.get(topic.name, 0)
            if held + adding > limit:
                refused.append(
                    (ns.outward(topic.name), E.policy_violation, _over_limit(limit, held, adding))
                )
            else:
                held += adding
                fitting.append(topic)
        allowed = fitting
    throttle_ms = 0
    if metered and allowed:
        verdict, message = _charge_mutations(
            ctx, [sizes.get(t.name, 0) for t in allowed], STRICT_CREATE_TOPICS
        )
        throttle_ms = verdict.throttle_ms
        refused.extend(
            (ns.outward(t.name), E.throttling_quota_exceeded, message)
            for i, t in enumerate(allowed)
            if i in verdict.refused
        )
        allowed = [t for i, t in enumerate(allowed) if i not in verdict.refused]
    refusals = tuple(
        api.make(
            "CreatableTopicResult",
            name=name,
            topic_id=ZERO_UUID,
            error_code=code,
            error_message=message,
            topic_config_error_code=0,
            num_partitions=-1,
            replication_factor=-1,
            configs=None,
        )
        for name, code, message in refused
    )
    if not allowed:
        return Answer(api.response(throttle_time=NO_THROTTLE, topics=refusals), throttle_ms)

    def finish(response: Any) -> Any:
        return replace(response, topics=rename_topics(response.topics, ns) + refusals)

    return Forward(replace(request, topics=tuple(allowed)), finish, throttle_ms=throttle_ms)


async def create_partitions(ctx: RequestContext, request: Any) -> Step:
    api, ns, access = ctx.api, ctx.ns, ctx.access
    allowed: list[Any] = []
    refused: list[tuple[str | None, E, str | None]] = []
    for topic in request.topics:
        if topic.name and access.may_topic(topic.name, Operation.ALTER):
            allowed.append(topic)
        else:
            refused.append((topic.name, E.topic_authorization_failed, None))
    limit = access.quotas.max_partitions
    metered = access.quotas.controller_mutation_rate is not None
    current: Mapping[str, int] = {}
    if allowed and (limit is not None or metered):
        current = await _tenant_partitions(ctx)

    def adding(topic: Any) -> int:
        count: int = topic.count
        return max(0, count - current.get(topic.name, count))

    if limit is not None and allowed:
        held = sum(current.values())
        fitting = []
        for topic in allowed:
            more = adding(topic)
            if held + more > limit:
                refused.append((topic.name, E.policy_violation, _over_limit(limit, held, more)))
            else:
                held += more
                fitting.append(topic)
        allowed = fitting
    throttle_ms = 0
    if metered and allowed:
        verdict, message = _charge_mutations(
            ctx, [adding(t) for t in allowed], STRICT_CREATE_PARTITIONS
        )
        throttle_ms = verdict.throttle_ms
        refused.extend(
            (t.name, E.throttling_quota_exceeded, message)
            for i, t in enumerate(allowed)
            if i in verdict.refused
        )
        allowed = [t for i, t in enumerate(allowed) if i not in verdict.refused]
    refusals = tuple(
        api.make("CreatePartitionsTopicResult", name=name, error_code=code, error_message=message)
        for name, code, message in refused
    )
    if not allowed:
        return Answer(api.response(throttle_time=NO_THROTTLE, results=refusals), throttle_ms)

    def finish(response: Any) -> Any:
        return replace(response, results=rename_topics(response.results, ns) + refusals)

    return Forward(
        replace(request, topics=tuple(replace(t, name=ns.inward(t.name)) for t in allowed)),
        finish,
        throttle_ms=throttle_ms,
    )


async def delete_topics(ctx: RequestContext, request: Any) -> Step:
    api, ns, access = ctx.api, ctx.ns, ctx.access
    by_state = ctx.version >= 6
    wanted: list[tuple[str | None, uuid.UUID | None]] = (
        [(t.name, t.topic_id) for t in request.topics]
        if by_state
        else [(name, None) for name in request.topic_names]
    )
    allowed: list[str] = []
    ids: dict[str, uuid.UUID | None] = {}
    refusals = []
    for given, topic_id in wanted:
        code = None
        name = given
        if not name and topic_id not in (None, ZERO_UUID):
            name = ns.outward(await ctx.lookups.topic_name(topic_id))
            if name is None:
                code = E.unknown_topic_id
        if code is None and not (name and access.may_topic(name, Operation.DELETE)):
            code = E.topic_authorization_failed
        if code is None and name:
            allowed.append(name)
            ids[name] = topic_id
        else:
            refusals.append(
                api.make(
                    "DeletableTopicResult",
                    name=None if code == E.unknown_topic_id else name,
                    topic_id=topic_id or ZERO_UUID,
                    error_code=code,
                    error_message=None,
                )
            )
    throttle_ms = 0
    if access.quotas.controller_mutation_rate is not None and allowed:
        current = await _tenant_partitions(ctx)
        verdict, message = _charge_mutations(
            ctx, [current.get(name, 0) for name in allowed], STRICT_DELETE_TOPICS
        )
        throttle_ms = verdict.throttle_ms
        refusals.extend(
            api.make(
                "DeletableTopicResult",
                name=name,
                topic_id=ids.get(name) or ZERO_UUID,
                error_code=E.throttling_quota_exceeded,
                error_message=message,
            )
            for i, name in enumerate(allowed)
            if i in verdict.refused
        )
        allowed = [name for i, name in enumerate(allowed) if i not in verdict.refused]
    if not allowed:
        return Answer(
            api.response(throttle_time=NO_THROTTLE, responses=tuple(refusals)), throttle_ms
        )
    if by_state:
        rewritten = replace(
            request,
            topics=tuple(
                api.make_request("DeleteTopicState", name=ns.inward(name), topic_id=ZERO_UUID)
                for name in allowed
            ),
        )
    else:
        rewritten = replace(request, topic_names=tuple(ns.inward(name) for name in allowed))

    def finish(response: Any) -> Any:
        return replace(response, responses=rename_topics(response.responses, ns) + tuple(refusals))

    return Forward(rewritten, finish, throttle_ms=throttle_ms)


def _config_check(ctx: RequestContext, resource: Any, operation: Operation) -> E | None:
    access = ctx.access
    kind = resource.resource_type
    if kind == TOPIC_RESOURCE:
        if not resource.resource_name or not access.may_topic(resource.resource_name, operation):
            return E.topic_authorization_failed
        return None
    if kind in (BROKER_RESOURCE, BROKER_LOGGER_RESOURCE) and access.platform_admin:
        return None
    if (
        kind == BROKER_RESOURCE
        and operation == Operation.DESCRIBE_CONFIGS
        and access.may_cluster(Operation.DESCRIBE_CONFIGS)
    ):
        return None
    return E.cluster_authorization_failed


def _config_refusal_message(code: E, operation: Operation) -> str:
    if code != E.cluster_authorization_failed:
        return "the key may not do this to the topic"
    if operation == Operation.DESCRIBE_CONFIGS:
        return (
            "tenants may describe topic configs and a subset of broker configs"
            " (DESCRIBE_CONFIGS on the cluster); broker loggers are the platform's"
        )
    return "broker configs are the platform's to change"


async def describe_configs(ctx: RequestContext, request: Any) -> Step:
    return _configs(ctx, request, Operation.DESCRIBE_CONFIGS, "DescribeConfigsResult", "results")


async def alter_configs(ctx: RequestContext, request: Any) -> Step:
    """AlterConfigs (33) and IncrementalAlterConfigs (44): the same checks and answer shape."""
    return _configs(
        ctx, request, Operation.ALTER_CONFIGS, "AlterConfigsResourceResponse", "responses"
    )


def _configs(
    ctx: RequestContext, request: Any, operation: Operation, result_class: str, results: str
) -> Step:
    api, ns = ctx.api, ctx.ns
    allowed, refusals = [], []
    for resource in request.resources:
        code = _config_check(ctx, resource, operation)
        if code is None and resource.resource_type == TOPIC_RESOURCE:
            allowed.append(replace(resource, resource_name=ns.inward(resource.resource_name)))
        elif code is None:
            allowed.append(resource)
        else:
            refusals.append(
                api.make(
                    result_class,
                    error_code=code,
                    error_message=_config_refusal_message(code, operation),
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=(),
                )
            )
    if not allowed:
        return Answer(api.response(throttle_time=NO_THROTTLE, **{results: tuple(refusals)}))

    def finish(response: Any) -> Any:
        mine = []
        for result in getattr(response, results):
            if result.resource_type != TOPIC_RESOURCE:
                # Only resources this key may see were forwarded (see _config_check).
                mine.append(_broker_result(ctx, result))
                continue
            name = ns.outward(result.resource_name)
            if name is not None:
                renamed = replace(result, resource_name=name)
                mine.append(scrubbed(renamed, result.resource_name, name))
        return replace(response, **{results: tuple(mine) + tuple(refusals)})

    return Forward(replace(request, resources=tuple(allowed)), finish)


def _broker_result(ctx: RequestContext, result: Any) -> Any:
    """A broker's answer as this key may see it: whole for the platform admin. Only
    DescribeConfigs forwards a tenant's broker resource, so a tenant's result has configs."""
    return result if ctx.access.platform_admin else tenant_view(result)
