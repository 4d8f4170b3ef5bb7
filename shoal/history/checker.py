"""The history checker: what a recorded run of producers and consumers proves wrong.

In the style of Jepsen's Kafka workload, but judged against the closing read
of the log (``final`` events) rather than by inferring orders: after the
faults stop, the log as it stands is what every acknowledgement, read and
commit must agree with. Pure logic: it reads events and returns a report.

What counts as an anomaly (each is something a Kafka user was promised):

- ``lost``: acknowledged, and not in the log.
- ``moved``: acknowledged at one offset, found at another.
- ``duplicated``: one send in the log more than once.
- ``reordered``: one producer's sends to one partition in the log out of
  the order it sent them.
- ``phantom_read``: a consumer read a value the log no longer holds
  (someone read a write that was later cut away).
- ``inconsistent_read``: a consumer read a value at an offset where the log
  holds another one.
- ``split_brain``: two different values acknowledged at the same offset, or
  a write acknowledged in an older leader epoch above one acknowledged in a
  newer epoch (two leaders accepting acks=all writes at once).
- ``commit_backwards``: a group's committed offset for a partition went
  back after a later commit had succeeded.

Sends whose delivery failed, or that never got an answer, may or may not be
in the log: either is allowed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

from shoal.history.events import Event, Kind

EXAMPLES = 5
"""How many examples of each anomaly a report keeps."""

ANOMALIES = (
    "lost",
    "moved",
    "duplicated",
    "reordered",
    "phantom_read",
    "inconsistent_read",
    "split_brain",
    "commit_backwards",
)


@dataclass
class Report:
    sent: int = 0
    acknowledged: int = 0
    failed: int = 0
    """Sends whose delivery report carried an error (allowed either way)."""
    unanswered: int = 0
    in_log: int = 0
    polled: int = 0
    commits: int = 0
    longest_ack_gap_s: float = 0.0
    """The longest a producer went without an acknowledgement from one partition,
    first to last ack (a stalled partition does not stall the others' acks)."""
    longest_ack_gap_at_s: float = 0.0
    """When that gap began, in seconds since the run began."""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ANOMALIES, 0))
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def found(self, anomaly: str, example: str) -> None:
        self.counts[anomaly] += 1
        if len(self.examples[anomaly]) < EXAMPLES:
            self.examples[anomaly].append(example)

    def summary(self) -> str:
        lines = [
            f"sent {self.sent}, acknowledged {self.acknowledged}, failed {self.failed}, "
            f"unanswered {self.unanswered}; in the log {self.in_log}; "
            f"polled {self.polled}; commits {self.commits}",
            "longest a producer waited for an ack from one partition: "
            f"{self.longest_ack_gap_s:.2f} s (from {self.longest_ack_gap_at_s:.1f} s)",
        ]
        for anomaly in ANOMALIES:
            lines.append(f"{anomaly}: {self.counts[anomaly]}")
            lines.extend(f"  e.g. {example}" for example in self.examples.get(anomaly, ()))
        lines.append("OK: no anomaly" if self.ok else "ANOMALIES FOUND")
        return "\n".join(lines)


def check(events: Iterable[Event]) -> Report:
    report = Report()
    sends: dict[str, Event] = {}
    acks: dict[str, Event] = {}
    polls: list[Event] = []
    commits: list[Event] = []
    log: dict[tuple[int, int], str] = {}
    places: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for event in events:
        if event.kind is Kind.SEND:
            sends[event.value] = event
        elif event.kind is Kind.ACK:
            acks[event.value] = event
        elif event.kind is Kind.POLL:
            polls.append(event)
        elif event.kind is Kind.COMMIT:
            commits.append(event)
        else:
            log[event.partition, event.offset] = event.value
            places[event.value].append((event.partition, event.offset))

    report.sent = len(sends)
    report.in_log = len(log)
    report.polled = len(polls)
    report.commits = len(commits)
    good = {value: ack for value, ack in acks.items() if not ack.error}
    report.acknowledged = len(good)
    report.failed = len(acks) - len(good)
    report.unanswered = len(sends.keys() - acks.keys())

    _measure_gaps(report, good.values())
    _check_acknowledged(report, good, log, places)
    _check_log(report, sends, places)
    _check_reads(report, polls, log, places)
    _check_commits(report, commits)
    return report


