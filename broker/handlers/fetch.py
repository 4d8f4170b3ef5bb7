"""Fetch (1): records from partition leaders, long-polled, sent straight from the log files.

Semantics, as Kafka's:

* Consumers read below the high watermark; replicas (replica id >= 0) read
  to the log end, and their fetch offset tells the leader how far they have
  copied (which moves the high watermark and lets them rejoin the ISR). A
  replica id that is not a replica of the partition is refused.
* The response waits up to ``max_wait_ms`` for ``min_bytes`` of records, and
  answers at once when any partition has an error.
* ``max_bytes`` caps the response and ``partition_max_bytes`` each partition,
  except that the first partition with data returns its first batch whole
  even when it is larger (KIP-74), so a consumer never stalls on a big batch.
* read_committed consumers (isolation_level 1) read below the last stable
  offset, and get the aborted transactions (producer id, first offset)
  overlapping what they read, so they can drop those records; every answer
  carries the partition's real last stable offset.
* Fetch sessions (KIP-227, :mod:`shoal.broker.fetch_sessions`): a request
  at epoch 0 gets a session id, and later requests of that session name only
  the partitions that changed; an incremental answer carries only partitions
  with records, news (high watermark, log start, last stable offset) or an
  error. A follower's position is recorded for every partition of its
  session, named in the request or not, so an idle partition's followers stay
  in the ISR.
* A consumer fetching with a version below 10 from a topic whose
  compression.type is zstd gets UNSUPPORTED_COMPRESSION_TYPE, as from Kafka:
  such clients predate zstd, and every batch there is zstd.

Records are never copied into Python: each partition's bytes are a region
of a segment file, spliced into the encoded response (see
:mod:`shoal.wire.splice`).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace
from typing import Any, Final

from shoal.broker.cluster.model import NodeId
from shoal.broker.fetch_sessions import FetchContext, PartitionKey, WantedPartition
from shoal.broker.handlers.base import (
    NO_THROTTLE,
    BrokerServices,
    E,
    RequestContext,
    Spliced,
    error,
)
from shoal.broker.log.log import FileSlice, OffsetOutOfRangeError
from shoal.broker.log.txn_index import AbortedTxn
from shoal.broker.partition import NO_EPOCH, Partition, PartitionError
from shoal.broker.tasks import wait_at_most

from shoal.wire import FINAL_EPOCH, NO_SESSION, ErrorCode, FileRegion, RecordsSplicer

SESSION_VERSION: Final = 7
"""The first Fetch version with sessions (KIP-227)."""
TOPIC_ID_VERSION: Final = 13
ZSTD_MIN_VERSION: Final = 10
"""The first Fetch version whose clients read zstd (KIP-110)."""
READ_COMMITTED: Final = 1


@dataclass(frozen=True, slots=True)
class _Result:
    wanted: WantedPartition
    code: ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: FileSlice | None = None
    last_stable_offset: int = -1
    aborted: tuple[AbortedTxn, ...] | None = None

    @property
    def has_records(self) -> bool:
        return self.records is not None and self.records.size > 0


async def handle_fetch(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    version = ctx.version
    replica_id = request.replica_state.replica_id if version >= 15 else request.replica_id
    context = _session_context(services, ctx, request, replica_id)
    if isinstance(context, ErrorCode):
        return _refusal(ctx, context)
    wanted = context.partitions
    refused: dict[WantedPartition, ErrorCode] = {}
    if replica_id >= 0:
        refused = dict.fromkeys(
            _record_replica_positions(services, wanted, replica_id), E.not_leader_or_follower
        )
    elif version < ZSTD_MIN_VERSION:
        refused = dict.fromkeys(_zstd_topics(services, wanted), E.unsupported_compression_type)
    read_committed = replica_id < 0 and getattr(request, "isolation_level", 0) == READ_COMMITTED
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request.max_wait.total_seconds()
    while True:
        results = _read_all(
            services, context, request.max_bytes, replica_id >= 0, read_committed, refused
        )
        available = sum(r.records.size for r in results if r.records is not None)
        remaining = deadline - loop.time()
        done = available >= request.min_bytes or any(r.code is not E.none for r in results)
        if done or remaining <= 0 or not wanted:
            break
        partitions = {
            p
            for w in wanted
            if w.name is not None and (p := services.replicas.get(w.name, w.index)) is not None
        }
        await _wait_for_data(partitions, remaining, data_only=replica_id >= 0)
    answered = context.answer(results)
    if isinstance(answered, ErrorCode):
        return _refusal(ctx, answered)
    session_id, carried = answered
    return _response(ctx, request, carried, session_id)


def _session_context(
    services: BrokerServices, ctx: RequestContext, request: Any, replica_id: int
) -> FetchContext | ErrorCode:
    by_id = ctx.version >= TOPIC_ID_VERSION
    has_session = ctx.version >= SESSION_VERSION
    context = services.fetch_sessions.context(
        request.session_id if has_session else 0,
        request.session_epoch if has_session else FINAL_EPOCH,
        _wanted(services, request),
        _forgotten(request, by_id) if has_session else (),
        uses_topic_ids=by_id,
        privileged=replica_id >= 0,
    )
    if isinstance(context, FetchContext) and by_id and context.session is not None:
        # A partition an earlier request named carries the name its id had then.
        context.partitions = [_renamed(services, w) for w in context.partitions]
    return context


def _renamed(services: BrokerServices, want: WantedPartition) -> WantedPartition:
    name = None if want.topic_id is None else services.image.topic_ids.get(want.topic_id)
    return want if name == want.name else replace(want, name=name)


def _refusal(ctx: RequestContext, code: ErrorCode) -> Any:
    return ctx.api.response(
        throttle_time=NO_THROTTLE, error_code=code, session_id=NO_SESSION, responses=()
    )


def _forgotten(request: Any, by_id: bool) -> list[PartitionKey]:
    return [
        (topic.topic_id if by_id else topic.topic, index)
        for topic in request.forgotten_topics_data or ()
        for index in topic.partitions
    ]


def _wanted(services: BrokerServices, request: Any) -> list[WantedPartition]:
    image = services.image
    wanted: list[WantedPartition] = []
    for topic in request.topics:
        topic_id = getattr(topic, "topic_id", None)
        name = getattr(topic, "topic", None)
        if topic_id is not None:
            name = image.topic_ids.get(topic_id)
        wanted.extend(
            WantedPartition(
                name,
                topic_id,
                p.partition,
                p.fetch_offset,
                p.partition_max_bytes,
                getattr(p, "current_leader_epoch", -1),
                getattr(p, "log_start_offset", -1),
            )
            for p in topic.partitions
        )
    return wanted


def _record_replica_positions(
    services: BrokerServices, wanted: list[WantedPartition], replica_id: int
) -> set[WantedPartition]:
    """Note each partition's follower position; the wanted entries to refuse."""
    refused = set()
    for want in wanted:
        partition = services.replicas.get(want.name, want.index) if want.name else None
        if partition is None or not partition.is_leader:
            continue
        if replica_id not in partition.replicas:
            refused.add(want)
            continue
        if want.current_leader_epoch == partition.leader_epoch:
            services.replicas.follower_fetched(
                partition, NodeId(replica_id), want.offset, want.log_start_offset
            )
    return refused


