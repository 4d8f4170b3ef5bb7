"""Offsets and offset ranges: spark-sql-kafka's JSON, rate limits, splits and lost data.

hypothesis properties state what must hold for any backlog: a micro-batch
never passes the limit or a partition's end, splitting never loses or
repeats an offset.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from shoal.connector.offsets import (
    INITIAL_MARK,
    DataLossError,
    OffsetRange,
    PartitionOffsets,
    TopicPartition,
    from_json,
    plan_ranges,
    rate_limit,
    split_ranges,
    to_json,
)

A0, A1, A2 = (TopicPartition("a", p) for p in range(3))
B0 = TopicPartition("b", 0)

topic_partitions = st.builds(
    TopicPartition,
    st.text(
        st.characters(codec="ascii", categories=("L", "N"), include_characters="._-"),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 1000),
)


def text(offsets: dict[str, object]) -> str:
    """How Spark stores and compares a Python source's offset."""
    return json.dumps(offsets)


# -- JSON offsets -----------------------------------------------------------------------


def test_json_is_spark_sql_kafka_offsets() -> None:
    assert to_json({A0: 23, A1: 7, B0: 0}) == {"a": {"0": 23, "1": 7}, "b": {"0": 0}}


def test_initial_mark_comes_first_and_is_read_back() -> None:
    marked = to_json({A0: 5}, initial=True)
    assert text(marked) == '{"$initial": true, "a": {"0": 5}}'
    assert from_json(marked) == ({A0: 5}, True)
    assert from_json(to_json({A0: 5})) == ({A0: 5}, False)


def test_equal_positions_serialise_to_the_same_text_in_partition_order() -> None:
    a10, b2 = TopicPartition("a", 10), TopicPartition("b", 2)
    one = to_json({b2: 1, a10: 2, A2: 3, B0: 4})
    other = to_json({B0: 4, A2: 3, b2: 1, a10: 2})
    # Partitions in numeric order ("2" before "10"), topics in name order.
    assert text(one) == text(other) == '{"a": {"2": 3, "10": 2}, "b": {"0": 4, "2": 1}}'


@given(st.dictionaries(topic_partitions, st.integers(-2, 2**62), max_size=12), st.booleans())
def test_json_round_trips_through_text(offsets: PartitionOffsets, initial: bool) -> None:
    stored = text(to_json(offsets, initial=initial))
    assert from_json(json.loads(stored)) == (offsets, initial)
    # Whatever order the offsets were gathered in, the text is the same.
    assert text(to_json(dict(reversed(list(offsets.items()))), initial=initial)) == stored


def test_from_json_refuses_a_topic_that_is_not_an_object() -> None:
    with pytest.raises(TypeError, match="offsets of topic 'a' are not an object"):
        from_json({"a": 5})


def test_initial_mark_is_not_a_topic() -> None:
    assert from_json({INITIAL_MARK: False, "a": {"0": 1}}) == ({A0: 1}, False)


# -- maxOffsetsPerTrigger -------------------------------------------------------------


@st.composite
def backlogs(draw: st.DrawFn) -> tuple[PartitionOffsets, PartitionOffsets, int]:
    """Start and latest offsets of a few partitions, and a limit."""
    partitions = draw(st.lists(topic_partitions, min_size=1, max_size=8, unique=True))
    big = draw(st.sampled_from([10, 10_000, 2**40]))
    start = {tp: draw(st.integers(0, big)) for tp in partitions}
    latest = {tp: start[tp] + draw(st.integers(0, big)) for tp in partitions}
    limit = draw(st.integers(1, 2 * big))
    return start, latest, limit


@given(backlogs())
def test_rate_limit_advances_exactly_min_of_limit_and_backlog(
    case: tuple[PartitionOffsets, PartitionOffsets, int],
) -> None:
    start, latest, limit = case
    end = rate_limit(start, latest, limit)
    assert end.keys() == latest.keys()
    for tp in latest:
        assert start[tp] <= end[tp] <= latest[tp]
    backlog = sum(latest[tp] - start[tp] for tp in latest)
    advanced = sum(end[tp] - start[tp] for tp in latest)
    assert advanced == min(limit, backlog)
    if backlog > 0:
        assert advanced >= 1  # a limit of at least one always makes progress


