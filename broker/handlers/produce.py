"""Produce (0): append the client's batches, as they are, to partition leaders.

Kafka's rules for v3 and later: exactly one magic-2 batch per partition;
zstd only from v7; acks must be 0, 1 or -1; nothing from clients into
internal topics. Batches of idempotent producers are checked against their
producer's sequence (a retry is answered with its original offset and not
stored twice). Transactional batches open or continue their producer's
transaction; a plain batch from a producer with an open transaction is
INVALID_TXN_STATE, an older producer epoch INVALID_PRODUCER_EPOCH (the
producer state's errors carry their Kafka code). With acks=all the answer
waits until the high watermark passes the batch (a retry too: its first
attempt may not be committed yet), and fails with
NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below
``min.insync.replicas`` meanwhile, NOT_LEADER_OR_FOLLOWER if leadership moved,
or REQUEST_TIMED_OUT after the request's timeout. That wait is a :class:`Later`
answer: the connection handles the producer's next produce meanwhile (appends
stay in request order, answers too). Errors are per partition. With
acks=0 the client reads no response, so an error closes the connection
instead, which is how Kafka tells such a client that something went wrong.

Transactional batches are verified first (KIP-890 part 1, see
:mod:`shoal.broker.txn.verification`): a partition where the producer has no
transaction open at this epoch gets its batch only once the transaction
coordinator of the request's ``transactional_id`` confirms that the partition
is in the producer's ongoing transaction, so a batch never opens a
transaction nobody will close. As Kafka's ReplicaManager answers: a partition
not in the transaction is INVALID_TXN_STATE (TRANSACTION_ABORTABLE from v11),
a coordinator that cannot answer now NOT_ENOUGH_REPLICAS (retried by every
client, without a metadata refresh); transactional batches without a
transactional id are TRANSACTIONAL_ID_AUTHORIZATION_FAILED, and batches of
two producers in one request INVALID_PRODUCER_ID_MAPPING, for the whole
request. Kafka skips the check when the producer's transaction is open in the
partition; Shoal skips it only when it is open at the batch's epoch or a
newer one, so a borrowed producer id with a higher epoch is always checked.

A topic whose compression.type names another codec than the batch's gets the
batch rebuilt in that codec (the log's rule, as Kafka's LogValidator). The
rebuild runs in a worker thread before the append: a codec takes
milliseconds per batch, which on the event loop would stall every
connection of the broker. The connection handles no other request until the
appends are done, so the wait reorders nothing of one producer's.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import dataclass
from typing import Any, Final

from shoal.broker.handlers.base import (
    NO_THROTTLE,
    BrokerServices,
    E,
    Later,
    RequestContext,
    error,
)
from shoal.broker.log.log import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    KafkaStorageError,
    Log,
    LogError,
    RecordTooLargeError,
)
from shoal.broker.log.producer_state import ProducerStateError
from shoal.broker.partition import Partition, PartitionError
from shoal.broker.server.connection import CloseConnectionError
from shoal.broker.topic_admin import INTERNAL_TOPICS

from shoal.records import BatchHeader, Compression, InvalidBatchError, parse_header, validate_batch
from shoal.wire import ErrorCode

log = logging.getLogger(__name__)

ZSTD_MIN_VERSION: Final = 7
ABORTABLE_VERSION: Final = 11
"""Produce answers TRANSACTION_ABORTABLE from here on (KIP-890)."""
_UNVERIFIED_RETRIABLE: Final = frozenset(
    {
        E.concurrent_transactions,
        E.network_exception,
        E.coordinator_load_in_progress,
        E.coordinator_not_available,
        E.not_coordinator,
    }
)
_LOG_ERRORS: Final[dict[type[LogError], ErrorCode]] = {
    CorruptRecordError: E.corrupt_message,
    InvalidRecordError: E.invalid_record,
    RecordTooLargeError: E.message_too_large,
    InvalidTimestampError: E.invalid_timestamp,
    # Retriable: the client refreshes metadata and finds the partition's next leader.
    KafkaStorageError: E.kafka_storage_error,
}


class _RefusedError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _check_single_batch(version: int, records: bytes | None) -> None:
    """ProduceRequest.validateRecords: one magic-2 batch, zstd only from v7."""
    if not records:
        raise _RefusedError(E.invalid_record, "no record batch for the partition")
    try:
        header = parse_header(records)
    except InvalidBatchError as exc:
        raise _RefusedError(E.corrupt_message, str(exc)) from exc
    if header.magic != 2:
        raise _RefusedError(E.invalid_record, f"record batch magic {header.magic}; Shoal needs 2")
    if header.size > len(records):
        raise _RefusedError(E.corrupt_message, "record batch is cut short")
    if header.size < len(records):
        raise _RefusedError(
            E.invalid_record, "Produce v3+ allows exactly one record batch per partition"
        )
    try:
        codec = header.compression
    except InvalidBatchError as exc:
        raise _RefusedError(E.invalid_record, str(exc)) from exc
    if codec is Compression.ZSTD and version < ZSTD_MIN_VERSION:
        raise _RefusedError(E.unsupported_compression_type, "zstd needs Produce v7 or later")


@dataclass(frozen=True, slots=True)
class _Outcome:
    code: ErrorCode
    message: str | None = None
    partition: Partition | None = None
    base_offset: int = -1
    log_append_time: datetime.datetime | None = None
    log_start_offset: int = -1
    next_offset: int = -1


def _rebuild_job(
    services: BrokerServices, ctx: RequestContext, acks: int, topic: str, data: Any
) -> tuple[Log, BatchHeader] | None:
    """The log and batch header when the batch needs its topic's codec; None otherwise.

    None too for anything :func:`_produce_one` refuses, which reports it.
    """
    if acks not in (0, 1, -1) or topic in INTERNAL_TOPICS:
        return None
    try:
        log_ = services.partition(topic, data.index).log
        codec = log_.config.compression
        if codec is None:
            return None  # compression.type=producer, the default: nothing to look at
        _check_single_batch(ctx.version, data.records)
        header = validate_batch(data.records)
    except (_RefusedError, PartitionError, InvalidBatchError):
        return None
    return None if header.compression is codec else (log_, header)


async def _rebuilt(log_: Log, records: bytes, header: BatchHeader) -> bytes | LogError:
    """``records`` in the topic's codec, or why it cannot be (the append reports it)."""
    try:
        rebuilt = await asyncio.to_thread(log_.in_topic_codec, records, header)
    except LogError as exc:
        return exc
    # None: compression.type changed meanwhile; the append rebuilds as it now says.
    return records if rebuilt is None else rebuilt


