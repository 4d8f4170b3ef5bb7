"""``shoal operator``: the Kubernetes operator for Cluster, Topic and Tenant resources."""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.running import run_until_signalled
from shoal.host_port import split_host_port
from shoal.logs import configure_logging

DEFAULT_IMAGE = "ghcr.io/shoal-dev/shoal:latest"
PRIORITY_RANGE = 1_000_000
"""A replica's random peering priority is below this: two replicas rarely draw the same."""


def _namespaces(given: list[str] | None) -> list[str]:
    if given:
        return given
    return [n.strip() for n in os.environ.get("SHOAL_WATCH_NAMESPACES", "").split(",") if n.strip()]


def operator(
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace",
            "-n",
            help="A namespace to watch (repeatable); SHOAL_WATCH_NAMESPACES takes a "
            "comma-separated list. None: every namespace.",
        ),
    ] = None,
    liveness_port: Annotated[
        int,
        typer.Option(envvar="SHOAL_LIVENESS_PORT", help="Port of the liveness probe (/healthz)."),
    ] = 8081,
    metrics_listen: Annotated[
        str | None,
        typer.Option(
            envvar="SHOAL_METRICS_LISTEN",
            help="HOST:PORT for Prometheus metrics (/metrics); off when unset.",
        ),
    ] = None,
    image: Annotated[
        str,
        typer.Option(
            envvar="SHOAL_OPERATOR_IMAGE",
            help="Image of a Cluster's pods when its spec names none (the operator's own).",
        ),
    ] = DEFAULT_IMAGE,
    endpoints_file: Annotated[
        Path | None,
        typer.Option(
            envvar="SHOAL_OPERATOR_ENDPOINTS_FILE",
            help="JSON file of where Clusters' brokers, etcd and gateway are, for an operator "
            "outside the Kubernetes cluster (see shoal.operator.endpoints.endpoints_file); "
            "unset: the in-cluster Service names.",
        ),
    ] = None,
    peering: Annotated[
        str | None,
        typer.Option(
            envvar="SHOAL_OPERATOR_PEERING",
            help="Run as one of several replicas, one active, through kopf's peering object of "
            "this name (a ClusterKopfPeering, or a KopfPeering per watched namespace); unset: "
            "the only replica.",
        ),
    ] = None,
    peering_priority: Annotated[
        int | None,
        typer.Option(
            envvar="SHOAL_OPERATOR_PEERING_PRIORITY",
            help="This replica's priority in the peering (the highest live one is active); "
            "unset: a random one, so replicas differ.",
        ),
    ] = None,
    peering_lifetime: Annotated[
        int,
        typer.Option(
            envvar="SHOAL_OPERATOR_PEERING_LIFETIME_S",
            help="Seconds after its last sign of life before a replica counts as gone "
            "and another takes over.",
        ),
    ] = 60,
    log_level: Annotated[
        str, typer.Option(envvar="SHOAL_LOG_LEVEL", help="DEBUG, INFO, WARNING or ERROR.")
    ] = "INFO",
    log_format: Annotated[
        str, typer.Option(envvar="SHOAL_LOG_FORMAT", help="text or json.")
    ] = "text",
) -> None:
    """Run the operator: Cluster, Topic and Tenant resources made real (see docs/kubernetes.md)."""
    # Imported here, not at the top: every `shoal` command loads this module for its
    # help, and the operator's (kopf, Kubernetes clients) take seconds to import.
    from shoal.operator.context import Intervals, OperatorContext  # noqa: PLC0415
    from shoal.operator.endpoints import endpoints_file as read_endpoints  # noqa: PLC0415
    from shoal.operator.endpoints import in_cluster_endpoints  # noqa: PLC0415
    from shoal.operator.handlers import Peering  # noqa: PLC0415
    from shoal.operator.runner import run_operator  # noqa: PLC0415

    configure_logging(log_level, log_format)
    metrics = split_host_port(metrics_listen) if metrics_listen else None
    ctx = OperatorContext(
        default_image=image,
        resolver=read_endpoints(endpoints_file) if endpoints_file else in_cluster_endpoints,
        intervals=Intervals.from_environment(os.environ),
    )

    replica = None
    if peering:
        drawn = secrets.randbelow(PRIORITY_RANGE) if peering_priority is None else peering_priority
        replica = Peering(peering, drawn, peering_lifetime)

    async def program(stop: asyncio.Event) -> None:
        await run_operator(
            ctx,
            stop,
            namespaces=_namespaces(namespace),
            liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz",
            metrics=metrics,
            peering=replica,
        )

    run_until_signalled(program)
