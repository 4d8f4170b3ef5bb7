"""``shoal gateway``: the tenants' door, configured by flags or SHOAL_* variables."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from pydantic import ValidationError

from shoal.cli.running import run_until_signalled
from shoal.gateway.config import GatewayConfig
from shoal.logs import configure_logging


def _doc(field: str) -> str:
    return GatewayConfig.model_fields[field].description or ""


def gateway(
    etcd: Annotated[str | None, typer.Option(envvar="SHOAL_ETCD", help=_doc("etcd"))] = None,
    listen: Annotated[str | None, typer.Option(envvar="SHOAL_LISTEN", help=_doc("listen"))] = None,
    tls_listen: Annotated[
        str | None, typer.Option(envvar="SHOAL_TLS_LISTEN", help=_doc("tls_listen"))
    ] = None,
    mtls_listen: Annotated[
        str | None, typer.Option(envvar="SHOAL_MTLS_LISTEN", help=_doc("mtls_listen"))
    ] = None,
    tls_cert: Annotated[
        str | None, typer.Option(envvar="SHOAL_TLS_CERT", help=_doc("tls_cert"))
    ] = None,
    tls_key: Annotated[
        str | None, typer.Option(envvar="SHOAL_TLS_KEY", help=_doc("tls_key"))
    ] = None,
    tls_client_ca: Annotated[
        str | None, typer.Option(envvar="SHOAL_TLS_CLIENT_CA", help=_doc("tls_client_ca"))
    ] = None,
    http_listen: Annotated[
        str | None, typer.Option(envvar="SHOAL_HTTP_LISTEN", help=_doc("http_listen"))
    ] = None,
    metrics_listen: Annotated[
        str | None, typer.Option(envvar="SHOAL_METRICS_LISTEN", help=_doc("metrics_listen"))
    ] = None,
    advertise_host: Annotated[
        str | None, typer.Option(envvar="SHOAL_ADVERTISE_HOST", help=_doc("advertise_host"))
    ] = None,
    upstream: Annotated[
        str | None, typer.Option(envvar="SHOAL_UPSTREAM", help=_doc("upstream"))
    ] = None,
    gateway_id: Annotated[
        str | None, typer.Option(envvar="SHOAL_GATEWAY_ID", help=_doc("gateway_id"))
    ] = None,
    oauth_issuer: Annotated[
        str | None, typer.Option(envvar="SHOAL_OAUTH_ISSUER", help=_doc("oauth_issuer"))
    ] = None,
    oauth_token_lifetime_s: Annotated[
        int | None,
        typer.Option(envvar="SHOAL_OAUTH_TOKEN_LIFETIME_S", help=_doc("oauth_token_lifetime_s")),
    ] = None,
    oauth_external_issuer: Annotated[
        str | None,
        typer.Option(envvar="SHOAL_OAUTH_EXTERNAL_ISSUER", help=_doc("oauth_external_issuer")),
    ] = None,
    oauth_external_jwks_url: Annotated[
        str | None,
        typer.Option(envvar="SHOAL_OAUTH_EXTERNAL_JWKS_URL", help=_doc("oauth_external_jwks_url")),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(envvar="SHOAL_LOG_LEVEL", help=_doc("log_level"))
    ] = None,
    log_format: Annotated[
        str | None, typer.Option(envvar="SHOAL_LOG_FORMAT", help=_doc("log_format"))
    ] = None,
) -> None:
    """Run the Kafka gateway in front of the brokers. Other settings (intervals, quota
    windows, the rest of OAuth) are read from SHOAL_* variables; see docs/gateway.md
    and docs/oauth.md."""
    # Imported here, not at the top: every `shoal` command loads this module for its
    # help, and the gateway's modules take seconds to import.
    from shoal.gateway.server import Gateway  # noqa: PLC0415
    from shoal.tracing import GATEWAY_SERVICE, tracer_provider  # noqa: PLC0415

    given: dict[str, Any] = {
        "etcd": etcd,
        "listen": listen,
        "tls_listen": tls_listen,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "mtls_listen": mtls_listen,
        "tls_client_ca": tls_client_ca,
        "http_listen": http_listen,
        "metrics_listen": metrics_listen,
        "advertise_host": advertise_host,
        "upstream": upstream,
        "gateway_id": gateway_id,
        "oauth_issuer": oauth_issuer,
        "oauth_token_lifetime_s": oauth_token_lifetime_s,
        "oauth_external_issuer": oauth_external_issuer,
        "oauth_external_jwks_url": oauth_external_jwks_url,
        "log_level": log_level,
        "log_format": log_format,
    }
    try:
        config = GatewayConfig(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from exc
    configure_logging(config.log_level, config.log_format)
    tracing = tracer_provider(GATEWAY_SERVICE, config.gateway_id)
    run_until_signalled(Gateway(config, tracing).run)
