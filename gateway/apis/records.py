"""Produce, Fetch, ListOffsets, OffsetForLeaderEpoch and DeleteRecords: the data path.

Record batches pass through as the client wrote them and as the broker
stored them; only topic names (and, for Fetch v13+, topic ids) are checked
and mapped. Everything transactions need passes untouched: a Fetch's and a
ListOffsets' isolation level, and a read_committed Fetch's last stable
offset and aborted transactions (the broker's producer ids are the ones in
the batches the client filters with them).

Fetch sessions (KIP-227) end at the gateway: it asks brokers for full
fetches without a session and answers clients with session id 0, so they keep
sending full fetches, each checked whole.

A topic the key may not use keeps its slot in the response with
TOPIC_AUTHORIZATION_FAILED, and the rest of the request goes on to the broker.
A topic id that is not one of the tenant's topics gets UNKNOWN_TOPIC_ID, the
same answer as an id that does not exist, so ids reveal nothing.

A tenant whose stored bytes have reached its ``max_storage_bytes``
(:mod:`shoal.gateway.storage_limit`) gets POLICY_VIOLATION, with a message
naming the limit, on every partition it may write; nothing goes to a broker.

DeleteRecords needs DELETE on the topic, as in Kafka. Like Produce it goes to
the broker behind the port the client chose: clients send each partition to
its leader's port (the port-per-broker addresses Metadata gave them), and a
partition sent elsewhere gets the broker's NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from shoal.gateway.apis.base import (
    NO_THROTTLE,
    ZERO_UUID,
    Answer,
    E,
    Forward,
    RefusedRequestError,
    RequestContext,
    Step,
    rename_topics,
    replace,
    topic_field,
)
from shoal.tenancy.model import Operation

from shoal.wire import FINAL_EPOCH, INITIAL_EPOCH, NO_SESSION

CONSUMER_REPLICA_ID: Final = -1
"""Only consumers fetch through the gateway; replica fetches are the brokers' own."""
READ_COMMITTED: Final = 1


async def produce(ctx: RequestContext, request: Any) -> Step:
    api, ns, access = ctx.api, ctx.ns, ctx.access
    txn = request.transactional_id
    txn_denied = txn is not None and not access.may_transaction(txn, Operation.WRITE)
    allowed: list[Any] = []
    refused: list[tuple[Any, E, str | None]] = []
    for topic in request.topic_data:
        if txn_denied:
            refused.append((topic, E.transactional_id_authorization_failed, None))
        elif not topic.name or not access.may_topic(topic.name, Operation.WRITE):
            refused.append((topic, E.topic_authorization_failed, None))
        else:
            allowed.append(topic)
    full = ctx.storage_refusal() if allowed else None
    if full is not None:
        # The tenant's storage limit is reached: nothing is written, anywhere.
        refused += [(topic, E.policy_violation, full) for topic in allowed]
        allowed = []
    forwarded = [replace(topic, name=ns.inward(topic.name)) for topic in allowed]
    refusals = tuple(
        api.make(
            "TopicProduceResponse",
            name=topic.name,
            partition_responses=tuple(
                api.make(
                    "PartitionProduceResponse",
                    index=part.index,
                    error_code=code,
                    base_offset=-1,
                    log_append_time=None,
                    log_start_offset=-1,
                    record_errors=(),
                    error_message=message,
                )
                for part in topic.partition_data
            ),
        )
        for topic, code, message in refused
    )
    if request.acks == 0:
        if full is not None:
            raise RefusedRequestError(f"acks=0 produce refused: {full}")
        if refused:
            raise RefusedRequestError("acks=0 produce to a topic the key may not write")
        return Forward(replace(request, topic_data=tuple(forwarded)), expects_response=False)
    if not forwarded:
        return Answer(api.response(responses=refusals, throttle_time=NO_THROTTLE))
    rewritten = replace(
        request,
        transactional_id=None if txn is None else ns.inward(txn),
        topic_data=tuple(forwarded),
    )

    def finish(response: Any) -> Any:
        return replace(response, responses=rename_topics(response.responses, ns) + refusals)

    return Forward(rewritten, finish)


