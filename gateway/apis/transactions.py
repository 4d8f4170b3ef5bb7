"""Idempotent and transactional producers: transactional ids in the namespace.

Kafka's checks: a transactional id needs WRITE on it; an idempotent producer
without one needs IDEMPOTENT_WRITE on the cluster; adding partitions needs
WRITE on each topic; adding a group's offsets needs READ on the group.
DescribeTransactions, ListTransactions and DescribeProducers, the operators'
tools, and WriteTxnMarkers, which the gateway answers itself, are at the end.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

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

_EPOCH: Final = datetime.fromtimestamp(0, UTC)
"""Kafka's -1 start time ("not started"); kio's timestamps cannot say it."""


async def init_producer_id(ctx: RequestContext, request: Any) -> Step:
    txn = request.transactional_id
    if txn is None:
        refusal = (
            None
            if ctx.access.may_cluster(Operation.IDEMPOTENT_WRITE)
            else (E.cluster_authorization_failed)
        )
    elif not txn:
        # As the brokers (and Kafka) answer it: a tenant's "" would reach them as
        # the non-empty "<tenant>.".
        refusal = E.invalid_request
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


# The operators' view (KIP-664), as ``kafka-transactions.sh`` asks for it.
# Kafka's checks: describing a transaction needs DESCRIBE on its id, and the
# partitions shown are only those of topics the key may DESCRIBE; a listing
# shows only the ids the key may DESCRIBE; describing producers needs READ on
# the topic. Through the gateway every id and topic is the tenant's own:
# another tenant's never reach an answer.


def _refused_transaction(ctx: RequestContext, transactional_id: str) -> Any:
    return ctx.api.make(
        "TransactionState",
        error_code=E.transactional_id_authorization_failed,
        transactional_id=transactional_id,
        transaction_state="",
        transaction_timeout=timedelta(0),
        transaction_start_time=_EPOCH,
        producer_id=-1,
        producer_epoch=-1,
        topics=(),
    )


async def describe_transactions(ctx: RequestContext, request: Any) -> Step:
    ns, access = ctx.ns, ctx.access
    forwarded, refusals = [], []
    for transactional_id in request.transactional_ids:
        if transactional_id and access.may_transaction(transactional_id, Operation.DESCRIBE):
            forwarded.append(ns.inward(transactional_id))
        else:
            refusals.append(_refused_transaction(ctx, transactional_id))
    if not forwarded:
        return Answer(
            ctx.api.response(throttle_time=NO_THROTTLE, transaction_states=tuple(refusals))
        )

    def finish(response: Any) -> Any:
        states = []
        for state in response.transaction_states:
            transactional_id = ns.outward(state.transactional_id)
            if transactional_id is None:
                continue
            topics = tuple(
                replace(t, topic=name)
                for t in state.topics
                if (name := ns.outward(t.topic)) is not None
                and access.may_topic(name, Operation.DESCRIBE)
            )
            states.append(replace(state, transactional_id=transactional_id, topics=topics))
        return replace(response, transaction_states=tuple(states) + tuple(refusals))

    return Forward(replace(request, transactional_ids=tuple(forwarded)), finish)


async def list_transactions(ctx: RequestContext, request: Any) -> Step:
    ns, access = ctx.ns, ctx.access

    def finish(response: Any) -> Any:
        states = []
        for state in response.transaction_states:
            transactional_id = ns.outward(state.transactional_id)
            if transactional_id is not None and access.may_transaction(
                transactional_id, Operation.DESCRIBE
            ):
                states.append(replace(state, transactional_id=transactional_id))
        return replace(response, transaction_states=tuple(states))

    return Forward(request, finish)


async def describe_producers(ctx: RequestContext, request: Any) -> Step:
    ns, access, api = ctx.ns, ctx.access, ctx.api
    forwarded, refusals = [], []
    for topic in request.topics:
        if topic.name and access.may_topic(topic.name, Operation.READ):
            forwarded.append(replace(topic, name=ns.inward(topic.name)))
        else:
            refusals.append(
                api.make(
                    "TopicResponse",
                    name=topic.name,
                    partitions=tuple(
                        api.make(
                            "PartitionResponse",
                            partition_index=index,
                            error_code=E.topic_authorization_failed,
                            error_message=None,
                            active_producers=(),
                        )
                        for index in topic.partition_indexes
                    ),
                )
            )
    if not forwarded:
        return Answer(api.response(throttle_time=NO_THROTTLE, topics=tuple(refusals)))

    def finish(response: Any) -> Any:
        return replace(response, topics=rename_topics(response.topics, ns) + tuple(refusals))

    return Forward(replace(request, topics=tuple(forwarded)), finish)


async def write_txn_markers(ctx: RequestContext, request: Any) -> Step:
    """WriteTxnMarkers (27), as ``kafka-transactions.sh abort`` sends it: refused here,
    never forwarded.

    A Kafka broker takes markers only from a principal with CLUSTER_ACTION (or ALTER)
    on the cluster, its own brokers, and answers anyone else CLUSTER_AUTHORIZATION_FAILED
    for every partition of the request (``WriteTxnMarkersRequest.getErrorResponse``).
    No key has that here, a platform admin's neither: a marker is the brokers' word
    on a transaction, and a tenant ends its own with ``shoal txn abort`` (a fenced
    producer, so the coordinator aborts and writes the markers). Answering rather than
    closing the connection, as Kafka does, lets the tool say why.
    """
    api = ctx.api
    refused = E.cluster_authorization_failed
    return Answer(
        api.response(
            markers=tuple(
                api.make(
                    "WritableTxnMarkerResult",
                    producer_id=marker.producer_id,
                    topics=tuple(
                        api.make(
                            "WritableTxnMarkerTopicResult",
                            name=topic.name,
                            partitions=tuple(
                                api.make(
                                    "WritableTxnMarkerPartitionResult",
                                    partition_index=index,
                                    error_code=refused,
                                )
                                for index in topic.partition_indexes
                            ),
                        )
                        for topic in marker.topics
                    ),
                )
                for marker in request.markers
            )
        )
    )