def _zstd_topics(services: BrokerServices, wanted: list[WantedPartition]) -> list[WantedPartition]:
    """The partitions of topics whose compression.type is zstd (Kafka checks the config,
    not the batches)."""
    found = []
    for want in wanted:
        partition = services.replicas.get(want.name, want.index) if want.name else None
        if partition is not None and partition.log.config.compression_type == "zstd":
            found.append(want)
    return found


def _read_all(
    services: BrokerServices,
    context: FetchContext,
    max_bytes: int,
    to_log_end: bool,
    read_committed: bool,
    refused: dict[WantedPartition, ErrorCode],
) -> list[_Result]:
    """A result for each partition the answer may carry.

    In an incremental fetch session a partition with nothing to read and
    nothing new to tell is skipped (:func:`_quiet`): the answer would leave it
    out, and a follower of thousands of idle partitions fetches twice a
    second.
    """
    budget = max_bytes
    first = True
    results = []
    incremental = context.session is not None
    for want in context.partitions:
        if want in refused:
            results.append(_Result(want, refused[want]))
            continue
        if incremental and _quiet(services, context, want, to_log_end, read_committed):
            continue
        result = _read_one(
            services, want, min(want.max_bytes, budget), first, to_log_end, read_committed
        )
        if result.records is not None:
            budget = max(0, budget - result.records.size)
            first = False
        results.append(result)
    return results


