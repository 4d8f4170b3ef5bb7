"""The gateway's listener settings: what each one needs, refused at start with the reason."""

import pytest
from pydantic import ValidationError
from shoal.gateway.config import GatewayConfig


def config(**settings: str | None) -> GatewayConfig:
    return GatewayConfig(gateway_id="t", **settings)  # type: ignore[arg-type]


def test_the_mutual_tls_listener_needs_a_certificate_a_key_and_a_client_ca() -> None:
    with pytest.raises(ValidationError, match="--mtls-listen needs --tls-cert, --tls-key and"):
        config(mtls_listen="127.0.0.1:9292", tls_cert="c.pem", tls_key="k.pem")
    ready = config(
        mtls_listen="127.0.0.1:9292", tls_cert="c.pem", tls_key="k.pem", tls_client_ca="ca.pem"
    )
    assert ready.mtls_listen == "127.0.0.1:9292"


def test_a_gateway_may_listen_only_for_client_certificates() -> None:
    only = config(
        listen="", mtls_listen="0.0.0.0:9292", tls_cert="c", tls_key="k", tls_client_ca="ca"
    )
    assert not only.listen
    with pytest.raises(ValidationError, match="--mtls-listen or several"):
        config(listen="")
