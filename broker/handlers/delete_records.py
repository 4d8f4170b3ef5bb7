"""DeleteRecords (21): move partitions' log start offsets up, as Kafka's ``kafka-delete-records``.

Per partition, on its leader, as Kafka's ``Partition.deleteRecordsOnLeader``
and ``DelayedDeleteRecords``:

* The offset -1 means the high watermark; any other negative offset, or one
  past the high watermark, is OFFSET_OUT_OF_RANGE (only committed records may
  go). A topic whose ``cleanup.policy`` lacks ``delete`` is POLICY_VIOLATION,
  an internal topic INVALID_TOPIC_EXCEPTION, a partition led elsewhere
  NOT_LEADER_OR_FOLLOWER, a checkpoint that cannot be written
  KAFKA_STORAGE_ERROR.
* The new log start offset is checkpointed (fsynced) before anything else
  happens, then the segments wholly below it are deleted. Readers get
  OFFSET_OUT_OF_RANGE below it and ListOffsets(earliest) returns it.
* The answer for a partition is its low watermark: the smallest log start
  offset of the leader and every live replica. Followers learn the leader's
  from their fetches, persist it, and report theirs in the next fetch; the
  answer waits for all of them up to the request's timeout, and a partition
  still short then gets REQUEST_TIMED_OUT (its records are deleted on the
  leader all the same, and the followers catch up).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Final

from shoal.broker.cluster.model import NodeId
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext, error
from shoal.broker.log.log import OffsetOutOfRangeError
from shoal.broker.partition import Partition, PartitionError
from shoal.broker.topic_admin import INTERNAL_TOPICS

from shoal.wire import ErrorCode

log = logging.getLogger(__name__)

HIGH_WATERMARK: Final = -1
"""Kafka's DeleteRecordsRequest.HIGH_WATERMARK: delete everything committed."""
INVALID_LOW_WATERMARK: Final = -1


@dataclass(slots=True)
class _Outcome:
    topic: str
    index: int
    code: ErrorCode
    low_watermark: int = INVALID_LOW_WATERMARK
    partition: Partition | None = None
    """Set while the answer waits for the replicas."""
    target: int = 0


async def handle_delete_records(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    outcomes = [
        _delete_on_leader(services, topic.name, p.partition_index, p.offset)
        for topic in request.topics
        for p in topic.partitions
    ]
    timeout_s = max(request.timeout.total_seconds(), 0.0)
    waiting = [o for o in outcomes if o.partition is not None]
    if waiting:
        await asyncio.gather(*(_wait_for_replicas(services, o, timeout_s) for o in waiting))
    api = ctx.api
    by_topic: dict[str, list[Any]] = {}
    for outcome in outcomes:
        by_topic.setdefault(outcome.topic, []).append(
            api.make(
                "DeleteRecordsPartitionResult",
                partition_index=outcome.index,
                low_watermark=outcome.low_watermark,
                error_code=outcome.code,
            )
        )
    return api.response(
        throttle_time=NO_THROTTLE,
        topics=tuple(
            api.make("DeleteRecordsTopicResult", name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()
        ),
    )


def _delete_on_leader(services: BrokerServices, topic: str, index: int, offset: int) -> _Outcome:
    if topic in INTERNAL_TOPICS:
        return _Outcome(topic, index, E.invalid_topic_exception)
    try:
        partition = services.partition(topic, index)
        partition.require_leader()
    except PartitionError as exc:
        return _Outcome(topic, index, error(exc.code))
    plog = partition.log
    if not plog.config.deletes:
        return _Outcome(topic, index, E.policy_violation)
    target = partition.high_watermark if offset == HIGH_WATERMARK else offset
    if target < 0:
        return _Outcome(topic, index, E.offset_out_of_range)
    try:
        services.replicas.logs.advance_log_start(plog, target)
    except OffsetOutOfRangeError:
        return _Outcome(topic, index, E.offset_out_of_range)
    except OSError:
        # The checkpoint could not be written: the deletion is not durable, so it
        # must not be reported as done (Kafka's answer for a failing log dir).
        log.exception("event=delete_records_failed topic=%s partition=%d", topic, index)
        return _Outcome(topic, index, E.kafka_storage_error)
    log.info(
        "event=records_deleted topic=%s partition=%d requested=%d log_start_offset=%d",
        topic,
        index,
        offset,
        plog.log_start_offset,
    )
    return _Outcome(topic, index, E.none, partition=partition, target=target)


async def _wait_for_replicas(services: BrokerServices, outcome: _Outcome, timeout_s: float) -> None:
    partition = outcome.partition
    assert partition is not None

    def alive() -> frozenset[NodeId]:
        return frozenset(services.image.brokers)

    try:
        low = await partition.wait_for_low_watermark(outcome.target, timeout_s, alive)
    except PartitionError as exc:
        outcome.code, outcome.low_watermark = error(exc.code), INVALID_LOW_WATERMARK
        return
    outcome.low_watermark = low
    outcome.code = E.none if low >= outcome.target else E.request_timed_out