def _produce_one(
    services: BrokerServices,
    ctx: RequestContext,
    acks: int,
    topic: str,
    data: Any,
    rebuilt: bytes | LogError | None = None,
) -> _Outcome:
    """Append one partition's batch (``rebuilt``, in the topic's codec, when there is
    one); the outcome, error or not, for the response."""
    try:
        if acks not in (0, 1, -1):
            raise _RefusedError(E.invalid_required_acks, f"acks={acks}; use 0, 1 or -1")
        if topic in INTERNAL_TOPICS:
            raise _RefusedError(E.invalid_topic_exception, f"clients may not write to {topic}")
        partition = services.partition(topic, data.index)
        _check_single_batch(ctx.version, data.records)
        if isinstance(rebuilt, LogError):
            raise rebuilt
        info = partition.append_as_leader(data.records if rebuilt is None else rebuilt, acks)
    except _RefusedError as exc:
        return _Outcome(exc.code, str(exc))
    except LogError as exc:
        return _Outcome(_LOG_ERRORS.get(type(exc), E.unknown_server_error), str(exc))
    except (PartitionError, ProducerStateError) as exc:
        return _Outcome(error(exc.code), str(exc))
    if info.duplicate:
        log.info(
            "event=produce_duplicate topic=%s partition=%d base_offset=%d",
            topic,
            data.index,
            info.first_offset,
        )
    append_time = None
    if info.log_append_time >= 0:
        append_time = datetime.datetime.fromtimestamp(info.log_append_time / 1000, datetime.UTC)
    return _Outcome(
        E.none,
        None,
        partition,
        info.first_offset,
        append_time,
        partition.log.log_start_offset,
        info.last_offset + 1,
    )


def _transactional_header(acks: int, topic: str, data: Any) -> BatchHeader | None:
    """The header of a transactional data batch the append would get; None for
    anything else (including what :func:`_produce_one` refuses, which reports it)."""
    if acks not in (0, 1, -1) or topic in INTERNAL_TOPICS or not data.records:
        return None
    try:
        header = parse_header(data.records)
    except InvalidBatchError:
        return None
    if header.is_control or not header.is_transactional or header.producer_id < 0:
        return None
    return header


def _needs_verification(
    services: BrokerServices, topic: str, index: int, header: BatchHeader
) -> bool:
    """Whether the batch could open a transaction here: its producer has none open in the
    partition at this epoch or a newer one (an older epoch is fenced by the append)."""
    try:
        partition = services.partition(topic, index)
    except PartitionError:
        return False  # the append reports it
    entry = partition.log.producer_state.producers.get(header.producer_id)
    return not (
        entry is not None
        and entry.current_txn_first_offset >= 0
        and header.producer_epoch <= entry.epoch
    )


