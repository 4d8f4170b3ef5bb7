"""``shoal rack-of-node``: the brokers' init container, writing their Node's rack to a file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer

from shoal.operator.rack import SERVICE_ACCOUNT_DIR, InClusterApi, RackError, rack_of_node


def rack_of_node_command(
    label: Annotated[
        str,
        typer.Option(
            envvar="SHOAL_RACK_LABEL",
            help="Node label whose value is the rack, e.g. topology.kubernetes.io/zone.",
        ),
    ],
    node: Annotated[
        str, typer.Option(envvar="SHOAL_NODE_NAME", help="The Node to read (spec.nodeName).")
    ],
    out: Annotated[Path, typer.Option(envvar="SHOAL_RACK_FILE", help="File to write the rack to.")],
    api_server: Annotated[
        str | None,
        typer.Option(
            envvar="SHOAL_API_SERVER",
            help="Kubernetes API URL; defaults to the in-cluster one (KUBERNETES_SERVICE_HOST).",
        ),
    ] = None,
    service_account_dir: Annotated[
        Path,
        typer.Option(
            envvar="SHOAL_SERVICE_ACCOUNT_DIR", help="Where the pod's token and ca.crt are."
        ),
    ] = SERVICE_ACCOUNT_DIR,
) -> None:
    """Write the value of LABEL on Node NODE to OUT (for the broker's SHOAL_RACK)."""
    try:
        api = InClusterApi.from_pod(service_account_dir, api_server)
        rack = asyncio.run(rack_of_node(api, node, label))
    except RackError as exc:
        typer.echo(f"shoal rack-of-node: {exc}", err=True)
        raise typer.Exit(1) from exc
    # Whole or absent: the broker must never read half a rack name.
    partial = out.with_name(f".{out.name}.partial")
    partial.write_text(rack)
    os.replace(partial, out)
    typer.echo(f"rack {rack!r} (node {node}, label {label})")
