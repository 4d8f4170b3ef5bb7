"""The Spark jobs of spark-operator-jobs/ run with spark-submit against a real
`shoal dev`: the hourly roll-up aggregates exactly one hour of records and
replaces only that hour's partition; the topic copy holds every record once,
and a second run adds exactly what was produced in between.
"""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from harness import SHORT_LIVED_SPARK_JVM, free_port_block, wait_until
from test_dev import alive, child_pids, start_dev

from shoal.cli.client import read_properties

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "spark-operator-jobs" / "jobs"
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"
TOPIC = "events"
HOUR_FORMAT = "%Y-%m-%dT%H"
# A whole past hour, far enough back that "after the hour" is in the past too.
HOUR = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class Shoal:
    """A running `shoal dev` and what was produced to its topic."""

    properties: Path
    log: Path
    # (partition, offset) -> the record stored there.
    produced: dict[tuple[int, int], Record] = field(default_factory=dict)

    def produce(self, records: list[Record]) -> None:
        producer = Producer({**read_properties(self.properties), "acks": "all"})
        failures: list[str] = []

        def delivered(error: Any, message: Any, record: Record) -> None:
            if error is not None:
                failures.append(str(error))
            else:
                self.produced[(message.partition(), message.offset())] = record

        for record in records:
            producer.produce(
                TOPIC,
                key=record.key,
                value=record.value,
                timestamp=record.timestamp_ms,
                headers=list(record.headers),
                on_delivery=lambda e, m, r=record: delivered(e, m, r),
            )
        assert producer.flush(60) == 0, "every record delivered"
        assert failures == []


def millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def load_job(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, JOBS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT, as Ctrl-C would, then SIGKILL for it and any child it left."""
    children = child_pids(process.pid)
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for pid in children:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def spark_submit(job: str, *args: str, log: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYTHONSAFEPATH", None)
    argv = [
        str(SPARK_SUBMIT), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
        "--conf", f"spark.sql.warehouse.dir={log.parent / 'spark-warehouse'}",
        "--driver-java-options", SHORT_LIVED_SPARK_JVM,
        str(JOBS / job), *args,
    ]  # fmt: skip
    with open(log, "ab") as output:
        output.write(f"\n$ {' '.join(argv)}\n".encode())
        output.flush()
        # Its own session, so a timeout takes the JVM's Python workers down with it.
        # Started in the checkout root, as README's commands are: the workers put
        # that folder first on sys.path, and must still get the installed
        # shoal.connector and the standard library's `operator`.
        process = subprocess.Popen(
            argv, stdout=output, stderr=output, env=env, cwd=ROOT, start_new_session=True
        )
        try:
            returncode = process.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    assert returncode == 0, f"{job} failed:\n{log.read_text(errors='replace')[-8000:]}"


@pytest.fixture(scope="module")
def shoal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shoal]:
    root = tmp_path_factory.mktemp("spark-jobs")
    data_dir = root / "shoal"
    ports = [free_port_block(n) for n in (4, 3, 2, 1, 4)]  # gateway, brokers, etcd, HTTP, metrics
    dev = start_dev(data_dir, *ports)
    try:
        properties = data_dir / "client.properties"
        wait_until(lambda: properties.exists() or dev.poll() is not None, 90, "shoal dev")
        assert dev.poll() is None, (root / "dev-output.log").read_text(errors="replace")
        subprocess.run(
            [sys.executable, "-m", "shoal", "topic", "create", TOPIC,
             "--partitions", "3", "-F", str(properties)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        cluster = Shoal(properties, root / "spark.log")
        cluster.produce(records_around(HOUR))
        yield cluster
    finally:
        stop(dev)


def records_around(hour: datetime) -> list[Record]:
    start = millis(hour)
    minute = 60_000
    keys = [b"alpha", b"beta", b"gamma", None]
    inside = [
        Record(
            keys[i % len(keys)],
            # Lengths 0-6, and some tombstones, so byte sums are not just counts.
            None if i % 9 == 4 else b"x" * (i % 7),
            start + i * 50_000,
            (("n", str(i).encode()),) if i % 5 == 0 else (),
        )
        for i in range(72)
    ]
    before = [Record(b"alpha", b"early", start - 30 * minute), Record(b"beta", b"", start - 1)]
    after = [
        Record(b"alpha", b"later", start + 60 * minute),
        Record(b"gamma", b"v", start + 70 * minute),
    ]
    # Produced after the hour's own records, so its offset lies inside the range
    # the timestamps select, while its timestamp lies outside.
    late = [Record(b"beta", b"straggler", start - 120 * minute)]
    return before + inside + late + after


def expected_rollup(records: list[Record], hour: datetime) -> dict[bytes | None, tuple[int, ...]]:
    start, end = millis(hour), millis(hour + timedelta(hours=1))
    groups: dict[bytes | None, list[Record]] = defaultdict(list)
    for record in records:
        if start <= record.timestamp_ms < end:
            groups[record.key].append(record)
    return {
        key: (
            len(group),
            sum(len(r.value or b"") for r in group),
            min(r.timestamp_ms for r in group),
            max(r.timestamp_ms for r in group),
        )
        for key, group in groups.items()
    }


def as_millis(column: pa.ChunkedArray) -> list[int]:
    # Spark may write INT96 (read back as naive nanoseconds) or UTC microseconds.
    values: list[int] = column.cast(pa.timestamp("ms", column.type.tz)).cast(pa.int64()).to_pylist()
    return values


def test_rollup_defaults_to_the_last_complete_utc_hour() -> None:
    rollup = load_job("hourly_rollup")
    # 20:34 in India is 15:04 UTC: the hour to roll up is 14:00-15:00 UTC.
    india = datetime(2026, 11, 22, 20, 34, 59, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    assert rollup.last_complete_hour(india) == datetime(2026, 11, 22, 14, tzinfo=UTC)
    before = rollup.last_complete_hour(datetime.now(UTC))
    default = rollup.parse_args(["--topic", "t", "--output", "o"]).hour
    assert default in (before, rollup.last_complete_hour(datetime.now(UTC)))


def test_hourly_rollup_aggregates_one_hour_and_replaces_only_its_partition(
    shoal: Shoal, tmp_path: Path
) -> None:
    output = tmp_path / "rollup"
    hour = HOUR.strftime(HOUR_FORMAT)
    stale = output / f"hour={hour}" / "stale.parquet"
    other = output / "hour=2000-01-01T00" / "kept.parquet"
    for path in (stale, other):
        path.parent.mkdir(parents=True)
        pq.write_table(pa.table({"key": [b"old"], "records": [1]}), path)

    spark_submit(
        "hourly_rollup.py", "--topic", TOPIC, "--output", str(output), "--hour", hour,
        "--client-properties", str(shoal.properties), log=shoal.log,
    )  # fmt: skip

    assert not stale.exists(), "the hour's partition is replaced"
    assert other.exists(), "other hours are left alone"
    table = pq.read_table(output / f"hour={hour}")
    rows = zip(
        table.column("key").to_pylist(),
        table.column("records").to_pylist(),
        table.column("value_bytes").to_pylist(),
        as_millis(table.column("first_timestamp")),
        as_millis(table.column("last_timestamp")),
        strict=True,
    )
    got = {key: tuple(values) for key, *values in rows}
    assert len(got) == table.num_rows, "one row per key"
    assert got == expected_rollup(list(shoal.produced.values()), HOUR)


def copied(output: Path) -> dict[tuple[int, int], dict[str, Any]]:
    table = ds.dataset(output, format="parquet", partitioning="hive").to_table()
    stamps = as_millis(table.column("timestamp"))
    rows = [
        {**row, "timestamp": stamp}
        for row, stamp in zip(table.drop_columns(["timestamp"]).to_pylist(), stamps, strict=True)
    ]
    positions = [(row["partition"], row["offset"]) for row in rows]
    assert len(set(positions)) == len(positions), "no record twice"
    return dict(zip(positions, rows, strict=True))


def test_topic_to_parquet_copies_every_record_once_and_resumes(
    shoal: Shoal, tmp_path: Path
) -> None:
    output, checkpoint = tmp_path / "copy", tmp_path / "checkpoint"
    args = [
        "--topic", TOPIC, "--output", str(output), "--checkpoint", str(checkpoint),
        # Several micro-batches per run.
        "--max-offsets-per-trigger", "40", "--include-headers",
        "--client-properties", str(shoal.properties),
    ]  # fmt: skip

    spark_submit("topic_to_parquet.py", *args, log=shoal.log)
    first = copied(output)
    assert first.keys() == shoal.produced.keys()
    batches = [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    assert len(batches) >= math.ceil(len(first) / 40), "maxOffsetsPerTrigger holds"

    now = millis(datetime.now(UTC))
    shoal.produce([Record(b"delta", b"new %d" % i, now + i) for i in range(9)])
    spark_submit("topic_to_parquet.py", *args, log=shoal.log)
    second = copied(output)
    assert second.keys() == shoal.produced.keys()
    assert {k: second[k] for k in first} == first, "the first run's rows are untouched"

    for position, row in second.items():
        record = shoal.produced[position]
        assert (row["key"], row["value"], row["topic"]) == (record.key, record.value, TOPIC)
        assert row["timestamp"] == record.timestamp_ms
        day = datetime.fromtimestamp(record.timestamp_ms / 1000, UTC).date()
        assert str(row["date"]) == day.isoformat()
        # spark-sql-kafka gives null, not an empty array, for a record without headers.
        assert [(h["key"], h["value"]) for h in row["headers"] or []] == list(record.headers)
