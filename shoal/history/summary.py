"""A soak's summary: what a run under faults cost its clients, per kind of fault.

The checker says whether anything went wrong; this says how a system behaved
while nothing did: records acknowledged, anomalies (each should be 0),
partition leaders moved, and the gap a producer saw per kind of fault
(median and max over that kind's faults). One summary per system, rendered
side by side so the soak against Shoal and the same schedule against Apache
Kafka read as one table. Pure logic: events and fault spans in, text out.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shoal.history.checker import Report, longest_ack_gap
from shoal.history.events import Event, Kind

NOT_APPLIED = "n/a"


@dataclass(frozen=True)
class FaultSpan:
    """One fault as it was applied: its kind, when it began, and when the calm spell
    after it ended. The calm spell counts: some faults cost most after they are
    healed (a broker's etcd lease found expired when etcd is back)."""

    kind: str
    began_s: float
    ends_s: float


@dataclass
class SoakSummary:
    system: str
    seconds: float
    acknowledged: int
    failed: int
    anomalies: dict[str, int]
    failovers: int
    """Partition leaders that moved during the run, as the fault injector saw them in
    the metadata before each fault, when it was healed and after its calm spell
    (approximate: a leader that moved and came back between two looks is missed)."""
    gaps: dict[str, list[float]] = field(default_factory=dict)
    """Per kind of fault, the longest gap a producer saw in each fault of that kind."""

    def gap(self, kind: str) -> tuple[float, float] | None:
        """Median and max of a kind's gaps, or None if no fault of that kind was applied."""
        found = self.gaps.get(kind)
        if not found:
            return None
        return statistics.median(found), max(found)


# A fault's gap is measured from a second before it began: a producer whose last
# ack came just before the fault waited through all of it.
LEAD_S = 1.0


def summarize(
    system: str,
    report: Report,
    events: Sequence[Event],
    faults: Iterable[FaultSpan],
    failovers: int,
) -> SoakSummary:
    acks = [e for e in events if e.kind is Kind.ACK and not e.error]
    times = [e.time for e in events]
    seconds = max(times) - min(times) if times else 0.0
    gaps: dict[str, list[float]] = defaultdict(list)
    ordered = sorted(faults, key=lambda f: f.began_s)
    for fault, following in zip(ordered, [*ordered[1:], None], strict=True):
        # Up to the next fault's lead second: a wait that began as the next fault began
        # (a gateway stopped right at the end of a calm spell) is that fault's.
        ends_s = fault.ends_s if following is None else following.began_s - LEAD_S
        ends_s = min(fault.ends_s, ends_s)
        gaps[fault.kind].append(longest_ack_gap(acks, fault.began_s - LEAD_S, ends_s))
    return SoakSummary(
        system=system,
        seconds=round(seconds, 1),
        acknowledged=report.acknowledged,
        failed=report.failed,
        anomalies=dict(report.counts),
        failovers=failovers,
        gaps=dict(gaps),
    )


def render(summaries: Sequence[SoakSummary], kinds: Sequence[str]) -> str:
    """A Markdown table, one column per system; ``n/a`` where a kind does not apply."""
    header = ["", *(s.system for s in summaries)]
    rows: list[list[str]] = [
        ["run, s", *(f"{s.seconds:.0f}" for s in summaries)],
        ["records acknowledged", *(str(s.acknowledged) for s in summaries)],
        ["sends that failed (allowed)", *(str(s.failed) for s in summaries)],
    ]
    anomalies = sorted({name for s in summaries for name in s.anomalies})
    rows += [[name, *(str(s.anomalies.get(name, 0)) for s in summaries)] for name in anomalies]
    rows.append(["partition leaders moved", *(str(s.failovers) for s in summaries)])
    for kind in kinds:
        cells = []
        for s in summaries:
            gap = s.gap(kind)
            cells.append(
                NOT_APPLIED if gap is None else f"{gap[0]:.1f} / {gap[1]:.1f} ({len(s.gaps[kind])})"
            )
        rows.append([f"gap, s: {kind} (median / max (faults))", *cells])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    separator = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(header), separator, *(line(row) for row in rows)])
