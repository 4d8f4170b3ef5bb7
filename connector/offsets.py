"""Offsets and offset ranges: the pure planning behind every read.

A stream's position is spark-sql-kafka's offset JSON, ``{"topic": {"0": 23}}``:
the next offset to read per partition, kept by Spark in the query's
checkpoint. Nothing here talks to a cluster; the reader asks the cluster for
watermarks and hands them in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

# Kafka's ListOffsets sentinels, also the values spark-sql-kafka's JSON offsets use.
LATEST = -1
EARLIEST = -2

# Marks a stream's initial position that was resolved from something that
# moves (latest, a timestamp). Spark logs a batch's end offsets before running
# it but asks the source for the initial offset again after a restart, so the
# first batch only pins the resolved position (it reads nothing) and every
# later batch starts from a logged offset. "$" cannot occur in a topic name.
INITIAL_MARK = "$initial"


class TopicPartition(NamedTuple):
    topic: str
    partition: int


PartitionOffsets = dict[TopicPartition, int]


class DataLossError(RuntimeError):
    """Records the query was meant to read are gone (retention, deletion)."""


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``start`` (inclusive) to ``end`` (exclusive) of one partition."""

    topic_partition: TopicPartition
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def to_json(offsets: Mapping[TopicPartition, int], initial: bool = False) -> dict[str, object]:
    """Offsets as spark-sql-kafka's JSON object, in a stable order.

    Spark compares offsets by their JSON text, so equal positions must always
    serialise the same way.
    """
    result: dict[str, object] = {INITIAL_MARK: True} if initial else {}
    for tp in sorted(offsets):
        by_partition = result.setdefault(tp.topic, {})
        assert isinstance(by_partition, dict)
        by_partition[str(tp.partition)] = offsets[tp]
    return result


def from_json(value: Mapping[str, object]) -> tuple[PartitionOffsets, bool]:
    """The offsets in a spark-sql-kafka JSON object, and whether it is an initial mark."""
    offsets: PartitionOffsets = {}
    for topic, by_partition in value.items():
        if topic == INITIAL_MARK:
            continue
        if not isinstance(by_partition, Mapping):
            raise TypeError(f"offsets of topic {topic!r} are not an object: {by_partition!r}")
        for partition, offset in by_partition.items():
            offsets[TopicPartition(topic, int(partition))] = int(offset)
    return offsets, bool(value.get(INITIAL_MARK))


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_offsets: int
) -> PartitionOffsets:
    """End offsets that advance at most ``max_offsets`` in all, shared by backlog.

    As maxOffsetsPerTrigger does in Spark's Kafka source, each partition gets
    a share proportional to its backlog, so a lagging partition catches up
    without starving the others. Unlike Spark's, the shares never add up to
    more than the limit: shares are rounded down and the offsets left over go
    to the partitions with the largest remainders. ``start`` must name every
    partition of ``latest``.
    """
    backlog = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(backlog.values())
    if total <= max_offsets:
        return dict(latest)
    shares = {tp: max_offsets * size / total for tp, size in backlog.items()}
    taken = {tp: math.floor(share) for tp, share in shares.items()}
    left = max_offsets - sum(taken.values())
    by_remainder = sorted(shares, key=lambda tp: (taken[tp] - shares[tp], tp))
    for tp in by_remainder[:left]:
        taken[tp] += 1
    return {tp: start[tp] + taken[tp] if backlog[tp] else latest[tp] for tp in latest}


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """The ranges, split so that there are at least ``min_partitions`` of them.

    Empty ranges are dropped. Larger ranges are cut into more pieces, in
    proportion to their size, as Spark's KafkaOffsetRangeCalculator does, so
    that tasks get similar amounts of work.
    """
    nonempty = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(nonempty) >= min_partitions:
        return nonempty
    total = sum(r.size for r in nonempty)
    parts = [min(r.size, max(1, min_partitions * r.size // total)) for r in nonempty]
    # Shares are rounded down: give the pieces still missing to the ranges
    # whose pieces are largest, as long as a piece can still be split.
    while sum(parts) < min_partitions:
        splittable = [i for i, r in enumerate(nonempty) if parts[i] < r.size]
        if not splittable:
            break
        widest = max(splittable, key=lambda i: nonempty[i].size / parts[i])
        parts[widest] += 1
    pieces: list[OffsetRange] = []
    for r, count in zip(nonempty, parts, strict=True):
        step, extra = divmod(r.size, count)
        cursor = r.start
        for index in range(count):
            length = step + (1 if index < extra else 0)
            pieces.append(OffsetRange(r.topic_partition, cursor, cursor + length))
            cursor += length
    return pieces


def plan_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    earliest_of_new: Mapping[TopicPartition, int],
    fail_on_data_loss: bool,
) -> tuple[list[OffsetRange], list[str]]:
    """The ranges between two positions, and the data losses found on the way.

    Partitions in ``end`` but not ``start`` appeared since (more partitions or
    a new topic) and are read from their earliest offset, given in
    ``earliest_of_new``. Partitions that vanished, and offsets that went
    backwards, are data loss: an error under failOnDataLoss, otherwise a
    warning returned to the caller and the partition is skipped.
    """
    losses: list[str] = []
    gone = sorted(set(start) - set(end))
    if gone:
        losses.append(
            "partitions "
            + ", ".join(f"{tp.topic}-{tp.partition}" for tp in gone)
            + " are gone (topic deleted?); some data may have been missed"
        )
    ranges: list[OffsetRange] = []
    for tp in sorted(end):
        if tp not in start and earliest_of_new[tp] > 0:
            losses.append(
                f"new partition {tp.topic}-{tp.partition} starts at offset "
                f"{earliest_of_new[tp]}, not 0; some data may have been missed"
            )
        first = start[tp] if tp in start else earliest_of_new[tp]
        last = end[tp]
        if last < first:
            losses.append(
                f"{tp.topic}-{tp.partition}: offset went back from {first} to {last} "
                "(topic recreated?); some data may have been missed"
            )
            continue
        ranges.append(OffsetRange(tp, first, last))
    if losses and fail_on_data_loss:
        raise DataLossError(
            "; ".join(losses) + ". Set failOnDataLoss=false to skip lost data with a warning."
        )
    return ranges, losses
