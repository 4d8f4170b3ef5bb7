"""The history checker finds each anomaly it names, and nothing in a clean history."""

from __future__ import annotations

from pathlib import Path

from shoal.history.checker import check, longest_ack_gap
from shoal.history.events import Event, Kind, read_history, write_history


def sent(producer: str, seq: int, partition: int = 0) -> Event:
    return Event(Kind.SEND, seq, producer, f"{producer}-{seq}", partition, seq=seq)


def acked(value: str, partition: int, offset: int, epoch: int = 0) -> Event:
    return Event(
        Kind.ACK, 0, value.split("-", maxsplit=1)[0], value, partition, offset, epoch=epoch
    )


def in_log(value: str, partition: int, offset: int) -> Event:
    return Event(Kind.FINAL, 0, "final", value, partition, offset)


def clean_run() -> list[Event]:
    events = []
    for seq in range(4):
        events += [sent("p", seq), acked(f"p-{seq}", 0, seq), in_log(f"p-{seq}", 0, seq)]
    return events


def test_a_clean_history_has_no_anomaly() -> None:
    report = check(
        [
            *clean_run(),
            Event(Kind.POLL, 1, "c", "p-1", 0, 1),
            Event(Kind.COMMIT, 1, "c", partition=0, offset=2, group="g"),
            Event(Kind.COMMIT, 2, "c", partition=0, offset=4, group="g"),
        ]
    )
    assert report.ok, report.summary()
    assert (report.sent, report.acknowledged, report.in_log, report.polled) == (4, 4, 4, 1)


def test_an_acknowledged_write_missing_from_the_log_is_lost() -> None:
    events = [e for e in clean_run() if e != in_log("p-2", 0, 2)]
    report = check(events)
    assert report.counts["lost"] == 1
    assert "p-2" in report.examples["lost"][0]


def test_a_failed_or_unanswered_send_may_be_in_the_log_or_not() -> None:
    events = [
        sent("p", 0),
        Event(Kind.ACK, 1, "p", "p-0", error="_MSG_TIMED_OUT"),
        in_log("p-0", 0, 0),
        sent("p", 1),
        sent("p", 2),
        Event(Kind.ACK, 1, "p", "p-2", error="_MSG_TIMED_OUT"),
    ]
    report = check(events)
    assert report.ok, report.summary()
    assert (report.failed, report.unanswered) == (2, 1)


def test_a_duplicate_a_move_and_a_reordering_are_each_found() -> None:
    events = [
        sent("p", 0),
        acked("p-0", 0, 0),
        sent("p", 1),
        acked("p-1", 0, 1),
        in_log("p-1", 0, 0),
        in_log("p-0", 0, 1),
        in_log("p-0", 0, 2),
    ]
    report = check(events)
    assert report.counts["duplicated"] == 1
    assert report.counts["reordered"] == 1
    assert report.counts["moved"] == 2  # p-0 acknowledged at 0, p-1 at 1: neither is there


def test_reads_of_vanished_or_displaced_values_are_found() -> None:
    events = [
        *clean_run(),
        Event(Kind.POLL, 1, "c", "p-9", 0, 4),
        Event(Kind.POLL, 1, "c", "p-3", 0, 2),
    ]
    report = check(events)
    assert report.counts["phantom_read"] == 1
    assert report.counts["inconsistent_read"] == 1


def test_two_leaders_acknowledging_are_a_split_brain() -> None:
    same_offset = [
        sent("p", 0),
        sent("q", 0),
        acked("p-0", 0, 5, epoch=3),
        acked("q-0", 0, 5, epoch=3),
        in_log("p-0", 0, 5),
    ]
    report = check(same_offset)
    assert report.counts["split_brain"] == 1
    assert report.counts["lost"] == 1  # q-0, cut away with its leader

    stale_epoch = [
        sent("p", 0),
        sent("q", 0),
        acked("p-0", 0, 5, epoch=4),
        acked("q-0", 0, 6, epoch=3),
        in_log("p-0", 0, 5),
        in_log("q-0", 0, 6),
    ]
    assert check(stale_epoch).counts["split_brain"] == 1


def test_a_committed_offset_going_back_is_found() -> None:
    commits = [
        Event(Kind.COMMIT, 1.0, "a", partition=0, offset=10, group="g"),
        Event(Kind.COMMIT, 2.0, "b", partition=0, offset=7, group="g"),
        Event(Kind.COMMIT, 2.0, "b", partition=1, offset=7, group="g"),
        Event(Kind.COMMIT, 3.0, "b", partition=0, offset=7, group="other"),
    ]
    report = check(commits)
    assert report.counts["commit_backwards"] == 1
    assert "committed 7 after a committed 10" in report.examples["commit_backwards"][0]


def test_a_history_survives_its_file(tmp_path: Path) -> None:
    events = [*clean_run(), Event(Kind.COMMIT, 2.5, "c", partition=0, offset=4, group="g")]
    path = tmp_path / "history.jsonl"
    write_history(path, events)
    assert list(read_history(path)) == events


def test_the_longest_wait_for_an_acknowledgement_is_per_producer_and_partition() -> None:
    def ack_at(value: str, time: float, partition: int = 0) -> Event:
        producer, seq = value.split("-")
        return Event(Kind.ACK, time, producer, value, partition, int(seq))

    report = check(
        [
            ack_at("p-0", 1.0),
            ack_at("q-0", 2.0),
            ack_at("p-1", 4.5),
            ack_at("q-1", 3.0),
            ack_at("p-2", 2.0, partition=1),  # another partition's acks do not fill the gap
        ]
    )
    assert (report.longest_ack_gap_s, report.longest_ack_gap_at_s) == (3.5, 1.0)


def test_the_gap_a_fault_cost_counts_only_gaps_that_began_during_it() -> None:
    acks = [
        Event(Kind.ACK, t, "p", f"p-{n}", 0, n)
        for n, t in enumerate([0.0, 5.0, 5.5, 9.0, 9.2, 20.0])
    ]
    assert longest_ack_gap(acks, 4.0, 9.1) == 3.5  # 5.5 to 9.0; 9.2 to 20.0 began after
    assert longest_ack_gap(acks, 9.1, 30.0) == 10.8


def test_an_ack_without_an_offset_counts_only_where_the_value_is_in_the_log() -> None:
    # librdkafka reports a retried send the broker already had as delivered, offset unknown.
    unknown = Event(Kind.ACK, 0, "p", "p-4", 0, offset=-1)
    found = check([*clean_run(), sent("p", 4), unknown, in_log("p-4", 0, 4)])
    assert found.ok, found.summary()
    missing = Event(Kind.ACK, 0, "p", "p-5", 0, offset=-1)
    assert check([*clean_run(), sent("p", 5), missing]).counts["lost"] == 1