def _check_replica(request: Any) -> None:
    state = getattr(request, "replica_state", None)
    replica = state.replica_id if state is not None else getattr(request, "replica_id", -1)
    if replica != CONSUMER_REPLICA_ID:
        raise RefusedRequestError(f"replica fetches (replica id {replica}) are internal")


async def fetch(ctx: RequestContext, request: Any) -> Step:
    api, ns = ctx.api, ctx.ns
    _check_replica(request)
    if getattr(request, "session_epoch", FINAL_EPOCH) > INITIAL_EPOCH:
        # The gateway answers every fetch with session id 0, so no client has a
        # session to be incremental in: Kafka's answer to an unknown one.
        return Answer(
            api.response(
                throttle_time=NO_THROTTLE,
                error_code=E.fetch_session_id_not_found,
                session_id=NO_SESSION,
                responses=(),
            )
        )
    by_id = ctx.version >= 13
    forwarded, refused = [], []
    for topic in request.topics:
        code = await _fetchable(ctx, topic, by_id)
        if code is None:
            forwarded.append(topic if by_id else replace(topic, topic=ns.inward(topic.topic)))
        else:
            refused.append((topic, code))
    # A refused slot is shaped as the broker shapes a partition for this
    # isolation level: read_committed always carries a (here empty) aborted
    # transactions list, read_uncommitted carries none.
    aborted: tuple[Any, ...] | None = () if request.isolation_level == READ_COMMITTED else None
    refusals = tuple(
        api.make(
            "FetchableTopicResponse",
            topic=getattr(topic, "topic", None),
            topic_id=getattr(topic, "topic_id", None),
            partitions=tuple(
                api.make(
                    "PartitionData",
                    partition_index=part.partition,
                    error_code=code,
                    high_watermark=-1,
                    last_stable_offset=-1,
                    log_start_offset=-1,
                    aborted_transactions=aborted,
                    preferred_read_replica=-1,
                    records=None,
                )
                for part in topic.partitions
            ),
        )
        for topic, code in refused
    )
    changes: dict[str, Any] = {"topics": tuple(forwarded)}
    if hasattr(request, "session_id"):
        # Full fetches upstream, never a session: a broker's session id would reach
        # the client, where it could name the session on any connection, of any
        # tenant, and an incremental request would skip the checks above for every
        # partition it does not list.
        changes.update(session_id=NO_SESSION, session_epoch=FINAL_EPOCH, forgotten_topics_data=())
    if ctx.fetch_cap is not None:
        # One response may not be larger than the consume quota allows (the
        # broker still returns a first batch that is larger, so nothing stalls).
        changes["max_bytes"] = min(request.max_bytes, ctx.fetch_cap)
        changes["topics"] = tuple(
            replace(
                topic,
                partitions=tuple(
                    replace(p, partition_max_bytes=min(p.partition_max_bytes, ctx.fetch_cap))
                    for p in topic.partitions
                ),
            )
            for topic in changes["topics"]
        )
    if not forwarded and refused:
        return Answer(
            api.response(
                throttle_time=NO_THROTTLE,
                error_code=E.none,
                session_id=NO_SESSION,
                responses=refusals,
            )
        )

    def finish(response: Any) -> Any:
        mine = response.responses if by_id else rename_topics(response.responses, ns)
        changes = {"session_id": NO_SESSION} if hasattr(response, "session_id") else {}
        return replace(response, responses=mine + refusals, **changes)

    return Forward(replace(request, **changes), finish)


