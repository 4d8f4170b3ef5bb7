"""A bare Kafka protocol client for tests that must send exactly the bytes they mean.

Requests are kio dataclasses encoded with a request header; responses are
decoded with kio. Tests use it for malformed input and for protocol details
(long-poll timing, exact error codes) that full clients hide.
"""

from __future__ import annotations

import io
import socket
import ssl
import struct
from typing import Any

from kio.index import load_payload_module
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType


def request_class(api_key: int, version: int, name: str | None = None) -> Any:
    module = load_payload_module(api_key, version, EntityType.request)
    if name is not None:
        return getattr(module, name)
    for value in vars(module).values():
        if (
            getattr(value, "__type__", None) is EntityType.request
            and value.__module__ == module.__name__
        ):
            return value
    raise LookupError(api_key)


def response_module(api_key: int, version: int) -> Any:
    return load_payload_module(api_key, version, EntityType.response)


def encode_request(request: Any, correlation_id: int, client_id: str = "raw-test") -> bytes:
    header_class = request.__header_schema__
    header = header_class(
        request_api_key=request.__api_key__,
        request_api_version=request.__version__,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    buf = io.BytesIO()
    entity_writer(header_class)(buf, header)
    entity_writer(type(request))(buf, request)
    body = buf.getvalue()
    return struct.pack(">i", len(body)) + body


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


class RawConnection:
    def __init__(
        self, bootstrap: str, timeout: float = 10, tls: ssl.SSLContext | None = None
    ) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname=host)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, request: Any) -> int:
        self.correlation_id += 1
        self.sock.sendall(encode_request(request, self.correlation_id))
        return self.correlation_id

    def read_frame(self) -> bytes:
        size = struct.unpack(">i", self._read_exactly(4))[0]
        return self._read_exactly(size)

    def _read_exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def receive(self, request_type: Any) -> tuple[int, Any]:
        """Read one response to a request of ``request_type``: (correlation id, body)."""
        data = self.read_frame()
        correlation_id = struct.unpack_from(">i", data)[0]
        offset = 4
        flexible = request_type.__flexible__ and request_type.__api_key__ != 18
        if flexible:
            offset += 1  # empty tagged fields of response header v1
        module = response_module(request_type.__api_key__, request_type.__version__)
        response_type = next(
            v
            for v in vars(module).values()
            if getattr(v, "__type__", None) is EntityType.response
            and v.__module__ == module.__name__
        )
        body, _ = entity_reader(response_type)(data, offset)
        return correlation_id, body

    def call(self, request: Any) -> Any:
        sent = self.send(request)
        correlation_id, body = self.receive(type(request))
        assert correlation_id == sent
        return body

    def is_closed_by_peer(self, timeout: float = 5) -> bool:
        """True if the broker closed the connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
