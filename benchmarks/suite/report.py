"""The suite's outputs: a Markdown table with ratios and winners, and two PNG charts.

Every figure is shown with its ratio to the machine ceiling that bounds it
(:class:`Row`'s ``ceiling``): writes against the page cache's write
bandwidth divided by the copies the system keeps on this one machine,
reads against one loopback TCP stream, latency against a loopback round
trip between two processes (a floor, so that ratio is a multiple).

When Apache Kafka ran too, two more tables follow: each Shoal target's
headline figures as ratios to the Kafka target with the same durability
(:data:`KAFKA_PAIRS`), and Kafka's own ``ProducerPerformance`` against the
RF=3 targets (:mod:`.producer_perf`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.cli.loadgen import CDF_QUANTILES

Results = dict[str, Any]
"""One system's results: workload name to its figures (or ``{"error": ...}``)."""


@dataclass(frozen=True)
class Row:
    workload: str
    label: str
    key: str
    unit: str
    higher_is_better: bool | None
    """None: not a contest (no winner is named)."""
    ceiling: Callable[[dict[str, float], int], float] | None = None
    """From the machine's limits and the system's copies to the bound for this figure."""
    ceiling_name: str = ""


def _writes(machine: dict[str, float], copies: int) -> float:
    return machine.get("pagecache_write_MBps", math.nan) / copies


def _loopback(machine: dict[str, float], _copies: int) -> float:
    return machine.get("loopback_MBps", math.nan)


def _rtt(name: str) -> Callable[[dict[str, float], int], float]:
    return lambda machine, _copies: machine.get(name, math.nan)


ROWS = (
    Row("produce", "1 produce flat out", "mb_per_s", "MB/s", True, _writes, "page cache / copies"),
    Row("produce", "1 produce flat out", "records_per_s", "records/s", True),
    Row("produce", "1 produce flat out", "latency_p99_ms", "ms p99 (queued)", None),
    Row("produce", "1 produce flat out", "mb_per_core_s", "MB per server core-s", True),
    Row("latency", "2 end to end, half rate", "p50_ms", "ms p50", False, _rtt("rtt_p50_ms"),
        "loopback round trip"),
    Row("latency", "2 end to end, half rate", "p99_ms", "ms p99", False, _rtt("rtt_p99_ms"),
        "loopback round trip"),
    Row("latency", "2 end to end, half rate", "p99_9_ms", "ms p99.9", False,
        _rtt("rtt_p99_9_ms"), "loopback round trip"),
    Row("latency", "2 end to end, half rate", "rate_kept", "achieved / target rate", None),
    Row("latency", "2 end to end, 5,000/s", "common_p50_ms", "ms p50", False,
        _rtt("rtt_p50_ms"), "loopback round trip"),
    Row("latency", "2 end to end, 5,000/s", "common_p99_ms", "ms p99", False,
        _rtt("rtt_p99_ms"), "loopback round trip"),
    Row("latency", "2 end to end, 5,000/s", "common_p99_9_ms", "ms p99.9", False,
        _rtt("rtt_p99_9_ms"), "loopback round trip"),
    Row("latency", "2 end to end, 1,000/s, linger.ms=0", "unbatched_p50_ms", "ms p50", False,
        _rtt("rtt_p50_ms"), "loopback round trip"),
    Row("latency", "2 end to end, 1,000/s, linger.ms=0", "unbatched_p99_ms", "ms p99", False,
        _rtt("rtt_p99_ms"), "loopback round trip"),
    Row("latency", "2 end to end, 1,000/s, linger.ms=0", "unbatched_p99_9_ms", "ms p99.9",
        False, _rtt("rtt_p99_9_ms"), "loopback round trip"),
    Row("latency", "2 end to end, 1,000/s, linger.ms=0", "unbatched_cpu", "server cores",
        None),
    Row("backlog", "3 consume backlog", "mb_per_s", "MB/s", True, _loopback, "loopback"),
    Row("backlog", "3 consume backlog", "fill_mb_per_s", "MB/s filling", True, _writes,
        "page cache / copies"),
    Row("backlog", "3 consume backlog", "mb_per_core_s", "MB per server core-s", True),
    Row("fanout", "4 fan-out, 3 groups", "mb_per_s", "MB/s delivered", True, _loopback,
        "loopback"),
    Row("fanout", "4 fan-out, 3 groups", "produce_mb_per_s", "MB/s produced", True, _writes,
        "page cache / copies"),
    Row("partitions", "5 100 partitions, 10 producers", "mb_per_s", "MB/s", True, _writes,
        "page cache / copies"),
    Row("partitions", "5 100 partitions, 10 producers", "mb_per_core_s", "MB per server core-s",
        True),
    # Only Shoal's gateway has an HTTP door: figures, not a contest.
    Row("http_produce", "6 HTTP produce, batches of 200", "mb_per_s", "MB/s", None, _writes,
        "page cache / copies"),
    Row("http_produce", "6 HTTP produce, batches of 200", "records_per_s", "records/s", None),
    Row("http_produce", "6 HTTP produce, batches of 200", "latency_p99_ms", "ms p99 (request)",
        None),
    Row("http_produce", "6 HTTP produce, batches of 200", "mb_per_core_s",
        "MB per server core-s", None),
)  # fmt: skip
HEADLINE = {
    "produce": "mb_per_s",
    "latency": "p99_ms",
    "backlog": "mb_per_s",
    "fanout": "mb_per_s",
    "partitions": "mb_per_s",
}
"""The figure that decides each workload's winner."""
KAFKA_PAIRS = {"shoal-gw-rf3": "kafka-rf3", "shoal-rf3": "kafka-rf3", "shoal-rf1": "kafka-rf1"}
"""Each Shoal target and the Apache Kafka target with the same durability."""
VS_KAFKA = (
    ("produce", "mb_per_s"),
    ("produce", "mb_per_core_s"),
    ("latency", "p99_ms"),
    ("latency", "common_p99_ms"),
    ("latency", "unbatched_p99_ms"),
    ("backlog", "mb_per_s"),
    ("backlog", "mb_per_core_s"),
    ("fanout", "mb_per_s"),
    ("partitions", "mb_per_s"),
    ("partitions", "mb_per_core_s"),
)
"""The headline figures (throughput, MB per server core-second, latency p99) of the
"vs Kafka" table: (workload, key) of :data:`ROWS`."""
PRODUCER_PERF_REFERENCE = "kafka-rf3"


