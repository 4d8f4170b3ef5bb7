"""Scale curves: how throughput, cost and the control plane follow the amount of work.

    python -m shoal.benchmarks.scale [--systems shoal kafka] [--curves C ...] [--scale F]
                                     [--out DIR] [--update-readme]

Every point of every curve in one run, next to the machine's limits measured in
the same run (``../shared/tools/limits`` and a loopback round trip):

1. ``partitions``: ten producers (processes of their own) spread their records
   over a topic of 1, 10, 100 and 1,000 partitions, RF=3 with acks=all straight
   to the brokers (the suite's ``partitions`` workload at each size): MB/s, MB
   per server core-second, the producers' p99; Shoal and Apache Kafka.
2. ``tenants``: 1, 100 and 1,000 tenants, each with one Kafka connection through
   one gateway (SASL/PLAIN login, then a Metadata request), opened
   :data:`CONNECTING_AT_ONCE` at a time: how long each took to set up (p50/p99),
   the gateway's resident memory with them all open, and one producer's MB/s
   through the gateway (acks=all, RF=3) while they stay open, with the gateway's
   own MB per core-second. Shoal only: Kafka has no gateway.
3. ``cluster``: one Shoal cluster grown to 100, 1,000 and 10,000 partitions
   (RF=3, topics of :data:`TOPIC_PARTITIONS`): the time to create them, how
   long a Metadata request for every topic takes (librdkafka's
   ``list_topics``, median of 5), and the failover when the controller's broker
   is killed with SIGKILL: seconds until a surviving broker names another
   controller and a live leader for every partition. The broker is then started
   again and the cluster waits until every partition has its three replicas in
   sync (reported too) before it grows. Shoal only: Kafka's suite cluster has a
   single KRaft controller, which cannot fail over.

``--scale`` below 1 drops the points above ``scale`` times the largest (a quick
look keeps the first point of each curve) and shrinks the records as
``compare`` does. Writes ``results.json``, ``table.md`` and one chart per curve
to ``--out`` (``benchmarks/results/scale-<time>/``); ``--update-readme`` puts
the tables into ``benchmarks/README.md`` and the charts into
``benchmarks/charts/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic
from shoal.benchmarks.common import (
    HERE,
    GatewayProcess,
    LocalCluster,
    create_tenant,
    measure_limits,
)
from shoal.benchmarks.suite import workloads
from shoal.benchmarks.suite.machine import loopback_round_trip
from shoal.benchmarks.suite.systems import (
    DURABILITY,
    SHOAL_BROKERS,
    SYSTEMS,
    Target,
    shoal_settings,
)
from shoal.benchmarks.suite.workloads import Sizes

from shoal.cli.wire_admin import WireAdmin

CURVES: Final = ("partitions", "tenants", "cluster")
PARTITION_COUNTS: Final = (1, 10, 100, 1000)
TENANT_COUNTS: Final = (1, 100, 1000)
CLUSTER_PARTITIONS: Final = (100, 1000, 10_000)
TOPIC_PARTITIONS: Final = 100
"""The cluster curve grows in topics of this many partitions."""
TOPICS_PER_REQUEST: Final = 10
CONNECTING_AT_ONCE: Final = 32
METADATA_SAMPLES: Final = 5
WAIT_S: Final = 600.0
"""The longest any step of the cluster curve may take before the run gives up on it."""

README = HERE / "README.md"
CHARTS = HERE / "charts"
TABLE_BEGIN = "<!-- scale:begin -->"
TABLE_END = "<!-- scale:end -->"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--systems", nargs="+", choices=["shoal", "kafka"], default=["shoal", "kafka"]
    )
    parser.add_argument("--curves", nargs="+", choices=CURVES, default=list(CURVES))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--update-readme", action="store_true")
    args = parser.parse_args()

    started = time.time()
    out = args.out or HERE / "results" / time.strftime("scale-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="shoal-scale-", dir=os.environ.get("SHOAL_BENCH_DIR")))
    sizes = dataclasses.replace(
        Sizes().scaled(args.scale) if args.scale != 1.0 else Sizes(), runs=1
    )
    _raise_open_files_limit()
    try:
        say("measuring the machine")
        machine = {**measure_limits(root, sizes.limits_mb), **loopback_round_trip()}
        results: dict[str, Any] = {}
        if "partitions" in args.curves:
            results["partitions"] = partitions_curve(
                root, sizes, args.systems, _points(PARTITION_COUNTS, args.scale)
            )
        if "tenants" in args.curves:
            results["tenants"] = tenants_curve(root, sizes, _points(TENANT_COUNTS, args.scale))
        if "cluster" in args.curves:
            results["cluster"] = cluster_curve(root, _points(CLUSTER_PARTITIONS, args.scale))
        seconds = time.time() - started
        table = markdown(results, machine)
        document = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "seconds": seconds,
            "machine": machine,
            "sizes": sizes.__dict__,
            "results": results,
        }
        (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
        (out / "table.md").write_text(table)
        charts(results, out)
        print(table)
        if args.update_readme:
            update_readme(table, seconds, out)
        say(f"done in {seconds:.0f} s; results in {out}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _points(points: Sequence[int], scale: float) -> list[int]:
    """The points up to ``scale`` times the largest, and at least the first."""
    kept = [p for p in points if p <= max(points) * scale]
    return kept or [points[0]]


def _raise_open_files_limit() -> None:
    """A thousand connections need more descriptors than the usual soft limit of 1024,
    in this process and in the gateway it starts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


