"""The driver's planning of reads, against an in-memory cluster.

``FakeCluster`` answers the planner's questions from a few logs held in
memory, which tests grow, extend with partitions, delete, recreate and expire
(retention) between calls. ``run_stream`` plays Spark's side of a
micro-batch query: ask for the next end, plan the batch, repeat until the end
no longer moves.

The restart tests stand for what Spark does with a Python source: after a
restart it asks for the initial offset again, then replays the last logged
batch from that offset to the end it logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pytest
from shoal.connector.offsets import (
    EARLIEST,
    LATEST,
    DataLossError,
    OffsetRange,
    PartitionOffsets,
    TopicPartition,
    from_json,
    to_json,
)
from shoal.connector.options import Mode, OptionError, ReadOptions, Subscription, parse_read_options
from shoal.connector.planner import StreamPlanner, plan_batch

NOW = 1_700_000_000_000


@dataclass
class FakeLog:
    """One partition: record timestamps by offset, and the first offset retention kept."""

    timestamps: list[int] = field(default_factory=list)
    log_start: int = 0

    @property
    def end(self) -> int:
        return len(self.timestamps)


class FakeCluster:
    """An in-memory ClusterView whose logs tests change between the planner's calls.

    It answers as ``shoal.connector.cluster.Cluster`` does: topics named by
    ``subscribe`` or ``assign`` must exist, a pattern may match nothing.
    """

    def __init__(self) -> None:
        self.topics: dict[str, list[FakeLog]] = {}
        self.clock = NOW

    # -- what tests do to the cluster --

    def create(self, topic: str, partitions: int = 1, records: int = 0) -> None:
        self.topics[topic] = [FakeLog() for _ in range(partitions)]
        for partition in range(partitions):
            self.produce(topic, partition, records)

    def produce(
        self, topic: str, partition: int, count: int = 1, timestamp_ms: int | None = None
    ) -> None:
        """``count`` records; each a millisecond after the last unless a timestamp is given."""
        for _ in range(count):
            self.clock += 1
            self.topics[topic][partition].timestamps.append(
                self.clock if timestamp_ms is None else timestamp_ms
            )

    def produce_everywhere(self, count: int) -> None:
        for topic, logs in self.topics.items():
            for partition in range(len(logs)):
                self.produce(topic, partition, count)

    def add_partitions(self, topic: str, count: int, records: int = 0) -> None:
        first = len(self.topics[topic])
        self.topics[topic].extend(FakeLog() for _ in range(count))
        for partition in range(first, first + count):
            self.produce(topic, partition, records)

    def delete(self, topic: str) -> None:
        del self.topics[topic]

    def expire(self, topic: str, partition: int, before: int) -> None:
        """Retention: offsets below ``before`` are gone."""
        log = self.topics[topic][partition]
        log.log_start = max(log.log_start, min(before, log.end))

    # -- ClusterView --

    def partitions(
        self, subscription: Subscription, must_exist: bool = True
    ) -> list[TopicPartition]:
        if subscription.pattern is not None:
            return [
                TopicPartition(topic, p)
                for topic in sorted(self.topics)
                if subscription.matches(topic)
                for p in range(len(self.topics[topic]))
            ]
        if subscription.assigned:
            for tp in subscription.assigned:
                self._log(tp)
            return list(subscription.assigned)
        missing = [t for t in subscription.topics if t not in self.topics]
        assert not (missing and must_exist), f"the real Cluster fails a read of {missing}"
        return [
            TopicPartition(t, p)
            for t in subscription.topics
            if t in self.topics
            for p in range(len(self.topics[t]))
        ]

    def offsets(self, wanted: Mapping[TopicPartition, int]) -> PartitionOffsets:
        earliest = self.earliest(tp for tp, offset in wanted.items() if offset == EARLIEST)
        latest = self.latest(tp for tp, offset in wanted.items() if offset == LATEST)
        return {tp: {**earliest, **latest}.get(tp, offset) for tp, offset in wanted.items()}

    def earliest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets:
        return {tp: self._log(tp).log_start for tp in partitions}

    def latest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets:
        return {tp: self._log(tp).end for tp in partitions}

    def offsets_for_timestamp(
        self, partitions: Iterable[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        found: dict[TopicPartition, int | None] = {}
        for tp in partitions:
            log = self._log(tp)
            found[tp] = next(
                (
                    offset
                    for offset in range(log.log_start, log.end)
                    if log.timestamps[offset] >= timestamp_ms
                ),
                None,
            )
        return found

    def _log(self, tp: TopicPartition) -> FakeLog:
        logs = self.topics.get(tp.topic, [])
        if tp.partition >= len(logs):
            raise LookupError(f"{tp.topic}-{tp.partition} does not exist")
        return logs[tp.partition]


T0, T1, T2 = (TopicPartition("t", p) for p in range(3))


def read_options(mode: Mode, /, **options: str) -> ReadOptions:
    given = {"kafka.bootstrap.servers": "gateway:9092", **options}
    if not {"subscribe", "subscribepattern", "assign"} & given.keys():
        given["subscribe"] = "t"
    return parse_read_options(given, mode)


def batch(cluster: FakeCluster, **options: str) -> list[OffsetRange]:
    return plan_batch(read_options(Mode.BATCH, **options), cluster)


def stream(cluster: FakeCluster, **options: str) -> StreamPlanner:
    return StreamPlanner(read_options(Mode.STREAMING, **options), cluster)


@dataclass
class Run:
    """What Spark did with a stream: each batch's ranges, and the last end it logged."""

    batches: list[list[OffsetRange]]
    end: dict[str, object]

    def offsets_read(self) -> list[tuple[TopicPartition, int]]:
        return [
            (r.topic_partition, offset)
            for ranges in self.batches
            for r in ranges
            for offset in range(r.start, r.end)
        ]


