"""``shoal topic``: create, list, describe, alter and delete topics over the Kafka admin API."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)
from rich.console import Console
from rich.table import Table

from shoal.cli.admin import TIMEOUT_S, admin_client, cluster_metadata, list_offsets, wait
from shoal.cli.client import (
    BootstrapOption,
    ConfigFileOption,
    OutputOption,
    PropertyOption,
    fail,
    parse_pairs,
)

topic_app = typer.Typer(
    help="Create, list, describe, alter and delete topics.", no_args_is_help=True
)


def _print(output: str, data: Any, table: Table | None) -> None:
    if output == "json":
        typer.echo(json.dumps(data, indent=2))
    elif table is not None:
        Console().print(table)


@topic_app.command("create")
def create(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", "-p", help="Partition count.")] = -1,
    replication_factor: Annotated[
        int, typer.Option("--replication-factor", "-r", help="Replicas per partition.")
    ] = -1,
    config: Annotated[
        list[str] | None, typer.Option("--config", "-c", help="Topic config KEY=VALUE.")
    ] = None,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Create a topic (the broker's defaults fill in what is not given)."""
    admin = admin_client(bootstrap, config_file, properties)
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=parse_pairs(config, "--config"),
    )
    wait(admin.create_topics([topic], operation_timeout=TIMEOUT_S)[name])
    described = _describe(admin, name)
    if output == "json":
        _print(output, described, None)
    else:
        typer.echo(f"created topic {name} with {len(described['partitions'])} partitions")


@topic_app.command("list")
def list_topics(
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """List topics with their partition counts."""
    admin = admin_client(bootstrap, config_file, properties)
    metadata = cluster_metadata(admin)
    rows = [
        {"name": name, "partitions": len(t.partitions)}
        for name, t in sorted(metadata.topics.items())
    ]
    table = Table("topic", "partitions")
    for row in rows:
        table.add_row(row["name"], str(row["partitions"]))
    _print(output, rows, table)


def _describe(admin: AdminClient, name: str) -> dict[str, Any]:
    metadata = cluster_metadata(admin, name)
    topic = metadata.topics[name]
    if topic.error is not None:
        raise fail(KafkaException(topic.error))
    tps = [(name, p) for p in sorted(topic.partitions)]
    earliest = list_offsets(admin, tps, OffsetSpec.earliest())
    latest = list_offsets(admin, tps, OffsetSpec.latest())
    resource = ConfigResource("topic", name)
    configs = wait(admin.describe_configs([resource])[resource])
    return {
        "name": name,
        "topic_id": str(topic.topic_id) if getattr(topic, "topic_id", None) else None,
        "partitions": [
            {
                "partition": p,
                "leader": topic.partitions[p].leader,
                "replicas": list(topic.partitions[p].replicas),
                "isr": list(topic.partitions[p].isrs),
                "earliest_offset": earliest[(name, p)],
                "latest_offset": latest[(name, p)],
            }
            for p in sorted(topic.partitions)
        ],
        "configs": {
            entry.name: {"value": entry.value, "default": entry.is_default}
            for entry in configs.values()
        },
    }


@topic_app.command("describe")
def describe(
    name: str,
    all_configs: Annotated[
        bool, typer.Option("--all-configs", help="Show default configs too.")
    ] = False,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Partitions (leader, replicas, ISR, offsets) and configs of a topic."""
    described = _describe(admin_client(bootstrap, config_file, properties), name)
    if output == "json":
        _print(output, described, None)
        return
    console = Console()
    console.print(f"[bold]{name}[/bold]  id {described['topic_id']}")
    table = Table("partition", "leader", "replicas", "isr", "earliest", "latest")
    for p in described["partitions"]:
        table.add_row(
            str(p["partition"]),
            str(p["leader"]),
            ",".join(map(str, p["replicas"])),
            ",".join(map(str, p["isr"])),
            str(p["earliest_offset"]),
            str(p["latest_offset"]),
        )
    console.print(table)
    configs = Table("config", "value", "source")
    for key, entry in sorted(described["configs"].items()):
        if all_configs or not entry["default"]:
            configs.add_row(key, str(entry["value"]), "default" if entry["default"] else "topic")
    if configs.row_count:
        console.print(configs)


@topic_app.command("alter")
def alter(
    name: str,
    partitions: Annotated[
        int | None, typer.Option("--partitions", "-p", help="New, larger partition count.")
    ] = None,
    config: Annotated[
        list[str] | None, typer.Option("--config", "-c", help="Set a topic config KEY=VALUE.")
    ] = None,
    delete_config: Annotated[
        list[str] | None, typer.Option("--delete-config", help="Return a config to its default.")
    ] = None,
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Grow a topic's partitions and change its configs."""
    admin = admin_client(bootstrap, config_file, properties)
    if partitions is not None:
        futures = admin.create_partitions([NewPartitions(name, partitions)])
        wait(futures[name])
        typer.echo(f"{name} now has {partitions} partitions")
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
        for k, v in parse_pairs(config, "--config").items()
    ] + [
        ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE)
        for k in delete_config or []
    ]
    if entries:
        resource = ConfigResource("topic", name, incremental_configs=entries)
        wait(admin.incremental_alter_configs([resource])[resource])
        typer.echo(f"{name}: {len(entries)} config change(s) applied")


@topic_app.command("delete")
def delete(
    name: str,
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Delete a topic and all its records."""
    admin = admin_client(bootstrap, config_file, properties)
    wait(admin.delete_topics([name], operation_timeout=TIMEOUT_S)[name])
    typer.echo(f"deleted topic {name}")