@given(backlogs())
def test_rate_limit_shares_the_limit_in_proportion_to_backlog(
    case: tuple[PartitionOffsets, PartitionOffsets, int],
) -> None:
    start, latest, limit = case
    backlog = {tp: latest[tp] - start[tp] for tp in latest}
    total = sum(backlog.values())
    end = rate_limit(start, latest, limit)
    for tp in latest:
        fair = Fraction(limit * backlog[tp], total) if total > limit else Fraction(backlog[tp])
        assert abs(end[tp] - start[tp] - fair) < 1
        if backlog[tp] == 0:
            assert end[tp] == start[tp]


def test_rate_limit_never_exceeds_the_limit_where_spark_rounds_up() -> None:
    # Shares 4.975, 4.975 and 0.05: Spark's rounding would read 5 + 5 + 1 = 11.
    start = {A0: 0, A1: 0, A2: 0}
    latest = {A0: 100, A1: 100, A2: 1}
    assert rate_limit(start, latest, 10) == {A0: 5, A1: 5, A2: 0}


def test_rate_limit_lets_a_lagging_partition_catch_up() -> None:
    start = {A0: 1000, A1: 0}
    latest = {A0: 1010, A1: 990}
    assert rate_limit(start, latest, 100) == {A0: 1001, A1: 99}


def test_rate_limit_with_enough_room_reads_to_latest() -> None:
    assert rate_limit({A0: 3, A1: 0}, {A0: 10, A1: 2}, 9) == {A0: 10, A1: 2}


def test_rate_limit_keeps_an_offset_that_went_back_for_loss_reporting() -> None:
    # A recreated topic's partition restarts below the stream's position;
    # rate limiting must not hide that from plan_ranges.
    assert rate_limit({A0: 50, A1: 0}, {A0: 3, A1: 100}, 10) == {A0: 3, A1: 10}


# -- minPartitions ------------------------------------------------------------------------


@st.composite
def offset_ranges(draw: st.DrawFn) -> list[OffsetRange]:
    partitions = draw(st.lists(topic_partitions, max_size=8, unique=True))
    ranges = []
    for tp in partitions:
        start = draw(st.integers(0, 10**6))
        ranges.append(OffsetRange(tp, start, start + draw(st.integers(0, 500))))
    return ranges


@given(offset_ranges(), st.none() | st.integers(1, 64))
def test_split_covers_every_offset_exactly_once(
    ranges: list[OffsetRange], min_partitions: int | None
) -> None:
    pieces = split_ranges(ranges, min_partitions)
    assert all(piece.size > 0 for piece in pieces)
    for r in ranges:
        mine = [p for p in pieces if p.topic_partition == r.topic_partition]
        # In order, contiguous, from the range's start to its end: no gap, no overlap.
        cursor = r.start
        for piece in mine:
            assert piece.start == cursor
            cursor = piece.end
        assert cursor == r.end
    assert sum(p.size for p in pieces) == sum(r.size for r in ranges)


@given(offset_ranges(), st.integers(1, 64))
def test_split_pieces_of_one_range_are_even(ranges: list[OffsetRange], min_partitions: int) -> None:
    pieces = split_ranges(ranges, min_partitions)
    for r in ranges:
        sizes = [p.size for p in pieces if p.topic_partition == r.topic_partition]
        assert not sizes or max(sizes) - min(sizes) <= 1


def test_split_drops_empty_ranges_and_keeps_enough_ranges_whole() -> None:
    ranges = [OffsetRange(A0, 0, 10), OffsetRange(A1, 5, 5), OffsetRange(A2, 3, 9)]
    assert split_ranges(ranges, None) == [ranges[0], ranges[2]]
    assert split_ranges(ranges, 2) == [ranges[0], ranges[2]]


