"""Kafka's own load generator as an independent check: ``ProducerPerformance``.

``org.apache.kafka.tools.ProducerPerformance`` (what ``bin/kafka-producer-perf-test.sh``
runs) is the tool Kafka users measure a cluster with. The suite runs it, from
the jars of :mod:`shoal.benchmarks.apache_kafka`, against the RF=3 targets of
Kafka and Shoal (directly, and through the gateway with SASL/PLAIN in its
``--command-config`` file, the newer name of ``--producer.config``): one run
per target, on a fresh one-partition topic created as the suite's other
topics (replication factor 3, ``min.insync.replicas=2``), with the suite's
record size (1 KiB), ``acks=all``, the idempotent producer (the Java client's
default with acks=all) and ``linger.ms=5`` (the Java client's default since
Kafka 4.0, and librdkafka's); everything else is the Java producer's default
(``batch.size`` 16 KiB, 5 requests in flight). The first ``warmup_records``
are left out of the figures (``--warmup-records``: the tool prints a
steady-state summary besides the whole run's).

Its latency, like the suite's flat-out produce latency, is from ``send()`` to
the acknowledgement, so it is mostly time queued in the producer (up to
``buffer.memory``, 32 MiB). Its ``MB/sec`` is MiB (2**20 bytes) per second;
``mb_per_s`` here is 10**6 bytes, as everywhere else in the suite.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal.benchmarks.apache_kafka import JVM_OPTS, TOOLS_LOG4J2, default_kafka_home
from shoal.benchmarks.suite.systems import Target, install_kafka
from shoal.benchmarks.suite.workloads import RECORD_SIZE, Sizes, create_topic

MAIN_CLASS = "org.apache.kafka.tools.ProducerPerformance"
TARGETS = ("shoal-gw-rf3", "shoal-rf3", "kafka-rf3")
"""The targets it runs against: Kafka and Shoal with the same durability (RF=3, acks=all),
and Shoal through its gateway."""
HEAP = ("-Xmx512m",)
"""What bin/kafka-producer-perf-test.sh sets (KAFKA_HEAP_OPTS), with kafka-run-class.sh's
JVM flags (:data:`~shoal.benchmarks.apache_kafka.JVM_OPTS`)."""
TIMEOUT_S = 600.0
SUMMARY = re.compile(
    r"(?P<records>\d+) (?P<steady>steady state )?records sent, "
    r"(?P<records_per_s>[\d.]+) records/sec \((?P<mib_per_s>[\d.]+) MB/sec\), "
    r"(?P<avg_ms>[\d.]+) ms avg latency, (?P<max_ms>[\d.]+) ms max latency, "
    r"(?P<p50_ms>\d+) ms 50th, (?P<p95_ms>\d+) ms 95th, (?P<p99_ms>\d+) ms 99th, "
    r"(?P<p99_9_ms>\d+) ms 99\.9th\."
)
"""ProducerPerformance's closing lines (the whole run's, then the steady state's)."""


def parse(output: str) -> dict[str, Any]:
    """The figures of the steady-state summary line (the whole run's if there is none),
    and the whole run's under ``all``."""
    found: dict[str, dict[str, Any]] = {}
    for line in output.splitlines():
        match = SUMMARY.search(line)
        if match is None:
            continue
        figures: dict[str, Any] = {
            key: float(number) for key, number in match.groupdict().items() if key != "steady"
        }
        figures["records"] = int(figures["records"])
        figures["mb_per_s"] = figures["mib_per_s"] * 2**20 / 1e6
        figures["summary"] = line.strip()
        found["steady" if match.group("steady") else "all"] = figures
    if not found:
        raise RuntimeError(f"no ProducerPerformance summary in its output:\n{output[-3000:]}")
    return {**found.get("steady", found["all"]), "all": found.get("all")}


def java_properties(target: Target) -> dict[str, str]:
    """The target's librdkafka settings (connection and producer) as the Java client's."""
    client = dict(target.connection["client"])
    producer = target.connection["producer"]
    settings = {"bootstrap.servers": client.pop("bootstrap.servers")}
    if "security.protocol" in client:
        settings["security.protocol"] = client.pop("security.protocol")
    if "sasl.mechanisms" in client:
        mechanism = client.pop("sasl.mechanisms")
        if mechanism != "PLAIN":
            raise ValueError(f"only SASL/PLAIN is mapped, not {mechanism}")
        username, password = client.pop("sasl.username"), client.pop("sasl.password")
        settings["sasl.mechanism"] = mechanism
        settings["sasl.jaas.config"] = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required"
            f' username="{username}" password="{password}";'
        )
    if client:
        raise ValueError(f"no Java name for {sorted(client)}")
    settings["acks"] = str(producer["acks"])
    if "enable.idempotence" in producer:
        settings["enable.idempotence"] = str(producer["enable.idempotence"]).lower()
    settings["linger.ms"] = "5"
    return settings


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise FileNotFoundError("no `java` on PATH: run `make java`")
    return java


def run(target: Target, sizes: Sizes, progress: Callable[[str], None]) -> dict[str, Any]:
    """One ProducerPerformance run against ``target`` (if it is one of :data:`TARGETS`)."""
    if target.name not in TARGETS:
        return {"skipped": "ProducerPerformance runs against the RF=3 targets only"}
    install_kafka()
    libs = default_kafka_home() / "libs"
    topic = create_topic(target, "producer-perf", 1)
    records = sizes.produce_records + sizes.warmup_records
    progress(f"Kafka's ProducerPerformance, {records:,} records")
    with tempfile.TemporaryDirectory(prefix="shoal-producer-perf-") as work:
        config = Path(work) / "producer.properties"
        # The file holds the gateway's secret: only this user reads it.
        config.touch(mode=0o600)
        config.write_text("".join(f"{k}={v}\n" for k, v in java_properties(target).items()))
        log4j = Path(work) / "tools-log4j2.properties"
        log4j.write_text(TOOLS_LOG4J2)
        argv = [
            _java(), *HEAP, *JVM_OPTS, f"-Dlog4j2.configurationFile={log4j}",
            "-cp", f"{libs}/*", MAIN_CLASS,
            "--topic", topic, "--num-records", str(records), "--record-size", str(RECORD_SIZE),
            "--throughput", "-1", "--warmup-records", str(sizes.warmup_records),
            "--command-config", str(config),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                argv, check=False, capture_output=True, text=True, timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"ProducerPerformance ran over {TIMEOUT_S:.0f} s") from None
    output = (done.stdout + done.stderr)[-3000:]
    if done.returncode != 0:
        raise RuntimeError(f"ProducerPerformance failed ({done.returncode}):\n{output}")
    figures = parse(done.stdout)
    # The tool counts only acknowledged records, and prints each failure's stack trace.
    acknowledged = figures["all"]["records"] if figures["all"] else 0
    if acknowledged != records:
        raise RuntimeError(
            f"ProducerPerformance: {acknowledged:,} of {records:,} records acknowledged:\n{output}"
        )
    return {
        **figures,
        "settings": {k: v for k, v in java_properties(target).items() if "sasl" not in k},
        "warmup_records": sizes.warmup_records,
    }
