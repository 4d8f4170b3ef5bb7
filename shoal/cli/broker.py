"""``shoal broker``: one broker process, configured by flags or SHOAL_* variables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from shoal.broker.config import BrokerConfig
from shoal.cli.running import run_until_signalled
from shoal.locking import DirectoryLockedError
from shoal.logs import configure_logging


def _doc(field: str) -> str:
    return BrokerConfig.model_fields[field].description or ""


def broker(
    node_id: Annotated[
        int | None, typer.Option(envvar="SHOAL_NODE_ID", help=_doc("node_id"))
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(envvar="SHOAL_DATA_DIR", help=_doc("data_dir"))
    ] = None,
    listen: Annotated[str | None, typer.Option(envvar="SHOAL_LISTEN", help=_doc("listen"))] = None,
    advertise: Annotated[
        str | None, typer.Option(envvar="SHOAL_ADVERTISE", help=_doc("advertise"))
    ] = None,
    etcd: Annotated[str | None, typer.Option(envvar="SHOAL_ETCD", help=_doc("etcd"))] = None,
    rack: Annotated[str | None, typer.Option(envvar="SHOAL_RACK", help=_doc("rack"))] = None,
    metrics_listen: Annotated[
        str | None, typer.Option(envvar="SHOAL_METRICS_LISTEN", help=_doc("metrics_listen"))
    ] = None,
    topic_default: Annotated[
        list[str] | None,
        typer.Option(help=_doc("topic_defaults") + " Given as KEY=VALUE."),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(envvar="SHOAL_LOG_LEVEL", help=_doc("log_level"))
    ] = None,
    log_format: Annotated[
        str | None, typer.Option(envvar="SHOAL_LOG_FORMAT", help=_doc("log_format"))
    ] = None,
) -> None:
    """Run one broker. Other settings (intervals, limits) are read from SHOAL_* variables;
    see docs/broker.md."""
    # Imported here, not at the top: every `shoal` command loads this module for its
    # help, and the broker's modules take seconds to import.
    from shoal.broker.app import Broker  # noqa: PLC0415
    from shoal.broker.cluster.store import StoreError  # noqa: PLC0415
    from shoal.broker.log.manager import DataDirError  # noqa: PLC0415
    from shoal.tracing import BROKER_SERVICE, tracer_provider  # noqa: PLC0415

    given: dict[str, Any] = {
        "node_id": node_id,
        "data_dir": data_dir,
        "listen": listen,
        "advertise": advertise,
        "etcd": etcd,
        "rack": rack,
        "metrics_listen": metrics_listen,
        "log_level": log_level,
        "log_format": log_format,
    }
    if topic_default:
        given["topic_defaults"] = dict(_pair(item) for item in topic_default)
    try:
        config = BrokerConfig(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from exc
    configure_logging(config.log_level, config.log_format)
    try:
        tracing = tracer_provider(BROKER_SERVICE, str(config.node_id))
        broker = Broker(config, tracing)
        run_until_signalled(broker.run)
    except (DirectoryLockedError, DataDirError, StoreError) as exc:
        typer.echo(f"shoal broker: {exc}", err=True)
        raise typer.Exit(1) from exc
    if broker.exit_code:
        raise typer.Exit(broker.exit_code)


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise typer.BadParameter(f"{item!r} is not KEY=VALUE")
    return key.strip(), value.strip()
