"""The driver's side of a read: which offsets each batch covers.

The planners hold the logic of spark-sql-kafka's offset handling: resolving
starting and ending positions, capping micro-batches, Trigger.AvailableNow,
picking up new partitions and noticing lost data. They talk to the cluster
only through the four questions of ``ClusterView``, so tests can answer those
without one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from shoal.connector.offsets import (
    OffsetRange,
    PartitionOffsets,
    TopicPartition,
    from_json,
    plan_ranges,
    rate_limit,
    split_ranges,
    to_json,
)
from shoal.connector.options import OffsetSpec, OptionError, ReadOptions, Subscription

log = logging.getLogger(__name__)


class ClusterView(Protocol):
    def partitions(
        self, subscription: Subscription, must_exist: bool = True
    ) -> list[TopicPartition]: ...

    def offsets(self, wanted: Mapping[TopicPartition, int]) -> PartitionOffsets: ...

    def earliest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets: ...

    def latest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets: ...

    def offsets_for_timestamp(
        self, partitions: Iterable[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]: ...


def resolve(
    spec: OffsetSpec,
    partitions: list[TopicPartition],
    cluster: ClusterView,
    name: str,
    timestamp_not_found_is_error: bool,
) -> PartitionOffsets:
    """Concrete offsets for ``spec`` on ``partitions``.

    By timestamp, a partition with no record at or after it starts at its end
    (ending positions, and startingOffsetsByTimestampStrategy=latest) or fails
    the read (the default for starting positions, as in Spark).
    """
    unknown = sorted(set(spec.offsets) - set(partitions))
    if unknown:
        raise OptionError(
            f"{name} names partitions the read does not cover: "
            + ", ".join(f"{tp.topic}-{tp.partition}" for tp in unknown)
        )
    if spec.timestamp_ms is None:
        return cluster.offsets({tp: spec.offsets.get(tp, spec.default) for tp in partitions})
    found = cluster.offsets_for_timestamp(partitions, spec.timestamp_ms)
    missing = [tp for tp, offset in found.items() if offset is None]
    if missing and timestamp_not_found_is_error:
        raise OptionError(
            f"no record at or after {name}={spec.timestamp_ms} in "
            + ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(missing))
            + "; set startingOffsetsByTimestampStrategy=latest to start at their end instead"
        )
    latest = cluster.latest(missing)
    return {tp: latest[tp] if offset is None else offset for tp, offset in found.items()}


def plan_batch(options: ReadOptions, cluster: ClusterView) -> list[OffsetRange]:
    """The ranges of a batch read, split as minPartitions asks."""
    partitions = cluster.partitions(options.subscription)
    start = resolve(
        options.starting,
        partitions,
        cluster,
        "startingTimestamp" if options.starting.timestamp_ms is not None else "startingOffsets",
        options.timestamp_not_found_is_error,
    )
    end = resolve(
        options.ending,
        partitions,
        cluster,
        "endingTimestamp" if options.ending.timestamp_ms is not None else "endingOffsets",
        timestamp_not_found_is_error=False,
    )
    backwards = [tp for tp in partitions if end[tp] < start[tp]]
    if backwards:
        raise OptionError(
            "the ending position is before the starting position in "
            + ", ".join(f"{tp.topic}-{tp.partition} ({start[tp]} > {end[tp]})" for tp in backwards)
        )
    return split_ranges(
        (OffsetRange(tp, start[tp], end[tp]) for tp in partitions), options.min_partitions
    )


class StreamPlanner:
    """Offsets of a streaming read, one micro-batch at a time.

    Spark keeps the offsets in its checkpoint and hands them back; this
    object only remembers what must not change within one run: the resolved
    initial position and the Trigger.AvailableNow target.
    """

    def __init__(self, options: ReadOptions, cluster: ClusterView) -> None:
        self._options = options
        self._cluster = cluster
        self._initial: dict[str, object] | None = None
        self._target: PartitionOffsets | None = None
        self._last_seen: PartitionOffsets | None = None

    def initial_offset(self) -> dict[str, object]:
        """The position a new query starts from, resolved once per run.

        Resolved from something that moves (latest, a timestamp), it carries
        the initial mark: see ``offsets.INITIAL_MARK``.
        """
        if self._initial is None:
            spec = self._options.starting
            partitions = self._cluster.partitions(self._options.subscription)
            start = resolve(
                spec,
                partitions,
                self._cluster,
                "startingTimestamp" if spec.timestamp_ms is not None else "startingOffsets",
                self._options.timestamp_not_found_is_error,
            )
            self._initial = to_json(start, initial=spec.moves(partitions))
        return self._initial

    def prepare_available_now(self) -> None:
        """Fix the end of a Trigger.AvailableNow run: what exists now, no more.

        Spark calls this before it asks for the initial offset; resolving that
        first keeps the target at or after it.
        """
        self.initial_offset()
        self._target = self.latest()

    def latest_offset(
        self, start_json: Mapping[str, object], max_offsets: int | None
    ) -> dict[str, object]:
        start, initial = from_json(start_json)
        if initial:
            # Pin the resolved initial position as the first batch's end.
            return to_json(start)
        latest = self._last_seen = self.latest()
        if self._target is not None:
            latest = {
                tp: _capped(offset, self._target[tp], start.get(tp))
                for tp, offset in latest.items()
                if tp in self._target
            }
        new = [tp for tp in latest if tp not in start]
        if new:
            log.info(
                "reading new partitions from their earliest offset: %s",
                ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(new)),
            )
        if max_offsets is not None:
            from_ = {**self._cluster.earliest(new), **start}
            latest = rate_limit({tp: from_[tp] for tp in latest}, latest, max_offsets)
        return to_json(latest)

    def last_seen_latest(self) -> dict[str, object] | None:
        """The end of every partition as the last ``latest_offset`` saw it, uncapped.

        For Spark's progress report, which asks right after ``latest_offset``:
        asking the cluster again would double each trigger's requests.
        """
        return None if self._last_seen is None else to_json(self._last_seen)

    def plan(
        self, start_json: Mapping[str, object], end_json: Mapping[str, object]
    ) -> list[OffsetRange]:
        """The ranges of the micro-batch from ``start`` to ``end``."""
        start, initial = from_json(start_json)
        if initial:
            return []
        end, _ = from_json(end_json)
        new = [tp for tp in end if tp not in start]
        ranges, losses = plan_ranges(
            start, end, self._cluster.earliest(new), self._options.fail_on_data_loss
        )
        for loss in losses:
            log.warning("failOnDataLoss=false, skipping: %s", loss)
        return split_ranges(ranges, self._options.min_partitions)

    def latest(self) -> PartitionOffsets:
        """The end of every partition the read covers now.

        A subscribed topic that is gone is left out, not an error: the next
        plan reports its partitions as lost, as failOnDataLoss says.
        """
        partitions = self._cluster.partitions(self._options.subscription, must_exist=False)
        return self._cluster.latest(partitions)


def _capped(latest: int, target: int, start: int | None) -> int:
    """The end of an AvailableNow batch: the target, but never back before the start
    (a restarted run may begin past its new target) unless the log itself went back."""
    end = min(latest, target)
    if start is not None and end < start <= latest:
        return start
    return end
