"""Noisy neighbours: a modest tenant's latency alone, beside a flooding tenant, and after.

    python -m shoal.benchmarks.noisy_neighbour [--runs R] [--phase-seconds S]
        [--rate RPS] [--connections C] [--quota BYTES] [--brokers B] [--keep]

Starts etcd, B (3) brokers (replication B) and a gateway in a temporary
directory, and three tenants: the *victim*, with no quota, producing RPS (450)
records of 200 bytes a second with ``acks=all`` and ``linger.ms=0`` and
reading them back; the *aggressor*, with a produce and a consume quota of
BYTES (2 MB/s) each; and *unthrottled*, the same clients without a quota.
Each of R (5) runs measures the victim over five phases of S (10) seconds:

1. alone;
2. beside the aggressor, flooding produce (10 kB records) and fetch from C (32)
   connections in four processes of their own (started, their imports done
   and their clients signed in, before the victim starts; the phase sets them
   going);
3. after the aggressor stopped;
4. beside *unthrottled*, the same flood without a quota: what the quota buys;
5. after it stopped.

For each phase the victim's produce latency (``produce()`` to its delivery
report) and end-to-end latency (``produce()`` to the consumer's ``poll()``,
one record at a time)
are reported as p50 and p99, leaving out each phase's first second; the
medians over the runs are printed with the spread of the victim's p99 alone
(min to max over the runs), the p99 beside the aggressor and after it as
ratios to the p99 alone, the machine's load average in each phase, the
cores the servers used in it (the brokers, the gateway and etcd, from /proc:
what each flood costs the cluster, where the load also counts the clients), and the
limits from ``../shared/tools/limits`` measured in the same invocation, and
per phase the machine's longest pause (a sleeping thread of the benchmark
waking late: :class:`MachinePauses`) and the cores its host stole. The
goal (issue 26): beside the throttled aggressor and after it, the victim's
p99 within 1.5 times its p99 alone. The JSON lands in ``benchmarks/results/``.

With ``--keep`` the temporary directory stays, with the logs and, for each run
i, ``victim-acks-i.txt`` and ``victim-e2e-i.txt`` (send time, milliseconds per
record) and ``phases-i.json`` (each phase's name, measured start and end, load):
enough to see when in a phase a stall came.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.common import (
    CpuMeter,
    GatewayProcess,
    LocalCluster,
    create_tenant,
    measure_limits,
    write_results,
)
from shoal.tenancy.model import Quotas
from shoal.tenancy.store import TenancyStore

VICTIM_RECORD = 200
FLOOD_RECORD = 10_000
FLOOD_PROCESSES = 4
PHASES = ("alone", "beside", "after", "beside-unthrottled", "after-unthrottled")
SETTLE_S = 1.0
"""Left out at the start of each phase: clients connecting, a flood ramping up or draining."""
BETWEEN_RUNS_S = 10.0
"""A run ends beside the unthrottled flood's backlog, still draining for seconds: the next
run's victim alone must not be measured beside it (one run's p99 alone was 90 ms, not 13)."""
PAUSE_REPORT_MS = 20.0
"""A sleeping thread's wake-up this late or later is a pause of the machine."""
QUEUE_FULL_WAIT_S = 0.01
"""How long a flooding producer whose queue is full waits for a delivery before trying again."""


def _client(bootstrap: str, key: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": key[0],
        "sasl.password": key[1],
        **extra,
    }


def victim_producer(config: dict[str, Any], rate: float, out: Path, stop: Any) -> None:
    """Produce at ``rate``, each value stamped with its send time; write (sent at, produce
    ms, acknowledged at) per record.

    Producer and consumer are processes of their own, as a tenant's applications
    would be: a consumer polled in the producer's loop delays its delivery
    reports by seconds (seen with librdkafka 2.16), which would be measured as
    the cluster's latency.
    """
    producer = Producer({**config, "acks": "all", "linger.ms": 0})
    padding = b"x" * (VICTIM_RECORD - 8)
    with open(out, "w") as samples:

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                sent, now = struct.unpack(">d", msg.value()[:8])[0], time.time()
                samples.write(f"{sent:.6f} {(now - sent) * 1000:.3f} {now:.6f}\n")

        next_send = time.monotonic()
        while not stop.is_set():
            if time.monotonic() >= next_send:
                producer.produce("victim", struct.pack(">d", time.time()) + padding,
                                 on_delivery=delivered)  # fmt: skip
                next_send += 1 / rate
            producer.poll(max(0.0, next_send - time.monotonic()))
        producer.flush(10)


