"""ListOffsets by time: offset_for_timestamp and offset_of_max_timestamp (KIP-734)."""

from __future__ import annotations

import pytest

from shoal.records import Compression

T = 1_700_000_000_000


def _timeline(open_log, helpers, **config):
    """Three segments of two batches of three records, timestamps T, T+10, ..., T+170."""
    log = open_log(index_interval_bytes=1, **config)
    for batch in range(6):
        if batch and batch % 2 == 0:
            log.roll()
        log.append_as_leader(
            helpers.make_batch(
                3, timestamp=T + 30 * batch, step=10, compression=list(Compression)[batch % 5]
            ),
            batch // 2,
        )
    assert [s.base_offset for s in log.segments] == [0, 6, 12]
    return log


@pytest.mark.parametrize(
    ("target", "offset"),
    [
        (T - 1000, 0),
        (T, 0),
        (T + 1, 1),
        (T + 10, 1),
        (T + 55, 6),
        (T + 60, 6),
        (T + 61, 7),
        (T + 120, 12),
        (T + 169, 17),
        (T + 170, 17),
    ],
)
def test_offset_for_timestamp_is_the_first_record_at_or_after(
    open_log, helpers, target, offset
) -> None:
    log = _timeline(open_log, helpers)
    found = log.offset_for_timestamp(target)
    assert found is not None
    assert found.offset == offset
    assert found.timestamp == T + 10 * offset
    assert found.leader_epoch == offset // 6


def test_offset_for_timestamp_is_none_when_every_record_is_older(open_log, helpers) -> None:
    log = _timeline(open_log, helpers)
    assert log.offset_for_timestamp(T + 171) is None


def test_offset_for_timestamp_on_an_empty_log_is_none(open_log) -> None:
    assert open_log().offset_for_timestamp(0) is None


def test_offset_for_timestamp_with_timestamps_out_of_order(open_log, helpers) -> None:
    log = open_log(index_interval_bytes=1)
    log.append_as_leader(helpers.make_batch(2, timestamp=T + 100, step=-50), 0)  # T+100, T+50
    log.append_as_leader(helpers.make_batch(2, timestamp=T + 20, step=10), 0)  # T+20, T+30
    log.append_as_leader(helpers.make_batch(2, timestamp=T + 70, step=100), 0)  # T+70, T+170
    found = log.offset_for_timestamp(T + 60)
    assert found is not None
    assert found.offset == 0
    found = log.offset_for_timestamp(T + 101)
    assert found is not None
    assert (found.offset, found.timestamp) == (5, T + 170)


def test_offset_for_timestamp_finds_a_record_in_the_middle_of_a_compressed_batch(
    open_log, helpers
) -> None:
    log = open_log()
    log.append_as_leader(
        helpers.make_batch(10, timestamp=T, step=5, compression=Compression.ZSTD), 0
    )
    found = log.offset_for_timestamp(T + 23)
    assert found is not None
    assert (found.offset, found.timestamp) == (5, T + 25)


def test_offset_for_timestamp_on_a_log_append_time_topic_uses_append_times(
    open_log, helpers, clock
) -> None:
    log = open_log(message_timestamp_type="LogAppendTime")
    for _ in range(3):
        log.append_as_leader(helpers.make_batch(2, timestamp=5, step=1), 0)
        clock.advance(1000)
    found = log.offset_for_timestamp(T + 1)
    assert found is not None
    # Every record of a LogAppendTime batch carries the batch's append time.
    assert (found.offset, found.timestamp) == (2, T + 1000)
    assert log.offset_for_timestamp(6) is not None
    assert log.offset_for_timestamp(T + 2001) is None


def test_offset_for_timestamp_skips_records_below_the_log_start(open_log, helpers) -> None:
    log = _timeline(open_log, helpers)
    for segment in log.delete_segments(log.segments[:1]):
        segment.destroy()
    found = log.offset_for_timestamp(T)
    assert found is not None
    assert found.offset == 6


def test_offset_of_max_timestamp(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(2, timestamp=T, step=1), 0)
    log.roll()
    log.append_as_leader(helpers.make_batch(3, timestamp=T + 500, step=-100), 3)  # max first
    log.roll()
    log.append_as_leader(helpers.make_batch(2, timestamp=T + 10, step=1), 3)
    found = log.offset_of_max_timestamp()
    assert found is not None
    assert (found.offset, found.timestamp, found.leader_epoch) == (2, T + 500, 3)


def test_offset_of_max_timestamp_on_an_empty_log_is_none(open_log) -> None:
    assert open_log().offset_of_max_timestamp() is None


def test_timestamp_lookups_survive_a_clean_restart(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(1, timestamp=T - 500), 0)
    log.append_as_leader(helpers.make_batch(1, timestamp=T - 100), 0)
    log.append_as_leader(helpers.make_batch(1, timestamp=T - 300), 0)
    log.close()
    log = open_log(recovery_point=3)
    assert log.active.max_timestamp == T - 100
    found = log.offset_for_timestamp(T - 200)
    assert found is not None
    assert found.offset == 1
    found = log.offset_of_max_timestamp()
    assert found is not None
    assert (found.offset, found.timestamp) == (1, T - 100)


def test_timestamp_lookups_survive_crash_recovery(open_log, helpers) -> None:
    log = _timeline(open_log, helpers)
    helpers.crash(log)
    log = open_log(index_interval_bytes=1, clean_shutdown=False)
    for target, offset in ((T + 55, 6), (T + 120, 12), (T + 170, 17)):
        found = log.offset_for_timestamp(target)
        assert found is not None
        assert found.offset == offset


def test_a_log_start_inside_the_first_candidate_batch_moves_on_to_later_batches(
    open_log, helpers
) -> None:
    from shoal.records import NewRecord, build_batch

    first = open_log()
    first.append_as_leader(
        build_batch(
            [NewRecord(None, b"a", timestamp=T + 300), NewRecord(None, b"b", timestamp=T + 100)]
        ),
        0,
    )
    first.append_as_leader(build_batch([NewRecord(None, b"c", timestamp=T + 250)]), 0)
    first.close()
    log = open_log(log_start_offset=1)
    found = log.offset_for_timestamp(T + 200)
    assert found is not None
    assert (found.offset, found.timestamp) == (2, T + 250)
