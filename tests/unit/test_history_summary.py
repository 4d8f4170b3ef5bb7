"""A soak's summary: gaps per kind of fault, failovers, and two systems side by side."""

from __future__ import annotations

from shoal.history.checker import check
from shoal.history.events import Event, Kind
from shoal.history.summary import FaultSpan, SoakSummary, render, summarize


def ack(producer: str, partition: int, at: float) -> Event:
    return Event(Kind.ACK, at, producer, f"{producer}-{at}", partition)


def acks_every_tenth_of_a_second(
    producer: str, partition: int, start: float, end: float
) -> list[Event]:
    return [ack(producer, partition, start + i / 10) for i in range(int((end - start) * 10))]


def test_each_fault_costs_the_longest_wait_any_producer_saw_until_its_calm_spell_ended() -> None:
    events = [
        # p waits 4 s on partition 0 during the kill (10 to 14).
        *acks_every_tenth_of_a_second("p", 0, 0, 10),
        *acks_every_tenth_of_a_second("p", 0, 14, 30),
        # q waits 1.6 s on partition 1 after etcd came back (healed at 25, calm until 28).
        *acks_every_tenth_of_a_second("q", 1, 0, 26),
        *acks_every_tenth_of_a_second("q", 1, 27.5, 30),
        # p waits 1.6 s on partition 1 during the pause (20 to 22).
        *acks_every_tenth_of_a_second("p", 1, 0, 20.5),
        *acks_every_tenth_of_a_second("p", 1, 22, 30),
    ]
    faults = [
        FaultSpan("kill", 10.0, 13.0),
        FaultSpan("pause", 20.0, 23.0),
        FaultSpan("etcd", 24.0, 28.0),
    ]

    summary = summarize("shoal", check(events), events, faults, failovers=2)

    kill = summary.gap("kill")
    assert kill is not None
    median, longest = kill
    assert 4.0 <= longest < 4.2 and median == longest
    assert 1.5 <= summary.gaps["pause"][0] < 1.7
    assert 1.5 <= summary.gaps["etcd"][0] < 1.7
    assert summary.gap("disk") is None
    assert summary.failovers == 2


def test_a_wait_that_began_as_the_next_fault_began_is_that_faults_alone() -> None:
    # The gateway stops at 30, just as the minority fault's calm spell ends; p waits 7 s.
    events = [
        *acks_every_tenth_of_a_second("p", 0, 0, 30.05),
        *acks_every_tenth_of_a_second("p", 0, 37, 45),
    ]
    faults = [FaultSpan("etcd_minority", 20.0, 30.0), FaultSpan("gateway", 30.0, 40.0)]

    summary = summarize("shoal", check(events), events, faults, failovers=0)

    assert summary.gaps["etcd_minority"][0] < 0.2
    assert 7.0 <= summary.gaps["gateway"][0] < 7.2


def test_the_table_sets_systems_side_by_side_and_marks_a_kind_one_did_not_run() -> None:
    shoal = SoakSummary("shoal", 1800, 10, 0, {"lost": 0}, 3, {"kill": [0.8, 1.2, 0.9]})
    kafka = SoakSummary("apache-kafka", 1800, 12, 1, {"lost": 0}, 4, {"kill": [9.5]})
    kafka.gaps["gateway"] = []

    table = render([shoal, kafka], ["kill", "gateway"]).splitlines()

    assert [c.strip() for c in table[0].split("|")[2:4]] == ["shoal", "apache-kafka"]
    [kill] = [row for row in table if "kill" in row]
    assert [c.strip() for c in kill.split("|")[2:4]] == ["0.9 / 1.2 (3)", "9.5 / 9.5 (1)"]
    [gateway] = [row for row in table if "gateway" in row]
    assert [c.strip() for c in gateway.split("|")[2:4]] == ["n/a", "n/a"]