def run_stream(
    planner: StreamPlanner,
    start: dict[str, object],
    max_offsets: int | None = None,
    growing: FakeCluster | None = None,
) -> Run:
    """Spark's micro-batch loop, until a batch would be empty.

    With ``growing``, one record more arrives in every partition after each
    of the first ten batches, as on a busy cluster.
    """
    batches: list[list[OffsetRange]] = []
    for _ in range(1000):
        end = planner.latest_offset(start, max_offsets)
        if end == start:
            return Run(batches, start)
        batches.append(planner.plan(start, end))
        start = end
        if growing is not None and len(batches) <= 10:
            growing.produce_everywhere(1)
    raise AssertionError("the stream never caught up")


def offsets_of(*ranges: tuple[TopicPartition, int, int]) -> list[tuple[TopicPartition, int]]:
    return [(tp, offset) for tp, start, end in ranges for offset in range(start, end)]


@pytest.fixture
def cluster() -> FakeCluster:
    """Topic t: partition 0 with 10 records, partition 1 with 4."""
    fake = FakeCluster()
    fake.create("t", partitions=2)
    fake.produce("t", 0, 10)
    fake.produce("t", 1, 4)
    return fake


# -- batch reads --------------------------------------------------------------------------


def test_batch_reads_from_earliest_to_latest_by_default(cluster: FakeCluster) -> None:
    cluster.expire("t", 0, 3)
    assert batch(cluster) == [OffsetRange(T0, 3, 10), OffsetRange(T1, 0, 4)]


def test_batch_json_offsets_mix_concrete_earliest_and_latest(cluster: FakeCluster) -> None:
    ranges = batch(
        cluster,
        startingoffsets='{"t":{"0":2,"1":-2}}',
        endingoffsets='{"t":{"0":7,"1":-1}}',
    )
    assert ranges == [OffsetRange(T0, 2, 7), OffsetRange(T1, 0, 4)]


def test_batch_json_offsets_leave_partitions_not_named_at_the_default(
    cluster: FakeCluster,
) -> None:
    ranges = batch(cluster, startingoffsets='{"t":{"1":3}}', endingoffsets='{"t":{"0":5}}')
    assert ranges == [OffsetRange(T0, 0, 5), OffsetRange(T1, 3, 4)]


@pytest.mark.parametrize("option", ["startingOffsets", "endingOffsets"])
def test_json_offsets_naming_partitions_not_read_fail(cluster: FakeCluster, option: str) -> None:
    with pytest.raises(OptionError) as caught:
        batch(cluster, **{option.lower(): '{"t":{"0":1,"7":1},"other":{"0":1}}'})
    assert str(caught.value) == (f"{option} names partitions the read does not cover: other-0, t-7")


