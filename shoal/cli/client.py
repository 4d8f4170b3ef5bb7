"""Client settings for the CLI's Kafka commands: librdkafka properties.

Resolution, last wins: ``--config-file`` (a ``client.properties`` as ``shoal
dev`` writes it, the same file ``kcat -F`` reads), then ``--bootstrap``, then
each ``-X key=value``. Without a bootstrap anywhere, ``SHOAL_BOOTSTRAP`` or
127.0.0.1:9092.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Final

import typer

DEFAULT_BOOTSTRAP: Final = "127.0.0.1:9092"

BootstrapOption = Annotated[
    str | None,
    typer.Option("--bootstrap", "-b", envvar="SHOAL_BOOTSTRAP", help="Kafka bootstrap host:port."),
]
ConfigFileOption = Annotated[
    Path | None,
    typer.Option(
        "--config-file",
        "-F",
        envvar="SHOAL_CLIENT_CONFIG",
        help="librdkafka properties file (client.properties).",
        exists=True,
        dir_okay=False,
    ),
]
PropertyOption = Annotated[
    list[str] | None,
    typer.Option("-X", help="librdkafka property KEY=VALUE (repeatable)."),
]
OutputOption = Annotated[str, typer.Option("--output", "-o", help="Output format: table or json.")]


def read_properties(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def parse_pairs(items: list[str] | None, what: str) -> dict[str, str]:
    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} {item!r} is not KEY=VALUE")
        pairs[key.strip()] = value
    return pairs


def client_config(
    bootstrap: str | None, config_file: Path | None, properties: list[str] | None
) -> dict[str, str]:
    config = read_properties(config_file) if config_file else {}
    if bootstrap:
        config["bootstrap.servers"] = bootstrap
    config.update(parse_pairs(properties, "-X"))
    config.setdefault("bootstrap.servers", os.environ.get("SHOAL_BOOTSTRAP", DEFAULT_BOOTSTRAP))
    return config
