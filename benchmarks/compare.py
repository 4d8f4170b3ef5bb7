"""Shoal side by side with Apache Kafka, NATS JetStream and Redis Streams, and the machine's limits.

    python -m shoal.benchmarks.compare [--systems shoal kafka nats redis] [--scale F]
                                       [--runs N] [--out DIR] [--update-readme] [--keep]

The path form, ``python benchmarks/compare.py ...``, works as well, from any
working directory.

Measures the machine (``../shared/tools/limits`` and a loopback round trip),
then, one system at a time, installs it if missing, starts it on loopback,
runs the workloads of :mod:`.suite.workloads` against each of its
targets, and Kafka's own ``ProducerPerformance`` against the RF=3 ones
(:mod:`.suite.producer_perf`), and stops it. Writes ``results.json``, ``table.md``,
``throughput.png`` and ``latency_cdf.png`` to ``--out`` (by default
``benchmarks/results/compare-<time>/``), prints the table, and with
``--update-readme`` puts it into ``benchmarks/README.md``. ``--scale``
multiplies every workload's size and the warm-up (0.05 for a quick look);
``--runs`` sets how many times the repeated workloads run (3, for medians). ``--profile W``
runs workload W under py-spy on every Shoal server process (see
:mod:`.suite.profile`). A workload that fails is recorded with its error and
the suite goes on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.benchmarks.common import HERE, measure_limits
from shoal.benchmarks.suite import producer_perf, report, workloads
from shoal.benchmarks.suite.machine import loopback_round_trip
from shoal.benchmarks.suite.profile import profiled
from shoal.benchmarks.suite.systems import SYSTEMS, Target
from shoal.benchmarks.suite.workloads import Sizes

README = HERE / "README.md"
CHARTS = HERE / "charts"
TABLE_BEGIN = "<!-- compare:begin -->"
TABLE_END = "<!-- compare:end -->"


WORKLOADS = (
    "produce",
    "latency",
    "backlog",
    "fanout",
    "partitions",
    "http_produce",
    "producer_perf",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--runs", type=int, help="runs of the repeated workloads (default 3)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--update-readme", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the systems' data directory")
    parser.add_argument(
        "--workloads",
        nargs="+",
        choices=WORKLOADS,
        default=list(WORKLOADS),
        help="run only these (latency needs produce's maximum, so it brings produce along)",
    )
    parser.add_argument(
        "--profile",
        choices=WORKLOADS,
        help="py-spy on Shoal's servers during this workload (slows them: not for the table)",
    )
    args = parser.parse_args()

    started = time.time()
    out = args.out or HERE / "results" / time.strftime("compare-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="shoal-compare-", dir=os.environ.get("SHOAL_BENCH_DIR")))
    sizes = Sizes().scaled(args.scale) if args.scale != 1.0 else Sizes()
    if args.runs is not None:
        sizes = dataclasses.replace(sizes, runs=args.runs)
    try:
        say("measuring the machine")
        machine = {**measure_limits(root, sizes.limits_mb), **loopback_round_trip()}
        systems: dict[str, dict[str, Any]] = {}
        described: dict[str, dict[str, Any]] = {}
        for name in args.systems:
            say(f"starting {name}")
            with SYSTEMS[name](root / name, sizes.warm_up_s) as targets:
                for target in targets:
                    described[target.name] = {
                        "version": target.version,
                        "durability": target.durability,
                        "copies": target.copies,
                    }
                    profile_dir = out if args.profile and name == "shoal" else None
                    systems[target.name] = run_target(
                        target, sizes, args.profile, profile_dir, args.workloads
                    )
            if not args.keep:
                shutil.rmtree(root / name, ignore_errors=True)
        copies = {name: d["copies"] for name, d in described.items()}
        table = report.markdown(systems, copies, machine)
        seconds = time.time() - started
        document = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "seconds": seconds,
            "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "machine": machine,
            "sizes": sizes.__dict__,
            "systems": described,
            "results": systems,
        }
        (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
        (out / "table.md").write_text(table)
        report.charts(systems, out)
        print(table)
        print(durability_table(described))
        if args.update_readme:
            update_readme(table, described, machine, seconds, out)
        say(f"done in {seconds:.0f} s; results in {out}")
    finally:
        if args.keep:
            say(f"data kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def run_target(
    target: Target,
    sizes: Sizes,
    profile: str | None = None,
    profile_dir: Path | None = None,
    only: list[str] | None = None,
) -> dict[str, Any]:
    """Each workload in order (or those in ``only``); one that fails is recorded and
    the rest still run.

    With ``profile_dir``, the ``profile`` workload runs under py-spy."""
    results: dict[str, Any] = {}
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("produce", lambda: workloads.produce(target, sizes, progress)),
        (
            "latency",
            lambda: workloads.latency(target, sizes, results["produce"]["records_per_s"], progress),
        ),
        ("backlog", lambda: workloads.backlog(target, sizes, progress)),
        ("fanout", lambda: workloads.fanout(target, sizes, progress)),
        ("partitions", lambda: workloads.partitions(target, sizes, progress)),
        ("http_produce", lambda: workloads.http_produce(target, sizes, progress)),
        ("producer_perf", lambda: producer_perf.run(target, sizes, progress)),
    ]

    if only is not None:
        wanted = set(only) | ({"produce"} if "latency" in only else set())
        steps = [step for step in steps if step[0] in wanted]

    def progress(message: str) -> None:
        say(f"{target.name}: {message}")

    try:
        _run_steps(target, steps, results, profile, profile_dir)
    finally:
        workloads.drop_topic(target)
    return results


def _run_steps(
    target: Target,
    steps: list[tuple[str, Callable[[], dict[str, Any]]]],
    results: dict[str, Any],
    profile: str | None,
    profile_dir: Path | None,
) -> None:
    for name, step in steps:
        began = time.monotonic()
        try:
            if profile_dir is not None and name == profile:
                # py-spy samples Python processes: etcd is Go.
                python = {n: pid for n, pid in target.pids.items() if n != "etcd"}
                with profiled(python, profile_dir, f"{target.name}-{name}"):
                    results[name] = {**step(), "seconds": time.monotonic() - began}
            else:
                results[name] = {**step(), "seconds": time.monotonic() - began}
        except Exception as exc:
            say(f"{target.name}: {name} failed: {exc}")
            results[name] = {"error": "".join(traceback.format_exception_only(exc)).strip()}


def durability_table(described: dict[str, dict[str, Any]]) -> str:
    lines = ["| system | version | durability |", "| --- | --- | --- |"]
    lines += [f"| {name} | {d['version']} | {d['durability']} |" for name, d in described.items()]
    return "\n".join(lines) + "\n"


def update_readme(
    table: str,
    described: dict[str, dict[str, Any]],
    machine: dict[str, float],
    seconds: float,
    out: Path,
) -> None:
    """The table between README's markers, and this run's charts in ``benchmarks/charts/``."""
    text = README.read_text()
    if TABLE_BEGIN not in text or TABLE_END not in text:
        say(f"{README} has no {TABLE_BEGIN} marker; not updated")
        return
    CHARTS.mkdir(exist_ok=True)
    for chart in ("throughput.png", "latency_cdf.png"):
        shutil.copyfile(out / chart, CHARTS / chart)
    limits = ", ".join(f"{k} {v:,.3g}" for k, v in machine.items())
    block = (
        f"{TABLE_BEGIN}\n"
        f"Run of {time.strftime('%Y-%m-%d')}, {seconds / 60:.1f} min, machine: {limits}.\n\n"
        f"{table}\n{durability_table(described)}\n"
        "![throughput](charts/throughput.png)\n\n![latency CDF](charts/latency_cdf.png)\n"
        f"{TABLE_END}"
    )
    head, rest = text.split(TABLE_BEGIN, 1)
    README.write_text(head + block + rest.split(TABLE_END, 1)[1])


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
