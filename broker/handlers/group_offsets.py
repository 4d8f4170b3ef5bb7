"""OffsetCommit (8), OffsetFetch (9, including the multi-group form of v8+), OffsetDelete (47),
and TxnOffsetCommit (28): offsets written inside a producer's transaction.

OffsetFetch v7+ may ask for stable offsets only (KIP-447 ``require_stable``):
a partition with a transactional offset still waiting for its marker is then
answered UNSTABLE_OFFSET_COMMIT, and the client asks again.

TxnOffsetCommit is verified first (KIP-890 part 1, see
:mod:`shoal.broker.txn.verification`): the transaction coordinator of the
request's transactional id must find the group's ``__consumer_offsets``
partition in the ongoing transaction of that producer id and epoch, else
nothing is written. Without it anyone could stage offsets, in that shared
partition, under another producer's id and a higher epoch: a transaction no
marker closes, and the real producer's markers refused as older. Kafka skips
the check when the producer's transaction is already open in the partition;
Shoal checks every time (one round trip per TxnOffsetCommit, usually one per
transaction), so the transactional id always owns the producer id. Errors
are answered as Kafka's group coordinator maps them
(GroupMetadataManager.maybeConvertOffsetCommitError).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from shoal.broker.coordinator.coordinator import OFFSETS_TOPIC
from shoal.broker.coordinator.group import CommittedOffset
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext

from shoal.wire import ErrorCode

NO_OFFSET: Final = -1
GROUP_LEVEL_ERROR_VERSION: Final = 2
MULTI_GROUP_VERSION: Final = 8
REQUIRE_STABLE_VERSION: Final = 7
TXN_ABORTABLE_VERSION: Final = 4
"""TxnOffsetCommit answers TRANSACTION_ABORTABLE from here on (KIP-890)."""
_VERIFICATION_ERRORS: Final[dict[ErrorCode, ErrorCode]] = {
    # Retriable, without a needless coordinator lookup.
    E.network_exception: E.coordinator_load_in_progress,
    E.unknown_topic_or_partition: E.coordinator_not_available,
    E.not_enough_replicas: E.coordinator_not_available,
    E.not_enough_replicas_after_append: E.coordinator_not_available,
    E.not_leader_or_follower: E.not_coordinator,
    E.kafka_storage_error: E.not_coordinator,
}


async def _verified(services: BrokerServices, ctx: RequestContext, request: Any) -> ErrorCode:
    """Whether the group's offsets partition is in the producer's ongoing transaction
    (NONE), or the code to answer every partition with. A broker that does not
    coordinate the group answers that itself, without asking."""
    group_id = request.group_id
    if not group_id or services.groups.owner_error(group_id) is not None:
        return E.none
    tp = (OFFSETS_TOPIC, services.groups.partition_of(group_id))
    codes = await services.verifier.verify(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        [tp],
        abortable=ctx.version >= TXN_ABORTABLE_VERSION,
    )
    return _VERIFICATION_ERRORS.get(codes[tp], codes[tp])


async def handle_txn_offset_commit(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    now = services.clock()
    offsets = {
        (topic.name, p.partition_index): CommittedOffset(
            p.committed_offset,
            getattr(p, "committed_leader_epoch", -1),
            p.committed_metadata or "",
            now,
        )
        for topic in request.topics
        for p in topic.partitions
    }
    refusal = await _verified(services, ctx, request)
    results: dict[tuple[str, int], ErrorCode]
    if refusal is not E.none:
        results = dict.fromkeys(offsets, refusal)
    else:
        results = await services.groups.commit_transactional_offsets(
            request.group_id,
            request.producer_id,
            request.producer_epoch,
            getattr(request, "member_id", ""),
            getattr(request, "generation_id", -1),
            getattr(request, "group_instance_id", None),
            offsets,
        )
    return _commit_response(api, "TxnOffsetCommit", request, results)


def _commit_response(
    api: Any, kind: str, request: Any, results: Mapping[tuple[str, int], ErrorCode]
) -> Any:
    """An OffsetCommit or TxnOffsetCommit (``kind``) answer: each requested partition's code."""
    topics = tuple(
        api.make(
            f"{kind}ResponseTopic",
            name=topic.name,
            partitions=tuple(
                api.make(
                    f"{kind}ResponsePartition",
                    partition_index=p.partition_index,
                    error_code=results[(topic.name, p.partition_index)],
                )
                for p in topic.partitions
            ),
        )
        for topic in request.topics
    )
    return api.response(throttle_time=NO_THROTTLE, topics=topics)


