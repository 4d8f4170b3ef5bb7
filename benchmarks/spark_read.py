"""A batch read of a 1 GiB topic into Spark, against confluent-kafka alone reading it.

    python -m shoal.benchmarks.spark_read [--size-mib M] [--runs R] [--partitions P]
                                          [--min-partitions N] [--profile] [--keep]

Starts etcd and three brokers (replication factor 3) in a temporary directory
on the disk the limits are measured on, a tenant ``bench`` with one API key,
and ``shoal gateway`` in front of the brokers (as ``gateway.py`` does); writes
the key's ``client.properties``; creates a topic of P (6) partitions and
fills it through the gateway with M (1024) MiB of 1 KiB records (values of
1024 bytes, no key; round robin over the partitions; ``acks=all``). Then,
R (3) rounds, each in a rotated order so that the machine's drift favours no
reader, read the whole topic, through the gateway with the tenant's key:

* **confluent-kafka**: one plain ``Consumer`` in this process, assigned to all
  partitions from their earliest offset, reading until every partition's end
  offset, adding up ``len(key) + len(value)`` of each record. Timed from the
  consumer's creation to the last record;
* **spark**: ``spark.read.format("shoal").options(**client_options(...))
  .option("subscribe", topic).load()``, then the action ``selectExpr("count(*)",
  "coalesce(sum(length(value)), 0) + coalesce(sum(length(key)), 0)").collect()``,
  which makes every task read and materialize all its rows in the JVM and
  sends only one row to the driver; ``local[2]``, one task per partition.
  Timed from the action's start to its end: the session's start and
  ``load()`` are not in it, the driver's planning (listing offsets) is;
* **spark minPartitions**: the same with ``minPartitions`` N (2 P), so twice
  as many tasks, each with its own consumer, read half a partition each;
* **spark kafka source**: the same action on Spark's own Kafka source,
  ``spark.read.format("kafka")`` (spark-sql-kafka-0-10, Java's Kafka client
  in the executors), with the same key given as ``kafka.sasl.jaas.config``,
  ``startingOffsets`` earliest and ``endingOffsets`` latest: the reader a
  Spark user would otherwise run. ``make spark-kafka`` fetches its jars
  (pinned in tools/spark-kafka/pom.xml at PySpark's version) into
  ``~/.cache/shoal``; the session gets them with ``spark.jars``.

Before the rounds, one small Spark read (the first 1000 offsets of each
partition) starts Spark's Python workers and warms the JVM; it is not
counted. Every read checks it got every record and byte.

Medians over the rounds are printed as MB/s (key and value bytes, 10^6) and
records/s, with each reader's ratio to confluent-kafka and to Spark's own
Kafka source, beside ``loopback_MBps``
from ``../shared/tools/limits`` run in the same invocation, and with the CPU
share of one core each part used during the read: the gateway, the brokers
(summed), this process (the confluent-kafka reader, or Spark's idle driver
client), Spark's JVM and Spark's Python workers; their total against
``cpus`` says whether the two cores were the bound. The JSON lands in
``benchmarks/results/``.

``--profile`` adds one more Spark read with ``py-spy record --subprocesses
--native`` attached to the daemon that forks Spark's Python workers; it
writes the collapsed stacks beside the JSON and prints the functions that
held the most samples.

Every process started is stopped, and the temporary directory removed, also
on Ctrl-C, SIGTERM or failure (after a failure, its ``*.log`` files are kept
and their path printed); ``--keep`` keeps all of it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.common import (
    HERE,
    GatewayProcess,
    LocalCluster,
    cpu_seconds,
    create_tenant,
    measure_limits,
)
from shoal.connector import client_options

RECORD_SIZE = 1024
BROKERS = 3
REPLICATION_FACTOR = 3
TENANT = "bench"
SPARK_MASTER = "local[2]"
WARM_UP_OFFSETS = 1000
"""Offsets of each partition the untimed warm-up read takes."""
READ_TIMEOUT_S = 600.0
PROFILE_RATE = 100
"""py-spy samples per second."""
PROFILE_TOP = 25
WORKER = b"pyspark.worker"
"""The module of the Python workers that run Spark's tasks (the reads)."""
CK_POLL_TIMEOUT_S = 0.1
"""consume() returns when it has its 10000 messages or after this long, even past the
end of the partitions: a longer timeout only adds time after the last record."""

