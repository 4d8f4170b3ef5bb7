"""``shoal txn``: find hanging transactions and abort them, as ``kafka-transactions.sh``.

``list`` asks every broker's transaction coordinator for the transactional ids
it knows (ListTransactions), ``describe`` asks an id's coordinator for its
state, producer and partitions (DescribeTransactions), ``describe-producers``
asks a topic's partition leaders for their active producers and the first
offset of each one's open transaction (DescribeProducers). These go through
:mod:`shoal.cli.wire_admin`: confluent-kafka's AdminClient does not have them.

``abort`` differs from Kafka's: ``kafka-transactions.sh abort`` writes an abort
marker into one partition for a producer whose coordinator has lost track of
it. ``shoal txn abort`` does what a new instance of the producer does: it
initialises a transactional producer with the id (InitProducerId), so the
coordinator aborts the open transaction, writes its markers to every
partition in it, and bumps the producer epoch. The running instance, if
there is one, is fenced: its next request fails with PRODUCER_FENCED.

Every command works against the brokers and, with a tenant's
client.properties, through the gateway, where it sees only the tenant's ids
and topics.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Annotated, Any, Final

import typer
from confluent_kafka import KafkaException, Producer
from rich.console import Console
from rich.table import Table

from shoal.cli.admin import TIMEOUT_S
from shoal.cli.client import (
    BootstrapOption,
    ConfigFileOption,
    OutputOption,
    PropertyOption,
    client_config,
    fail,
)
from shoal.cli.wire_admin import WireAdmin, WireAdminError
from shoal.wire import ErrorCode, schema

txn_app = typer.Typer(
    help="List, describe and abort transactions; describe partitions' producers.",
    no_args_is_help=True,
)

DESCRIBE_PRODUCERS: Final = 61
DESCRIBE_TRANSACTIONS: Final = 65
LIST_TRANSACTIONS: Final = 66
_RETRIABLE: Final = frozenset({ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator})
_RETRY_PAUSE_S: Final = 0.5


def _admin(bootstrap: Any, config_file: Any, properties: Any) -> WireAdmin:
    try:
        return WireAdmin(client_config(bootstrap, config_file, properties))
    except WireAdminError as exc:
        raise fail(exc) from exc


def _print(output: str, data: Any, table: Table | None) -> None:
    if output == "json":
        typer.echo(json.dumps(data, indent=2))
    elif table is not None:
        Console().print(table)


def _time(value: datetime) -> str | None:
    """Kafka's -1 "not started" arrives as the epoch."""
    return None if value.timestamp() <= 0 else value.isoformat()