async def handle_offset_commit(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    now = services.clock()
    retention = getattr(request, "retention_time", None)
    retention_ms = round(retention.total_seconds() * 1000) if retention is not None else -1
    expire = now + retention_ms if retention_ms >= 0 else -1
    offsets = {
        (topic.name, p.partition_index): CommittedOffset(
            p.committed_offset,
            getattr(p, "committed_leader_epoch", -1),
            p.committed_metadata or "",
            now,
            expire,
        )
        for topic in request.topics
        for p in topic.partitions
    }
    results = await services.groups.commit_offsets(
        request.group_id,
        request.generation_id_or_member_epoch,
        request.member_id,
        getattr(request, "group_instance_id", None),
        offsets,
        api_version=ctx.version,
    )
    return _commit_response(api, "OffsetCommit", request, results)


def _fetch_topics(
    services: BrokerServices,
    ctx: RequestContext,
    group_id: str,
    topics: Any,
    topic_class: str,
    partition_class: str,
    per_partition_errors: bool,
    require_stable: bool,
    member: tuple[str | None, int] | None = None,
) -> tuple[ErrorCode, tuple[Any, ...]]:
    """One group's committed offsets: the asked partitions, or all (``topics`` null)."""
    api = ctx.api
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    code, found = services.groups.fetch_offsets(group_id, wanted)
    if code is E.none and member is not None:
        # OffsetFetch v9 from a KIP-848 member: its id and epoch must be current.
        refusal = services.groups.consumer.validate_fetch(group_id, *member)
        if refusal is not None:
            code, found = refusal, {}
    if code is not E.none and per_partition_errors:
        found = dict.fromkeys(wanted or [], None)
    unstable = services.groups.unstable_partitions(group_id) if require_stable else frozenset()
    by_topic: dict[str, list[Any]] = {}
    for tp, stored in found.items():
        topic, partition = tp
        committed, partition_code = stored, code if per_partition_errors else E.none
        if tp in unstable:
            committed, partition_code = None, E.unstable_offset_commit
        by_topic.setdefault(topic, []).append(
            api.make(
                partition_class,
                partition_index=partition,
                committed_offset=committed.offset if committed else NO_OFFSET,
                committed_leader_epoch=committed.leader_epoch if committed else -1,
                metadata=committed.metadata if committed else "",
                error_code=partition_code,
            )
        )
    return code, tuple(
        api.make(topic_class, name=topic, partitions=tuple(parts))
        for topic, parts in by_topic.items()
    )


async def handle_offset_fetch(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    require_stable = ctx.version >= REQUIRE_STABLE_VERSION and request.require_stable
    if ctx.version >= MULTI_GROUP_VERSION:
        groups = []
        for group in request.groups:
            code, topics = _fetch_topics(
                services,
                ctx,
                group.group_id,
                group.topics,
                "OffsetFetchResponseTopics",
                "OffsetFetchResponsePartitions",
                per_partition_errors=False,
                require_stable=require_stable,
                member=(getattr(group, "member_id", None), getattr(group, "member_epoch", -1)),
            )
            groups.append(
                api.make(
                    "OffsetFetchResponseGroup",
                    group_id=group.group_id,
                    topics=topics,
                    error_code=code,
                )
            )
        return api.response(throttle_time=NO_THROTTLE, groups=tuple(groups))
    per_partition = ctx.version < GROUP_LEVEL_ERROR_VERSION
    code, topics = _fetch_topics(
        services,
        ctx,
        request.group_id,
        request.topics,
        "OffsetFetchResponseTopic",
        "OffsetFetchResponsePartition",
        per_partition_errors=per_partition,
        require_stable=require_stable,
    )
    return api.response(throttle_time=NO_THROTTLE, topics=topics, error_code=code)


async def handle_offset_delete(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    wanted = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    code, results = await services.groups.delete_offsets(request.group_id, wanted)
    topics = tuple(
        api.make(
            "OffsetDeleteResponseTopic",
            name=topic.name,
            partitions=tuple(
                api.make(
                    "OffsetDeleteResponsePartition",
                    partition_index=p.partition_index,
                    error_code=results.get((topic.name, p.partition_index), E.none),
                )
                for p in topic.partitions
            ),
        )
        for topic in request.topics
    )
    if code is not E.none:
        topics = ()
    return api.response(error_code=code, throttle_time=NO_THROTTLE, topics=topics)