async def _fetchable(ctx: RequestContext, topic: Any, by_id: bool) -> E | None:
    """None if the key may read the topic; otherwise the error for its slot."""
    if by_id:
        topic_id = topic.topic_id
        broker_name = (
            None if topic_id in (None, ZERO_UUID) else await ctx.lookups.topic_name(topic_id)
        )
        name = ctx.ns.outward(broker_name)
        if name is None:
            return E.unknown_topic_id
    else:
        name = topic.topic
    if not name or not ctx.access.may_topic(name, Operation.READ):
        return E.topic_authorization_failed
    return None


async def list_offsets(ctx: RequestContext, request: Any) -> Step:
    if request.replica_id not in (CONSUMER_REPLICA_ID, -2):
        raise RefusedRequestError(f"ListOffsets for replica {request.replica_id} is internal")
    return _describe_partitions(
        ctx,
        request,
        "ListOffsetsTopicResponse",
        lambda part: ctx.api.make(
            "ListOffsetsPartitionResponse",
            partition_index=part.partition_index,
            error_code=E.topic_authorization_failed,
            timestamp=-1,
            offset=-1,
            leader_epoch=-1,
        ),
    )


async def offset_for_leader_epoch(ctx: RequestContext, request: Any) -> Step:
    if getattr(request, "replica_id", CONSUMER_REPLICA_ID) != CONSUMER_REPLICA_ID:
        raise RefusedRequestError("OffsetForLeaderEpoch for a replica is internal")
    return _describe_partitions(
        ctx,
        request,
        "OffsetForLeaderTopicResult",
        lambda part: ctx.api.make(
            "EpochEndOffset",
            error_code=E.topic_authorization_failed,
            partition=part.partition,
            leader_epoch=-1,
            end_offset=-1,
        ),
    )


def _describe_partitions(
    ctx: RequestContext,
    request: Any,
    topic_class: str,
    refused_partition: Callable[[Any], Any],
) -> Step:
    """ListOffsets and OffsetForLeaderEpoch: DESCRIBE per topic, refused slots kept."""
    api, ns = ctx.api, ctx.ns
    forwarded, refused = [], []
    for topic in request.topics:
        key = topic_field(topic)
        name = getattr(topic, key)
        if name and ctx.access.may_topic(name, Operation.DESCRIBE):
            forwarded.append(replace(topic, **{key: ns.inward(name)}))
        else:
            refused.append((name, topic))
    refusals = tuple(
        # The response calls its topic field what the request does; make() keeps that one.
        api.make(
            topic_class,
            name=name,
            topic=name,
            partitions=tuple(refused_partition(part) for part in topic.partitions),
        )
        for name, topic in refused
    )
    if not forwarded:
        return Answer(api.response(throttle_time=NO_THROTTLE, topics=refusals))

    def finish(response: Any) -> Any:
        return replace(response, topics=rename_topics(response.topics, ns) + refusals)

    return Forward(replace(request, topics=tuple(forwarded)), finish)


async def delete_records(ctx: RequestContext, request: Any) -> Step:
    api, ns, access = ctx.api, ctx.ns, ctx.access
    forwarded, refused = [], []
    for topic in request.topics:
        if topic.name and access.may_topic(topic.name, Operation.DELETE):
            forwarded.append(replace(topic, name=ns.inward(topic.name)))
        else:
            refused.append(topic)
    refusals = tuple(
        api.make(
            "DeleteRecordsTopicResult",
            name=topic.name,
            partitions=tuple(
                api.make(
                    "DeleteRecordsPartitionResult",
                    partition_index=part.partition_index,
                    low_watermark=-1,
                    error_code=E.topic_authorization_failed,
                )
                for part in topic.partitions
            ),
        )
        for topic in refused
    )
    if not forwarded:
        return Answer(api.response(throttle_time=NO_THROTTLE, topics=refusals))

    def finish(response: Any) -> Any:
        return replace(response, topics=rename_topics(response.topics, ns) + refusals)

    return Forward(replace(request, topics=tuple(forwarded)), finish)
