"""The gateway's cost: throughput and latency through it against straight to the brokers.

    python -m shoal.benchmarks.gateway [--records N] [--runs R] [--rate RPS]
                                       [--latency-seconds S] [--brokers B] [--keep]

Starts etcd and B (1) brokers in a temporary directory on the disk the limits
are measured on, a tenant ``bench`` with one API key in etcd, and a ``shoal
gateway`` in front of the brokers (SASL_PLAINTEXT; its own process, as in
production). The same load then runs both ways, in one run: *direct*, with
no authentication, to the brokers' topic ``bench.<name>``; and *gateway*,
with the tenant's key, to the tenant's topic ``<name>``, which is the same
topic on the brokers. Each of R (3) rounds, in alternating order so that the
machine's drift does not favour one route, measures on each route:

* **produce MB/s**: one confluent-kafka producer, N (1000000) records of 1 KiB
  flat out, ``acks=all``, ``linger.ms=5``, into a fresh one-partition topic;
* **consume MB/s**: one confluent-kafka consumer reading those N records back,
  timed from the first record (the consumer's start-up is not throughput);
* **latency**: ``acks=all``, ``linger.ms=0``, at a steady RPS (1000) records
  per second for S (5) seconds, from ``produce()`` to the delivery report;
  the first half second (connections, metadata) is left out. Unlike the
  flat-out latency of the other benchmarks, this is no time in queues: it is
  the round trip, so the gateway's hop shows in full.

Medians over the rounds are printed beside each other with their ratio
(gateway / direct), and beside the machine limits from ``../shared/tools/limits``
run in the same invocation. The CPU share of one core that the gateway, the
broker and this process (the client and librdkafka's threads) used in each
phase says where the time went: the gateway is one Python process that
decodes, checks and re-encodes every request, so near 1.0 it, not the
broker, sets the pace; well below, the extra hop's latency does, since one
client keeps only so many requests in flight. The JSON lands in
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.common import (
    CpuMeter,
    GatewayProcess,
    LocalCluster,
    create_tenant,
    measure_limits,
    produce_flat_out,
    write_results,
)

RECORD_SIZE = 1024
TENANT = "bench"
ROUTES = ("direct", "gateway")
LATENCY_WARM_UP_S = 0.5


@dataclass
class Route:
    """One way to the brokers: how its clients connect, and what a tenant topic is called there."""

    name: str
    config: dict[str, Any]
    prefix: str
    """Put before a tenant topic's name: ``bench.`` directly, nothing via the gateway."""

    def topic(self, name: str) -> str:
        return self.prefix + name


@dataclass
class Run:
    route: str
    round: int
    produce_seconds: float
    produce_mb_per_s: float
    consume_mb_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    gateway_cpu_produce: float
    """Share of one core the gateway used while producing (about 0 on the direct route)."""
    gateway_cpu_consume: float
    broker_cpu_produce: float
    """Share of one core broker 0 used while producing."""
    broker_cpu_consume: float
    client_cpu_produce: float
    """Share of one core this process (the client and librdkafka's threads) used while producing."""
    client_cpu_consume: float


def produce(route: Route, topic: str, records: int) -> float:
    producer = Producer(
        {
            **route.config,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 512 * 1024,
        }
    )
    seconds, _ = produce_flat_out(producer, route.topic(topic), os.urandom(RECORD_SIZE), records)
    return seconds