@txn_app.command("list")
def list_transactions(
    state: Annotated[
        list[str] | None,
        typer.Option("--state", help="Only transactions in this state, e.g. Ongoing (repeatable)."),
    ] = None,
    producer_id: Annotated[
        list[int] | None,
        typer.Option("--producer-id", help="Only this producer id (repeatable)."),
    ] = None,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Every transactional id with its producer id, state and coordinator."""
    rows: list[dict[str, Any]] = []
    try:
        with _admin(bootstrap, config_file, properties) as admin:
            for node_id in sorted(admin.brokers()):
                response = admin.call(
                    node_id,
                    LIST_TRANSACTIONS,
                    1,
                    state_filters=tuple(state or ()),
                    producer_id_filters=tuple(producer_id or ()),
                    duration_filter=-1,
                )
                if response.error_code != ErrorCode.none:
                    raise WireAdminError(f"broker {node_id}: {response.error_code.name}")
                if response.unknown_state_filters:
                    typer.echo(
                        "warning: unknown states: " + ", ".join(response.unknown_state_filters),
                        err=True,
                    )
                rows.extend(
                    {
                        "transactional_id": s.transactional_id,
                        "coordinator": node_id,
                        "producer_id": s.producer_id,
                        "state": s.transaction_state,
                    }
                    for s in response.transaction_states
                )
    except WireAdminError as exc:
        raise fail(exc) from exc
    rows.sort(key=lambda row: row["transactional_id"])
    table = Table("transactional id", "coordinator", "producer id", "state")
    for row in rows:
        table.add_row(
            row["transactional_id"], str(row["coordinator"]), str(row["producer_id"]), row["state"]
        )
    _print(output, rows, table)


def _describe(admin: WireAdmin, transactional_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        coordinator = admin.transaction_coordinator(transactional_id)
        response = admin.call(
            coordinator, DESCRIBE_TRANSACTIONS, 0, transactional_ids=(transactional_id,)
        )
        (state,) = response.transaction_states
        if state.error_code in _RETRIABLE and time.monotonic() < deadline:
            time.sleep(_RETRY_PAUSE_S)
            continue
        if state.error_code != ErrorCode.none:
            raise WireAdminError(f"transactional id {transactional_id!r}: {state.error_code.name}")
        break
    start = _time(state.transaction_start_time)
    return {
        "transactional_id": transactional_id,
        "coordinator": coordinator,
        "state": state.transaction_state,
        "producer_id": state.producer_id,
        "producer_epoch": state.producer_epoch,
        "timeout_ms": int(state.transaction_timeout.total_seconds() * 1000),
        "start_time": start,
        "duration_ms": (
            int((datetime.now(UTC) - state.transaction_start_time).total_seconds() * 1000)
            if start is not None
            else None
        ),
        "partitions": sorted(f"{t.topic}-{p}" for t in state.topics for p in t.partitions),
    }


@txn_app.command("describe")
def describe(
    transactional_id: str,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """A transactional id's state, producer, timeout, age and partitions."""
    try:
        with _admin(bootstrap, config_file, properties) as admin:
            data = _describe(admin, transactional_id)
    except WireAdminError as exc:
        raise fail(exc) from exc
    table = Table("field", "value")
    for key, value in data.items():
        shown = ", ".join(value) if isinstance(value, list) else value
        table.add_row(key.replace("_", " "), "-" if shown in (None, "") else str(shown))
    _print(output, data, table)


@txn_app.command("describe-producers")
def describe_producers(
    topic: str,
    partition: Annotated[
        int | None, typer.Option("--partition", "-p", help="Only this partition.")
    ] = None,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """The active producers of a topic's partitions, from their leaders.

    A current transaction start offset other than -1 is an open transaction:
    it holds back what read_committed consumers can read.
    """
    rows: list[dict[str, Any]] = []
    try:
        with _admin(bootstrap, config_file, properties) as admin:
            leaders = _leaders(admin, topic, partition)
            for leader, indexes in sorted(leaders.items()):
                request_topic = schema(DESCRIBE_PRODUCERS, 0).make_request(
                    "TopicRequest", name=topic, partition_indexes=tuple(sorted(indexes))
                )
                response = admin.call(leader, DESCRIBE_PRODUCERS, 0, topics=(request_topic,))
                for answer in response.topics:
                    for p in answer.partitions:
                        if p.error_code != ErrorCode.none:
                            raise WireAdminError(
                                f"{topic}-{p.partition_index}: {p.error_code.name}"
                            )
                        rows.extend(
                            {
                                "partition": p.partition_index,
                                "producer_id": s.producer_id,
                                "producer_epoch": s.producer_epoch,
                                "last_sequence": s.last_sequence,
                                "last_timestamp": s.last_timestamp,
                                "coordinator_epoch": s.coordinator_epoch,
                                "current_txn_start_offset": s.current_txn_start_offset,
                            }
                            for s in p.active_producers
                        )
    except WireAdminError as exc:
        raise fail(exc) from exc
    rows.sort(key=lambda row: (row["partition"], row["producer_id"]))
    columns = (
        "partition",
        "producer_id",
        "producer_epoch",
        "last_sequence",
        "last_timestamp",
        "coordinator_epoch",
        "current_txn_start_offset",
    )
    table = Table(*(c.replace("_", " ") for c in columns))
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    _print(output, rows, table)


def _leaders(admin: WireAdmin, topic: str, partition: int | None) -> dict[int, list[int]]:
    (described,) = admin.metadata([topic]).topics
    if described.error_code != ErrorCode.none:
        raise WireAdminError(f"topic {topic!r}: {described.error_code.name}")
    leaders: dict[int, list[int]] = defaultdict(list)
    for p in described.partitions:
        if partition is None or p.partition_index == partition:
            leaders[p.leader_id].append(p.partition_index)
    if not leaders:
        raise WireAdminError(f"topic {topic!r} has no partition {partition}")
    if -1 in leaders:
        raise WireAdminError(f"{topic}-{leaders[-1][0]} has no leader")
    return leaders


@txn_app.command("abort")
def abort(
    transactional_id: str,
    output: OutputOption = "table",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Abort the id's open transaction by fencing its producer.

    Initialises a transactional producer with the id, as a new instance of
    the application would: the coordinator aborts the open transaction and
    bumps the epoch, so the running instance (if any) is fenced.
    """
    config = client_config(bootstrap, config_file, properties)
    try:
        with WireAdmin(config) as admin:
            before = _describe(admin, transactional_id)
        producer = Producer({**config, "transactional.id": transactional_id})
        producer.init_transactions(TIMEOUT_S)
        producer.flush(TIMEOUT_S)
        with WireAdmin(config) as admin:
            after = _describe(admin, transactional_id)
    except (WireAdminError, KafkaException) as exc:
        raise fail(exc) from exc
    data = {
        "transactional_id": transactional_id,
        "state_before": before["state"],
        "partitions": before["partitions"],
        "state": after["state"],
        "producer_id": after["producer_id"],
        "producer_epoch": after["producer_epoch"],
    }
    if output == "json":
        typer.echo(json.dumps(data, indent=2))
        return
    what = "aborted its open transaction" if before["state"] == "Ongoing" else "no open transaction"
    typer.echo(
        f"{transactional_id}: {what}; fenced at producer id {data['producer_id']}"
        f" epoch {data['producer_epoch']} (was {before['state']}, now {after['state']})"
    )
