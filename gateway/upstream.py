"""A Kafka connection from the gateway to one broker's internal listener.

Two uses: a client session forwards frames and reads answers in order
(:meth:`send`, :meth:`read_frame`), and the gateway's own control connection
asks questions (:meth:`call`) - Metadata, ApiVersions, validate-only
CreateTopics - one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from typing import Any, Final

from shoal.wire import ApiSchema, decode_response, encode_request

_SIZE: Final = struct.Struct(">i")
CLIENT_ID: Final = "shoal-gateway"


class UpstreamError(ConnectionError):
    """The broker could not be reached, or the connection broke."""


class BrokerConnection:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.address = address
        self._correlation = itertools.count(1)
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, host: str, port: int, timeout_s: float = 5.0) -> BrokerConnection:
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, port, limit=2**20)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"broker {host}:{port} is unreachable: {exc}") from exc
        return cls(reader, writer, f"{host}:{port}")

    def send(self, frame: bytes) -> None:
        self._writer.write(frame)

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except OSError as exc:
            raise UpstreamError(f"broker {self.address}: {exc}") from exc

    async def read_frame(self) -> bytes:
        try:
            head = await self._reader.readexactly(_SIZE.size)
            (size,) = _SIZE.unpack(head)
            return await self._reader.readexactly(size)
        except (asyncio.IncompleteReadError, OSError) as exc:
            raise UpstreamError(f"broker {self.address} closed the connection") from exc

    async def call(
        self, api: ApiSchema, body: Any, timeout_s: float = 10.0, client_id: str = CLIENT_ID
    ) -> Any:
        """Send one request and return the decoded response body."""
        async with self._lock:
            correlation_id = next(self._correlation)
            self.send(encode_request(api, correlation_id, client_id, body))
            try:
                async with asyncio.timeout(timeout_s):
                    await self.drain()
                    frame = await self.read_frame()
            except TimeoutError as exc:
                self.close()
                raise UpstreamError(f"broker {self.address} did not answer in time") from exc
            except BaseException:
                # Cancelled (an HTTP client went away) or broken between the request and
                # its answer: the answer may still arrive, and the next call would read it
                # as its own, so the connection cannot be used again.
                self.close()
                raise
            answered, response = decode_response(api, frame)
            if answered != correlation_id:
                self.close()
                raise UpstreamError(f"broker {self.address} answered out of order")
            return response

    @property
    def closed(self) -> bool:
        return self._writer.is_closing()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._writer.close()
