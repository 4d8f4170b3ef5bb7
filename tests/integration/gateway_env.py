"""A real gateway in front of real brokers, and tenants to use it, for gateway tests.

:class:`GatewayProcess` runs ``shoal gateway`` as a child process with a
SASL_PLAINTEXT listener, a SASL_SSL one and a mutual-TLS one (throwaway CAs
from trustme: one signs the gateway's certificate, another its clients').
:func:`make_tenant` writes a tenant and a key straight into etcd, as
``shoal tenant create`` and ``shoal key create`` would. Client settings come
out of :class:`TenantKey` for each client library's spelling.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import struct
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
from harness import ShoalProcess, free_port_block, launch, wait_until
from raw_kafka import RawConnection, request_class
from shoal.tenancy.acl import default_bindings
from shoal.tenancy.keys import key_record
from shoal.tenancy.model import AclBinding, Quotas, Tenant
from shoal.tenancy.secrets import new_key_id, new_secret
from shoal.tenancy.store import TenancyStore

READY_EVENT = "event=gateway_ready"


@dataclass
class TlsFiles:
    ca: Path
    cert: Path
    key: Path
    client_ca: Path
    """The CA the mutual-TLS listener trusts for client certificates."""
    client_authority: trustme.CA
    """Issues client certificates (:func:`client_certificate`)."""

    @classmethod
    def make(cls, directory: Path) -> TlsFiles:
        directory.mkdir(parents=True, exist_ok=True)
        authority = trustme.CA()
        server = authority.issue_cert("127.0.0.1", "localhost")
        files = cls(
            directory / "ca.pem",
            directory / "cert.pem",
            directory / "key.pem",
            directory / "client-ca.pem",
            trustme.CA(organization_name="shoal tests", organization_unit_name="client CA"),
        )
        authority.cert_pem.write_to_path(str(files.ca))
        files.client_authority.cert_pem.write_to_path(str(files.client_ca))
        server.cert_chain_pems[0].write_to_path(str(files.cert))
        for extra in server.cert_chain_pems[1:]:
            extra.write_to_path(str(files.cert), append=True)
        server.private_key_pem.write_to_path(str(files.key))
        return files


@dataclass(frozen=True)
class ClientCertificate:
    """A client certificate and its key in PEM files, and its subject as the gateway
    reads it (RFC 4514)."""

    subject: str
    cert: Path
    key: Path

    def librdkafka(self, gateway: GatewayProcess, **extra: Any) -> dict[str, Any]:
        """confluent-kafka settings for the gateway's mutual-TLS listener."""
        assert gateway.tls is not None
        return {
            "bootstrap.servers": gateway.mtls_bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": str(gateway.tls.ca),
            "ssl.certificate.location": str(self.cert),
            "ssl.key.location": str(self.key),
            **extra,
        }


def client_certificate(
    directory: Path,
    authority: trustme.CA,
    common_name: str,
    not_after: datetime.datetime | None = None,
) -> ClientCertificate:
    """A certificate for ``CN=<common_name>,OU=apps,O=acme`` signed by ``authority``."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding
    from shoal.tenancy.certificates import certificate_subject

    directory.mkdir(parents=True, exist_ok=True)
    issued = authority.issue_cert(
        f"{common_name}.clients.example",
        common_name=common_name,
        organization_name="acme",
        organization_unit_name="apps",
        not_before=None if not_after is None else not_after - datetime.timedelta(days=30),
        not_after=not_after,
    )
    cert, key = directory / f"{common_name}.pem", directory / f"{common_name}.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    der = x509.load_pem_x509_certificate(issued.cert_chain_pems[0].bytes()).public_bytes(
        Encoding.DER
    )
    return ClientCertificate(certificate_subject(der), cert, key)


class GatewayProcess:
    """A ``shoal gateway`` child process; broker n is at port + 1 + n."""

    def __init__(
        self,
        etcd_url: str,
        upstream: str,
        directory: Path,
        tls: TlsFiles | None = None,
        env: dict[str, str] | None = None,
        brokers: int = 3,
        gateway_id: str | None = None,
    ) -> None:
        self.etcd_url = etcd_url
        self.upstream = upstream
        self.tls = tls
        self.env = env or {}
        self.port = free_port_block(brokers + 1)
        self.tls_port = free_port_block(brokers + 1) if tls is not None else None
        self.mtls_port = free_port_block(brokers + 1) if tls is not None else None
        self.http_port = free_port_block(1)
        self.metrics_port = free_port_block(1)
        self.gateway_id = gateway_id or f"test-{self.port}"
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / f"gateway-{self.port}.log"
        self.process: ShoalProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        """Where Prometheus scrapes: a listener of its own, not the tenants' HTTP port."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def tls_bootstrap(self) -> str:
        assert self.tls_port is not None
        return f"127.0.0.1:{self.tls_port}"

    @property
    def mtls_bootstrap(self) -> str:
        assert self.mtls_port is not None
        return f"127.0.0.1:{self.mtls_port}"

    def command(self) -> list[str]:
        args = [
            sys.executable, "-m", "shoal", "gateway",
            f"--etcd={self.etcd_url}",
            f"--listen=127.0.0.1:{self.port}",
            f"--http-listen=127.0.0.1:{self.http_port}",
            f"--metrics-listen=127.0.0.1:{self.metrics_port}",
            f"--upstream={self.upstream}",
            f"--gateway-id={self.gateway_id}",
        ]  # fmt: skip
        if self.tls is not None:
            args += [
                f"--tls-listen=127.0.0.1:{self.tls_port}",
                f"--tls-cert={self.tls.cert}",
                f"--tls-key={self.tls.key}",
                f"--mtls-listen=127.0.0.1:{self.mtls_port}",
                f"--tls-client-ca={self.tls.client_ca}",
            ]
        return args

    def start(self, timeout: float = 60) -> GatewayProcess:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "SHOAL_TENANCY_POLL_INTERVAL_MS": "300",
            **self.env,
        }
        self.process = launch(self.command(), env, self.log_path)
        wait_until(lambda: self._ready(offset), timeout, "the gateway to be ready")
        return self

    def _ready(self, offset: int) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"gateway exited with {self.process.returncode}:\n{self.log_tail()}")
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return READY_EVENT.encode() in log.read()

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


