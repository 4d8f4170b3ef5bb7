"""The ``shoal`` command: one entry point for every component and for humans.

``shoal broker``, ``shoal gateway`` and ``shoal operator`` run one component each (container
entry points); ``shoal dev`` runs a local cluster; ``shoal topic``, ``shoal produce`` and ``shoal
consume`` are a Kafka client for people; ``shoal bench produce|consume|e2e``
measures any Kafka-compatible cluster as Kafka's perf-test tools do; ``shoal
tenant``, ``key``, ``acl`` and ``quota`` manage tenants in etcd; ``shoal oauth
rotate-keys`` rotates the gateways' token signing key; ``shoal rack-of-node`` is the
brokers' init container on Kubernetes; ``shoal group`` and ``shoal txn``
look after consumer groups and transactions; ``shoal history`` records what
clients see on a cluster (under faults, say) and checks it for lost or
duplicated writes. Every flag also reads a
``SHOAL_*`` environment variable, named in ``--help``.

The entry point is :func:`main` (``[project.scripts]`` in pyproject.toml).
"""

from __future__ import annotations

import importlib
import sys
from typing import Final

import typer

_COMPONENTS: Final = {
    "broker": "shoal.cli.broker",
    "gateway": "shoal.cli.gateway",
    "operator": "shoal.cli.operator",
}
"""The commands that run a component, and the module of each."""


def build_app() -> typer.Typer:
    """The whole command: every component, client and tool."""
    from shoal.cli.bench import bench_app  # noqa: PLC0415
    from shoal.cli.broker import broker  # noqa: PLC0415
    from shoal.cli.dev import dev  # noqa: PLC0415
    from shoal.cli.gateway import gateway  # noqa: PLC0415
    from shoal.cli.group import group_app  # noqa: PLC0415
    from shoal.cli.history import history_app  # noqa: PLC0415
    from shoal.cli.oauth import oauth_app  # noqa: PLC0415
    from shoal.cli.operator import operator  # noqa: PLC0415
    from shoal.cli.rack import rack_of_node_command  # noqa: PLC0415
    from shoal.cli.records import consume, produce  # noqa: PLC0415
    from shoal.cli.tenancy import acl_app, key_app, quota_app, tenant_app  # noqa: PLC0415
    from shoal.cli.topic import topic_app  # noqa: PLC0415
    from shoal.cli.txn import txn_app  # noqa: PLC0415

    app = typer.Typer(
        name="shoal",
        help="Shoal: multi-tenant, Kafka-compatible event streaming.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.command()(broker)
    app.command()(dev)
    app.command()(gateway)
    app.command()(operator)
    app.command()(produce)
    app.command()(consume)
    app.command(name="rack-of-node")(rack_of_node_command)
    app.add_typer(topic_app, name="topic")
    app.add_typer(bench_app, name="bench")
    app.add_typer(group_app, name="group")
    app.add_typer(txn_app, name="txn")
    app.add_typer(history_app, name="history")
    app.add_typer(tenant_app, name="tenant")
    app.add_typer(key_app, name="key")
    app.add_typer(acl_app, name="acl")
    app.add_typer(quota_app, name="quota")
    app.add_typer(oauth_app, name="oauth")
    return app


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] in _COMPONENTS:
        # A component starts on every pod (re)start, and by the hundred in the tests:
        # it loads its own command only, not every client and tool of the CLI (about
        # 0.4 s of imports). Its flags, help and errors are the same either way.
        name = args[0]
        command = getattr(importlib.import_module(_COMPONENTS[name]), name)
        alone = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        alone.command(name=name)(command)
        alone(args=args[1:], prog_name=f"shoal {name}")
        return
    build_app()()
