"""What the noisy-neighbour benchmark's victim load costs, on Apache Kafka and on Shoal.

    python -m shoal.benchmarks.victim_cost [--rate RPS] [--warm-up W] [--seconds S]
                                           [--systems kafka,shoal,shoal-gw]
                                           [--no-consumer] [--keep]

The victim of :mod:`shoal.benchmarks.noisy_neighbour`, alone and with its own
clients (its producer of RPS (450) records of 200 bytes a second,
``acks=all``, ``linger.ms=0``, and its consumer in a group, each a process),
on a topic of three partitions with three replicas; ``--no-consumer`` leaves
the consumer out. Each system starts in a temporary directory: Apache Kafka
(one KRaft controller and three brokers, :mod:`shoal.benchmarks.apache_kafka`),
Shoal's three brokers and etcd straight, and the same behind the gateway
with a tenant's key. After a warm-up of W (30) seconds (Kafka's JIT), it
measures over S (15) seconds: the cores the servers used (every JVM; the
brokers, etcd and the gateway), the records acknowledged a second, and the
produce latency (``produce()`` to the delivery report) and end-to-end latency
(to the consumer's ``poll()``), p50 and p99, of the records sent in the
window, with how many of those were never acknowledged (the producer stops
waiting 10 s after the window). A system that cannot serve the load shows
latency of seconds that grows with the run. The cores are printed beside
the machine's from ``../shared/tools/limits``; the JSON lands in
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.apache_kafka import ApacheKafka
from shoal.benchmarks.common import (
    CpuMeter,
    GatewayProcess,
    LocalCluster,
    create_tenant,
    measure_limits,
    write_results,
)
from shoal.benchmarks.noisy_neighbour import VICTIM_RECORD, victim_consumer, victim_producer

HERE = Path(__file__).resolve().parent
SYSTEMS = ("kafka", "shoal", "shoal-gw")
TENANT = "victim"
TOPIC = "victim"
"""The topic noisy_neighbour's victim writes and reads."""
PARTITIONS = 3
REPLICAS = 3


@dataclass
class Result:
    system: str
    server_cores: float
    acked_per_s: float
    """Acknowledgements that came within the window, a second."""
    unacknowledged: int
    """Records sent in the window that were never acknowledged."""
    produce_p50_ms: float
    produce_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float


def measure(
    system: str,
    config: dict[str, Any],
    pids: list[int],
    root: Path,
    args: argparse.Namespace,
) -> Result:
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    acks, e2e = root / f"{system}-acks.txt", root / f"{system}-e2e.txt"
    clients = [spawn.Process(target=victim_producer, args=(config, args.rate, acks, stop))]
    if args.consumer:
        clients.append(spawn.Process(target=victim_consumer, args=(config, e2e, stop)))
    for client in clients:
        client.start()
    try:
        time.sleep(args.warm_up)
        cpu = CpuMeter({str(pid): pid for pid in pids})
        start = time.time()
        time.sleep(args.seconds)
        used, end = sum(cpu.lap().values()), time.time()
        if not all(client.is_alive() for client in clients):
            raise RuntimeError(f"a client of the victim exited early on {system}")
    finally:
        stop.set()
        for client in clients:
            client.join(30)
            if client.is_alive():
                client.kill()
    sent = [row for row in _rows(acks) if start <= row[0] < end]
    produce = sorted(row[1] for row in sent)
    delivered = sorted(row[1] for row in _rows(e2e) if start <= row[0] < end)
    return Result(
        system,
        used,
        sum(1 for row in _rows(acks) if start <= row[2] < end) / (end - start),
        max(0, round(args.rate * (end - start)) - len(sent)),
        _percentile(produce, 0.5),
        _percentile(produce, 0.99),
        _percentile(delivered, 0.5),
        _percentile(delivered, 0.99),
    )


def _rows(path: Path) -> list[list[float]]:
    if not path.exists():
        return []
    return [[float(field) for field in line.split()] for line in path.read_text().splitlines()]


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, REPLICAS)])[name].result(60)


def run_system(system: str, root: Path, args: argparse.Namespace) -> Result:
    with ExitStack() as stack:
        if system == "kafka":
            kafka = stack.enter_context(ApacheKafka(root / "kafka"))
            _create_topic(kafka.bootstrap, TOPIC)
            config = {"bootstrap.servers": kafka.bootstrap}
            return measure(system, config, kafka.pids(), root, args)
        env = {"SHOAL_DEFAULT_REPLICATION_FACTOR": str(REPLICAS)}
        cluster = stack.enter_context(LocalCluster(root / system, brokers=3, env=env))
        assert cluster.etcd is not None
        pids = [cluster.pid(i) for i in range(3)] + [cluster.etcd.pid]
        if system == "shoal":
            _create_topic(cluster.bootstrap, TOPIC)
            config = {"bootstrap.servers": cluster.bootstrap}
            return measure(system, config, pids, root, args)
        key_id, secret = create_tenant(cluster.etcd_url, TENANT)
        _create_topic(cluster.bootstrap, f"{TENANT}.{TOPIC}")
        gateway = stack.enter_context(
            GatewayProcess(root / system, cluster.etcd_url, cluster.bootstrap, 3)
        )
        config = {
            "bootstrap.servers": gateway.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": key_id,
            "sasl.password": secret,
        }
        return measure(system, config, [*pids, gateway.pid], root, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=450.0, help="records/s")
    parser.add_argument("--warm-up", type=float, default=30.0, help="seconds left out")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--no-consumer", dest="consumer", action="store_false", help="the producer alone"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")))
    keep = args.keep
    try:
        limits = measure_limits(root)
        results = []
        for system in systems:
            (root / system).mkdir()
            results.append(run_system(system, root, args))
            print(f"{system}: {asdict(results[-1])}", flush=True)
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"kept {root} (each system's logs and the victim's samples)")
        else:
            shutil.rmtree(root, ignore_errors=True)
    cores = limits.get("cpus") or os.cpu_count() or 1
    clients = "its producer and consumer" if args.consumer else "its producer alone"
    print(
        f"\nthe victim, {clients}: {args.rate:g} records/s of {VICTIM_RECORD} B, acks=all,"
        f" linger.ms=0, {PARTITIONS} partitions x {REPLICAS} replicas;"
        f" {args.seconds:g} s after {args.warm_up:g} s\n"
    )
    print(
        f"{'system':<10}{'server cores':>13}{'of machine':>11}{'acked/s':>9}{'unacked':>9}"
        f"{'produce p50':>12}{'p99':>9}{'e2e p50':>9}{'p99':>9}  (ms)"
    )
    for r in results:
        print(
            f"{r.system:<10}{r.server_cores:>13.2f}{r.server_cores / cores:>11.2f}"
            f"{r.acked_per_s:>9.0f}{r.unacknowledged:>9}{r.produce_p50_ms:>12.1f}"
            f"{r.produce_p99_ms:>9.1f}{r.e2e_p50_ms:>9.1f}{r.e2e_p99_ms:>9.1f}"
        )
    print(f"\nmachine limits ({cores:g} cores):", json.dumps(limits))
    document = {"settings": vars(args), "limits": limits, "results": [asdict(r) for r in results]}
    write_results("victim_cost", document)


if __name__ == "__main__":
    main()