# -- 1. partitions --------------------------------------------------------------------------


def partitions_curve(
    root: Path, sizes: Sizes, systems: Sequence[str], counts: Sequence[int]
) -> dict[str, list[dict[str, Any]]]:
    """Each system's RF=3 target under the ``partitions`` workload at every count."""
    curves: dict[str, list[dict[str, Any]]] = {}
    for system in systems:
        say(f"partitions: starting {system}")
        with SYSTEMS[system](root / f"partitions-{system}", sizes.warm_up_s) as targets:
            target = next(t for t in targets if t.name == f"{system}-rf3")
            points = []
            for count in counts:
                figures = workloads.partitions(
                    target, dataclasses.replace(sizes, partitions=count), progress(target.name)
                )
                figures.pop("runs")
                points.append({"partitions": count, **figures})
            workloads.drop_topic(target)
            curves[target.name] = points
        shutil.rmtree(root / f"partitions-{system}", ignore_errors=True)
    return curves


# -- 2. tenants -----------------------------------------------------------------------------


@contextmanager
def shoal_with_gateway(root: Path) -> Iterator[tuple[LocalCluster, GatewayProcess]]:
    root.mkdir(parents=True, exist_ok=True)
    with (
        LocalCluster(root, brokers=SHOAL_BROKERS, env=shoal_settings()) as cluster,
        GatewayProcess(root, cluster.etcd_url, cluster.bootstrap, SHOAL_BROKERS) as gateway,
    ):
        yield cluster, gateway


def tenants_curve(root: Path, sizes: Sizes, counts: Sequence[int]) -> list[dict[str, Any]]:
    """At each count, that many tenants connected through one gateway; see the module."""
    points = []
    with shoal_with_gateway(root / "tenants") as (cluster, gateway):
        keys: list[tuple[str, str, str]] = []
        held: list[WireAdmin] = []
        try:
            for count in counts:
                say(f"tenants: creating tenants {len(keys) + 1} to {count}")
                names = [f"tenant-{n:04d}" for n in range(len(keys), count)]
                with ThreadPoolExecutor(4) as pool:
                    made = list(pool.map(lambda name: create_tenant(cluster.etcd_url, name), names))
                new = [
                    (name, key_id, secret)
                    for name, (key_id, secret) in zip(names, made, strict=True)
                ]
                keys += new
                say(f"tenants: {len(new)} new tenants connect, {CONNECTING_AT_ONCE} at a time")
                connecting = time.monotonic()
                setups, admins = _connect(gateway.bootstrap, new)
                connect_s = time.monotonic() - connecting
                held += admins
                rss_mb = _rss_mb(gateway.pid)
                produced = _produce_through(cluster, gateway, keys[0], sizes)
                points.append(
                    {
                        "tenants": count,
                        "setup_p50_ms": _percentile(setups, 50) * 1000,
                        "setup_p99_ms": _percentile(setups, 99) * 1000,
                        "new_connections_s": connect_s,
                        "gateway_rss_mb": rss_mb,
                        **produced,
                    }
                )
        finally:
            for admin in held:
                admin.close()
    return points