def test_json_offsets_must_stay_within_assigned_partitions(cluster: FakeCluster) -> None:
    with pytest.raises(OptionError, match=r"startingOffsets names partitions .*: t-0"):
        batch(cluster, assign='{"t":[1]}', startingoffsets='{"t":{"0":1}}')
    assert batch(cluster, assign='{"t":[1]}', startingoffsets='{"t":{"1":1}}') == [
        OffsetRange(T1, 1, 4)
    ]


def test_batch_ending_before_its_start_fails(cluster: FakeCluster) -> None:
    with pytest.raises(OptionError, match=r"ending position is before .* t-0 \(6 > 5\)"):
        batch(cluster, startingoffsets='{"t":{"0":6}}', endingoffsets='{"t":{"0":5}}')


def test_batch_min_partitions_splits_the_ranges(cluster: FakeCluster) -> None:
    assert batch(cluster, minpartitions="4") == [
        OffsetRange(T0, 0, 4),
        OffsetRange(T0, 4, 7),
        OffsetRange(T0, 7, 10),
        OffsetRange(T1, 0, 4),
    ]


@pytest.fixture
def timed() -> FakeCluster:
    """Topic t: partition 0 at 1000, 2000, 3000 ms; partition 1 at 1500, 2500 ms."""
    fake = FakeCluster()
    fake.create("t", partitions=2)
    for timestamp in (1000, 2000, 3000):
        fake.produce("t", 0, timestamp_ms=timestamp)
    for timestamp in (1500, 2500):
        fake.produce("t", 1, timestamp_ms=timestamp)
    return fake


def test_batch_by_timestamps_starts_and_ends_at_first_records_at_or_after(
    timed: FakeCluster,
) -> None:
    ranges = batch(timed, startingtimestamp="2000", endingtimestamp="2600")
    # t-0 starts at 2000 (offset 1) and ends before 3000 (offset 2); t-1 has
    # nothing at or after 2600, so it ends at its end.
    assert ranges == [OffsetRange(T0, 1, 2), OffsetRange(T1, 1, 2)]


def test_no_record_after_starting_timestamp_fails_by_default(timed: FakeCluster) -> None:
    with pytest.raises(OptionError) as caught:
        batch(timed, startingtimestamp="2800")
    message = str(caught.value)
    assert "no record at or after startingTimestamp=2800 in t-1" in message
    assert "t-0" not in message
    assert "startingOffsetsByTimestampStrategy=latest" in message


def test_no_record_after_starting_timestamp_starts_at_the_end_with_strategy_latest(
    timed: FakeCluster,
) -> None:
    ranges = batch(timed, startingtimestamp="2800", startingoffsetsbytimestampstrategy="latest")
    assert ranges == [OffsetRange(T0, 2, 3)]  # t-1's empty range is dropped


def test_starting_timestamp_skips_records_retention_deleted(timed: FakeCluster) -> None:
    timed.expire("t", 0, 2)
    assert batch(timed, startingtimestamp="0") == [OffsetRange(T0, 2, 3), OffsetRange(T1, 0, 2)]


# -- streams: the initial position ---------------------------------------------------------


def test_stream_from_earliest_has_no_mark_and_reads_at_once(cluster: FakeCluster) -> None:
    cluster.expire("t", 1, 1)
    planner = stream(cluster, startingoffsets="earliest")
    initial = planner.initial_offset()
    assert initial == {"t": {"0": 0, "1": 1}}
    end = planner.latest_offset(initial, None)
    assert end == {"t": {"0": 10, "1": 4}}
    assert planner.plan(initial, end) == [OffsetRange(T0, 0, 10), OffsetRange(T1, 1, 4)]


def test_stream_from_latest_is_marked(cluster: FakeCluster) -> None:
    initial = stream(cluster).initial_offset()
    assert initial == {"$initial": True, "t": {"0": 10, "1": 4}}


def test_stream_from_a_timestamp_is_marked(timed: FakeCluster) -> None:
    initial = stream(timed, startingtimestamp="2000").initial_offset()
    assert from_json(initial) == ({T0: 1, T1: 1}, True)


