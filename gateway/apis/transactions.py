"""Idempotent and transactional producers: transactional ids in the namespace.

Kafka's checks: a transactional id needs WRITE on it; an idempotent producer
without one needs IDEMPOTENT_WRITE on the cluster; adding partitions needs
WRITE on each topic; adding a group's offsets needs READ on the group.
"""

from __future__ import annotations

from typing import Any

from shoal.gateway.apis.base import (
    NO_THROTTLE,
    Answer,
    E,
    Forward,
    RequestContext,
    Step,
    rename_topics,
    replace,
)
from shoal.tenancy.model import Operation


async def init_producer_id(ctx: RequestContext, request: Any) -> Step:
    txn = request.transactional_id
    if txn is None:
        refusal = (
            None
            if ctx.access.may_cluster(Operation.IDEMPOTENT_WRITE)
            else (E.cluster_authorization_failed)
        )
    else:
        refusal = (
            None
            if ctx.access.may_transaction(txn, Operation.WRITE)
            else (E.transactional_id_authorization_failed)
        )
    if refusal is not None:
        return Answer(
            ctx.api.response(
                throttle_time=NO_THROTTLE, error_code=refusal, producer_id=-1, producer_epoch=-1
            )
        )
    if txn is None:
        return Forward(request)
    return Forward(replace(request, transactional_id=ctx.ns.inward(txn)))


async def add_partitions_to_txn(ctx: RequestContext, request: Any) -> Step:
    ns, access, api = ctx.ns, ctx.access, ctx.api
    txn = request.v3_and_below_transactional_id
    txn_allowed = access.may_transaction(txn, Operation.WRITE)
    denied = [
        t
        for t in request.v3_and_below_topics
        if not txn_allowed or not (t.name and access.may_topic(t.name, Operation.WRITE))
    ]
    if denied:
        # Kafka refuses the whole request: the denied topics get the
        # authorization error and the others OPERATION_NOT_ATTEMPTED.
        results = []
        for topic in request.v3_and_below_topics:
            if not txn_allowed:
                code = E.transactional_id_authorization_failed
            elif topic in denied:
                code = E.topic_authorization_failed
            else:
                code = E.operation_not_attempted
            results.append(
                api.make(
                    "AddPartitionsToTxnTopicResult",
                    name=topic.name,
                    results_by_partition=tuple(
                        api.make(
                            "AddPartitionsToTxnPartitionResult",
                            partition_index=index,
                            partition_error_code=code,
                        )
                        for index in topic.partitions
                    ),
                )
            )
        return Answer(
            api.response(throttle_time=NO_THROTTLE, results_by_topic_v3_and_below=tuple(results))
        )

    def finish(response: Any) -> Any:
        return replace(
            response,
            results_by_topic_v3_and_below=rename_topics(response.results_by_topic_v3_and_below, ns),
        )

    return Forward(
        replace(
            request,
            v3_and_below_transactional_id=ns.inward(txn),
            v3_and_below_topics=tuple(
                replace(t, name=ns.inward(t.name)) for t in request.v3_and_below_topics
            ),
        ),
        finish,
    )


async def add_offsets_to_txn(ctx: RequestContext, request: Any) -> Step:
    access, ns = ctx.access, ctx.ns
    if not access.may_transaction(request.transactional_id, Operation.WRITE):
        refusal = E.transactional_id_authorization_failed
    elif not access.may_group(request.group_id, Operation.READ):
        refusal = E.group_authorization_failed
    else:
        return Forward(
            replace(
                request,
                transactional_id=ns.inward(request.transactional_id),
                group_id=ns.inward(request.group_id),
            )
        )
    return Answer(ctx.api.response(throttle_time=NO_THROTTLE, error_code=refusal))


async def end_txn(ctx: RequestContext, request: Any) -> Step:
    if not ctx.access.may_transaction(request.transactional_id, Operation.WRITE):
        return Answer(
            ctx.api.response(
                throttle_time=NO_THROTTLE, error_code=E.transactional_id_authorization_failed
            )
        )
    return Forward(replace(request, transactional_id=ctx.ns.inward(request.transactional_id)))