def _connect(
    bootstrap: str, keys: Sequence[tuple[str, str, str]]
) -> tuple[list[float], list[WireAdmin]]:
    """One connection per key: login and a Metadata request; each one's seconds, and the
    connections, left open."""

    opened: list[WireAdmin] = []

    def one(key: tuple[str, str, str]) -> tuple[float, WireAdmin]:
        _, key_id, secret = key
        admin = WireAdmin(
            {
                "bootstrap.servers": bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": key_id,
                "sasl.password": secret,
            }
        )
        opened.append(admin)
        began = time.monotonic()
        admin.metadata()
        return time.monotonic() - began, admin

    try:
        with ThreadPoolExecutor(CONNECTING_AT_ONCE) as pool:
            done = list(pool.map(one, keys))
    except BaseException:
        for admin in opened:
            admin.close()
        raise
    return [seconds for seconds, _ in done], [admin for _, admin in done]


def _produce_through(
    cluster: LocalCluster, gateway: GatewayProcess, key: tuple[str, str, str], sizes: Sizes
) -> dict[str, float]:
    """One producer flat out through the gateway with the first tenant's key; its MB/s and
    p99, and the gateway's own cost (the brokers' is the partitions curve's)."""
    tenant, key_id, secret = key
    client = {
        "bootstrap.servers": gateway.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": key_id,
        "sasl.password": secret,
    }
    target = Target(
        "shoal-gw-rf3", "kafka",
        {
            "admin": {"bootstrap.servers": cluster.bootstrap},
            "client": client,
            "producer": {"acks": "all", "enable.idempotence": True},
        },
        copies=3, durability=DURABILITY["shoal-gw-rf3"], version="",
        pids={"gateway": gateway.pid}, topic_prefix=f"{tenant}.", replicas=3,
    )  # fmt: skip
    figures = workloads.produce(target, sizes, progress("tenants"))
    workloads.drop_topic(target)
    return {
        "mb_per_s": figures["mb_per_s"],
        "latency_p99_ms": figures["latency_p99_ms"],
        "gateway_cores": figures["cpu"],
        "gateway_mb_per_core_s": figures["mb_per_core_s"],
    }


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- 3. cluster size ------------------------------------------------------------------------


def cluster_curve(root: Path, totals: Sequence[int]) -> list[dict[str, Any]]:
    """One cluster grown to each total; see the module. A step that does not finish
    within :data:`WAIT_S` is recorded as such, and the cluster grows no further."""
    (root / "cluster").mkdir(parents=True, exist_ok=True)
    points: list[dict[str, Any]] = []
    with LocalCluster(root / "cluster", brokers=SHOAL_BROKERS, env=shoal_settings()) as cluster:
        topics: list[str] = []
        for total in totals:
            point: dict[str, Any] = {"partitions": total}
            points.append(point)
            try:
                _grow_and_fail_over(cluster, topics, total, point)
            except TimeoutError as exc:
                point["timed_out"] = str(exc)
                say(f"cluster: {total} partitions: {exc}; growing no further")
                break
    return points