def consume(route: Route, topic: str, records: int) -> float:
    """Seconds from the first record to the last: the consumer's start-up is not throughput."""
    consumer = Consumer(
        {
            **route.config,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52428800,
            "max.partition.fetch.bytes": 10485760,
        }
    )
    consumer.assign([TopicPartition(route.topic(topic), 0, OFFSET_BEGINNING)])
    got = 0
    started = 0.0
    deadline = time.monotonic() + 120
    while got < records:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{route.name}: read {got} of {records} records in 120 s")
        for message in consumer.consume(10000, 1.0):
            if message.error() is None:
                if not got:
                    started = time.perf_counter()
                got += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def steady_latencies(route: Route, topic: str, rate: float, seconds: float) -> list[float]:
    """Seconds from produce() to the delivery report of each record, at ``rate`` records/s."""
    producer = Producer({**route.config, "acks": "all", "linger.ms": 0})
    value = os.urandom(RECORD_SIZE)
    latencies: list[float] = []
    failures: list[str] = []
    started = time.perf_counter()

    def delivered(err: KafkaError | None, sent: float) -> None:
        if err is not None:
            failures.append(err.str())
        elif sent - started >= LATENCY_WARM_UP_S:
            latencies.append(time.perf_counter() - sent)

    next_at = started
    while next_at - started < seconds:
        sent = time.perf_counter()
        producer.produce(route.topic(topic), value, on_delivery=_with(delivered, sent))
        next_at += 1 / rate
        # poll() returns early whenever it serves a delivery report.
        while (wait := next_at - time.perf_counter()) > 0:
            producer.poll(wait)
    remaining = producer.flush(60)
    if failures or remaining:
        raise RuntimeError(f"{route.name}: {len(failures)} failed, {remaining} undelivered")
    return latencies


def _with(
    delivered: Callable[[KafkaError | None, float], None], sent: float
) -> Callable[[KafkaError | None, Any], None]:
    return lambda err, _msg: delivered(err, sent)


def one_run(
    route: Route, round_: int, admin: AdminClient, args: argparse.Namespace, cpu: CpuMeter
) -> Run:
    topic = f"{route.name}-{uuid.uuid4().hex[:8]}"
    broker_topic = f"{TENANT}.{topic}"
    admin.create_topics([NewTopic(broker_topic, 1, args.brokers)])[broker_topic].result(30)
    cpu.lap()
    produce_s = produce(route, topic, args.records)
    producing = cpu.lap()
    consume_s = consume(route, topic, args.records)
    consuming = cpu.lap()
    quantiles = statistics.quantiles(
        steady_latencies(route, topic, args.rate, args.latency_seconds), n=100
    )
    megabytes = args.records * RECORD_SIZE / 1e6
    return Run(
        route=route.name,
        round=round_,
        produce_seconds=produce_s,
        produce_mb_per_s=megabytes / produce_s,
        consume_mb_per_s=megabytes / consume_s,
        latency_p50_ms=quantiles[49] * 1000,
        latency_p99_ms=quantiles[98] * 1000,
        gateway_cpu_produce=producing["gateway"],
        gateway_cpu_consume=consuming["gateway"],
        broker_cpu_produce=producing["broker"],
        broker_cpu_consume=consuming["broker"],
        client_cpu_produce=producing["client"],
        client_cpu_consume=consuming["client"],
    )


