"""The gateway's settings: one typed model, read from flags and ``SHOAL_*`` variables.

Ports: each listener has a bootstrap port (``--listen``'s) and one port per
broker after it: broker ``n`` is reached at bootstrap port + 1 + n
(Kroxylicious' port-per-broker scheme). ``shoal gateway --listen :9092`` in
front of brokers 0-2 therefore listens on 9092 (bootstrap), 9093, 9094 and
9095. A TLS listener (``--tls-listen``) works the same from its own port, and
so does the mutual-TLS one (``--mtls-listen``), where clients sign in with a
certificate instead of SASL.
"""

from __future__ import annotations

import os
import socket

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shoal.host_port import split_host_port


class GatewayConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_", extra="forbid")

    etcd: str = Field(
        "http://127.0.0.1:2379",
        description="etcd endpoint with the tenancy records, optionally with a chroot path.",
    )
    listen: str | None = Field(
        "127.0.0.1:9092",
        description="HOST:PORT of the SASL_PLAINTEXT bootstrap listener (broker n at PORT+1+n);"
        " empty for none.",
    )
    tls_listen: str | None = Field(
        None, description="HOST:PORT of the SASL_SSL bootstrap listener (broker n at PORT+1+n)."
    )
    mtls_listen: str | None = Field(
        None,
        description="HOST:PORT of the SSL listener where clients sign in with a certificate"
        " (mutual TLS; broker n at PORT+1+n).",
    )
    tls_cert: str | None = Field(None, description="PEM certificate chain for the TLS listeners.")
    tls_key: str | None = Field(None, description="PEM private key for the TLS listeners.")
    tls_client_ca: str | None = Field(
        None,
        description="PEM certificates of the CAs whose client certificates --mtls-listen accepts"
        " (only these: not the system's).",
    )
    advertise_host: str | None = Field(
        None,
        description="Host name clients are told to connect to; defaults to the listen host,"
        " or this host's name when listening on every interface.",
    )
    http_listen: str | None = Field(
        "127.0.0.1:8080",
        description="HOST:PORT of the HTTP API (also OAuth, /healthz); empty for none.",
    )
    metrics_listen: str | None = Field(
        None,
        description="HOST:PORT where Prometheus scrapes /metrics; none by default.",
    )
    upstream: str = Field(
        "127.0.0.1:19092",
        description="Comma-separated HOST:PORT of brokers' internal listeners to bootstrap from.",
    )
    gateway_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="This gateway's name among the replicas (quotas are split between them).",
    )
    tenancy_poll_interval_ms: int = Field(
        1000, ge=50, description="How often tenancy records are re-read (revocations apply then)."
    )
    metadata_refresh_interval_ms: int = Field(
        10000, ge=100, description="How often the broker list is refreshed (new brokers get ports)."
    )
    broker_check_interval_ms: int = Field(
        250,
        ge=100,
        description="How often the gateway asks which brokers are live; clients of a broker"
        " that left (its etcd session expired) are disconnected, to retry where its"
        " partitions went.",
    )
    authentication_timeout_ms: int = Field(
        10000, ge=100, description="A connection that has not authenticated by then is closed."
    )
    membership_ttl_s: int = Field(
        5, ge=2, description="Lease of this gateway's registration (how fast a gone one is seen)."
    )
    quota_window_size_s: float = Field(
        1.0,
        gt=0,
        description="Seconds of its quota a quiet tenant may burst (quota.window.size.seconds).",
    )
    socket_request_max_bytes: int = Field(
        104857600, ge=1024, description="Largest request accepted (socket.request.max.bytes)."
    )
    group_lag_interval_s: float = Field(
        30.0, ge=0, description="How often consumer group lag is measured for /metrics; 0: never."
    )
    group_lag_max_groups: int = Field(
        100, ge=1, description="Groups per tenant whose lag /metrics names (the largest lags)."
    )
    oauth_issuer: str | None = Field(
        None,
        description="Public URL of the HTTP door: the iss of issued tokens and base of"
        " /oauth2/token; defaults to http://<http-listen address>.",
    )
    oauth_audience: str = Field("shoal", description="The aud of issued (and accepted) tokens.")
    oauth_token_lifetime_s: int = Field(
        900, ge=5, le=86400, description="Lifetime of tokens from /oauth2/token, in seconds."
    )
    oauth_key_rotation_s: int = Field(
        86400,
        ge=60,
        description="A new signing key after this many seconds (old ones stay"
        " published until their tokens expire).",
    )
    oauth_leeway_s: int = Field(
        30, ge=0, le=300, description="Clock skew allowed when checking a token's exp and nbf."
    )
    oauth_external_issuer: str | None = Field(
        None, description="iss of an external identity provider whose tokens are accepted."
    )
    oauth_external_jwks_url: str | None = Field(
        None, description="JWKS URL of the external issuer (its public signing keys)."
    )
    oauth_external_audience: str | None = Field(
        None, description="aud required of external tokens; defaults to --oauth-audience."
    )
    oauth_external_tenant_claim: str = Field(
        "tenant", description="Claim of an external token that names the tenant."
    )
    oauth_external_principal_claim: str = Field(
        "sub", description="Claim of an external token that names the principal (for ACLs)."
    )
    log_level: str = Field("INFO", description="Logging level.")
    log_format: str = Field("text", description="Log line format: text (key=value) or json.")

    @field_validator("metrics_listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)
        return value

    @model_validator(mode="after")
    def _tls_complete(self) -> GatewayConfig:
        if self.tls_listen and not (self.tls_cert and self.tls_key):
            raise ValueError("--tls-listen needs --tls-cert and --tls-key")
        if self.mtls_listen and not (self.tls_cert and self.tls_key and self.tls_client_ca):
            raise ValueError("--mtls-listen needs --tls-cert, --tls-key and --tls-client-ca")
        if not (self.listen or self.tls_listen or self.mtls_listen):
            raise ValueError("give --listen, --tls-listen, --mtls-listen or several")
        if bool(self.oauth_external_issuer) != bool(self.oauth_external_jwks_url):
            raise ValueError("--oauth-external-issuer and --oauth-external-jwks-url go together")
        return self

    def oauth_issuer_url(self) -> str:
        """The issuer URL: configured, or the HTTP door's own address."""
        if self.oauth_issuer:
            return self.oauth_issuer
        host, port = split_host_port(self.http_listen or "127.0.0.1:8080")
        if host in ("0.0.0.0", "::", ""):  # noqa: S104 - comparing, not binding
            host = self.advertise_host or socket.getfqdn()
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def upstream_addresses(self) -> list[tuple[str, int]]:
        return [split_host_port(item.strip()) for item in self.upstream.split(",") if item.strip()]
