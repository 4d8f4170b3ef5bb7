"""``shoal operator``: the Kubernetes operator for Cluster, Topic and Tenant resources."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

import typer

from shoal.cli.running import run_until_signalled
from shoal.host_port import split_host_port
from shoal.logs import configure_logging

DEFAULT_IMAGE = "ghcr.io/shoal-dev/shoal:latest"


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
    from shoal.operator.context import OperatorContext  # noqa: PLC0415
    from shoal.operator.runner import run_operator  # noqa: PLC0415

    configure_logging(log_level, log_format)
    metrics = split_host_port(metrics_listen) if metrics_listen else None
    ctx = OperatorContext(default_image=image)

    async def program(stop: asyncio.Event) -> None:
        await run_operator(
            ctx,
            stop,
            namespaces=_namespaces(namespace),
            liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz",
            metrics=metrics,
        )

    run_until_signalled(program)
