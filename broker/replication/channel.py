"""One Kafka-protocol connection from this broker to another, one request at a time.

Replica fetchers use it to call their leader (Fetch, OffsetForLeaderEpoch).
Requests and responses go through :mod:`shoal.wire`'s kio adapter; this
module only moves frames. Any failure closes the channel; the caller opens a
new one (the peer may have restarted at another address).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any, Final

from shoal.wire import (
    ApiSchema,
    FrameSizeError,
    MalformedRequestError,
    decode_response,
    encode_request,
)

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES: Final = 256 * 1024 * 1024


class ChannelError(Exception):
    """The peer could not be reached, went away, or answered nonsense."""


class KafkaChannel:
    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation_id = 0

    @property
    def is_open(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def open(self, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise ChannelError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc

    async def call(self, api: ApiSchema, body: Any, timeout_s: float) -> Any:
        """Send one request and return the decoded response body."""
        if self._reader is None or self._writer is None:
            raise ChannelError("channel is not open")
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        correlation_id = self._correlation_id
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can lose a
        # cancellation that lands as the answer arrives, and a fetcher being
        # stopped would then keep fetching.
        try:
            async with asyncio.timeout(timeout_s):
                self._writer.write(encode_request(api, correlation_id, self.client_id, body))
                await self._writer.drain()
                (size,) = _SIZE.unpack(await self._reader.readexactly(4))
                if not 4 <= size <= MAX_RESPONSE_BYTES:
                    raise FrameSizeError(f"response frame of {size} bytes")
                frame = await self._reader.readexactly(size)
            answered, response = decode_response(api, frame)
        except (
            OSError,
            TimeoutError,
            asyncio.IncompleteReadError,
            FrameSizeError,
            MalformedRequestError,
        ) as exc:
            await self.close()
            raise ChannelError(f"{self.host}:{self.port}: {exc!r}") from exc
        if answered != correlation_id:
            await self.close()
            raise ChannelError(f"{self.host}:{self.port} answered request {answered}")
        return response

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            # Never swallow a cancellation here: a fetcher being stopped while
            # it closes a failed channel would otherwise retry forever.
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class PeerLink:
    """The channel to one peer role (a partition's leader, the controller) whose
    address may change: reused while open at the same address, else replaced."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self._channel: KafkaChannel | None = None

    async def to(self, host: str, port: int, timeout_s: float) -> KafkaChannel:
        channel = self._channel
        if channel is not None and channel.is_open and (channel.host, channel.port) == (host, port):
            return channel
        if channel is not None:
            await channel.close()
        channel = KafkaChannel(host, port, self.client_id)
        await channel.open(timeout_s)
        self._channel = channel
        return channel

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