CK = "confluent-kafka"
SPARK = "spark"
SPARK_SPLIT = "spark minPartitions"
SPARK_KAFKA = "spark kafka source"
READERS = (CK, SPARK, SPARK_SPLIT, SPARK_KAFKA)
REPO = HERE.parent
SPARK_KAFKA_POM = REPO / "tools" / "spark-kafka" / "pom.xml"


@dataclass
class Run:
    reader: str
    round: int
    tasks: int
    """Spark tasks (offset ranges) of the read; 1 for confluent-kafka (one consumer)."""
    seconds: float
    records: int
    bytes: int
    mb_per_s: float
    records_per_s: float
    cpu: dict[str, float] = field(default_factory=dict)
    """Share of one core each part used during the read."""


# --- CPU time of processes and process trees, from /proc ------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants, living or reaped.

    A descendant that exited between two samples moves its time into its
    parent's reaped-children time, so differences of two samples stay right.
    """
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        fields = _stat_fields(current)
        if fields:
            # utime, stime, and the same of the children it has reaped
            total += sum(int(f) for f in fields[11:15])
        todo.extend(children.get(current, ()))
    return total / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """Shares of one core that each named part used between ``start`` and ``stop``."""

    def __init__(self, parts: dict[str, Callable[[], float]]) -> None:
        self.parts = parts
        self._t0 = 0.0
        self._before: dict[str, float] = {}

    def start(self) -> None:
        self._t0, self._before = time.perf_counter(), {n: f() for n, f in self.parts.items()}

    def stop(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self._t0
        shares = {n: (f() - self._before[n]) / elapsed for n, f in self.parts.items()}
        shares["total"] = sum(shares.values())
        return shares


# --- The topic ------------------------------------------------------------------------


def write_client_properties(path: Path, bootstrap: str, key_id: str, secret: str) -> dict[str, str]:
    """The tenant key's client.properties, as Shoal hands it out; returns its settings."""
    settings = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": key_id,
        "sasl.password": secret,
    }
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    path.chmod(0o600)
    return settings


def fill(client: dict[str, str], topic: str, partitions: int, records: int) -> float:
    """Produce ``records`` 1 KiB values round robin over the partitions; seconds taken."""
    producer = Producer(
        {
            **client,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 512 * 1024,
        }
    )
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err.str())

    value = os.urandom(RECORD_SIZE)
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(300)
    elapsed = time.perf_counter() - started
    producer.close()
    if failures or remaining:
        raise RuntimeError(f"fill: {len(failures)} failed, {remaining} undelivered: {failures[:3]}")
    return elapsed