def test_stream_from_json_offsets_is_marked_as_unnamed_partitions_take_latest(
    cluster: FakeCluster,
) -> None:
    initial = stream(cluster, startingoffsets='{"t":{"0":3}}').initial_offset()
    assert initial == {"$initial": True, "t": {"0": 3, "1": 4}}


def test_initial_offset_is_resolved_once_per_run(cluster: FakeCluster) -> None:
    planner = stream(cluster)
    first = planner.initial_offset()
    cluster.produce_everywhere(5)
    assert planner.initial_offset() == first


def test_first_batch_after_a_marked_start_pins_it_and_reads_nothing(
    cluster: FakeCluster,
) -> None:
    planner = stream(cluster, maxoffsetspertrigger="1")
    initial = planner.initial_offset()
    cluster.produce_everywhere(5)
    end = planner.latest_offset(initial, 1)
    assert end == {"t": {"0": 10, "1": 4}}  # the same offsets, unmarked
    assert end != initial  # so Spark runs (and logs) batch 0
    assert planner.plan(initial, end) == []
    # From there on, the records that arrived after the start are read.
    run = run_stream(planner, end)
    assert sorted(run.offsets_read()) == offsets_of((T0, 10, 15), (T1, 4, 9))


def test_stream_json_offsets_naming_partitions_not_read_fail(cluster: FakeCluster) -> None:
    with pytest.raises(OptionError, match=r"startingOffsets names partitions .*: t-2"):
        stream(cluster, startingoffsets='{"t":{"2":0}}').initial_offset()


# -- streams: restarts ------------------------------------------------------------------


def test_restart_after_the_log_grew_skips_no_record(cluster: FakeCluster) -> None:
    # Run 1 starts from latest and logs batch 0 (its end), then stops.
    first_run = stream(cluster)
    initial = first_run.initial_offset()
    logged_end_of_batch_0 = first_run.latest_offset(initial, None)
    assert first_run.plan(initial, logged_end_of_batch_0) == []
    cluster.produce_everywhere(5)

    # Run 2: Spark asks the new reader for its initial offset again, which
    # has moved, and replays batch 0 from it to the logged end.
    second_run = stream(cluster)
    new_initial = second_run.initial_offset()
    assert new_initial != initial
    assert new_initial == {"$initial": True, "t": {"0": 15, "1": 9}}
    assert second_run.plan(new_initial, logged_end_of_batch_0) == []

    # The next batch starts from the logged end: every record written since
    # run 1 started is read, once.
    run = run_stream(second_run, logged_end_of_batch_0)
    assert sorted(run.offsets_read()) == offsets_of((T0, 10, 15), (T1, 4, 9))


def test_restart_replays_a_logged_batch_with_the_same_ranges(cluster: FakeCluster) -> None:
    first_run = stream(cluster, startingoffsets="earliest", maxoffsetspertrigger="6")
    start = first_run.initial_offset()
    end = first_run.latest_offset(start, 6)
    planned = first_run.plan(start, end)
    cluster.produce_everywhere(20)
    assert stream(cluster, startingoffsets="earliest").plan(start, end) == planned


# -- streams: maxOffsetsPerTrigger -------------------------------------------------------------


def test_max_offsets_caps_every_batch_and_the_batches_reach_the_end(
    cluster: FakeCluster,
) -> None:
    cluster.create("u", partitions=1, records=0)
    planner = stream(cluster, subscribepattern="t|u", startingoffsets="earliest")
    run = run_stream(planner, planner.initial_offset(), max_offsets=3)
    for ranges in run.batches:
        assert sum(r.size for r in ranges) <= 3
    assert len(run.batches) == 5  # 14 offsets, 3 at a time
    assert sorted(run.offsets_read()) == offsets_of((T0, 0, 10), (T1, 0, 4))
    assert run.end == {"t": {"0": 10, "1": 4}, "u": {"0": 0}}


