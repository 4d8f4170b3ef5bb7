"""What fetch sessions (KIP-227) save a consumer of many partitions, through the gateway.

    python -m shoal.benchmarks.fetch_sessions [--partitions P] [--active A] [--rate RPS]
                                              [--seconds S] [--runs R] [--keep]

Starts etcd, one broker and a gateway in a temporary directory, a tenant
``bench`` and its topic of P (1000) partitions. A producer of its own (a
process, straight to the broker, ``linger.ms=0``) writes RPS (200) records of
100 bytes a second round-robin to A (10) of the partitions, and one
kafka-python consumer, assigned every partition at its end, reads them through
the gateway for S (20) seconds: once with fetch sessions (kafka-python's
default, as Kafka's Java client) and once without (every fetch lists every
partition, as librdkafka's do), alternating over R (3) rounds. The figures
are the shares of a core the gateway, the broker and the consumer's process
used, and the fetches a second the gateway served (its own Prometheus
counter), all over the same window after a warm-up; the medians are printed
with the session/full ratio and the machine's cores from
``../shared/tools/limits``. Most partitions are quiet, as in a consumer of a
wide topic: with a session a fetch names only what changed and its answer
only what has something new; without one both list all P. The JSON lands in
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from shoal.benchmarks.common import (
    CpuMeter,
    GatewayProcess,
    LocalCluster,
    create_tenant,
    measure_limits,
    write_results,
)

HERE = Path(__file__).resolve().parent
TENANT = "bench"
TOPIC = "wide"
RECORD = b"x" * 100
MODES = ("session", "full")
WARM_UP_S = 5.0
"""Left out of each run: assignment, the first full fetches, the session's opening."""


@dataclass
class Run:
    mode: str
    round: int
    records_per_s: float
    fetches_per_s: float
    """Fetch requests the gateway served."""
    gateway_cores: float
    broker_cores: float
    """Includes the producer's requests, the same in both modes."""
    consumer_cores: float


def trickle(bootstrap: str, topic: str, active: int, rate: float, stop: Any) -> None:
    """Produce ``rate`` records a second round-robin over the first ``active`` partitions."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    sent, due = 0, time.monotonic()
    while not stop.is_set():
        if time.monotonic() >= due:
            producer.produce(topic, RECORD, partition=sent % active)
            sent += 1
            due += 1 / rate
        producer.poll(max(0.0, due - time.monotonic()))
    producer.flush(10)


def one_run(
    mode: str,
    round_: int,
    consumer_config: dict[str, Any],
    cpu: CpuMeter,
    metrics_url: str,
    args: argparse.Namespace,
) -> Run:
    consumer = KafkaConsumer(**consumer_config, enable_incremental_fetch_sessions=mode == "session")
    try:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(args.partitions)])
        consumer.seek_to_end()
        warm_until = time.monotonic() + WARM_UP_S
        while time.monotonic() < warm_until:
            consumer.poll(timeout_ms=200)
        fetches_before = _gateway_fetches(metrics_url)
        cpu.lap()
        started, read = time.monotonic(), 0
        while time.monotonic() < started + args.seconds:
            read += sum(len(batch) for batch in consumer.poll(timeout_ms=200).values())
        elapsed = time.monotonic() - started
        shares = cpu.lap()
        fetches = _gateway_fetches(metrics_url) - fetches_before
    finally:
        consumer.close()
    return Run(
        mode,
        round_,
        read / elapsed,
        fetches / elapsed,
        shares["gateway"],
        shares["broker"],
        shares["consumer"],
    )


def _gateway_fetches(metrics_url: str) -> float:
    """The Fetch requests the gateway has served so far, by its own counter."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "shoal_gateway_kafka_requests"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("api") == "Fetch"
    )


def _create_topic(bootstrap: str, name: str, partitions: int) -> None:
    # Its own scope: the admin client's threads would count as the consumer's CPU.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(60)


