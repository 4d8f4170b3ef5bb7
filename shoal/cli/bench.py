"""``shoal bench``: throughput and latency of any Kafka-compatible cluster, for people.

``produce``, ``consume`` and ``e2e`` take kafka-producer-perf-test's and
kafka-consumer-perf-test's flags (``--topic``, ``--num-records``,
``--record-size``, ``--throughput`` with -1 for no limit, ``--producer-props``)
and the client settings of every other Kafka command here (``--bootstrap``,
``--config-file``, ``-X``), so one command line measures Shoal and a Kafka
side by side. The load itself is :mod:`shoal.cli.loadgen`; this module only
parses flags and shows what it reports.

Output: on a terminal, a live progress line (records, current rate, MB/s,
elapsed) and a summary table at the end; otherwise only the summary, as one
line shaped like kafka-producer-perf-test's last one; with ``-o json``, the
result as one JSON object. MB is 10**6 bytes. Exit status: 0 when the run
did what was asked, 1 on an error or records lost, 130 after Ctrl-C (which
stops the run and prints what it measured so far).
"""

from __future__ import annotations

import json
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Annotated, Any, Final, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as ProgressBar
from rich.table import Table

from shoal.cli import loadgen
from shoal.cli.client import (
    BootstrapOption,
    ConfigFileOption,
    OutputOption,
    PropertyOption,
    client_config,
    parse_pairs,
)

bench_app = typer.Typer(
    help="Measure produce, consume and end-to-end performance of any Kafka-compatible cluster.",
    no_args_is_help=True,
)

INTERRUPTED_EXIT: Final = 130
"""Exit status after Ctrl-C, as a shell reports a command ended by SIGINT."""
RATE_WINDOW_S: Final = 2.0
"""The live display's current rate is over this many seconds."""

R = TypeVar("R", bound=loadgen.Throughput)
Work = Callable[[threading.Event, loadgen.ProgressCallback | None], R]

TopicOption = Annotated[str, typer.Option("--topic", "-t", help="Topic to use (must exist).")]
RecordSizeOption = Annotated[
    int, typer.Option("--record-size", min=1, help="Value size in bytes (random, incompressible).")
]
ProducerPropsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--producer-props",
        help="Producer property KEY=VALUE, over -X and the file (repeat the flag for each).",
    ),
]
ConsumerPropsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--consumer-props",
        help="Consumer property KEY=VALUE, over -X and the file (repeat the flag for each).",
    ),
]
TimeoutOption = Annotated[
    float,
    typer.Option("--timeout", min=0.1, help="Stop after this many seconds without a record."),
]


def _rate(throughput: float) -> float | None:
    """kafka-producer-perf-test's --throughput: negative is no limit; 0 would never send."""
    if throughput == 0:
        raise typer.BadParameter("--throughput must be positive, or -1 for no limit")
    return None if throughput < 0 else throughput