def _grow_and_fail_over(
    cluster: LocalCluster, topics: list[str], total: int, point: dict[str, Any]
) -> None:
    """Add topics to ``topics`` until the cluster has ``total`` partitions; then time a
    Metadata request, kill the controller's broker and start it again. Each figure goes
    into ``point`` as soon as it is measured."""
    say(f"cluster: growing to {total} partitions")
    began = time.monotonic()
    topics += _create_topics(cluster, len(topics), total // TOPIC_PARTITIONS)
    _wait(lambda: _healthy(_metadata(cluster.bootstrap), topics), "leaders and full ISRs")
    point["create_s"] = time.monotonic() - began
    samples = []
    for _ in range(METADATA_SAMPLES):
        sampled = time.monotonic()
        _metadata(cluster.bootstrap)
        samples.append(time.monotonic() - sampled)
    point["metadata_ms"] = statistics.median(samples) * 1000
    controller = _metadata(cluster.bootstrap).controller_id
    say(f"cluster: {total} partitions; killing broker {controller}, the controller")
    cluster.kill(controller)
    killed = time.monotonic()
    _wait(
        lambda: _failed_over(_metadata(cluster.live_bootstrap()), topics, controller),
        "new controller and leaders",
    )
    point["failover_s"] = time.monotonic() - killed
    cluster.start(controller)
    restarted = time.monotonic()
    _wait(lambda: _healthy(_metadata(cluster.bootstrap), topics), "full ISRs again")
    point["back_in_sync_s"] = time.monotonic() - restarted


def _create_topics(cluster: LocalCluster, first: int, wanted: int) -> list[str]:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    names = [f"scale-{n:05d}" for n in range(first, wanted)]
    for at in range(0, len(names), TOPICS_PER_REQUEST):
        batch = [
            NewTopic(name, TOPIC_PARTITIONS, SHOAL_BROKERS)
            for name in names[at : at + TOPICS_PER_REQUEST]
        ]
        for future in admin.create_topics(batch, operation_timeout=120).values():
            future.result()
    return names


def _metadata(bootstrap: str) -> ClusterMetadata:
    """Every topic's metadata from a new client (no connection kept to a killed broker)."""
    return AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=60)


def _healthy(metadata: ClusterMetadata, topics: Sequence[str]) -> bool:
    return all(
        name in metadata.topics
        and len(metadata.topics[name].partitions) == TOPIC_PARTITIONS
        and all(
            p.leader >= 0 and len(p.isrs) == SHOAL_BROKERS
            for p in metadata.topics[name].partitions.values()
        )
        for name in topics
    )


def _failed_over(metadata: ClusterMetadata, topics: Sequence[str], killed: int) -> bool:
    if metadata.controller_id in (-1, killed):
        return False
    return all(
        p.leader not in (-1, killed)
        for name in topics
        for p in metadata.topics[name].partitions.values()
    )