def test_max_offsets_keeps_up_with_a_growing_log(cluster: FakeCluster) -> None:
    planner = stream(cluster, startingoffsets="earliest")
    start = planner.initial_offset()
    run = run_stream(planner, start, max_offsets=5, growing=cluster)
    assert all(sum(r.size for r in ranges) <= 5 for ranges in run.batches)
    ends = from_json(run.end)[0]
    assert ends == {T0: cluster.topics["t"][0].end, T1: cluster.topics["t"][1].end}
    read = run.offsets_read()
    assert len(read) == len(set(read)) == sum(ends.values())


# -- streams: Trigger.AvailableNow ------------------------------------------------------------


def test_available_now_stops_at_what_existed_when_it_started(cluster: FakeCluster) -> None:
    planner = stream(cluster, startingoffsets="earliest")
    planner.prepare_available_now()
    cluster.produce_everywhere(3)
    run = run_stream(planner, planner.initial_offset(), growing=cluster)
    assert run.end == {"t": {"0": 10, "1": 4}}
    assert sorted(run.offsets_read()) == offsets_of((T0, 0, 10), (T1, 0, 4))


def test_available_now_with_max_offsets_runs_capped_batches_to_the_target(
    cluster: FakeCluster,
) -> None:
    planner = stream(cluster, startingoffsets="earliest", maxoffsetspertrigger="4")
    planner.prepare_available_now()
    run = run_stream(planner, planner.initial_offset(), max_offsets=4, growing=cluster)
    assert [sum(r.size for r in ranges) for ranges in run.batches] == [4, 4, 4, 2]
    assert sorted(run.offsets_read()) == offsets_of((T0, 0, 10), (T1, 0, 4))


def test_available_now_ignores_partitions_created_after_it_started(
    cluster: FakeCluster,
) -> None:
    planner = stream(cluster, subscribepattern="t|u", startingoffsets="earliest")
    planner.prepare_available_now()
    initial = planner.initial_offset()
    cluster.add_partitions("t", 1, records=5)
    cluster.create("u", partitions=1, records=5)
    run = run_stream(planner, initial)
    assert sorted(run.offsets_read()) == offsets_of((T0, 0, 10), (T1, 0, 4))


@pytest.mark.parametrize(
    ("starting", "change"),
    [("latest", "log grows"), ("latest", "partition added"), ("earliest", "partition added")],
)
def test_available_now_is_not_data_loss_when_the_log_moves_as_it_starts(
    cluster: FakeCluster, starting: str, change: str
) -> None:
    planner = stream(cluster, startingoffsets=starting)
    planner.prepare_available_now()  # Spark: when the query starts
    if change == "log grows":
        cluster.produce_everywhere(3)
    else:
        cluster.add_partitions("t", 1, records=2)
    initial = planner.initial_offset()  # Spark: when it plans the first batch
    run = run_stream(planner, initial)
    existed = offsets_of((T0, 0, 10), (T1, 0, 4)) if starting == "earliest" else []
    assert sorted(run.offsets_read()) == existed


# -- streams: new partitions and lost data --------------------------------------------------


def test_new_partitions_are_read_from_their_earliest_offset(cluster: FakeCluster) -> None:
    planner = stream(cluster, subscribepattern="t|u", startingoffsets="earliest")
    caught_up = run_stream(planner, planner.initial_offset()).end
    cluster.add_partitions("t", 1, records=6)
    cluster.create("u", partitions=1, records=3)
    run = run_stream(planner, caught_up)
    assert run.batches == [[OffsetRange(T2, 0, 6), OffsetRange(TopicPartition("u", 0), 0, 3)]]


def test_a_new_partition_whose_first_records_expired_is_data_loss(cluster: FakeCluster) -> None:
    strict = stream(cluster, startingoffsets="earliest")
    caught_up = run_stream(strict, strict.initial_offset()).end
    cluster.add_partitions("t", 1, records=6)
    cluster.expire("t", 2, 2)
    end = strict.latest_offset(caught_up, None)
    with pytest.raises(DataLossError, match="new partition t-2 starts at offset 2, not 0"):
        strict.plan(caught_up, end)
    lenient = stream(cluster, startingoffsets="earliest", failondataloss="false")
    assert lenient.plan(caught_up, end) == [OffsetRange(T2, 2, 6)]