def test_split_cuts_larger_ranges_into_more_pieces() -> None:
    pieces = split_ranges([OffsetRange(A0, 0, 90), OffsetRange(A1, 100, 130)], 4)
    assert pieces == [
        OffsetRange(A0, 0, 30),
        OffsetRange(A0, 30, 60),
        OffsetRange(A0, 60, 90),
        OffsetRange(A1, 100, 130),
    ]


def test_split_never_makes_pieces_smaller_than_one_offset() -> None:
    assert split_ranges([OffsetRange(A0, 7, 10)], 50) == [
        OffsetRange(A0, 7, 8),
        OffsetRange(A0, 8, 9),
        OffsetRange(A0, 9, 10),
    ]


@given(offset_ranges(), st.integers(1, 64))
@example([OffsetRange(A0, 0, 10), OffsetRange(A1, 0, 10), OffsetRange(A2, 0, 10)], 4)
def test_split_makes_at_least_min_partitions_when_there_are_enough_offsets(
    ranges: list[OffsetRange], min_partitions: int
) -> None:
    pieces = split_ranges(ranges, min_partitions)
    if sum(r.size for r in ranges) >= min_partitions:
        assert len(pieces) >= min_partitions


# -- lost data ------------------------------------------------------------------------


def test_ranges_between_two_positions() -> None:
    ranges, losses = plan_ranges({A0: 5, A1: 0}, {A0: 9, A1: 0}, {}, fail_on_data_loss=True)
    assert ranges == [OffsetRange(A0, 5, 9), OffsetRange(A1, 0, 0)]
    assert losses == []


def test_new_partitions_are_read_from_their_earliest_offset() -> None:
    ranges, losses = plan_ranges({A0: 5}, {A0: 6, A1: 40, B0: 3}, {A1: 0, B0: 0}, True)
    assert ranges == [OffsetRange(A0, 5, 6), OffsetRange(A1, 0, 40), OffsetRange(B0, 0, 3)]
    assert losses == []


def test_a_new_partition_whose_first_records_are_gone_is_data_loss() -> None:
    with pytest.raises(DataLossError, match="new partition a-1 starts at offset 10, not 0"):
        plan_ranges({A0: 5}, {A0: 6, A1: 40}, {A1: 10}, fail_on_data_loss=True)
    ranges, losses = plan_ranges({A0: 5}, {A0: 6, A1: 40}, {A1: 10}, fail_on_data_loss=False)
    assert ranges == [OffsetRange(A0, 5, 6), OffsetRange(A1, 10, 40)]
    assert losses == [
        "new partition a-1 starts at offset 10, not 0; some data may have been missed"
    ]


def test_gone_partitions_fail_naming_them_and_failondataloss() -> None:
    with pytest.raises(DataLossError) as caught:
        plan_ranges({A0: 5, A1: 6, B0: 1}, {A0: 7}, {}, fail_on_data_loss=True)
    message = str(caught.value)
    assert "partitions a-1, b-0 are gone (topic deleted?)" in message
    assert "failOnDataLoss=false" in message


def test_offsets_that_went_back_fail_naming_the_partition() -> None:
    with pytest.raises(DataLossError) as caught:
        plan_ranges({A0: 50, A1: 6}, {A0: 3, A1: 9}, {}, fail_on_data_loss=True)
    message = str(caught.value)
    assert "a-0: offset went back from 50 to 3 (topic recreated?)" in message
    assert "a-1" not in message
    assert "failOnDataLoss=false" in message


def test_without_fail_on_data_loss_losses_are_warnings_and_skipped() -> None:
    ranges, losses = plan_ranges(
        {A0: 50, A1: 6, B0: 1}, {A0: 3, A1: 9}, {}, fail_on_data_loss=False
    )
    assert ranges == [OffsetRange(A1, 6, 9)]
    assert len(losses) == 2
    assert "partitions b-0 are gone" in losses[0]
    assert "a-0: offset went back from 50 to 3" in losses[1]