@dataclass
class TenantKey:
    """A tenant's key, and how each client library is told to use it."""

    tenant: str
    key_id: str
    secret: str
    gateway: GatewayProcess
    bindings: Sequence[AclBinding] = field(default_factory=list)

    def bootstrap(self, tls: bool = False) -> str:
        return self.gateway.tls_bootstrap if tls else self.gateway.bootstrap

    def librdkafka(
        self, tls: bool = False, mechanism: str = "PLAIN", **extra: Any
    ) -> dict[str, Any]:
        """confluent-kafka settings (librdkafka names, as in client.properties);
        ``mechanism`` may be SCRAM-SHA-256 or SCRAM-SHA-512 (same username and password)."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap(tls),
            "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": self.key_id,
            "sasl.password": self.secret,
        }
        if tls:
            assert self.gateway.tls is not None
            config["ssl.ca.location"] = str(self.gateway.tls.ca)
        return {**config, **extra}

    def properties_file(self, path: Path, tls: bool = False) -> Path:
        """A client.properties for kcat -F."""
        path.write_text("".join(f"{k}={v}\n" for k, v in self.librdkafka(tls).items()))
        return path

    def python_client(self, tls: bool = False, mechanism: str = "PLAIN") -> dict[str, Any]:
        """kafka-python and aiokafka keyword arguments (they share the names, the
        ``plain`` ones included for SCRAM)."""
        config: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap(tls),
            "security_protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism,
            "sasl_plain_username": self.key_id,
            "sasl_plain_password": self.secret,
        }
        return config

    def ssl_context(self) -> Any:
        import ssl

        assert self.gateway.tls is not None
        return ssl.create_default_context(cafile=str(self.gateway.tls.ca))

    def raw(self, tls: bool = False) -> RawConnection:
        """A bare protocol connection, already through SASL/PLAIN."""
        connection = RawConnection(self.bootstrap(tls))
        sasl_login(connection, self.key_id, self.secret)
        return connection


def sasl_login(connection: RawConnection, username: str, password: str) -> Any:
    """SaslHandshake v1 + SaslAuthenticate v2; returns the SaslAuthenticate response."""
    handshake = request_class(17, 1)
    connection.send(handshake(mechanism="PLAIN"))
    _, answer = connection.receive(handshake)
    assert answer.error_code == 0, answer
    authenticate = request_class(36, 2)
    connection.send(authenticate(auth_bytes=b"\0" + username.encode() + b"\0" + password.encode()))
    _, result = connection.receive(authenticate)
    return result


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make_tenant(
    etcd_url: str,
    gateway: GatewayProcess,
    name: str,
    quotas: Quotas | None = None,
    bindings: Sequence[AclBinding] | None = None,
    platform_admin: bool = False,
) -> TenantKey:
    """A tenant (if new) and a key for it; default bindings unless ``bindings`` is given."""

    async def go() -> TenantKey:
        async with TenancyStore(etcd_url) as store:
            if await store.get_tenant(name) is None:
                await store.create_tenant(Tenant(name, int(time.time() * 1000), quotas or Quotas()))
            key_id, secret = new_key_id(), new_secret()
            wanted = default_bindings(name, key_id) if bindings is None else list(bindings)
            await store.add_key(
                key_record(
                    key_id, name, secret, int(time.time() * 1000), platform_admin=platform_admin
                ),
                [b if b.principal in ("*", key_id) else _for_key(b, key_id) for b in wanted],
            )
            return TenantKey(name, key_id, secret, gateway, wanted)

    return run(go())


def _for_key(binding: AclBinding, key_id: str) -> AclBinding:
    """Bindings written with principal "KEY" are for the key being made."""
    from dataclasses import replace

    return replace(binding, principal=key_id) if binding.principal == "KEY" else binding


def tenancy(etcd_url: str, action: Any) -> Any:
    """Run ``action(store)`` against the tenancy store (revoke a key, add a binding)."""

    async def go() -> Any:
        async with TenancyStore(etcd_url) as store:
            return await action(store)

    return run(go())


def limit_refusals(key: TenantKey, limit: str) -> float:
    """``shoal_gateway_limit_refusals_total`` of the key's tenant for ``limit``, as its
    gateway's /metrics shows it now (0 before the first refusal)."""
    with urllib.request.urlopen(key.gateway.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("shoal_gateway_limit_refusals_total{") and (
            f'tenant="{key.tenant}"' in line and f'limit="{limit}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def frame_size(data: bytes) -> int:
    return int(struct.unpack(">i", data[:4])[0])
