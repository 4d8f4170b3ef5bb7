"""The server side of TLS on an accepted connection, run by hand on memory BIOs.

Written here rather than left to asyncio (``ssl=`` on the server, or
``StreamWriter.start_tls``) for one reason: when OpenSSL refuses a client
certificate it writes the alert saying why (``unknown_ca``,
``certificate_expired``), and asyncio's SSL transport closes the socket
without sending it. Kafka clients then see a bare disconnect, which librdkafka
reports as a possible protocol mismatch and the Java client as a network
error, where on Kafka's SSL listener they report an authentication failure
(``SslAuthenticationException``). Here the alert is flushed before the close.

The work per byte is asyncio's own (it too drives an ``SSLObject`` over memory
BIOs in Python); only the mutual-TLS listener uses this.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any, Final

_CHUNK: Final = 65536


class TlsStream:
    """A TLS session over an accepted connection: ``readexactly`` for the reading
    side, ``write``/``drain``/``close`` for the writing side, as the stream pair
    they replace. One task reads and one writes; neither blocks the other."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.ssl_object = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._plain = bytearray()

    async def handshake(self) -> None:
        """Complete the handshake; raises :class:`ssl.SSLError` (after sending the
        alert) if it fails, :class:`asyncio.IncompleteReadError` if the client goes away."""
        while True:
            try:
                self.ssl_object.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                await self._receive()
            except ssl.SSLError:
                with contextlib.suppress(ConnectionError):
                    await self._flush()
                raise
            else:
                await self._flush()
                return

    async def readexactly(self, n: int) -> bytes:
        while len(self._plain) < n:
            try:
                chunk = self.ssl_object.read(_CHUNK)
            except ssl.SSLWantReadError:
                # TLS 1.3 may have something to say first (a key update's answer).
                await self._flush()
                await self._receive(partial=bytes(self._plain), expected=n)
                continue
            except ssl.SSLZeroReturnError:
                chunk = b""
            if not chunk:  # the client's close_notify
                raise asyncio.IncompleteReadError(bytes(self._plain), n)
            self._plain += chunk
        data = bytes(self._plain[:n])
        del self._plain[:n]
        return data

    def write(self, data: bytes) -> None:
        self.ssl_object.write(data)
        self._writer.write(self._outgoing.read())

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        with contextlib.suppress(ssl.SSLError):
            self.ssl_object.unwrap()  # queues close_notify; never waits for the client's
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._writer.write(self._outgoing.read())
        self._writer.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self.ssl_object
        return self._writer.get_extra_info(name, default)

    async def _flush(self) -> None:
        data = self._outgoing.read()
        if data:
            self._writer.write(data)
            await self._writer.drain()

    async def _receive(self, partial: bytes = b"", expected: int = 0) -> None:
        data = await self._reader.read(_CHUNK)
        if not data:
            raise asyncio.IncompleteReadError(partial, expected)
        self._incoming.write(data)
