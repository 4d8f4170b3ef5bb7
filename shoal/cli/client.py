"""Client settings for the CLI's Kafka commands: librdkafka properties.

Resolution, last wins: ``--config-file`` (a ``client.properties`` as ``shoal
dev`` writes it, the same file ``kcat -F`` reads), then ``--bootstrap``, then
each ``-X key=value``. Without a bootstrap anywhere, ``SHOAL_BOOTSTRAP`` or
127.0.0.1:9092.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Final

import typer
from confluent_kafka import KafkaException

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


class _FirstWarningOnly(logging.Handler):
    """Shows librdkafka's first warning and drops the rest.

    While a broker is down librdkafka logs every reconnect attempt, many a
    second; a person at a terminal needs the first, then the command's own
    outcome.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.spoke = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.spoke:
            self.spoke = True
            # "FAIL [rdkafka#consumer-1] [thrd:...]: host:port/id: what happened"
            text = record.getMessage().rsplit("]: ", 1)[-1]
            sys.stderr.write(f"warning: {text} (further warnings not shown)\n")


def _librdkafka_logger() -> logging.Logger:
    logger = logging.getLogger("shoal.cli.librdkafka")
    if not logger.handlers:
        logger.addHandler(_FirstWarningOnly())
        logger.propagate = False
    return logger


def client_config(
    bootstrap: str | None, config_file: Path | None, properties: list[str] | None
) -> dict[str, Any]:
    config: dict[str, Any] = read_properties(config_file) if config_file else {}
    config["logger"] = _librdkafka_logger()
    if bootstrap:
        config["bootstrap.servers"] = bootstrap
    config.update(parse_pairs(properties, "-X"))
    config.setdefault("bootstrap.servers", os.environ.get("SHOAL_BOOTSTRAP", DEFAULT_BOOTSTRAP))
    return config


def fail(exc: BaseException) -> typer.Exit:
    """Print ``error: <Kafka's message>`` and return the Exit to raise."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    message = getattr(error, "str", lambda: str(error))()
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)