@bench_app.command("produce")
def produce(
    topic: TopicOption,
    num_records: Annotated[
        int, typer.Option("--num-records", "-n", min=1, help="Records to produce.")
    ],
    record_size: RecordSizeOption = 1024,
    throughput: Annotated[
        float, typer.Option("--throughput", help="Records per second; -1 for no limit.")
    ] = -1,
    warmup_records: Annotated[
        int,
        typer.Option(
            "--warmup-records",
            min=0,
            help="Records produced first by the same client and left out of the figures.",
        ),
    ] = 0,
    producer_props: ProducerPropsOption = None,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Produce records as fast as allowed; acknowledgement latency percentiles."""
    config = client_config(bootstrap, config_file, properties)
    config.update(parse_pairs(producer_props, "--producer-props"))
    rate = _rate(throughput)
    result = _run(
        f"produce {topic}",
        lambda stop, progress: loadgen.produce(
            config,
            topic,
            num_records,
            record_size,
            rate,
            progress,
            stop,
            warmup_records=warmup_records,
        ),
    )
    params = {
        "topic": topic,
        "record_size": record_size,
        "throughput": rate,
        "warmup_records": warmup_records,
    }
    _report("produce", params, result, [("produce", result, result.latency)], output == "json")
    _print_delivery_errors(result)
    _exit(result.interrupted, failed=result.failed > 0)


@bench_app.command("consume")
def consume(
    topic: TopicOption,
    num_records: Annotated[
        int | None,
        typer.Option(
            "--num-records",
            "--messages",
            "-n",
            min=1,
            help="Records to read (default: until the end of every partition).",
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option("--group", "-g", help="Read as a member of this group (default: no group)."),
    ] = None,
    timeout: TimeoutOption = loadgen.IDLE_TIMEOUT_S,
    consumer_props: ConsumerPropsOption = None,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Read a topic from the beginning (or the group's offsets) as fast as it comes."""
    config = client_config(bootstrap, config_file, properties)
    config.update(parse_pairs(consumer_props, "--consumer-props"))
    result = _run(
        f"consume {topic}",
        lambda stop, progress: loadgen.consume(
            config, topic, num_records, group, progress, stop, timeout
        ),
    )
    params = {"topic": topic, "group": group, "target": num_records}
    _report("consume", params, result, [("consume", result, None)], output == "json")
    short = num_records is not None and result.records < num_records
    if result.timed_out and not result.interrupted:
        typer.echo(
            f"error: nothing arrived for {timeout:g} s; stopped after {result.records} records"
            + (f" of {num_records}" if num_records is not None else ""),
            err=True,
        )
    _exit(result.interrupted, failed=short or result.timed_out)


@bench_app.command("e2e")
def end_to_end(
    topic: TopicOption,
    num_records: Annotated[
        int, typer.Option("--num-records", "-n", min=1, help="Records to send and read back.")
    ],
    record_size: Annotated[
        int,
        typer.Option(
            "--record-size",
            min=loadgen.STAMP_SIZE,
            help="Value size in bytes; the first 16 carry the send time.",
        ),
    ] = 1024,
    throughput: Annotated[
        float,
        typer.Option(
            "--throughput",
            help="Records per second; -1 for no limit (latency then measures the queues).",
        ),
    ] = 1000,
    producer_props: ProducerPropsOption = None,
    consumer_props: ConsumerPropsOption = None,
    timeout: TimeoutOption = loadgen.IDLE_TIMEOUT_S,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Produce at a fixed rate and read back in the same process: end-to-end latency."""
    config = client_config(bootstrap, config_file, properties)
    producer_config = parse_pairs(producer_props, "--producer-props")
    consumer_config = parse_pairs(consumer_props, "--consumer-props")
    rate = _rate(throughput)
    result = _run(
        f"e2e {topic}",
        lambda stop, progress: loadgen.end_to_end(
            config,
            topic,
            num_records,
            record_size,
            rate,
            progress,
            stop,
            producer_config,
            consumer_config,
            timeout,
        ),
    )
    rows: list[Row] = [("end to end", result, result.latency)]
    if result.produce is not None:
        rows.append(("produce ack", result.produce, result.produce.latency))
    params = {"topic": topic, "record_size": record_size, "throughput": rate}
    _report("e2e", params, result, rows, output == "json")
    if result.produce is not None:
        _print_delivery_errors(result.produce)
    short = result.records < num_records
    if short and not result.interrupted:
        typer.echo(
            f"error: {result.records} of {num_records} records came back"
            f" ({result.missing} acknowledged but not seen)",
            err=True,
        )
    _exit(result.interrupted, failed=short)


# -- running --------------------------------------------------------------------------------


def _run(label: str, work: Work[R]) -> R:
    """Run ``work`` with Ctrl-C as its stop event, and a live display on a terminal."""
    console = Console()
    stop = threading.Event()
    with _stop_on_ctrl_c(stop):
        try:
            if not console.is_terminal:
                return work(stop, None)
            with _LiveDisplay(console, label) as display:
                return work(stop, display.update)
        except loadgen.LoadError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc


@contextmanager
def _stop_on_ctrl_c(stop: threading.Event) -> Iterator[None]:
    """The first Ctrl-C sets ``stop`` (the run ends and reports); a second one aborts."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _LiveDisplay:
    """One progress line: records done of total, current rate and MB/s, elapsed time.

    The current rate is over the last :data:`RATE_WINDOW_S` seconds of the
    engine's progress reports, so it shows stalls and bursts that a
    whole-run average would hide. The line disappears when the run ends.
    """

    def __init__(self, console: Console, label: str) -> None:
        self.bar = ProgressBar(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TextColumn("{task.fields[rates]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task(label, total=None, counts="", rates="")
        self.window: deque[loadgen.Progress] = deque()

    def __enter__(self) -> _LiveDisplay:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def update(self, progress: loadgen.Progress) -> None:
        self.window.append(progress)
        while len(self.window) > 2 and progress.seconds - self.window[1].seconds >= RATE_WINDOW_S:
            self.window.popleft()
        oldest = self.window[0]
        span = progress.seconds - oldest.seconds
        records_per_s = (progress.records - oldest.records) / span if span > 0 else 0.0
        mb_per_s = (progress.bytes - oldest.bytes) / 1e6 / span if span > 0 else 0.0
        of = f"/{progress.total:,}" if progress.total is not None else ""
        self.bar.update(
            self.task,
            completed=progress.records,
            total=progress.total,
            counts=f"{progress.records:,}{of} records",
            rates=f"{records_per_s:,.0f} rec/s  {mb_per_s:,.2f} MB/s",
        )


# -- reporting ------------------------------------------------------------------------------


Row = tuple[str, loadgen.Throughput, loadgen.Latencies | None]


def _report(
    workload: str,
    params: dict[str, Any],
    result: loadgen.Throughput,
    rows: list[Row],
    json_output: bool,
) -> None:
    """The result: JSON, a table on a terminal, or kafka-perf-test-like lines."""
    console = Console()
    if json_output:
        typer.echo(json.dumps({"workload": workload, **params, **result.as_dict()}, indent=2))
    elif console.is_terminal:
        console.print(_table(rows))
    else:
        for name, throughput, latency in rows:
            typer.echo(summary_line(name, throughput, latency))
    if getattr(result, "interrupted", False):
        typer.echo("interrupted: the figures are for the part that ran", err=True)


def summary_line(name: str, result: loadgen.Throughput, latency: loadgen.Latencies | None) -> str:
    """kafka-producer-perf-test's last line, with MB = 10**6 and fractional milliseconds."""
    verb = "sent" if name == "produce" else "received"
    line = (
        f"{name}: {result.records} records {verb}, {result.records_per_s:.1f} records/sec"
        f" ({result.mb_per_s:.2f} MB/sec), {result.seconds:.2f} s"
    )
    if latency is not None:
        line += (
            f", {latency.avg_ms:.2f} ms avg latency, {latency.max_ms:.2f} ms max latency,"
            f" {latency.p50_ms:.2f} ms 50th, {latency.p95_ms:.2f} ms 95th,"
            f" {latency.p99_ms:.2f} ms 99th, {latency.p99_9_ms:.2f} ms 99.9th"
        )
    return line + "."


def _table(rows: list[Row]) -> Table:
    table = Table("")
    with_latency = any(latency is not None for _, _, latency in rows)
    columns = ["records", "seconds", "records/s", "MB/s"]
    if with_latency:
        columns += ["avg ms", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms", "max ms"]
    for column in columns:
        table.add_column(column, justify="right")
    for name, result, latency in rows:
        cells = [
            name,
            f"{result.records:,}",
            f"{result.seconds:.2f}",
            f"{result.records_per_s:,.0f}",
            f"{result.mb_per_s:,.2f}",
        ]
        if with_latency:
            figures = (
                (latency.avg_ms, latency.p50_ms, latency.p95_ms, latency.p99_ms,
                 latency.p99_9_ms, latency.max_ms)
                if latency is not None else ()
            )  # fmt: skip
            cells += [f"{value:.2f}" for value in figures] or ["-"] * 6
        table.add_row(*cells)
    return table


def _print_delivery_errors(result: loadgen.ProduceResult) -> None:
    for message, count in result.errors.items():
        typer.echo(f"error: {count} records not delivered: {message}", err=True)


def _exit(interrupted: bool, failed: bool) -> None:
    if interrupted:
        raise typer.Exit(INTERRUPTED_EXIT)
    if failed:
        raise typer.Exit(1)
