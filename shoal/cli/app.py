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

_COMMANDS: Final = {
    # name: (module, attribute); a typer.Typer attribute is a group of subcommands.
    "broker": ("shoal.cli.broker", "broker"),
    "dev": ("shoal.cli.dev", "dev"),
    "gateway": ("shoal.cli.gateway", "gateway"),
    "operator": ("shoal.cli.operator", "operator"),
    "produce": ("shoal.cli.records", "produce"),
    "consume": ("shoal.cli.records", "consume"),
    "rack-of-node": ("shoal.cli.rack", "rack_of_node_command"),
    "topic": ("shoal.cli.topic", "topic_app"),
    "bench": ("shoal.cli.bench", "bench_app"),
    "group": ("shoal.cli.group", "group_app"),
    "txn": ("shoal.cli.txn", "txn_app"),
    "history": ("shoal.cli.history", "history_app"),
    "tenant": ("shoal.cli.tenancy", "tenant_app"),
    "key": ("shoal.cli.tenancy", "key_app"),
    "acl": ("shoal.cli.tenancy", "acl_app"),
    "quota": ("shoal.cli.tenancy", "quota_app"),
    "oauth": ("shoal.cli.oauth", "oauth_app"),
}


def _new_app() -> typer.Typer:
    app = typer.Typer(
        name="shoal",
        help="Shoal: multi-tenant, Kafka-compatible event streaming.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    # A callback keeps the app a group of commands even with one command in it,
    # which typer would otherwise run as the app itself.
    app.callback()(_no_options)
    return app


def _no_options() -> None:
    """The app's own options: none but --help."""


def _add(app: typer.Typer, name: str) -> None:
    module, attribute = _COMMANDS[name]
    command = getattr(importlib.import_module(module), attribute)
    if isinstance(command, typer.Typer):
        app.add_typer(command, name=name)
    else:
        app.command(name=name)(command)


def build_app(only: str | None = None) -> typer.Typer:
    """The command with every component, client and tool, or with ``only`` one of them.

    Each command's module is imported only when the command is wanted: a component
    starts on every pod (re)start and by the hundred in the tests, and a client
    command is typed by a person waiting for it; loading every other command costs
    about a second of imports. Flags, help and errors are the same either way.
    """
    app = _new_app()
    for name in [only] if only is not None else _COMMANDS:
        _add(app, name)
    return app


def main() -> None:
    wanted = sys.argv[1] if len(sys.argv) > 1 else None
    if wanted in _COMMANDS:
        build_app(only=wanted)(args=sys.argv[1:], prog_name="shoal")
        return
    build_app()()