def value(results: Results, workload: str, key: str) -> float:
    figures = results.get(workload, {})
    found = figures.get(key) if isinstance(figures, dict) else None
    return float(found) if isinstance(found, int | float) else math.nan


def _format(number: float) -> str:
    if math.isnan(number):
        return "-"
    if abs(number) >= 1000:
        return f"{number:,.0f}"
    if abs(number) >= 10:
        return f"{number:.1f}"
    return f"{number:.2f}"


def winner(
    systems: dict[str, Results], workload: str, key: str, higher_is_better: bool
) -> tuple[str, float] | None:
    """The best system on one figure, and how many times better it is than the runner-up."""
    scored = [(name, value(r, workload, key)) for name, r in systems.items()]
    scored = [(name, v) for name, v in scored if not math.isnan(v) and v > 0]
    if not scored:
        return None
    scored.sort(key=lambda item: item[1], reverse=higher_is_better)
    if len(scored) == 1:
        return scored[0][0], math.nan
    best, second = scored[0][1], scored[1][1]
    return scored[0][0], best / second if higher_is_better else second / best


def markdown(
    systems: dict[str, Results],
    copies: dict[str, int],
    machine: dict[str, float],
) -> str:
    """The table: a row per figure, a column per system, each cell ``value (ratio)``."""
    names = list(systems)
    lines = [
        "| workload | figure | " + " | ".join(names) + " | winner |",
        "| --- | --- | " + " | ".join("---:" for _ in names) + " | --- |",
    ]
    for row in ROWS:
        cells = []
        for name in names:
            number = value(systems[name], row.workload, row.key)
            cell = _format(number)
            if row.ceiling is not None and not math.isnan(number):
                bound = row.ceiling(machine, copies[name])
                if bound and not math.isnan(bound):
                    cell += f" ({number / bound:.2f})"
            cells.append(cell)
        best = (
            None
            if row.higher_is_better is None
            else winner(systems, row.workload, row.key, row.higher_is_better)
        )
        won = "" if best is None else f"{best[0]} x{_format(best[1])}"
        lines.append(f"| {row.label} | {row.unit} | " + " | ".join(cells) + f" | {won} |")
    failed = [
        f"- {name}, {workload}: {figures['error'].splitlines()[0]}"
        for name, results in systems.items()
        for workload, figures in results.items()
        if isinstance(figures, dict) and "error" in figures
    ]
    notes = [
        "",
        "Cells are `value (value / ceiling)`; for latency the ceiling is the floor, so the"
        " ratio is how many loopback round trips it takes. Winner: best system, and how many"
        " times better than the runner-up.",
    ]
    extra = vs_kafka(systems) + producer_perf(systems)
    return "\n".join(lines + notes + extra + (["", "Failed:", *failed] if failed else [])) + "\n"


def _ratio(numerator: float, denominator: float) -> str:
    if math.isnan(numerator) or math.isnan(denominator) or denominator <= 0:
        return "-"
    return f"{numerator / denominator:.2f}"