async def _verify_transactional(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> dict[int, _Outcome]:
    """KIP-890 part 1: refusals, by ``id(partition data)``, of transactional batches whose
    partition the transaction coordinator does not find in the ongoing transaction."""
    found = [
        (data, topic.name, header)
        for topic in request.topic_data
        for data in topic.partition_data
        if (header := _transactional_header(request.acks, topic.name, data)) is not None
    ]
    if not found:
        return {}
    everything = [data for topic in request.topic_data for data in topic.partition_data]
    transactional_id = getattr(request, "transactional_id", None)
    if transactional_id is None:
        return {
            id(data): _Outcome(
                E.transactional_id_authorization_failed,
                "transactional records need the request's transactional id",
            )
            for data in everything
        }
    producers = {(h.producer_id, h.producer_epoch) for _, _, h in found}
    if len(producers) > 1:
        return {
            id(data): _Outcome(
                E.invalid_producer_id_mapping,
                "transactional records contained more than one producer id",
            )
            for data in everything
        }
    ((producer_id, epoch),) = producers
    wanted = {
        (topic, data.index): data
        for data, topic, header in found
        if _needs_verification(services, topic, data.index, header)
    }
    if not wanted:
        return {}
    codes = await services.verifier.verify(
        transactional_id, producer_id, epoch, wanted, abortable=ctx.version >= ABORTABLE_VERSION
    )
    refused = {}
    for tp, code in codes.items():
        if code is E.none:
            continue
        if code is E.invalid_txn_state:
            outcome = _Outcome(code, "Partition was not added to the transaction")
        elif code in _UNVERIFIED_RETRIABLE:
            outcome = _Outcome(
                E.not_enough_replicas,
                "Unable to verify the partition has been added to the transaction."
                f" Underlying error: {code.name}",
            )
        else:
            outcome = _Outcome(code, f"transaction verification failed: {code.name}")
        refused[id(wanted[tp])] = outcome
    return refused


async def handle_produce(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    acks = request.acks
    refused = await _verify_transactional(services, ctx, request)
    jobs = {
        id(data): job
        for topic in request.topic_data
        for data in topic.partition_data
        if id(data) not in refused
        and (job := _rebuild_job(services, ctx, acks, topic.name, data)) is not None
    }
    rebuilt: dict[int, bytes | LogError] = {}
    if jobs:
        records = {id(d): d.records for t in request.topic_data for d in t.partition_data}
        done = await asyncio.gather(
            *(_rebuilt(log_, records[key], header) for key, (log_, header) in jobs.items())
        )
        rebuilt = dict(zip(jobs, done, strict=True))
    outcomes = [
        [
            (
                data.index,
                refused.get(id(data))
                or _produce_one(services, ctx, acks, topic.name, data, rebuilt.get(id(data))),
            )
            for data in topic.partition_data
        ]
        for topic in request.topic_data
    ]
    appended = [o for parts in outcomes for _, o in parts if o.partition is not None]
    # flush.messages asks for an fsync before the acknowledgement, as in Kafka.
    for partition in dict.fromkeys(o.partition for o in appended if o.partition is not None):
        if partition.log.unflushed_messages >= partition.log.config.flush_messages:
            await partition.log.flush()
    if acks == -1 and appended:
        return Later(_answer_when_committed(api, request, outcomes, appended))
    return _response(api, request, outcomes)


async def _answer_when_committed(
    api: Any, request: Any, outcomes: list[list[tuple[int, _Outcome]]], appended: list[_Outcome]
) -> Any:
    """acks=all: the response once every appended batch is committed or has failed."""
    timeout_s = request.timeout.total_seconds()
    committed = await asyncio.gather(*(_committed(o, timeout_s) for o in appended))
    replaced = dict(zip(map(id, appended), committed, strict=True))
    outcomes = [[(i, replaced.get(id(o), o)) for i, o in parts] for parts in outcomes]
    return _response(api, request, outcomes)


def _response(api: Any, request: Any, outcomes: list[list[tuple[int, _Outcome]]]) -> Any:
    failed = False
    topics = []
    for topic, parts in zip(request.topic_data, outcomes, strict=True):
        results = []
        for index, outcome in parts:
            if outcome.code is not E.none:
                failed = True
                log.info(
                    "event=produce_refused topic=%s partition=%d error=%s reason=%s",
                    topic.name,
                    index,
                    outcome.code.name,
                    outcome.message,
                )
            results.append(
                api.make(
                    "PartitionProduceResponse",
                    index=index,
                    error_code=outcome.code,
                    base_offset=outcome.base_offset,
                    log_append_time=outcome.log_append_time,
                    log_start_offset=outcome.log_start_offset,
                    record_errors=(),
                    error_message=outcome.message,
                )
            )
        topics.append(
            api.make("TopicProduceResponse", name=topic.name, partition_responses=tuple(results))
        )
    if request.acks == 0:
        if failed:
            raise CloseConnectionError("acks=0 produce failed; closing so the client notices")
        return None
    return api.response(responses=tuple(topics), throttle_time=NO_THROTTLE)


async def _committed(outcome: _Outcome, timeout_s: float) -> _Outcome:
    """acks=all: the outcome once the ISR has the batch, or the error that stopped it."""
    assert outcome.partition is not None
    try:
        await outcome.partition.wait_for_commit(outcome.next_offset, timeout_s)
    except PartitionError as exc:
        return _Outcome(error(exc.code), str(exc))
    return outcome
