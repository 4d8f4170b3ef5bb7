"""The benchmarks run from any working directory, by path or as ``shoal.benchmarks``.

They are the installed package ``shoal.benchmarks`` and import each other by
that name, so neither the working directory nor the script's folder has to be
on ``sys.path``. Every script (a module of ``benchmarks/`` with a
``__main__`` block) is started by its path under ``python -P``, which keeps
its folder off ``sys.path``, and as ``python -m shoal.benchmarks.<name>``,
both from an empty directory, and must print its help. Then the real
side-by-side suite (``make bench``'s, at a twentieth of its size, each workload
once) runs from the checkout root, as ``make bench`` starts it, and must write a
table with a column of figures for every system (Apache Kafka's included),
Shoal's ratios to Kafka, and Kafka's ProducerPerformance against both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
HELP_TIMEOUT_S = 60
SUITE_TIMEOUT_S = 1080
"""Apache Kafka (a start, a 30 s warm-up, two targets) made the quick suite longer."""
PEERS = ("shoal", "kafka", "nats", "redis")
"""The systems ``compare`` runs by default; each has one or more columns (targets)."""
PRODUCER_PERF_TARGETS = ("shoal-gw-rf3", "shoal-rf3", "kafka-rf3")
"""The targets Kafka's ProducerPerformance runs against."""


def scripts() -> list[Path]:
    found = [
        path
        for path in sorted(BENCHMARKS.rglob("*.py"))
        if 'if __name__ == "__main__":' in path.read_text()
    ]
    assert {p.stem for p in found} >= {"compare", "produce_consume", "tracing_overhead"}, found
    return found


SCRIPTS = scripts()


def module_of(script: Path) -> str:
    parts = script.relative_to(BENCHMARKS).with_suffix("").parts
    return ".".join(("shoal", "benchmarks", *parts))


def clean_env() -> dict[str, str]:
    """This environment without what would put the checkout on ``sys.path`` or keep it off."""
    env = dict(os.environ)
    env.pop("PYTHONSAFEPATH", None)
    env.pop("PYTHONPATH", None)
    return env


def run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(s.relative_to(BENCHMARKS)) for s in SCRIPTS])
def test_script_by_path_with_safe_path_prints_help(script: Path, tmp_path: Path) -> None:
    result = run([sys.executable, "-P", str(script), "--help"], tmp_path, HELP_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.parametrize("module", [module_of(s) for s in SCRIPTS])
def test_script_as_module_prints_help(module: str, tmp_path: Path) -> None:
    result = run([sys.executable, "-m", module, "--help"], tmp_path, HELP_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def table_columns(table: str) -> dict[str, dict[str, str]]:
    """``table.md``'s main table: each system's column, figure (``workload | figure``) to cell.

    The main table is the first: the ones after it (Shoal vs Kafka, ProducerPerformance)
    have columns of their own."""
    lines = table.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[first:end]
    ]
    header, body = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
    assert header[:2] == ["workload", "figure"], header
    systems = header[2:-1]  # the last column names the winner
    return {
        system: {f"{r[0]} | {r[1]}": r[2 + i] for r in body} for i, system in enumerate(systems)
    }


# `alone`: the suite keeps both cores busy for minutes; beside other tests it
# would slow their timeouts and they its figures. `bench_smoke`: its five
# minutes are `make bench-smoke`'s, which CI runs after `make test`.
@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.bench_smoke
@pytest.mark.timeout(1140)
def test_quick_suite_runs_from_the_checkout_root(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "shoal.benchmarks.compare", "--scale", "0.05", "--runs", "1"]
    argv += ["--out", str(out)]
    result = run(argv, ROOT, SUITE_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-5000:]

    # A workload that failed leaves its cells empty ("-"): its error says why.
    document = json.loads((out / "results.json").read_text())
    failed = {
        f"{system}/{workload}": figures["error"]
        for system, results in document["results"].items()
        for workload, figures in results.items()
        if "error" in figures
    }
    assert not failed, (failed, result.stdout[-5000:])

    table = (out / "table.md").read_text()
    columns = table_columns(table)
    assert set(document["results"]) == set(columns), table
    for peer in PEERS:
        assert any(name.startswith(peer) for name in columns), (peer, table)
    for name, cells in columns.items():
        produced = cells["1 produce flat out | MB/s"].split()[0]
        assert produced != "-" and float(produced.replace(",", "")) > 0, (name, table)

    for target in PRODUCER_PERF_TARGETS:
        perf = document["results"][target]["producer_perf"]
        assert perf["records_per_s"] > 0, (target, perf)
    assert "| shoal-rf3 / kafka-rf3 |" in table, table
    assert "Kafka's ProducerPerformance" in table, table


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.bench_smoke
@pytest.mark.timeout(900)
def test_quick_scale_curves_run_from_the_checkout_root(tmp_path: Path) -> None:
    """The scale curves' first points (``--scale 0.05``): every curve has its figures and
    its chart."""
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "shoal.benchmarks.scale", "--scale", "0.05", "--out", str(out)]
    result = run(argv, ROOT, 840)
    assert result.returncode == 0, result.stderr[-5000:]

    document = json.loads((out / "results.json").read_text())["results"]
    partitions = document["partitions"]
    assert set(partitions) == {"shoal-rf3", "kafka-rf3"}, partitions
    for system, points in partitions.items():
        assert [p["partitions"] for p in points] == [1, 10], (system, points)
        assert all(p["mb_per_s"] > 0 and p["mb_per_core_s"] > 0 for p in points), points
    (tenants,) = document["tenants"]
    assert tenants["tenants"] == 1 and tenants["setup_p99_ms"] > 0, tenants
    assert tenants["gateway_rss_mb"] > 0 and tenants["mb_per_s"] > 0, tenants
    (cluster,) = document["cluster"]
    assert cluster["partitions"] == 100 and cluster["metadata_ms"] > 0, cluster
    assert 0 < cluster["failover_s"] < 60, cluster
    for curve in ("partitions", "tenants", "cluster"):
        assert (out / f"scale_{curve}.png").stat().st_size > 0, curve
    assert "**Cluster size**" in (out / "table.md").read_text()
