"""Produce, Fetch, ListOffsets, OffsetForLeaderEpoch and DeleteRecords: the data path.

Record batches pass through as the client wrote them and as the broker
stored them; only topic names (and, for Fetch v13+, topic ids) are checked
and mapped. Everything transactions need passes untouched: a Fetch's and a
ListOffsets' isolation level, and a read_committed Fetch's last stable
offset and aborted transactions (the broker's producer ids are the ones in
the batches the client filters with them).

A client's fetch session (KIP-227) is its broker's, passed through and kept
in step by :mod:`shoal.gateway.fetch_session`: accepted only on the
connection that opened it, holding only topics the key may read, its topics
judged again when the tenant's ACLs change. Fetches without a session
(librdkafka's, the HTTP door's) are checked whole, as they come.

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

import uuid
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
from shoal.gateway.fetch_session import ClientFetchSession, TopicKey
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
    _check_replica(request)
    by_id = ctx.version >= 13
    has_sessions = hasattr(request, "session_id")
    epoch = request.session_epoch if has_sessions else FINAL_EPOCH
    session = ctx.fetch_session if has_sessions else None
    if epoch > INITIAL_EPOCH:
        if session is None or not session.usable or request.session_id != session.id:
            return Answer(_session_error(ctx.api, E.fetch_session_id_not_found))
        if session.by_id != by_id:
            return Answer(_session_error(ctx.api, E.fetch_session_topic_id_error))
        return await _fetch_in_session(ctx, request, session, incremental=True)
    # A full fetch: the connection's session (if any) closes, and a new one opens in
    # its place when the client asked for one.
    closing = NO_SESSION if session is None else session.restart(by_id, ctx.access.bindings)
    if session is not None and epoch == INITIAL_EPOCH:
        return await _fetch_in_session(ctx, request, session, incremental=False, closing=closing)
    return await _fetch_without_session(ctx, request, closing)


async def _fetch_without_session(ctx: RequestContext, request: Any, closing: int) -> Step:
    """A full fetch that keeps no session (librdkafka's every fetch, the HTTP door's):
    each topic checked and renamed as it stands, the answer's session id 0."""
    api, ns = ctx.api, ctx.ns
    by_id = ctx.version >= 13
    forwarded, refused = [], []
    for topic in request.topics:
        key = _topic_key(topic, by_id)
        code = await _fetchable(ctx, key, by_id)
        if code is None:
            forwarded.append(_capped(ctx, topic if by_id else replace(topic, topic=ns.inward(key))))
        else:
            refused.append((key, code, [p.partition for p in topic.partitions]))
    refusals = _refusals(api, refused, by_id, request.isolation_level)
    if not forwarded and refused and closing == NO_SESSION:
        return _refused_whole(api, refusals)
    changes = _capped_request(ctx, request, {"topics": tuple(forwarded)})
    has_sessions = hasattr(request, "session_id")
    if has_sessions:
        changes.update(session_id=closing, session_epoch=FINAL_EPOCH, forgotten_topics_data=())

    def finish(response: Any) -> Any:
        mine = response.responses if by_id else rename_topics(response.responses, ns)
        changes = {"session_id": NO_SESSION} if has_sessions else {}
        return replace(response, responses=mine + refusals, **changes)

    return Forward(replace(request, **changes), finish)