def _check_acknowledged(
    report: Report,
    good: dict[str, Event],
    log: dict[tuple[int, int], str],
    places: dict[str, list[tuple[int, int]]],
) -> None:
    by_place: dict[tuple[int, int], str] = {}
    by_partition: dict[int, list[Event]] = defaultdict(list)
    for value, ack in good.items():
        if ack.offset is None or ack.offset < 0:
            # Acknowledged without an offset: a retried send the broker already had
            # (Kafka answers DUPLICATE_SEQUENCE_NUMBER, librdkafka reports success).
            # It must be in the log; where is not known.
            if not places.get(value):
                report.found("lost", f"{value} acknowledged without an offset, not in the log")
            continue
        place = (ack.partition, ack.offset)
        other = by_place.setdefault(place, value)
        if other != value:
            report.found("split_brain", f"{other} and {value} both acknowledged at {place}")
        by_partition[ack.partition].append(ack)
        if place in log and log[place] == value:
            continue
        if places.get(value):
            report.found("moved", f"{value} acknowledged at {place}, in the log at {places[value]}")
        else:
            report.found("lost", f"{value} acknowledged at {place} (epoch {ack.epoch})")
    for partition, partition_acks in by_partition.items():
        newest = None
        for ack in sorted(partition_acks, key=lambda a: a.offset):
            if ack.epoch < 0:
                continue
            if newest is not None and ack.epoch < newest.epoch:
                report.found(
                    "split_brain",
                    f"partition {partition}: {ack.value} acknowledged at {ack.offset} in epoch "
                    f"{ack.epoch}, above {newest.value} at {newest.offset} in epoch {newest.epoch}",
                )
            if newest is None or ack.epoch > newest.epoch:
                newest = ack


def _check_log(
    report: Report, sends: dict[str, Event], places: dict[str, list[tuple[int, int]]]
) -> None:
    order: dict[tuple[str, int], list[tuple[int, int, str]]] = defaultdict(list)
    for value, found in places.items():
        if len(found) > 1:
            report.found("duplicated", f"{value} in the log at {sorted(found)}")
        send = sends.get(value)
        if send is not None:
            partition, offset = min(found)
            order[send.client, partition].append((offset, send.seq, value))
    for (producer, partition), written in order.items():
        highest: tuple[int, int, str] | None = None
        for offset, seq, value in sorted(written):
            if highest is not None and seq < highest[1]:
                report.found(
                    "reordered",
                    f"{producer} on partition {partition}: {value} (send {seq}) at {offset} "
                    f"after {highest[2]} (send {highest[1]}) at {highest[0]}",
                )
            if highest is None or seq > highest[1]:
                highest = (offset, seq, value)


def _check_reads(
    report: Report,
    polls: list[Event],
    log: dict[tuple[int, int], str],
    places: dict[str, list[tuple[int, int]]],
) -> None:
    for poll in polls:
        place = (poll.partition, poll.offset)
        if log.get(place) == poll.value:
            continue
        if not places.get(poll.value):
            report.found("phantom_read", f"{poll.client} read {poll.value} at {place}")
        else:
            report.found(
                "inconsistent_read",
                f"{poll.client} read {poll.value} at {place}, where the log holds {log.get(place)}",
            )


def _check_commits(report: Report, commits: list[Event]) -> None:
    highest: dict[tuple[str, int], Event] = {}
    for commit in sorted(commits, key=lambda c: c.time):
        key = (commit.group, commit.partition)
        before = highest.get(key)
        if before is not None and commit.offset < before.offset:
            report.found(
                "commit_backwards",
                f"group {commit.group} partition {commit.partition}: {commit.client} committed "
                f"{commit.offset} after {before.client} committed {before.offset}",
            )
        if before is None or commit.offset > before.offset:
            highest[key] = commit


def _measure_gaps(report: Report, acks: Iterable[Event]) -> None:
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    for ack in acks:
        times[ack.client, ack.partition].append(ack.time)
    for producer_times in times.values():
        producer_times.sort()
        for before, after in pairwise(producer_times):
            if after - before > report.longest_ack_gap_s:
                report.longest_ack_gap_s = after - before
                report.longest_ack_gap_at_s = before


def longest_ack_gap(events: Iterable[Event], since: float, until: float) -> float:
    """The longest any producer waited for an acknowledgement from one partition, in a gap
    that began between ``since`` and ``until`` (a fault's span): what that fault cost."""
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    for event in events:
        if event.kind is Kind.ACK and not event.error:
            times[event.client, event.partition].append(event.time)
    longest = 0.0
    for producer_times in times.values():
        producer_times.sort()
        for before, after in pairwise(producer_times):
            if since <= before <= until:
                longest = max(longest, after - before)
    return longest