def _quiet(
    services: BrokerServices,
    context: FetchContext,
    want: WantedPartition,
    to_log_end: bool,
    read_committed: bool,
) -> bool:
    """Whether ``want`` has no records to give and nothing its session was not told.

    Only the plain case: this broker leads the partition at the epoch asked
    (or none asked) and the fetch is at exactly the end of what it may read;
    anything else (an error to give, an offset out of range) is read.
    """
    told = context.told(want)
    if told is None or want.name is None:
        return False
    partition = services.replicas.get(want.name, want.index)
    if partition is None or not partition.is_leader or not partition.may_lead():
        return False
    if want.current_leader_epoch not in (NO_EPOCH, partition.leader_epoch):
        return False
    log = partition.log
    high_watermark = log.high_watermark
    stable = log.last_stable_offset
    limit = stable if read_committed else high_watermark
    if to_log_end:
        limit = log.log_end_offset
    return want.offset == limit and told == (high_watermark, log.log_start_offset, stable)


def _read_one(
    services: BrokerServices,
    want: WantedPartition,
    max_bytes: int,
    min_one: bool,
    to_log_end: bool,
    read_committed: bool,
) -> _Result:
    if want.name is None:
        return _Result(want, E.unknown_topic_id)
    try:
        partition = services.partition(want.name, want.index)
        partition.require_leader()
        partition.check_epoch(want.current_leader_epoch)
    except PartitionError as exc:
        return _Result(want, error(exc.code))
    try:
        info = partition.read(want.offset, max_bytes, min_one, to_log_end, read_committed)
    except OffsetOutOfRangeError:
        log = partition.log
        return _Result(
            want,
            E.offset_out_of_range,
            log.high_watermark,
            log.log_start_offset,
            last_stable_offset=log.last_stable_offset,
        )
    return _Result(
        want,
        E.none,
        info.high_watermark,
        info.log_start_offset,
        info.records,
        info.last_stable_offset,
        info.aborted_transactions,
    )


async def _wait_for_data(partitions: set[Partition], seconds: float, data_only: bool) -> None:
    """Until a change in any of ``partitions`` or ``seconds`` pass. A replica's fetch
    (``data_only``) is not woken by a new high watermark: it reads to the log end, and
    a watermark alone does not complete it (min_bytes of records do), so each record
    committed would cost every parked follower a read of its whole session for nothing."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    for partition in partitions:
        partition.add_waiter(waiter, data_only=data_only)
    try:
        await wait_at_most(waiter, seconds)
    finally:
        for partition in partitions:
            partition.remove_waiter(waiter)


def _aborted(api: Any, result: _Result) -> tuple[Any, ...]:
    return tuple(
        api.make("AbortedTransaction", producer_id=t.producer_id, first_offset=t.first_offset)
        for t in result.aborted or ()
    )


def _response(
    ctx: RequestContext, request: Any, results: list[_Result], session_id: int
) -> Spliced:
    api = ctx.api
    splicer = RecordsSplicer()
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    by_topic: dict[tuple[str | None, uuid.UUID | None], list[Any]] = {}
    for result in results:
        want = result.wanted
        records: bytes = b""
        if result.records is not None:
            s = result.records
            records = splicer.placeholder([FileRegion(s.file, s.position, s.size)])
        by_topic.setdefault((want.name, want.topic_id), []).append(
            api.make(
                "PartitionData",
                partition_index=want.index,
                error_code=result.code,
                high_watermark=result.high_watermark,
                last_stable_offset=result.last_stable_offset,
                log_start_offset=result.log_start_offset,
                aborted_transactions=_aborted(api, result) if read_committed else None,
                preferred_read_replica=-1,
                records=records,
            )
        )
    topics = tuple(
        api.make("FetchableTopicResponse", topic=name, topic_id=topic_id, partitions=tuple(parts))
        for (name, topic_id), parts in by_topic.items()
    )
    body = api.response(
        throttle_time=NO_THROTTLE, error_code=E.none, session_id=session_id, responses=topics
    )
    return Spliced(body, splicer)
