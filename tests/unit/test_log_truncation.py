"""Log.truncate_to: a follower cutting a divergent tail, across segments."""

from __future__ import annotations


def _three_segments(open_log, helpers):
    log = open_log(index_interval_bytes=1)
    for segment in range(3):
        if segment:
            log.roll()
        for _ in range(3):
            log.append_as_leader(helpers.make_batch(2), segment + 1)
    assert [s.base_offset for s in log.segments] == [0, 6, 12]
    return log


def test_truncate_inside_the_active_segment(open_log, helpers) -> None:
    log = _three_segments(open_log, helpers)
    log.truncate_to(14)
    assert log.log_end_offset == 14
    assert [s.base_offset for s in log.segments] == [0, 6, 12]
    assert [r.offset for r in helpers.read_all(log)] == list(range(14))
    assert log.append_as_leader(helpers.make_batch(1), 3).first_offset == 14


def test_truncate_removes_whole_later_segments(open_log, helpers, log_dir) -> None:
    log = _three_segments(open_log, helpers)
    log.truncate_to(8)
    assert [s.base_offset for s in log.segments] == [0, 6]
    assert log.log_end_offset == 8
    assert helpers.segment_files(log_dir) == [
        "00000000000000000000.log",
        "00000000000000000006.log",
    ]
    assert not list(log_dir.glob("*.deleted"))
    info = log.append_as_leader(helpers.make_batch(2), 4)
    assert (info.first_offset, info.last_offset) == (8, 9)
    assert [r.offset for r in helpers.read_all(log)] == list(range(10))


def test_truncate_at_a_segment_base_removes_that_segment(open_log, helpers) -> None:
    log = _three_segments(open_log, helpers)
    log.truncate_to(12)
    assert [s.base_offset for s in log.segments] == [0, 6]
    assert log.log_end_offset == 12
    assert log.append_as_leader(helpers.make_batch(1), 4).first_offset == 12


def test_truncate_at_or_past_the_log_end_does_nothing(open_log, helpers) -> None:
    log = _three_segments(open_log, helpers)
    log.truncate_to(18)
    log.truncate_to(100)
    assert log.log_end_offset == 18
    assert len(log.segments) == 3


def test_truncate_clamps_high_watermark_recovery_point_and_epochs(open_log, helpers) -> None:
    log = _three_segments(open_log, helpers)
    log.high_watermark = 18
    log.recovery_point = 16
    assert log.epochs.entries == [(1, 0), (2, 6), (3, 12)]
    log.truncate_to(10)
    assert log.high_watermark == 10
    assert log.recovery_point == 10
    assert log.epochs.entries == [(1, 0), (2, 6)]


def test_truncate_to_the_log_start_empties_the_log(open_log, helpers) -> None:
    log = _three_segments(open_log, helpers)
    log.truncate_to(0)
    assert log.log_end_offset == 0
    assert [s.base_offset for s in log.segments] == [0]
    assert log.active.size == 0
    assert log.epochs.entries == []
    assert log.append_as_leader(helpers.make_batch(1), 5).first_offset == 0


def test_truncated_log_reopens_with_the_same_contents(open_log, helpers) -> None:
    log = _three_segments(open_log, helpers)
    log.truncate_to(10)
    log.append_as_leader(helpers.make_batch(3, tag="new"), 4)
    before = [(r.offset, r.value) for r in helpers.read_all(log)]
    log.close()
    log = open_log(index_interval_bytes=1, recovery_point=13)
    assert [(r.offset, r.value) for r in helpers.read_all(log)] == before
    assert log.epochs.entries == [(1, 0), (2, 6), (4, 10)]