async def _fetch_in_session(
    ctx: RequestContext,
    request: Any,
    session: ClientFetchSession,
    incremental: bool,
    closing: int = NO_SESSION,
) -> Step:
    """A fetch that opens the connection's session (``closing`` the one it had), or goes
    on in it: :class:`ClientFetchSession` decides what the broker's session must change
    and what the gateway answers itself."""
    api, ns = ctx.api, ctx.ns
    by_id = ctx.version >= 13
    listed = []
    for topic in request.topics:
        key = _topic_key(topic, by_id)
        listed.append((key, topic.partitions, await _fetchable(ctx, key, by_id)))
    judged = []
    forgotten = []
    if incremental:
        judged = [
            (key, await _fetchable(ctx, key, by_id))
            for key in session.to_judge_again(ctx.access.bindings, (k for k, _, _ in listed))
        ]
        # Kafka reads forgotten_topics_data only in an incremental fetch.
        forgotten = [
            (_topic_key(topic, by_id), topic.partitions) for topic in request.forgotten_topics_data
        ]
    plan = session.apply(listed, judged, forgotten)
    refusals = _refusals(api, session.refused(), by_id, request.isolation_level)
    # A full fetch of nothing the broker may read opens no session, as when a broker
    # has no slot for one; it only closes the connection's old one, if any.
    opens = incremental or bool(plan.send)
    if not opens and closing == NO_SESSION:
        return _refused_whole(api, refusals)
    field = _topic_field(by_id)
    changes = _capped_request(
        ctx,
        request,
        {
            "session_id": session.id if incremental else closing,
            "session_epoch": request.session_epoch if opens else FINAL_EPOCH,
            "topics": tuple(
                _capped(
                    ctx,
                    api.make_request(
                        "FetchTopic",
                        **{field: _upstream_name(ctx, key, by_id)},
                        partitions=tuple(partitions),
                    ),
                )
                for key, partitions in plan.send.items()
            ),
            "forgotten_topics_data": tuple(
                api.make_request(
                    "ForgottenTopic",
                    **{field: _upstream_name(ctx, key, by_id)},
                    partitions=tuple(indexes),
                )
                for key, indexes in plan.forget.items()
            ),
        },
    )

    def finish(response: Any) -> Any:
        session.answered(incremental, response.error_code, response.session_id)
        if response.error_code is not E.none:
            return response
        mine = response.responses if by_id else rename_topics(response.responses, ns)
        # Only what the session lets the broker answer for: a broker's session that
        # had drifted from the gateway's view would show nothing more.
        held = tuple(t for t in mine if session.holds(getattr(t, field)))
        return replace(response, responses=held + refusals)

    return Forward(replace(request, **changes), finish)


def _capped_request(ctx: RequestContext, request: Any, changes: dict[str, Any]) -> dict[str, Any]:
    if ctx.fetch_cap is not None:
        # One response may not be larger than the consume quota allows (the
        # broker still returns a first batch that is larger, so nothing stalls).
        changes["max_bytes"] = min(request.max_bytes, ctx.fetch_cap)
    return changes


def _capped(ctx: RequestContext, topic: Any) -> Any:
    cap = ctx.fetch_cap
    if cap is None:
        return topic
    partitions = tuple(
        replace(p, partition_max_bytes=min(p.partition_max_bytes, cap)) for p in topic.partitions
    )
    return replace(topic, partitions=partitions)


def _refused_whole(api: Any, refusals: tuple[Any, ...]) -> Answer:
    """The gateway's own answer to a fetch of which nothing may reach a broker."""
    return Answer(
        api.response(
            throttle_time=NO_THROTTLE, error_code=E.none, session_id=NO_SESSION, responses=refusals
        )
    )


def _session_error(api: Any, code: E) -> Any:
    return api.response(
        throttle_time=NO_THROTTLE, error_code=code, session_id=NO_SESSION, responses=()
    )


def _topic_key(topic: Any, by_id: bool) -> Any:
    return topic.topic_id if by_id else topic.topic


def _topic_field(by_id: bool) -> str:
    return "topic_id" if by_id else "topic"


def _upstream_name(ctx: RequestContext, key: TopicKey, by_id: bool) -> TopicKey:
    return key if by_id else ctx.ns.inward(str(key))


def _refusals(
    api: Any, refused: list[tuple[TopicKey, E, list[int]]], by_id: bool, isolation_level: int
) -> tuple[Any, ...]:
    # A refused slot is shaped as the broker shapes a partition for this
    # isolation level: read_committed always carries a (here empty) aborted
    # transactions list, read_uncommitted carries none.
    aborted: tuple[Any, ...] | None = () if isolation_level == READ_COMMITTED else None
    return tuple(
        api.make(
            "FetchableTopicResponse",
            topic=None if by_id else key,
            topic_id=key if by_id else None,
            partitions=tuple(
                api.make(
                    "PartitionData",
                    partition_index=index,
                    error_code=code,
                    high_watermark=-1,
                    last_stable_offset=-1,
                    log_start_offset=-1,
                    aborted_transactions=aborted,
                    preferred_read_replica=-1,
                    records=None,
                )
                for index in indexes
            ),
        )
        for key, code, indexes in refused
    )


async def _fetchable(ctx: RequestContext, topic: TopicKey | None, by_id: bool) -> E | None:
    """None if the key may read the topic (named as the client names it: its name or
    its id); otherwise the error for its slot."""
    name: str | None
    if isinstance(topic, uuid.UUID):
        broker_name = None if topic == ZERO_UUID else await ctx.lookups.topic_name(topic)
        name = ctx.ns.outward(broker_name)
        if name is None:
            return E.unknown_topic_id
    elif by_id:
        return E.unknown_topic_id
    else:
        name = topic
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
