"""A small blocking Kafka client for the admin requests confluent-kafka lacks.

confluent-kafka's AdminClient has no ListTransactions, DescribeTransactions
or DescribeProducers (KIP-664), so ``shoal txn`` sends them itself, with
:mod:`shoal.wire`'s codec, the way Kafka's Admin client does: Metadata to
learn the brokers (and partition leaders), FindCoordinator for a
transactional id, then the request to the broker that can answer it.

It reads the same librdkafka properties as every other command
(``client.properties``): ``bootstrap.servers``, ``security.protocol``
(PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``sasl.mechanism`` (PLAIN only:
what a gateway key is), ``sasl.username``/``sasl.password``,
``ssl.ca.location``, ``enable.ssl.certificate.verification`` and
``ssl.endpoint.identification.algorithm``. Through the gateway the brokers'
addresses it learns are the gateway's ports for them, so the same code serves
an operator on the brokers and a tenant on the gateway.

One connection per broker, one request at a time on each; a connection is
closed with the client.
"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from shoal.wire import ErrorCode, decode_response, encode_request, schema

CLIENT_ID: Final = "shoal-cli"
TIMEOUT_S: Final = 30.0
SASL_HANDSHAKE: Final = 17
SASL_AUTHENTICATE: Final = 36
METADATA: Final = 3
FIND_COORDINATOR: Final = 10
TRANSACTION_KEY: Final = 1
_SIZE: Final = struct.Struct(">i")
_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class WireAdminError(Exception):
    """A request could not be made or was refused; the message is for the user."""


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int


class _Connection:
    def __init__(self, sock: socket.socket, address: str) -> None:
        self._sock = sock
        self._address = address
        self._correlation = 0

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        api = schema(api_key, version)
        self._correlation += 1
        try:
            self._sock.sendall(
                encode_request(api, self._correlation, CLIENT_ID, api.request(**fields))
            )
            (size,) = _SIZE.unpack(self._read(_SIZE.size))
            answered, body = decode_response(api, self._read(size))
        except OSError as exc:
            raise WireAdminError(f"{self._address}: {exc}") from exc
        if answered != self._correlation:
            raise WireAdminError(f"{self._address} answered out of order")
        return body

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self._sock.recv(min(left, 1 << 20))
            if not chunk:
                raise WireAdminError(f"{self._address} closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self._sock.close()


class WireAdmin:
    """Requests to the cluster that ``config`` (librdkafka properties) reaches."""

    def __init__(self, config: Mapping[str, Any], timeout_s: float = TIMEOUT_S) -> None:
        self._config = {k: str(v) for k, v in config.items() if isinstance(v, str | int)}
        protocol = self._config.get("security.protocol", "PLAINTEXT").upper()
        if protocol not in _PROTOCOLS:
            raise WireAdminError(f"security.protocol {protocol} is not supported")
        self._tls = protocol.endswith("SSL")
        self._sasl = protocol.startswith("SASL")
        mechanism = self._config.get("sasl.mechanism", self._config.get("sasl.mechanisms", "PLAIN"))
        if self._sasl and mechanism.upper() != "PLAIN":
            raise WireAdminError(f"sasl.mechanism {mechanism} is not supported here; use PLAIN")
        self._timeout_s = timeout_s
        self._connections: dict[int | None, _Connection] = {}
        self._brokers: dict[int, Broker] = {}

    def __enter__(self) -> WireAdmin:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    # Connections

    def _connect(self, host: str, port: int) -> _Connection:
        address = f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=self._timeout_s)
            if self._tls:
                sock = self._ssl_context().wrap_socket(sock, server_hostname=host)
        except OSError as exc:
            raise WireAdminError(f"cannot connect to {address}: {exc}") from exc
        connection = _Connection(sock, address)
        if self._sasl:
            self._authenticate(connection, address)
        return connection

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self._config.get("ssl.ca.location"))
        if self._config.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
            context.check_hostname = False
        if self._config.get("enable.ssl.certificate.verification", "true").lower() == "false":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def _authenticate(self, connection: _Connection, address: str) -> None:
        handshake = connection.call(SASL_HANDSHAKE, 1, mechanism="PLAIN")
        if handshake.error_code != ErrorCode.none:
            raise WireAdminError(f"{address}: SASL handshake: {handshake.error_code.name}")
        username = self._config.get("sasl.username", "")
        password = self._config.get("sasl.password", "")
        auth = connection.call(
            SASL_AUTHENTICATE, 2, auth_bytes=f"\0{username}\0{password}".encode()
        )
        if auth.error_code != ErrorCode.none:
            message = auth.error_message or auth.error_code.name
            raise WireAdminError(f"{address}: authentication failed: {message}")

    def _bootstrap(self) -> _Connection:
        connection = self._connections.get(None)
        if connection is not None:
            return connection
        failures = []
        for server in self._config.get("bootstrap.servers", "").split(","):
            host, _, port = server.strip().rpartition(":")
            try:
                connection = self._connect(host.strip("[]"), int(port))
            except (WireAdminError, ValueError) as exc:
                failures.append(str(exc))
                continue
            self._connections[None] = connection
            return connection
        raise WireAdminError("no bootstrap server answered: " + "; ".join(failures))

    def call(self, node_id: int | None, api_key: int, version: int, **fields: Any) -> Any:
        """Send one request to broker ``node_id`` (None: a bootstrap server)."""
        if node_id is None:
            return self._bootstrap().call(api_key, version, **fields)
        connection = self._connections.get(node_id)
        if connection is None:
            broker = self.brokers().get(node_id)
            if broker is None:
                raise WireAdminError(f"broker {node_id} is not in the cluster's metadata")
            connection = self._connect(broker.host, broker.port)
            self._connections[node_id] = connection
        return connection.call(api_key, version, **fields)

    # Questions every command asks

    def metadata(self, topics: list[str] | None = None) -> Any:
        api = schema(METADATA, 12)
        response = self.call(
            None,
            METADATA,
            12,
            topics=None
            if topics is None
            else tuple(
                api.make_request("MetadataRequestTopic", name=t, topic_id=None) for t in topics
            ),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        self._brokers = {b.node_id: Broker(b.node_id, b.host, b.port) for b in response.brokers}
        return response

    def brokers(self) -> dict[int, Broker]:
        if not self._brokers:
            self.metadata([])
        return dict(self._brokers)

    def transaction_coordinator(self, transactional_id: str) -> int:
        response = self.call(
            None,
            FIND_COORDINATOR,
            4,
            key_type=TRANSACTION_KEY,
            coordinator_keys=(transactional_id,),
        )
        (coordinator,) = response.coordinators
        if coordinator.error_code != ErrorCode.none:
            raise WireAdminError(
                f"no coordinator for transactional id {transactional_id!r}:"
                f" {coordinator.error_code.name}"
            )
        self._brokers[coordinator.node_id] = Broker(
            coordinator.node_id, coordinator.host, coordinator.port
        )
        return int(coordinator.node_id)