def victim_consumer(config: dict[str, Any], out: Path, stop: Any) -> None:
    """Read the victim's records as they come; write (sent at, end-to-end ms)."""
    consumer = Consumer({**config, "group.id": "victim", "fetch.wait.max.ms": 100})
    consumer.subscribe(["victim"])
    with open(out, "w") as samples:
        while not stop.is_set():
            # poll, not consume(n): librdkafka's batch call waits for n records or its
            # whole timeout, which at this rate would add up to the timeout to each.
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                sent = struct.unpack(">d", message.value()[:8])[0]
                samples.write(f"{sent:.6f} {(time.time() - sent) * 1000:.3f}\n")
    consumer.close()


def aggressor(
    bootstrap: str, key: tuple[str, str], producers: int, ready: Any, go: Any, stop: Any
) -> None:
    """``producers`` producers flooding one topic and one consumer reading it over and over,
    from when ``go`` is set until ``stop`` is.

    The process is started before its phase and waits for ``go`` with its imports
    done and its clients signed in (each producer has written one record, so it is
    connected to the leaders too): four Pythons starting at once take both cores for
    a second or two, and dozens of clients signing in at once are a login storm
    (measured on its own by tests/integration/test_gateway_connection_storm.py),
    either of which the victim would otherwise count against the flood.
    """
    clients = [
        Producer(_client(bootstrap, key, **{"queue.buffering.max.kbytes": 4096}))
        for _ in range(producers)
    ]
    consumer = Consumer(
        _client(
            bootstrap, key, **{"group.id": f"flood-{os.getpid()}", "auto.offset.reset": "earliest"}
        )
    )
    value = os.urandom(FLOOD_RECORD)
    for producer in clients:
        producer.produce("flood", value)
        producer.flush(60)
    consumer.list_topics("flood", timeout=60)
    ready.put(os.getpid())
    go.wait()
    consumer.subscribe(["flood"])
    while not stop.is_set():
        for producer in clients:
            try:
                for _ in range(20):
                    producer.produce("flood", value)
            except BufferError:
                # Its queue is full (its quota holds it back): wait for a delivery to
                # make room, as a flooding application does, rather than spin on the
                # cores the cluster under test shares (which made the victim's wait
                # the machine's load, not the cluster's fairness).
                producer.poll(QUEUE_FULL_WAIT_S)
            producer.poll(0)
        consumer.consume(100, timeout=0.01)
    for producer in clients:
        producer.purge()
        producer.flush(5)
    consumer.close()


@dataclass
class Phase:
    name: str
    produce_p50_ms: float
    produce_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float
    samples: int
    load_average: float
    server_cores: float
    """Cores the brokers, the gateway and etcd used over the phase."""
    gateway_cores: float
    machine_pause_ms: float
    """The longest a sleeping thread of the benchmark woke late in the phase
    (:class:`MachinePauses`)."""
    steal_cores: float
    """Cores the host took from the machine over the phase."""


