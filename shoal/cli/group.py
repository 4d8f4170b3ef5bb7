"""``shoal group``: list consumer groups, describe them with lag, reset their offsets.

``reset-offsets`` follows kafka-consumer-groups: it shows the plan and changes
nothing unless ``--execute`` is given, and the group must have no active
members (the broker refuses a commit for a live group, as Kafka does).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from rich.console import Console
from rich.table import Table

from shoal.cli.admin import admin_client, cluster_metadata, list_offsets, wait
from shoal.cli.client import (
    BootstrapOption,
    ConfigFileOption,
    OutputOption,
    PropertyOption,
)

group_app = typer.Typer(help="List, describe and reset consumer groups.", no_args_is_help=True)


def _state(value: Any) -> str:
    return str(value).rsplit(".", 1)[-1].lower()


@group_app.command("list")
def list_groups(
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Every consumer group with its state."""
    admin = admin_client(bootstrap, config_file, properties)
    listed = wait(admin.list_consumer_groups())
    rows = sorted(
        ({"group": g.group_id, "state": _state(g.state)} for g in listed.valid),
        key=lambda row: row["group"],
    )
    if output == "json":
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("group", "state")
    for row in rows:
        table.add_row(row["group"], row["state"])
    Console().print(table)


def _lag(admin: AdminClient, group: str) -> list[dict[str, Any]]:
    request = ConsumerGroupTopicPartitions(group)
    committed = wait(admin.list_consumer_group_offsets([request])[group]).topic_partitions
    if not committed:
        return []
    ends = list_offsets(admin, [(tp.topic, tp.partition) for tp in committed], OffsetSpec.latest())
    rows = []
    for tp in sorted(committed, key=lambda t: (t.topic, t.partition)):
        end = ends[(tp.topic, tp.partition)]
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "committed": tp.offset if tp.offset >= 0 else None,
                "end": end,
                "lag": end - tp.offset if tp.offset >= 0 else None,
            }
        )
    return rows


@group_app.command("describe")
def describe(
    group: str,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Members, assignments, and lag per partition (log end minus committed offset)."""
    admin = admin_client(bootstrap, config_file, properties)
    described = wait(admin.describe_consumer_groups([group])[group])
    members = [
        {
            "member": m.member_id,
            "instance": m.group_instance_id,
            "client": m.client_id,
            "host": m.host,
            "partitions": sorted(
                f"{tp.topic}-{tp.partition}" for tp in (m.assignment.topic_partitions or [])
            ),
        }
        for m in described.members
    ]
    lag = _lag(admin, group)
    data = {
        "group": group,
        "state": _state(described.state),
        "assignor": described.partition_assignor,
        "members": members,
        "offsets": lag,
    }
    if output == "json":
        typer.echo(json.dumps(data, indent=2))
        return
    console = Console()
    console.print(f"[bold]{group}[/bold]  {data['state']}  assignor {data['assignor'] or '-'}")
    if members:
        table = Table("member", "client", "host", "partitions")
        for m in members:
            table.add_row(m["member"], m["client"], m["host"], ", ".join(m["partitions"]))
        console.print(table)
    offsets = Table("topic", "partition", "committed", "end", "lag")
    for row in lag:
        offsets.add_row(
            row["topic"],
            str(row["partition"]),
            "-" if row["committed"] is None else str(row["committed"]),
            str(row["end"]),
            "-" if row["lag"] is None else str(row["lag"]),
        )
    console.print(offsets)


@group_app.command("reset-offsets")
def reset_offsets(
    group: str,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic whose offsets to reset.")],
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset")] = None,
    to_datetime: Annotated[
        datetime | None, typer.Option("--to-datetime", help="First records at or after this time.")
    ] = None,
    shift_by: Annotated[
        int | None, typer.Option("--shift-by", help="Move committed offsets by N.")
    ] = None,
    execute: Annotated[
        bool, typer.Option("--execute", help="Apply; without it, only show.")
    ] = False,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Plan, and with --execute commit, new offsets for a group's partitions of a topic."""
    chosen = [
        to_earliest,
        to_latest,
        to_offset is not None,
        to_datetime is not None,
        shift_by is not None,
    ]
    if sum(chosen) != 1:
        raise typer.BadParameter(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, --shift-by"
        )
    admin = admin_client(bootstrap, config_file, properties)
    metadata = cluster_metadata(admin, topic).topics.get(topic)
    if metadata is None or metadata.error is not None:
        typer.echo(f"error: unknown topic {topic}", err=True)
        raise typer.Exit(1)
    partitions = [(topic, p) for p in sorted(metadata.partitions)]

    def offsets_for(spec: OffsetSpec) -> dict[int, int]:
        return {p: o for (_, p), o in list_offsets(admin, partitions, spec).items()}

    earliest = offsets_for(OffsetSpec.earliest())
    latest = offsets_for(OffsetSpec.latest())
    if to_earliest:
        plan = earliest
    elif to_latest:
        plan = latest
    elif to_offset is not None:
        plan = {p: to_offset for p in earliest}
    elif to_datetime is not None:
        found = offsets_for(OffsetSpec.for_timestamp(int(to_datetime.timestamp() * 1000)))
        plan = {p: latest[p] if o < 0 else o for p, o in found.items()}
    else:
        current: dict[int, int] = {
            row["partition"]: row["committed"]
            for row in _lag(admin, group)
            if row["topic"] == topic and row["committed"] is not None
        }
        plan = {p: current.get(p, earliest[p]) + (shift_by or 0) for p in earliest}
    plan = {p: min(max(o, earliest[p]), latest[p]) for p, o in plan.items()}
    rows: list[dict[str, Any]] = [
        {"topic": topic, "partition": p, "new_offset": o} for p, o in sorted(plan.items())
    ]
    if execute:
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(topic, p, o) for p, o in sorted(plan.items())]
        )
        wait(admin.alter_consumer_group_offsets([request])[group])
    if output == "json":
        typer.echo(json.dumps({"executed": execute, "offsets": rows}, indent=2))
        return
    table = Table("topic", "partition", "new offset")
    for row in rows:
        table.add_row(row["topic"], str(row["partition"]), str(row["new_offset"]))
    Console().print(table)
    typer.echo("offsets committed" if execute else "dry run: add --execute to apply", err=True)
