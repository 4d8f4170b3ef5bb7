"""One Kafka-protocol connection from this broker to another, one request at a time.

Replica fetchers use it to call their leader (Fetch, OffsetForLeaderEpoch),
as do the transaction markers, verification and AlterPartition senders.
Requests and responses go through :mod:`shoal.wire`'s kio adapter; this
module only moves frames. Any failure closes the channel; the caller opens a
new one (the peer may have restarted at another address).

Responses are received as the broker's own listener receives requests: an
``asyncio.BufferedProtocol`` whose :class:`~shoal.wire.FrameReader` has the
kernel write into its buffers, so a follower's fetch response (most of the
bytes a follower handles) is copied once on its way in, not three times
(asyncio streams receive into a new bytes object, append it to their buffer,
and copy the frame out again: 18% of a follower's samples at full produce
rate, in ``benchmarks/``'s RF3 profile).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any, Final

from shoal.wire import (
    ApiSchema,
    FrameReader,
    FrameSizeError,
    MalformedRequestError,
    decode_response,
    encode_request,
)

MAX_RESPONSE_BYTES: Final = 256 * 1024 * 1024


class ChannelError(Exception):
    """The peer could not be reached, went away, or answered nonsense."""


class _ResponseFrames(asyncio.BufferedProtocol):
    """Whole response frames as they arrive; the connection's end as an error."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        # One request at a time: each response is decoded (records copied out) before the next.
        self._reader = FrameReader(MAX_RESPONSE_BYTES, reuse_large=True)
        self._frames: collections.deque[bytes | bytearray | memoryview] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended: Exception | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self._frames.extend(self._reader.received(nbytes))
        except FrameSizeError as exc:
            self._end(FrameSizeError(f"response frame: {exc}"))
            assert self.transport is not None
            self.transport.abort()
            return
        self._wake()

    def eof_received(self) -> bool:
        self._end(ConnectionResetError("connection closed by the peer"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or ConnectionResetError("connection closed"))
        self._writable.set()
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def closed(self) -> None:
        await asyncio.shield(self._lost)

    async def drained(self) -> None:
        await self._writable.wait()
        if self._ended is not None:
            raise self._ended

    async def next_frame(self) -> bytes | bytearray | memoryview:
        while not self._frames:
            if self._ended is not None:
                raise self._ended
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._frames.popleft()

    def _end(self, exc: Exception) -> None:
        if self._ended is None:
            self._ended = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class KafkaChannel:
    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self._protocol: _ResponseFrames | None = None
        self._correlation_id = 0
        self._turn = asyncio.Lock()

    @property
    def is_open(self) -> bool:
        protocol = self._protocol
        return (
            protocol is not None
            and protocol.transport is not None
            and not protocol.transport.is_closing()
        )

    async def open(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, self._protocol = await loop.create_connection(
                    _ResponseFrames, self.host, self.port
                )
        except (OSError, TimeoutError) as exc:
            raise ChannelError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc

    async def call(self, api: ApiSchema, body: Any, timeout_s: float) -> Any:
        """Send one request and return the decoded response body.

        A channel carries one request at a time; callers that share one (the
        controller forwarder serves every client connection) take turns.
        """
        async with self._turn:
            protocol = self._protocol
            if protocol is None or protocol.transport is None:
                raise ChannelError("channel is not open")
            self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
            correlation_id = self._correlation_id
            request = encode_request(api, correlation_id, self.client_id, body)
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can lose a
            # cancellation that lands as the answer arrives, and a fetcher being
            # stopped would then keep fetching.
            try:
                async with asyncio.timeout(timeout_s):
                    protocol.transport.write(request)
                    await protocol.drained()
                    frame = await protocol.next_frame()
                answered, response = decode_response(api, frame)
            except (OSError, TimeoutError, FrameSizeError, MalformedRequestError) as exc:
                self._abort()
                raise ChannelError(f"{self.host}:{self.port}: {exc!r}") from exc
            except BaseException:
                # Cancelled with the request out: its answer may still come, and would be
                # taken for the next request's (into a buffer the reader reuses).
                self._abort()
                raise
            if answered != correlation_id:
                self._abort()
                raise ChannelError(f"{self.host}:{self.port} answered request {answered}")
            return response

    def _abort(self) -> None:
        """Drop the connection at once: a failed channel's unsent bytes are worthless, and
        a close would wait for a peer that may have stopped reading."""
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.abort()

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is None or protocol.transport is None:
            return
        protocol.transport.close()
        # Never swallow a cancellation here: a fetcher being stopped while it
        # closes a failed channel would otherwise retry forever.
        with contextlib.suppress(OSError):
            await protocol.closed()


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