def vs_kafka(systems: dict[str, Results]) -> list[str]:
    """Shoal's headline figures as ratios to Apache Kafka's of the same run, a column per
    Shoal target present with its Kafka pair; no lines if there is none."""
    pairs = [(s, k) for s, k in KAFKA_PAIRS.items() if s in systems and k in systems]
    if not pairs:
        return []
    rows = {(row.workload, row.key): row for row in ROWS}
    lines = [
        "",
        "Shoal vs Apache Kafka, same run, same durability: Shoal's figure / Kafka's.",
        "",
        "| workload | figure | better | " + " | ".join(f"{s} / {k}" for s, k in pairs) + " |",
        "| --- | --- | --- | " + " | ".join("---:" for _ in pairs) + " |",
    ]
    for workload, key in VS_KAFKA:
        row = rows[(workload, key)]
        cells = [
            _ratio(value(systems[s], workload, key), value(systems[k], workload, key))
            for s, k in pairs
        ]
        better = "higher" if row.higher_is_better else "lower"
        lines.append(f"| {row.label} | {row.unit} | {better} | " + " | ".join(cells) + " |")
    return lines


PERF_COLUMNS = (
    ("records_per_s", "records/s"),
    ("mb_per_s", "MB/s"),
    ("avg_ms", "ms avg"),
    ("p50_ms", "ms p50"),
    ("p99_ms", "ms p99"),
    ("p99_9_ms", "ms p99.9"),
    ("max_ms", "ms max"),
)


def producer_perf(systems: dict[str, Results]) -> list[str]:
    """A row per target ProducerPerformance ran against; no lines if it ran against none."""
    ran = {
        name: results["producer_perf"]
        for name, results in systems.items()
        if isinstance(results.get("producer_perf"), dict)
        and "skipped" not in results["producer_perf"]
    }
    if not ran:
        return []
    reference = systems.get(PRODUCER_PERF_REFERENCE, {})
    lines = [
        "",
        "Kafka's ProducerPerformance, same topic settings (1 partition, replication factor 3,"
        " min.insync.replicas=2), 1 KiB records, acks=all, idempotent, linger.ms=5, the Java"
        " producer's defaults otherwise; steady state after the warm-up records. Latency is"
        f" from send() to the acknowledgement, queueing included. `/ {PRODUCER_PERF_REFERENCE}`:"
        " MB/s over Kafka's.",
        "",
        "| target | " + " | ".join(title for _, title in PERF_COLUMNS)
        + f" | MB/s / {PRODUCER_PERF_REFERENCE} |",
        "| --- | " + " | ".join("---:" for _ in PERF_COLUMNS) + " | ---: |",
    ]  # fmt: skip
    for name, figures in ran.items():
        if "error" in figures:
            lines.append(f"| {name} | " + " | ".join("-" for _ in PERF_COLUMNS) + " | error |")
            continue
        cells = [_format(value(systems[name], "producer_perf", key)) for key, _ in PERF_COLUMNS]
        ratio = _ratio(
            value(systems[name], "producer_perf", "mb_per_s"),
            value(reference, "producer_perf", "mb_per_s"),
        )
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def charts(systems: dict[str, Results], directory: Path) -> list[Path]:
    """throughput.png (bars per workload) and latency_cdf.png (workload 2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(systems)
    bars = [
        ("produce", "mb_per_s", "1 produce"),
        ("backlog", "mb_per_s", "3 consume backlog"),
        ("fanout", "mb_per_s", "4 fan-out (delivered)"),
        ("partitions", "mb_per_s", "5 100 partitions"),
    ]
    figure, axes = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        heights = [value(systems[name], w, k) for w, k, _ in bars]
        positions = [b + i * width for b in range(len(bars))]
        axes.bar(positions, [0 if math.isnan(h) else h for h in heights], width, label=name)
    axes.set_xticks([b + 0.4 - width / 2 for b in range(len(bars))], [t for *_, t in bars])
    axes.set_ylabel("MB/s (10^6 bytes)")
    axes.set_title("Throughput, 1 KiB records")
    axes.legend()
    figure.tight_layout()
    throughput = directory / "throughput.png"
    figure.savefig(throughput, dpi=120)
    plt.close(figure)

    figure, panels = plt.subplots(1, 3, figsize=(20, 5), sharey=True)
    quantiles = [*CDF_QUANTILES, 1.0]
    nines = [-math.log10(max(1 - q, 1e-5)) for q in quantiles]
    ticks = [0, 0.5, 0.9, 0.99, 0.999, 0.9999]
    for axes, key, title in (
        (panels[0], "cdf_ms", "at half of each system's maximum rate"),
        (panels[1], "common_cdf_ms", "at 5,000 records/s for every system"),
        (panels[2], "unbatched_cdf_ms", "at 1,000 records/s, linger.ms=0"),
    ):
        for name in names:
            cdf = systems[name].get("latency", {}).get(key)
            if cdf:
                axes.plot(cdf, nines, label=name, drawstyle="steps-post")
        axes.set_xscale("log")
        axes.set_yticks([-math.log10(1 - q) for q in ticks], [f"{q * 100:g}%" for q in ticks])
        axes.set_xlabel("produce to consume, ms (log)")
        axes.set_title(f"End-to-end latency {title}")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
    panels[0].set_ylabel("percentile")
    figure.tight_layout()
    cdf_path = directory / "latency_cdf.png"
    figure.savefig(cdf_path, dpi=120)
    plt.close(figure)
    return [throughput, cdf_path]