def end_offsets(client: dict[str, str], topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({**client, "group.id": f"bench-{uuid.uuid4().hex[:6]}"})
    try:
        return {
            p: int(consumer.get_watermark_offsets(KafkaTopicPartition(topic, p), timeout=30)[1])
            for p in range(partitions)
        }
    finally:
        consumer.close()


# --- The readers ----------------------------------------------------------------------


def read_with_confluent_kafka(
    client: dict[str, str], topic: str, ends: dict[int, int]
) -> tuple[float, int, int]:
    """(seconds, records, key and value bytes) of one consumer reading every partition."""
    started = time.perf_counter()
    consumer = Consumer(
        {**client, "group.id": f"bench-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False}
    )
    consumer.assign(
        [KafkaTopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end > 0]
    )
    left = {p for p, end in ends.items() if end > 0}
    records = size = 0
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while left:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{CK}: partitions {sorted(left)} not read in {READ_TIMEOUT_S} s"
                )
            for message in consumer.consume(10_000, CK_POLL_TIMEOUT_S):
                if message.error() is not None:
                    raise RuntimeError(f"{CK}: {message.error()}")
                key = message.key()
                records += 1
                size += len(message.value()) + (len(key) if key is not None else 0)
                if message.offset() + 1 >= ends[message.partition()]:
                    left.discard(message.partition())
        return time.perf_counter() - started, records, size
    finally:
        consumer.close()


def spark_kafka_jars() -> list[Path]:
    """spark-sql-kafka-0-10 and what it needs beyond pyspark/jars, from `make spark-kafka`.

    The jars must come from the installed PySpark's release: Spark's
    connectors use its internal APIs.
    """
    import pyspark

    match = re.search(
        r"<spark\.version>\s*([^<\s]+)\s*</spark\.version>", SPARK_KAFKA_POM.read_text()
    )
    if match is None or match.group(1) != pyspark.__version__:
        raise RuntimeError(
            f"{SPARK_KAFKA_POM} pins spark-sql-kafka-0-10 {match and match.group(1)},"
            f" PySpark is {pyspark.__version__}: they must be the same release"
        )
    home = Path.home() / ".cache" / "shoal" / f"spark-kafka-{match.group(1)}"
    subprocess.run(["make", "-s", "spark-kafka", f"SPARK_KAFKA_HOME={home}"], cwd=REPO, check=True)
    return sorted((home / "jars").glob("*.jar"))


def start_spark(root: Path) -> Any:
    # Spark's Python workers must run this interpreter, which has shoal installed.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from shoal.connector import ShoalDataSource

    jars = ",".join(str(jar) for jar in spark_kafka_jars())
    session = (
        SparkSession.builder.master(SPARK_MASTER)
        .appName("shoal-bench-spark-read")
        .config("spark.jars", jars)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(root / "spark-local"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={root / 'spark-local'}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(ShoalDataSource)
    return session


def jvm_pid(session: Any) -> int:
    """Spark's JVM: the child PySpark started (spark-submit execs java in place)."""
    return int(session.sparkContext._gateway.proc.pid)


@contextmanager
def spark_session(root: Path) -> Iterator[Any]:
    """A local Spark session, stopped (its JVM killed if need be) however the block ends."""
    (root / "spark-local").mkdir(exist_ok=True)
    session = start_spark(root)
    proc = session.sparkContext._gateway.proc
    try:
        yield session
    finally:
        try:
            session.stop()
        except Exception as error:
            print(f"note: stopping Spark failed ({error!r}); killing its JVM", file=sys.stderr)
        try:
            proc.stdin.close()  # PySpark's JVM exits when this pipe closes.
            proc.wait(30)
        except (OSError, subprocess.TimeoutExpired, AttributeError):
            proc.kill()
            proc.wait(10)


def read_with_spark(
    session: Any,
    options: dict[str, str],
    topic: str,
    min_partitions: int | None = None,
    ending: dict[int, int] | None = None,
) -> tuple[float, int, int]:
    """(seconds of the action, records, key and value bytes) of one Spark batch read."""
    reader = session.read.format("shoal").options(**options).option("subscribe", topic)
    if min_partitions is not None:
        reader = reader.option("minPartitions", str(min_partitions))
    if ending is not None:
        offsets = {topic: {str(p): o for p, o in ending.items()}}
        reader = reader.option("endingOffsets", json.dumps(offsets))
    df = reader.load()
    started = time.perf_counter()
    row = df.selectExpr(
        "count(*) AS records",
        "coalesce(sum(length(value)), 0) + coalesce(sum(length(key)), 0) AS bytes",
    ).collect()[0]
    return time.perf_counter() - started, int(row["records"]), int(row["bytes"])


def kafka_source_options(client: dict[str, str]) -> dict[str, str]:
    """The tenant's key as Spark's Kafka source takes client settings (a ``kafka.`` prefix)."""
    return {
        "kafka.bootstrap.servers": client["bootstrap.servers"],
        "kafka.security.protocol": client["security.protocol"],
        "kafka.sasl.mechanism": client["sasl.mechanism"],
        "kafka.sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{client["sasl.username"]}" password="{client["sasl.password"]}";'
        ),
    }


def read_with_spark_kafka(
    session: Any, client: dict[str, str], topic: str, ending: dict[int, int] | None = None
) -> tuple[float, int, int]:
    """(seconds of the action, records, key and value bytes) of Spark's own Kafka source."""
    last = (
        "latest" if ending is None else json.dumps({topic: {str(p): o for p, o in ending.items()}})
    )
    df = (
        session.read.format("kafka")
        .options(**kafka_source_options(client))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", last)
        .load()
    )
    started = time.perf_counter()
    row = df.selectExpr(
        "count(*) AS records",
        "coalesce(sum(length(value)), 0) + coalesce(sum(length(key)), 0) AS bytes",
    ).collect()[0]
    return time.perf_counter() - started, int(row["records"]), int(row["bytes"])


# --- The profile ----------------------------------------------------------------------


def python_daemon_pid(session: Any) -> int:
    """The ``pyspark.daemon`` that forks the workers running tasks (``pyspark.worker``).

    Spark has other daemons beside it, for the driver's planning
    (``pyspark.sql.worker.*``: looking up and creating the data source,
    planning the read's partitions).
    """
    parent = jvm_pid(session)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            fields = _stat_fields(int(entry.name))
        except OSError:
            continue
        if fields and int(fields[1]) == parent and cmdline[-3:-1] == [b"pyspark.daemon", WORKER]:
            return int(entry.name)
    raise RuntimeError(f"no pyspark.daemon {WORKER.decode()} under Spark's JVM; no read yet?")


def profile_spark_read(
    session: Any, options: dict[str, str], topic: str, records: int, out: Path
) -> dict[str, Any]:
    """One more Spark read under ``py-spy record --native``; the most sampled functions."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("note: py-spy not found (.venv/bin/pip install py-spy); no profile", file=sys.stderr)
        return {}
    daemon = python_daemon_pid(session)
    command = [
        py_spy, "record", "--pid", str(daemon), "--subprocesses", "--native",
        "--format", "raw", "--nolineno", "--rate", str(PROFILE_RATE), "--output", str(out),
    ]  # fmt: skip
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)  # py-spy attaches before the read starts
        seconds, got, _ = read_with_spark(session, options, topic)
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            _, err = spy.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait(10)
            raise
    if got != records or not out.exists():
        raise RuntimeError(f"profiled read: {got} of {records} records; py-spy: {err.decode()}")
    return summarize_profile(out, seconds, leave_out=daemon)


def _is_python(frame: str) -> bool:
    """A Python function's frame: ``name (file.py)``; native ones name a library or address."""
    return frame.endswith((".py)", ">)"))


def summarize_profile(path: Path, seconds: float, leave_out: int) -> dict[str, Any]:
    """Samples per function, from py-spy's collapsed stacks of the workers.

    Samples of process ``leave_out`` (the daemon, which only forks and waits)
    are left out.

    *python*: the innermost Python function of each sample, so the C code it
    calls (librdkafka, pyarrow, the garbage collector) counts as its own;
    *native*: the innermost frame, whatever it is; *total*: anywhere on the
    stack, leaving out frames on 90 % of the stacks or more (PySpark's worker
    loop, which every sample is under).
    """
    python: Counter[str] = Counter()
    native: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # With --subprocesses, a stack starts with its process's ancestry.
        processes = [f for f in stack.split(";") if f.startswith("process ")]
        frames = stack.split(";")[len(processes) :]
        if not frames or (processes and processes[-1].startswith(f"process {leave_out}:")):
            continue
        n = int(count)
        samples += n
        native[frames[-1]] += n
        python[next((f for f in reversed(frames) if _is_python(f)), frames[-1])] += n
        for frame in set(frames):
            total[frame] += n
    inner = Counter({f: n for f, n in total.items() if n < 0.9 * samples})
    return {
        "read_seconds": seconds,
        "samples": samples,
        "rate": PROFILE_RATE,
        "python": python.most_common(PROFILE_TOP),
        "native": native.most_common(PROFILE_TOP),
        "total": inner.most_common(PROFILE_TOP),
    }


def print_profile(profile: dict[str, Any], path: Path) -> None:
    samples = profile["samples"]
    busy = samples / profile["rate"] / profile["read_seconds"]
    print(
        f"\npy-spy --native on Spark's Python workers: {samples} samples at {profile['rate']}/s"
        f" over a {profile['read_seconds']:.1f} s read (on CPU: {busy:.2f} cores); {path}"
    )
    titles = {
        "python": "innermost Python function (with the C code it calls)",
        "native": "innermost frame",
        "total": "anywhere on the stack",
    }
    for key, title in titles.items():
        print(f"  {title}:")
        for frame, n in profile[key][:15]:
            print(f"    {n / samples:6.1%}  {frame}")


# --- The run --------------------------------------------------------------------------


def measure(
    reader: str,
    round_: int,
    read: Callable[[], tuple[float, int, int]],
    tasks: int,
    expected: tuple[int, int],
    cpu: CpuMeter,
) -> Run:
    cpu.start()
    seconds, records, size = read()
    shares = cpu.stop()
    if (records, size) != expected:
        raise RuntimeError(f"{reader}: read {records} records, {size} bytes; expected {expected}")
    return Run(reader, round_, tasks, seconds, records, size, size / 1e6 / seconds,
               records / seconds, shares)  # fmt: skip


def report(runs: list[Run], limits: dict[str, float], settings: dict[str, Any]) -> dict[str, Any]:
    readers = [r for r in READERS if any(run.reader == r for run in runs)]
    median: dict[str, dict[str, Any]] = {}
    for reader in readers:
        mine = [r for r in runs if r.reader == reader]
        median[reader] = {
            "tasks": mine[0].tasks,
            "seconds": statistics.median(r.seconds for r in mine),
            "mb_per_s": statistics.median(r.mb_per_s for r in mine),
            "records_per_s": statistics.median(r.records_per_s for r in mine),
            "cpu": {k: statistics.median(r.cpu[k] for r in mine) for k in mine[0].cpu},
        }
    loopback = limits.get("loopback_MBps")
    cpus = limits.get("cpus")
    base = median[CK]["mb_per_s"]
    source = median[SPARK_KAFKA]["mb_per_s"] if SPARK_KAFKA in median else None
    print(
        f"\nmedian of {settings['runs']} rounds; {settings['size_mib']} MiB topic of"
        f" {RECORD_SIZE} B records, {settings['partitions']} partitions, {BROKERS} brokers,"
        f" replication factor {REPLICATION_FACTOR}, read through the gateway"
        f" ({CK}: one consumer in one process; spark: {SPARK_MASTER})\n"
    )
    header = f"{'reader':<22}{'tasks':>6}{'s':>8}{'MB/s':>9}{'records/s':>12}{'/ck':>7}"
    header += f"{'/kafka src':>11}" if source else ""
    print(header + (f"{'/loopback':>11}" if loopback else ""))
    for reader in readers:
        m = median[reader]
        line = (
            f"{reader:<22}{m['tasks']:>6}{m['seconds']:>8.2f}{m['mb_per_s']:>9.1f}"
            f"{m['records_per_s']:>12,.0f}{m['mb_per_s'] / base:>7.2f}"
        )
        line += f"{m['mb_per_s'] / source:>11.2f}" if source else ""
        print(line + (f"{m['mb_per_s'] / loopback:>11.3f}" if loopback else ""))
    parts = list(median[readers[-1]]["cpu"])
    print(f"\nCPU, share of one core during the read{f' (cpus={cpus:g})' if cpus else ''}")
    print(f"{'reader':<22}" + "".join(f"{p:>15}" for p in parts))
    for reader in readers:
        shares = median[reader]["cpu"]
        print(f"{reader:<22}" + "".join(f"{shares.get(p, 0.0):>15.2f}" for p in parts))
    for reader in readers:
        each = ", ".join(f"{r.mb_per_s:.1f}" for r in runs if r.reader == reader)
        print(f"  MB/s of each {reader} run: {each}")
    if loopback:
        print(f"\nloopback_MBps={loopback:g}: one TCP stream, sendfile; a read crosses loopback")
        print("twice (broker -> gateway -> client), and the gateway decodes every fetch.")
    print("machine limits:", json.dumps(limits))
    return {
        "settings": settings,
        "median": median,
        "runs": [asdict(r) for r in runs],
        "limits": limits,
    }


def rounds(
    args: argparse.Namespace,
    session: Any,
    client: dict[str, str],
    options: dict[str, str],
    topic: str,
    expected: tuple[int, int],
    ends: dict[int, int],
    cpu: CpuMeter,
) -> list[Run]:
    reads: dict[str, tuple[int, Callable[[], tuple[float, int, int]]]] = {
        CK: (1, lambda: read_with_confluent_kafka(client, topic, ends)),
        SPARK: (args.partitions, lambda: read_with_spark(session, options, topic)),
    }
    if args.min_partitions > args.partitions:
        reads[SPARK_SPLIT] = (
            args.min_partitions,
            lambda: read_with_spark(session, options, topic, args.min_partitions),
        )
    # Spark's Kafka source plans one task per partition, as the shoal source does.
    reads[SPARK_KAFKA] = (args.partitions, lambda: read_with_spark_kafka(session, client, topic))
    order = list(reads)
    runs: list[Run] = []
    for round_ in range(args.runs):
        for reader in order[round_ % len(order) :] + order[: round_ % len(order)]:
            tasks, read = reads[reader]
            runs.append(measure(reader, round_, read, tasks, expected, cpu))
            print(
                f"round {round_} {reader}: {runs[-1].seconds:.2f} s,"
                f" {runs[-1].mb_per_s:.1f} MB/s, cpu {json.dumps(runs[-1].cpu)}",
                flush=True,
            )
    return runs


def benchmark(args: argparse.Namespace, root: Path, stamp: str) -> dict[str, Any]:
    limits = measure_limits(root)
    env = {"SHOAL_DEFAULT_REPLICATION_FACTOR": str(REPLICATION_FACTOR)}
    with LocalCluster(root, brokers=BROKERS, env=env) as cluster:
        key_id, secret = create_tenant(cluster.etcd_url, TENANT)
        with GatewayProcess(root, cluster.etcd_url, cluster.bootstrap, BROKERS) as gw:
            return read_through(args, root, stamp, cluster, gw, key_id, secret, limits)


def read_through(
    args: argparse.Namespace,
    root: Path,
    stamp: str,
    cluster: LocalCluster,
    gw: GatewayProcess,
    key_id: str,
    secret: str,
    limits: dict[str, float],
) -> dict[str, Any]:
    """Fill the topic through the gateway, read it every way, report."""
    properties = root / "client.properties"
    client = write_client_properties(properties, gw.bootstrap, key_id, secret)
    topic = f"read-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    broker_topic = f"{TENANT}.{topic}"
    admin.create_topics([NewTopic(broker_topic, args.partitions, REPLICATION_FACTOR)])[
        broker_topic
    ].result(30)
    records = args.size_mib * 2**20 // RECORD_SIZE
    fill_s = fill(client, topic, args.partitions, records)
    print(f"filled {topic}: {records} records in {fill_s:.1f} s", flush=True)
    ends = end_offsets(client, topic, args.partitions)
    if sum(ends.values()) != records:
        raise RuntimeError(f"end offsets {ends} do not add up to {records} records")
    expected = (records, records * RECORD_SIZE)
    options = client_options(properties)
    with spark_session(root) as session:
        spark_jvm = jvm_pid(session)
        cpu = CpuMeter(
            {
                "gateway": lambda: cpu_seconds(gw.pid),
                "brokers": lambda: sum(cpu_seconds(cluster.pid(n)) for n in range(BROKERS)),
                "this process": lambda: cpu_seconds(os.getpid()),
                "spark jvm": lambda: cpu_seconds(spark_jvm),
                "spark python": lambda: tree_cpu(spark_jvm) - cpu_seconds(spark_jvm),
            }
        )
        warm_up = {p: min(end, WARM_UP_OFFSETS) for p, end in ends.items()}
        seconds, _, _ = read_with_spark(session, options, topic, ending=warm_up)
        print(f"warm-up read ({sum(warm_up.values())} records): {seconds:.2f} s", flush=True)
        # Spark's Kafka source loads its classes and Java's Kafka client on first use.
        seconds, _, _ = read_with_spark_kafka(session, client, topic, ending=warm_up)
        print(f"warm-up read of Spark's Kafka source: {seconds:.2f} s", flush=True)
        runs = rounds(args, session, client, options, topic, expected, ends, cpu)
        profile: dict[str, Any] = {}
        profile_path = HERE / "results" / f"spark_read-{stamp}-pyspy.txt"
        if args.profile:
            profile_path.parent.mkdir(exist_ok=True)
            profile = profile_spark_read(session, options, topic, records, profile_path)
    settings = {
        "size_mib": args.size_mib,
        "record_bytes": RECORD_SIZE,
        "records": records,
        "partitions": args.partitions,
        "min_partitions": args.min_partitions,
        "brokers": BROKERS,
        "replication_factor": REPLICATION_FACTOR,
        "runs": args.runs,
        "spark_master": SPARK_MASTER,
        "spark_action": "selectExpr(count(*), coalesce(sum(length(value)), 0)"
        " + coalesce(sum(length(key)), 0)).collect()",
        "fill_seconds": fill_s,
    }
    result = report(runs, limits, settings)
    if profile:
        print_profile(profile, profile_path)
        result["profile"] = {**profile, "collapsed_stacks": profile_path.name}
    return result


def clean(root: Path, keep_logs: bool) -> None:
    """Remove the temporary directory; with ``keep_logs``, all but its ``*.log`` files."""
    if not keep_logs:
        shutil.rmtree(root, ignore_errors=True)
        return
    for entry in root.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.suffix != ".log":
            entry.unlink(missing_ok=True)
    print(f"kept the logs in {root} (gateway.log, broker-N.log, etcd.log)", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="topic size (1 KiB records)")
    parser.add_argument("--runs", type=int, default=3, help="rounds (each reads with every reader)")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--min-partitions", type=int, help="Spark's minPartitions for the split read (2 x P)"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy on one more Spark read")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    if args.min_partitions is None:
        args.min_partitions = 2 * args.partitions
    # SIGTERM (and SIGHUP) unwind like Ctrl-C, so every process is stopped and
    # the data removed.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda num, _frame: sys.exit(128 + num))
    started = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")))
    failed = False
    try:
        result = benchmark(args, root, stamp)
    except Exception:
        failed = True
        raise
    finally:
        # Interrupted (Ctrl-C, SIGTERM), nothing is kept; failed, the logs are.
        if args.keep:
            print(f"kept {root} (logs, data)", file=sys.stderr)
        else:
            clean(root, keep_logs=failed)
    result["settings"]["benchmark_seconds"] = time.monotonic() - started
    out = HERE / "results" / f"spark_read-{stamp}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"benchmark took {time.monotonic() - started:.0f} s; wrote {out}")


if __name__ == "__main__":
    main()