def test_new_partitions_share_max_offsets_from_their_earliest_offset(
    cluster: FakeCluster,
) -> None:
    planner = stream(cluster, startingoffsets="earliest")
    caught_up = run_stream(planner, planner.initial_offset()).end
    cluster.add_partitions("t", 1, records=8)
    end = planner.latest_offset(caught_up, 2)
    assert end == {"t": {"0": 10, "1": 4, "2": 2}}
    assert planner.plan(caught_up, end) == [OffsetRange(T2, 0, 2)]


def test_position_below_the_log_start_is_planned_for_the_reader_to_report(
    cluster: FakeCluster,
) -> None:
    # Retention deleted offsets the stream has not read: the task finds out
    # when it reads (and applies failOnDataLoss); the plan keeps the range.
    planner = stream(cluster)
    start = to_json({T0: 2, T1: 0})
    cluster.expire("t", 0, 6)
    end = planner.latest_offset(start, None)
    assert planner.plan(start, end) == [OffsetRange(T0, 2, 10), OffsetRange(T1, 0, 4)]


@pytest.fixture
def two_topics() -> FakeCluster:
    fake = FakeCluster()
    fake.create("t", partitions=1, records=5)
    fake.create("u", partitions=2, records=5)
    return fake


def test_deleted_topic_is_data_loss(two_topics: FakeCluster) -> None:
    planner = stream(two_topics, subscribepattern="t|u", startingoffsets="earliest")
    start = run_stream(planner, planner.initial_offset()).end
    two_topics.delete("u")
    two_topics.produce("t", 0, 2)
    end = planner.latest_offset(start, None)
    with pytest.raises(DataLossError) as caught:
        planner.plan(start, end)
    assert "partitions u-0, u-1 are gone" in str(caught.value)
    assert "failOnDataLoss=false" in str(caught.value)


def test_deleted_topic_without_fail_on_data_loss_is_skipped_with_a_warning(
    two_topics: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    planner = stream(
        two_topics, subscribepattern="t|u", startingoffsets="earliest", failondataloss="false"
    )
    start = run_stream(planner, planner.initial_offset()).end
    two_topics.delete("u")
    two_topics.produce("t", 0, 2)
    with caplog.at_level(logging.WARNING, logger="shoal.connector.planner"):
        ranges = planner.plan(start, planner.latest_offset(start, None))
    assert ranges == [OffsetRange(T0, 5, 7)]
    assert "failOnDataLoss=false, skipping: partitions u-0, u-1 are gone" in caplog.text


@pytest.mark.parametrize("max_offsets", [None, 3])
def test_recreated_topic_is_data_loss(cluster: FakeCluster, max_offsets: int | None) -> None:
    planner = stream(cluster, startingoffsets="earliest")
    start = run_stream(planner, planner.initial_offset()).end
    cluster.create("t", partitions=2, records=2)
    end = planner.latest_offset(start, max_offsets)
    with pytest.raises(DataLossError) as caught:
        planner.plan(start, end)
    message = str(caught.value)
    assert "t-0: offset went back from 10 to 2 (topic recreated?)" in message
    assert "t-1: offset went back from 4 to 2" in message


def test_recreated_topic_is_data_loss_during_available_now(cluster: FakeCluster) -> None:
    planner = stream(cluster, startingoffsets="earliest")
    start = run_stream(planner, planner.initial_offset()).end
    planner.prepare_available_now()
    cluster.create("t", partitions=2, records=2)
    end = planner.latest_offset(start, None)
    with pytest.raises(DataLossError, match="t-0: offset went back from 10 to 2"):
        planner.plan(start, end)


def test_recreated_topic_without_fail_on_data_loss_carries_on_from_the_new_end(
    cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    planner = stream(cluster, startingoffsets="earliest", failondataloss="false")
    start = run_stream(planner, planner.initial_offset()).end
    cluster.create("t", partitions=2, records=2)
    with caplog.at_level(logging.WARNING, logger="shoal.connector.planner"):
        end = planner.latest_offset(start, None)
        assert planner.plan(start, end) == []
    assert "t-0: offset went back from 10 to 2" in caplog.text
    cluster.produce("t", 0, 3)
    run = run_stream(planner, end)
    assert run.offsets_read() == offsets_of((T0, 2, 5))
