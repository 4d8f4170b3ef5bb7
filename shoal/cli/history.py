"""``shoal history``: record what Kafka clients see on a cluster, and check it.

``run`` drives idempotent producers and a consumer group against a topic for a
while (break the cluster meanwhile, as you like), takes a closing read of
the whole topic, writes the history as JSON lines and checks it. ``check``
checks a history again. Both exit 1 when the checker finds an anomaly. It
works against any Kafka-compatible cluster (Shoal's gateway with a tenant's
client.properties, its brokers, Apache Kafka), so a platform team can
rehearse its own failures with it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import KafkaException

from shoal.cli.client import (
    BootstrapOption,
    ConfigFileOption,
    PropertyOption,
    client_config,
    fail,
)
from shoal.history.checker import check
from shoal.history.events import Event, read_history, write_history
from shoal.history.workload import Run, Workload

history_app = typer.Typer(
    help="Record a history of producers and consumers on a topic, and check it.",
    no_args_is_help=True,
)

HistoryFile = Annotated[Path, typer.Option("--history", help="The history file (JSON lines).")]


def _report(events: list[Event], path: Path) -> None:
    report = check(events)
    typer.echo(report.summary())
    if not report.ok:
        typer.echo(f"history: {path}", err=True)
        raise typer.Exit(1)


@history_app.command("run")
def run(
    topic: Annotated[str, typer.Argument(help="An existing topic the run may fill.")],
    history: HistoryFile = Path("history.jsonl"),
    seconds: Annotated[float, typer.Option(help="How long the clients run.")] = 60.0,
    producers: Annotated[int, typer.Option(help="Idempotent acks=all producers.")] = 2,
    consumers: Annotated[int, typer.Option(help="Members of one consumer group.")] = 2,
    rate: Annotated[float, typer.Option(help="Records per second per producer.")] = 100.0,
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Run the clients, write the history, and check it."""
    settings = client_config(bootstrap, config_file, properties)
    workload = Workload(settings, topic, producers, consumers, rate)
    try:
        running = Run(workload).start()
        time.sleep(seconds)
        events = running.finish()
    except (KafkaException, RuntimeError, TimeoutError, OSError) as exc:
        raise fail(exc) from exc
    write_history(history, events)
    _report(events, history)


@history_app.command("check")
def check_command(history: HistoryFile = Path("history.jsonl")) -> None:
    """Check a history written by ``shoal history run`` (or by the fault tests)."""
    try:
        events = list(read_history(history))
    except (OSError, ValueError) as exc:
        raise fail(exc) from exc
    _report(events, history)