def report(runs: list[Run], limits: dict[str, float], settings: dict[str, Any]) -> dict[str, Any]:
    fields = [k for k, v in asdict(runs[0]).items() if isinstance(v, float)]
    median = {
        route: {
            k: statistics.median(getattr(r, k) for r in runs if r.route == route) for k in fields
        }
        for route in ROUTES
    }
    rows: list[tuple[str, str, str | None]] = [
        ("produce MB/s", "produce_mb_per_s", "pagecache_write_MBps"),
        ("produce MB/s (vs disk)", "produce_mb_per_s", "disk_write_MBps"),
        ("consume MB/s", "consume_mb_per_s", "loopback_MBps"),
        (f"latency p50 ms, {settings['rate']:g}/s", "latency_p50_ms", None),
        (f"latency p99 ms, {settings['rate']:g}/s", "latency_p99_ms", None),
        ("gateway CPU, producing", "gateway_cpu_produce", None),
        ("gateway CPU, consuming", "gateway_cpu_consume", None),
        ("broker CPU, producing", "broker_cpu_produce", None),
        ("broker CPU, consuming", "broker_cpu_consume", None),
        ("client CPU, producing", "client_cpu_produce", None),
        ("client CPU, consuming", "client_cpu_consume", None),
    ]
    rounds = len(runs) // len(ROUTES)
    print(
        f"\nmedian of {rounds} rounds; {settings['records']} x {RECORD_SIZE} B records,"
        f" acks=all, one partition, {settings['brokers']} broker(s)\n"
    )
    print(
        f"{'figure':<26}{'direct':>9}{'gateway':>9}{'gw/direct':>10}  {'ceiling':<22}"
        f"{'ceiling value':>14}{'direct/ceil':>12}{'gw/ceil':>9}"
    )
    for name, key, ceiling in rows:
        direct, gateway = median["direct"][key], median["gateway"][key]
        ratio = f"{gateway / direct:.2f}" if direct > 0.05 else ""
        limit = limits.get(ceiling or "")
        of_limit = f"{direct / limit:>12.2f}{gateway / limit:>9.2f}" if limit else ""
        print(
            f"{name:<26}{direct:>9.2f}{gateway:>9.2f}{ratio:>10}  {ceiling if limit else '':<22}"
            f"{limit or '':>14}{of_limit}"
        )
    each_run = (
        ("produce MB/s", "produce_mb_per_s"),
        ("consume MB/s", "consume_mb_per_s"),
        ("latency p99 ms", "latency_p99_ms"),
    )
    for label, key in each_run:
        for route in ROUTES:
            each = ", ".join(f"{getattr(r, key):.1f}" for r in runs if r.route == route)
            print(f"  {label} of each {route} run: {each}")
    print("\nmachine limits:", json.dumps(limits))
    return {
        "settings": settings,
        "median": median,
        "runs": [asdict(r) for r in runs],
        "limits": limits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="per throughput run")
    parser.add_argument("--runs", type=int, default=3, help="rounds (each measures both routes)")
    parser.add_argument("--rate", type=float, default=1000, help="records/s for latency")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")))
    keep = args.keep
    runs: list[Run] = []
    try:
        limits = measure_limits(root)
        env = {"SHOAL_DEFAULT_REPLICATION_FACTOR": str(args.brokers)}
        with LocalCluster(root, brokers=args.brokers, env=env) as cluster:
            key_id, secret = create_tenant(cluster.etcd_url, TENANT)
            with GatewayProcess(root, cluster.etcd_url, cluster.bootstrap, args.brokers) as gw:
                routes = {
                    "direct": Route("direct", {"bootstrap.servers": cluster.bootstrap}, "bench."),
                    "gateway": Route(
                        "gateway",
                        {
                            "bootstrap.servers": gw.bootstrap,
                            "security.protocol": "SASL_PLAINTEXT",
                            "sasl.mechanism": "PLAIN",
                            "sasl.username": key_id,
                            "sasl.password": secret,
                        },
                        "",
                    ),
                }
                admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
                cpu = CpuMeter({"gateway": gw.pid, "broker": cluster.pid(0), "client": os.getpid()})
                for round_ in range(args.runs):
                    order = ROUTES if round_ % 2 == 0 else ROUTES[::-1]
                    for name in order:
                        runs.append(one_run(routes[name], round_, admin, args, cpu))
                        print(f"round {round_} {name}: {asdict(runs[-1])}", flush=True)
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"kept {root} (gateway.log, broker-N.log, etcd.log, data)")
        else:
            shutil.rmtree(root, ignore_errors=True)
    settings = {
        "records": args.records,
        "record_bytes": RECORD_SIZE,
        "runs": args.runs,
        "rate": args.rate,
        "latency_seconds": args.latency_seconds,
        "brokers": args.brokers,
    }
    result = report(runs, limits, settings)
    write_results("gateway", result)


if __name__ == "__main__":
    main()