class MachinePauses:
    """How late a thread that only sleeps wakes, and the hypervisor's steal time.

    A thread of this process sleeps 10 ms at a time and notes each wake-up
    :data:`PAUSE_REPORT_MS` or more late. Nothing of the cluster runs in it, so
    a late wake-up is the machine's: a CPU too crowded to run it, or the virtual
    machine paused by its host (seen as every process here, servers and clients,
    waking 70-85 ms late at the same instant at a load of 1.4 on two cores). A
    victim's p99 is its ninth-worst record in a phase, so one such pause sets it;
    ``steal`` (from /proc/stat) says how much of the phase the host took."""

    TICK_S: Final = 0.01

    def __init__(self) -> None:
        self.late: list[tuple[float, float]] = []
        """(wall time, ms late) of each late wake-up."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="machine-pauses", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            time.sleep(self.TICK_S)
            late_ms = (time.perf_counter() - began - self.TICK_S) * 1000
            if late_ms >= PAUSE_REPORT_MS:
                self.late.append((time.time(), late_ms))

    def longest_ms(self, start: float, end: float) -> float:
        return max((ms for at, ms in self.late if start <= at < end), default=0.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def steal_seconds() -> float:
    """CPU time the host took from this virtual machine, all CPUs, since boot."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def one_run(
    bootstrap: str,
    keys: dict[str, tuple[str, str]],
    args: argparse.Namespace,
    root: Path,
    index: int,
    servers: dict[str, int],
    pauses: MachinePauses,
) -> list[Phase]:
    """One run of the five phases; ``servers`` names the cluster's processes (their pids),
    whose CPU each phase reports, and ``pauses`` the machine's pauses."""
    context = multiprocessing.get_context("spawn")
    acks_path, e2e_path = root / f"victim-acks-{index}.txt", root / f"victim-e2e-{index}.txt"
    stop_victim = context.Event()
    victim = _client(bootstrap, keys["victim"])
    victims = [
        context.Process(target=victim_consumer, args=(victim, e2e_path, stop_victim)),
        context.Process(target=victim_producer, args=(victim, args.rate, acks_path, stop_victim)),
    ]
    per_process = max(1, args.connections // FLOOD_PROCESSES)
    ready = context.Queue()
    floods: dict[str, tuple[Any, Any, list[Any]]] = {}
    for phase, tenant in (("beside", "aggressor"), ("beside-unthrottled", "unthrottled")):
        go, stop = context.Event(), context.Event()
        processes = [
            # Daemons: if the run fails before setting them going, they must not keep
            # the benchmark from exiting.
            context.Process(
                target=aggressor,
                args=(bootstrap, keys[tenant], per_process, ready, go, stop),
                daemon=True,
            )
            for _ in range(FLOOD_PROCESSES)
        ]
        for process in processes:
            process.start()
        floods[phase] = (go, stop, processes)
    for _ in range(2 * FLOOD_PROCESSES):
        ready.get(timeout=120)
    for process in victims:
        process.start()
    time.sleep(3)  # connected, the consumer's group joined
    bounds: list[tuple[str, float, float, float]] = []
    cores: list[dict[str, float]] = []
    steal: list[float] = []
    for name in PHASES:
        flood = floods.get(name)
        if flood is not None:
            flood[0].set()
        start = time.time()
        meter = CpuMeter(servers)
        stolen = steal_seconds()
        time.sleep(args.phase_seconds)
        cores.append(meter.lap())
        steal.append((steal_seconds() - stolen) / (time.time() - start))
        bounds.append((name, start + SETTLE_S, time.time(), os.getloadavg()[0]))
        if flood is not None:
            flood[1].set()
            for process in flood[2]:
                process.join(30)
                if process.is_alive():
                    process.kill()
    stop_victim.set()
    for process in victims:
        process.join(30)
    (root / f"phases-{index}.json").write_text(json.dumps(bounds))
    ack_rows = _samples(acks_path)
    e2e_rows = _samples(e2e_path)
    phases = []
    for (name, start, end, load), used, stolen in zip(bounds, cores, steal, strict=True):
        acks = [ms for sent, ms in ack_rows if start <= sent < end]
        e2e = [ms for sent, ms in e2e_rows if start <= sent < end]
        phases.append(
            Phase(
                name,
                percentile(acks, 0.5),
                percentile(acks, 0.99),
                percentile(e2e, 0.5),
                percentile(e2e, 0.99),
                len(acks),
                load,
                sum(used.values()),
                used["gateway"],
                pauses.longest_ms(start, end),
                stolen,
            )
        )
    return phases


def _samples(path: Path) -> list[tuple[float, float]]:
    """(sent at, milliseconds) of each record a victim's file holds."""
    rows = (line.split() for line in path.read_text().splitlines())
    return [(float(row[0]), float(row[1])) for row in rows]


def set_quotas(etcd_url: str, tenant: str, quotas: Quotas) -> None:
    async def go() -> None:
        async with TenancyStore(etcd_url) as store:
            await store.set_quotas(tenant, quotas)

    asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--phase-seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=450.0, help="victim records/s")
    parser.add_argument("--connections", type=int, default=32, help="aggressor producers")
    parser.add_argument("--quota", type=float, default=2_000_000, help="aggressor bytes/s")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")))
    keep = args.keep
    runs: list[list[Phase]] = []
    try:
        limits = measure_limits(root)
        env = {"SHOAL_DEFAULT_REPLICATION_FACTOR": str(args.brokers)}
        with LocalCluster(root, brokers=args.brokers, env=env) as cluster:
            keys = {name: create_tenant(cluster.etcd_url, name) for name in
                    ("victim", "aggressor", "unthrottled")}  # fmt: skip
            set_quotas(
                cluster.etcd_url,
                "aggressor",
                Quotas(producer_byte_rate=args.quota, consumer_byte_rate=args.quota),
            )
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            pairs = (("victim", "victim"), ("aggressor", "flood"), ("unthrottled", "flood"))
            topics = [NewTopic(f"{tenant}.{name}", 3) for tenant, name in pairs]
            for future in admin.create_topics(topics).values():
                future.result(30)
            with GatewayProcess(root, cluster.etcd_url, cluster.bootstrap, args.brokers) as gw:
                assert cluster.etcd is not None
                servers = {f"broker-{i}": cluster.pid(i) for i in range(args.brokers)}
                servers |= {"etcd": cluster.etcd.pid, "gateway": gw.pid}
                time.sleep(2)  # the gateway's tenancy poll sees the quotas
                pauses = MachinePauses()
                try:
                    for run in range(args.runs):
                        if run:
                            time.sleep(BETWEEN_RUNS_S)
                        runs.append(one_run(gw.bootstrap, keys, args, root, run, servers, pauses))
                        print(f"run {run}: {[vars(p) for p in runs[-1]]}", flush=True)
                finally:
                    pauses.stop()
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    report(runs, limits, vars(args))


