"""``shoal oauth``: the gateways' OAuth signing keys.

``shoal oauth rotate-keys`` makes a new signing key active now, for every
gateway replica (they re-read the key ring within seconds, or at once when a
token names the new key). The previous key keeps verifying the tokens it
signed until they expire; give the gateways' token lifetime, so that keys
are dropped only once no valid token needs them. Use it when a signing key
may have leaked, or to try rotation without waiting for the period.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated

import typer

from shoal.cli.client import OutputOption
from shoal.cli.tenancy import EtcdOption
from shoal.gateway.config import GatewayConfig
from shoal.gateway.oauth.keys import KeyRing
from shoal.gateway.oauth.keystore import DEFAULT_REFRESH_S, KeyStoreError, SigningKeyStore

oauth_app = typer.Typer(help="The gateways' OAuth token signing keys.", no_args_is_help=True)


def _default(field: str) -> int:
    value = GatewayConfig.model_fields[field].default
    assert isinstance(value, int)
    return value


@oauth_app.command("rotate-keys")
def rotate_keys(
    etcd: EtcdOption,
    token_lifetime_s: Annotated[
        int,
        typer.Option(
            envvar="SHOAL_OAUTH_TOKEN_LIFETIME_S",
            help="The gateways' token lifetime: retired keys older than this are dropped.",
        ),
    ] = _default("oauth_token_lifetime_s"),
    leeway_s: Annotated[
        int,
        typer.Option(envvar="SHOAL_OAUTH_LEEWAY_S", help="The gateways' clock leeway."),
    ] = _default("oauth_leeway_s"),
    output: OutputOption = "table",
) -> None:
    """Make a new signing key active now; the old one stays until its tokens expire."""

    async def go() -> KeyRing:
        async with SigningKeyStore(etcd) as store:
            retain_ms = int((token_lifetime_s + DEFAULT_REFRESH_S + leeway_s) * 1000)
            return await store.rotate(int(time.time() * 1000), retain_ms)

    try:
        ring = asyncio.run(go())
    except (KeyStoreError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    retired = [k.kid for k in ring.keys[:-1]]
    if output == "json":
        typer.echo(json.dumps({"active": ring.active.kid, "retired": retired}, indent=2))
    else:
        typer.echo(f"active signing key: {ring.active.kid}")
        for kid in retired:
            typer.echo(f"retired, still trusted: {kid}")