def report(runs: list[Run], limits: dict[str, float], settings: dict[str, Any]) -> dict[str, Any]:
    fields = [k for k, v in asdict(runs[0]).items() if isinstance(v, float)]
    median = {
        mode: {k: statistics.median(getattr(r, k) for r in runs if r.mode == mode) for k in fields}
        for mode in MODES
    }
    cores = limits.get("cpus") or os.cpu_count() or 1
    print(
        f"\nmedian of {settings['runs']} rounds; {settings['partitions']} partitions,"
        f" {settings['rate']:g} records/s to {settings['active']} of them, one broker,"
        f" kafka-python through the gateway\n"
    )
    print(f"{'figure':<22}{'session':>10}{'full':>10}{'session/full':>14}{'of the machine':>16}")
    for key in fields:
        session, full = median["session"][key], median["full"][key]
        ratio = f"{session / full:.2f}" if full > 0.005 else ""
        share = f"{session / cores:.3f} / {full / cores:.3f}" if key.endswith("cores") else ""
        print(f"{key:<22}{session:>10.3f}{full:>10.3f}{ratio:>14}{share:>16}")
    for key in ("gateway_cores", "broker_cores"):
        for mode in MODES:
            each = ", ".join(f"{getattr(r, key):.3f}" for r in runs if r.mode == mode)
            print(f"  {key} of each {mode} run: {each}")
    print(f"\nmachine limits ({cores:g} cores):", json.dumps(limits))
    return {
        "settings": settings,
        "median": median,
        "runs": [asdict(r) for r in runs],
        "limits": limits,
    }


def all_rounds(
    cluster: LocalCluster,
    gateway: GatewayProcess,
    consumer_config: dict[str, Any],
    args: argparse.Namespace,
) -> list[Run]:
    """Every round, both modes each, beside the producer's trickle."""
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    producer = spawn.Process(
        target=trickle,
        args=(cluster.bootstrap, f"{TENANT}.{TOPIC}", args.active, args.rate, stop),
    )
    producer.start()
    metrics_url = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
    cpu = CpuMeter({"gateway": gateway.pid, "broker": cluster.pid(0), "consumer": os.getpid()})
    runs = []
    try:
        for round_ in range(args.runs):
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                runs.append(one_run(mode, round_, consumer_config, cpu, metrics_url, args))
                print(f"round {round_} {mode}: {asdict(runs[-1])}", flush=True)
        if not producer.is_alive():
            raise RuntimeError(f"the producer exited ({producer.exitcode})")
    finally:
        stop.set()
        producer.join(30)
        if producer.is_alive():
            producer.kill()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--active", type=int, default=10, help="partitions written to")
    parser.add_argument("--rate", type=float, default=200.0, help="records/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured per run")
    parser.add_argument("--runs", type=int, default=3, help="rounds (each measures both modes)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")))
    keep = args.keep
    runs: list[Run] = []
    try:
        limits = measure_limits(root)
        with LocalCluster(root, brokers=1) as cluster:
            key_id, secret = create_tenant(cluster.etcd_url, TENANT)
            broker_topic = f"{TENANT}.{TOPIC}"
            _create_topic(cluster.bootstrap, broker_topic, args.partitions)
            with GatewayProcess(
                root, cluster.etcd_url, cluster.bootstrap, 1, metrics=True
            ) as gateway:
                consumer_config = {
                    "bootstrap_servers": gateway.bootstrap,
                    "security_protocol": "SASL_PLAINTEXT",
                    "sasl_mechanism": "PLAIN",
                    "sasl_plain_username": key_id,
                    "sasl_plain_password": secret,
                }
                runs = all_rounds(cluster, gateway, consumer_config, args)
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"kept {root} (gateway.log, broker-0.log, etcd.log, data)")
        else:
            shutil.rmtree(root, ignore_errors=True)
    settings = {
        "partitions": args.partitions,
        "active": args.active,
        "rate": args.rate,
        "seconds": args.seconds,
        "runs": args.runs,
    }
    result = report(runs, limits, settings)
    write_results("fetch_sessions", result)


if __name__ == "__main__":
    main()