def report(runs: list[list[Phase]], limits: dict[str, float], settings: dict[str, Any]) -> None:
    medians = {}
    for i, name in enumerate(PHASES):
        phase = [run[i] for run in runs]
        medians[name] = {
            field: statistics.median(getattr(p, field) for p in phase)
            for field in (
                "produce_p50_ms",
                "produce_p99_ms",
                "e2e_p50_ms",
                "e2e_p99_ms",
                "load_average",
                "server_cores",
                "gateway_cores",
                "machine_pause_ms",
                "steal_cores",
            )
        }
    alone = [run[0].e2e_p99_ms for run in runs]
    base = medians["alone"]["e2e_p99_ms"]
    print("\nvictim, medians over", len(runs), "runs (ms):")
    header = (
        "phase", "produce p50", "p99", "e2e p50", "p99", "p99/alone", "load", "servers",
        "gateway", "pause", "steal",
    )  # fmt: skip
    widths = (20, 12, 8, 9, 8, 10, 6, 8, 8, 7, 6)
    print(
        " ".join(
            f"{h:{'<' if i == 0 else '>'}{w}}"
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    )
    for name, m in medians.items():
        print(
            f"{name:20} {m['produce_p50_ms']:12.1f} {m['produce_p99_ms']:8.1f}"
            f" {m['e2e_p50_ms']:9.1f} {m['e2e_p99_ms']:8.1f} {m['e2e_p99_ms'] / base:10.2f}"
            f" {m['load_average']:6.2f} {m['server_cores']:8.2f} {m['gateway_cores']:8.2f}"
            f" {m['machine_pause_ms']:7.0f} {m['steal_cores']:6.3f}"
        )
    print(f"victim e2e p99 alone over the runs: {min(alone):.1f} to {max(alone):.1f} ms")
    print(
        "each run alone, e2e p99 ms (the machine's longest pause in the phase, ms):",
        ", ".join(f"{run[0].e2e_p99_ms:.1f} ({run[0].machine_pause_ms:.0f})" for run in runs),
    )
    if limits:
        print("machine limits:", {k: round(v, 2) for k, v in limits.items()})
    document = {
        "settings": settings,
        "limits": limits,
        "medians": medians,
        "p99_alone_spread_ms": [min(alone), max(alone)],
        "runs": [[vars(p) for p in run] for run in runs],
    }
    write_results("noisy-neighbour", document)


if __name__ == "__main__":
    main()
