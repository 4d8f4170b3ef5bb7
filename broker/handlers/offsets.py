"""ListOffsets (2) and OffsetForLeaderEpoch (23): positions in a partition's log.

ListOffsets' special timestamps are Kafka's: -1 latest (the high watermark,
what a consumer can read; the last stable offset for a read_committed one,
isolation_level 1), -2 earliest (the log start offset), -3 the record
with the largest timestamp (KIP-734), -4 the earliest local offset (KIP-405;
every offset is local here, so it is the log start). Any other timestamp
finds the first record at or after it, below the high watermark (the last
stable offset for read_committed); none gives offset and timestamp -1.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext, error
from shoal.broker.log.log import TimestampOffset
from shoal.broker.partition import Partition, PartitionError

from shoal.records import CompressionError, InvalidBatchError
from shoal.wire import ErrorCode

LATEST: Final = -1
EARLIEST: Final = -2
MAX_TIMESTAMP: Final = -3
EARLIEST_LOCAL: Final = -4


READ_COMMITTED: Final = 1


def list_offset(
    partition: Partition, timestamp: int, read_committed: bool = False
) -> TimestampOffset | None:
    log = partition.log
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        start = log.log_start_offset
        return TimestampOffset(-1, start, log.epochs.epoch_for_offset(start))
    fetchable = log.last_stable_offset if read_committed else partition.high_watermark
    if timestamp == LATEST:
        return TimestampOffset(-1, fetchable, log.epochs.latest_epoch)
    found = (
        log.offset_of_max_timestamp()
        if timestamp == MAX_TIMESTAMP
        else (log.offset_for_timestamp(timestamp))
    )
    if found is None or found.offset >= fetchable:
        return None
    return found


async def handle_list_offsets(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    topics = []
    for topic in request.topics:
        results = []
        for p in topic.partitions:
            code: ErrorCode = E.none
            found: TimestampOffset | None = None
            try:
                partition = services.partition(topic.name, p.partition_index)
                partition.require_leader()
                partition.check_epoch(getattr(p, "current_leader_epoch", -1))
                found = list_offset(partition, p.timestamp, read_committed)
            except PartitionError as exc:
                code = error(exc.code)
            except (InvalidBatchError, CompressionError):
                code = E.corrupt_message
            results.append(
                api.make(
                    "ListOffsetsPartitionResponse",
                    partition_index=p.partition_index,
                    error_code=code,
                    timestamp=found.timestamp if found else -1,
                    offset=found.offset if found else -1,
                    leader_epoch=found.leader_epoch if found else -1,
                )
            )
        topics.append(
            api.make("ListOffsetsTopicResponse", name=topic.name, partitions=tuple(results))
        )
    return api.response(throttle_time=NO_THROTTLE, topics=tuple(topics))


async def handle_offset_for_leader_epoch(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    topics = []
    for topic in request.topics:
        results = []
        for p in topic.partitions:
            code: ErrorCode = E.none
            epoch, end_offset = -1, -1
            try:
                partition = services.partition(topic.topic, p.partition)
                partition.require_leader()
                partition.check_epoch(getattr(p, "current_leader_epoch", -1))
                epoch, end_offset = partition.log.epochs.end_offset_for(
                    p.leader_epoch, partition.log.log_end_offset
                )
            except PartitionError as exc:
                code = error(exc.code)
            results.append(
                api.make(
                    "EpochEndOffset",
                    error_code=code,
                    partition=p.partition,
                    leader_epoch=epoch,
                    end_offset=end_offset,
                )
            )
        topics.append(
            api.make("OffsetForLeaderTopicResult", topic=topic.topic, partitions=tuple(results))
        )
    return api.response(throttle_time=NO_THROTTLE, topics=tuple(topics))