def _wait(ready: Callable[[], bool], what: str) -> None:
    """Until ``ready()``; a cluster that cannot answer yet (a broker just killed, a topic
    missing from a partial answer) is not ready yet."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            if ready():
                return
        except (KafkaException, KeyError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {WAIT_S:.0f} s")
        time.sleep(0.1)


# -- report ---------------------------------------------------------------------------------


def markdown(results: dict[str, Any], machine: dict[str, float]) -> str:
    page_cache = machine.get("pagecache_write_MBps", float("nan"))
    ceiling = page_cache / 3  # three copies of every byte, each written to the page cache
    lines = [
        f"Machine (same run): loopback {machine.get('loopback_MBps', float('nan')):.0f} MB/s,"
        f" page cache writes {page_cache:.0f} MB/s; an RF=3 write's ceiling is a third of"
        f" the latter, {ceiling:.0f} MB/s (the `of ceiling` columns).",
        "",
    ]
    if "partitions" in results:
        lines += [
            "**Partitions** (10 producers, RF=3, acks=all, straight to the brokers):",
            "",
            "| system | partitions | MB/s | of ceiling | MB per server core-s | producer p99 ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for system, points in results["partitions"].items():
            for p in points:
                lines.append(
                    f"| {system} | {p['partitions']} | {p['mb_per_s']:.1f}"
                    f" | {p['mb_per_s'] / ceiling:.3f} | {p['mb_per_core_s']:.1f}"
                    f" | {p['latency_p99_ms']:.1f} |"
                )
        lines.append("")
    if "tenants" in results:
        lines += [
            "**Tenants** connected through one gateway (one connection each), and one"
            " producer through it meanwhile:",
            "",
            "| tenants | setup p50 ms | setup p99 ms | gateway RSS MB | producer MB/s"
            " | of ceiling | producer p99 ms | gateway cores | gateway MB per core-s |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for p in results["tenants"]:
            lines.append(
                f"| {p['tenants']} | {p['setup_p50_ms']:.1f} | {p['setup_p99_ms']:.1f}"
                f" | {p['gateway_rss_mb']:.0f} | {p['mb_per_s']:.1f}"
                f" | {p['mb_per_s'] / ceiling:.3f} | {p['latency_p99_ms']:.1f}"
                f" | {p['gateway_cores']:.2f} | {p['gateway_mb_per_core_s']:.1f} |"
            )
        lines.append("")
    if "cluster" in results:
        lines += [
            "**Cluster size** (RF=3, topics of 100 partitions; the controller's broker killed):",
            "",
            "| partitions | grown in s | Metadata ms | failover s | back in sync s |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
        for p in results["cluster"]:
            cells = [
                _cell(p, "create_s", ".1f"),
                _cell(p, "metadata_ms", ".1f"),
                _cell(p, "failover_s", ".2f"),
                _cell(p, "back_in_sync_s", ".1f"),
            ]
            lines.append(f"| {p['partitions']} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += [
            f"{p['partitions']} partitions: {p['timed_out']}."
            for p in results["cluster"]
            if "timed_out" in p
        ]
        lines.append("")
    return "\n".join(lines)


def charts(results: dict[str, Any], out: Path) -> None:
    """One PNG per curve, log-scaled along the work."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "partitions" in results:
        figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for system, points in results["partitions"].items():
            xs = [p["partitions"] for p in points]
            left.plot(xs, [p["mb_per_s"] for p in points], marker="o", label=system)
            right.plot(xs, [p["mb_per_core_s"] for p in points], marker="o", label=system)
        _axes(left, "partitions", "MB/s")
        _axes(right, "partitions", "MB per server core-second")
        _save(figure, out / "scale_partitions.png")
    if "tenants" in results:
        points = results["tenants"]
        xs = [p["tenants"] for p in points]
        figure, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 4))
        left.plot(xs, [p["setup_p50_ms"] for p in points], marker="o", label="p50")
        left.plot(xs, [p["setup_p99_ms"] for p in points], marker="o", label="p99")
        middle.plot(xs, [p["gateway_rss_mb"] for p in points], marker="o", label="gateway RSS")
        right.plot(xs, [p["mb_per_s"] for p in points], marker="o", label="producer MB/s")
        _axes(left, "tenants connected", "connection setup, ms")
        _axes(middle, "tenants connected", "MB")
        _axes(right, "tenants connected", "MB/s")
        _save(figure, out / "scale_tenants.png")
    if "cluster" in results:
        points = results["cluster"]
        figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for axes, key, label in (
            (left, "metadata_ms", "Metadata, all topics"),
            (right, "failover_s", "controller failover"),
            (right, "back_in_sync_s", "back in sync"),
        ):
            measured = [p for p in points if key in p]
            axes.plot(
                [p["partitions"] for p in measured],
                [p[key] for p in measured],
                marker="o",
                label=label,
            )
        _axes(left, "partitions in the cluster", "ms")
        _axes(right, "partitions in the cluster", "s")
        _save(figure, out / "scale_cluster.png")


def _axes(axes: Any, x: str, y: str) -> None:
    axes.set_xscale("log")
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    axes.grid(True, alpha=0.3)
    axes.legend()


def _save(figure: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def update_readme(table: str, seconds: float, out: Path) -> None:
    """The tables between the README's scale markers; the charts into ``charts/``."""
    text = README.read_text()
    begin, end = text.index(TABLE_BEGIN), text.index(TABLE_END)
    stamp = time.strftime("%d %B %Y")
    images = "\n\n".join(
        f"![{chart.stem.replace('_', ' ')}](charts/{chart.name})"
        for chart in sorted(out.glob("scale_*.png"))
    )
    body = f"\n_Run of {stamp}, {seconds / 60:.0f} min._\n\n{table}\n{images}\n"
    README.write_text(text[: begin + len(TABLE_BEGIN)] + body + text[end:])
    CHARTS.mkdir(exist_ok=True)
    for chart in out.glob("scale_*.png"):
        shutil.copy(chart, CHARTS / chart.name)


def _cell(point: dict[str, Any], key: str, spec: str) -> str:
    """A figure, or what stopped it being measured (a step that ran past WAIT_S)."""
    if key in point:
        return format(point[key], spec)
    return f"over {WAIT_S:.0f} s" if "timed_out" in point else "-"


def _percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def progress(name: str) -> Callable[[str], None]:
    return lambda message: say(f"{name}: {message}")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    main()
