"""One client connection: frames in, requests handled in order, responses out in order.

A thin ``asyncio.BufferedProtocol`` (cheaper per request than streams):
received bytes land in the :class:`~shoal.wire.FrameReader`'s buffers, whole
frames go to a queue, and one task per connection handles them strictly in
order, as Kafka handles a connection's requests one at a time. Clients may
pipeline as much as they like; reading pauses while too many requests wait.

One exception to one-at-a-time, for the answers that only wait: a dispatcher
may answer with a future (a Deferred) once the request's work in order is
done - an acks=all produce once its batches are appended, waiting only for
the followers. Requests the dispatcher lets ``overtake`` (produces) are then
handled while it waits, so a producer with several requests in flight gets
its appends replicated together instead of one replication round after
another (Kafka mutes the connection until the answer, which caps one
connection's acks=all produces at one per round trip to the followers). Any
other request waits until every deferred answer before it has been sent, so
it sees the connection's earlier requests finished, as in Kafka.

Responses are written in request order: file regions with ``loop.sendfile``
(zero-copy on plain TCP with the standard event loop; asyncio falls back to
reading and writing elsewhere), and the bytes between them in one
``transport.write`` each. Small regions are read and joined to those bytes,
where a system call round is cheaper than sendfile's setup.

Anything wrong with a frame (too large, undecodable, an unknown API) closes
this connection only; the dispatcher decides which.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

from shoal.wire import Chunk, FileRegion, FrameReader, FrameSizeError

log = logging.getLogger(__name__)

MAX_QUEUED_REQUESTS: Final = 64
MAX_DEFERRED_ANSWERS: Final = 16
"""Answers a connection may owe at once; each holds its request's body until it is sent."""
SENDFILE_MIN_BYTES: Final = 64 * 1024


class CloseConnectionError(Exception):
    """Raised by a dispatcher to drop the connection (Kafka's answer to bad input)."""


Frame = bytes | bytearray | memoryview
Answer = list[Chunk] | None
"""A response's chunks, or None for a request that gets no response (acks=0)."""
Deferred = asyncio.Future[Answer]
"""An answer still to come; the request's work in order is done."""
Dispatch = Callable[[Frame, "ConnectionInfo"], Awaitable[Answer | Deferred]]


def _never(_frame: Frame) -> bool:
    return False


class ConnectionInfo:
    """What handlers may know of the peer."""

    def __init__(self, peer: str, connection_id: int) -> None:
        self.peer = peer
        self.connection_id = connection_id


class KafkaConnection(asyncio.BufferedProtocol):
    _next_id = 0

    def __init__(
        self,
        dispatch: Dispatch,
        max_request_bytes: int,
        overtakes: Callable[[Frame], bool] = _never,
    ) -> None:
        """``overtakes`` says which requests may be handled while earlier ones' deferred
        answers wait."""
        self._dispatch = dispatch
        self._overtakes = overtakes
        self._frames = FrameReader(max_request_bytes)
        self._queue: asyncio.Queue[Frame] = asyncio.Queue()
        self._transport: asyncio.Transport | None = None
        self._worker: asyncio.Task[None] | None = None
        # Once an answer is deferred, every answer after it queues here, in request
        # order, until the sender has sent the ones before it.
        self._owed: deque[Deferred] = deque()
        self._sender: asyncio.Task[None] | None = None
        self._answer_sent = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading_paused = False
        self._closed = False
        self.on_close: Callable[[KafkaConnection], None] | None = None
        KafkaConnection._next_id += 1
        self.info = ConnectionInfo("?", KafkaConnection._next_id)

    # -- asyncio callbacks -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.info.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._worker = asyncio.get_running_loop().create_task(
            self._work(), name=f"conn-{self.info.connection_id}"
        )

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._frames.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self._frames.received(nbytes)
        except FrameSizeError as exc:
            log.warning("event=connection_closed peer=%s reason=%s", self.info.peer, exc)
            self.close()
            return
        for frame in frames:
            self._queue.put_nowait(frame)
        if self._queue.qsize() >= MAX_QUEUED_REQUESTS and not self._reading_paused:
            assert self._transport is not None
            self._transport.pause_reading()
            self._reading_paused = True

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._writable.set()
        if self._worker is not None:
            self._worker.cancel()
        if self._sender is not None:
            self._sender.cancel()
        for answer in self._owed:
            answer.cancel()
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- work ------------------------------------------------------------------

    def close(self) -> None:
        if self._transport is not None and not self._closed:
            self._closed = True
            self._transport.close()

    @contextlib.contextmanager
    def _closed_on_failure(self) -> Iterator[None]:
        """Close this connection, and only it, on whatever breaks its work; log why."""
        try:
            yield
        except asyncio.CancelledError:
            pass
        except CloseConnectionError as exc:
            log.info("event=connection_closed peer=%s reason=%s", self.info.peer, exc)
            self.close()
        except (ConnectionError, OSError) as exc:
            log.info("event=connection_broken peer=%s error=%s", self.info.peer, exc)
            self.close()
        except Exception:
            log.exception("event=connection_failed peer=%s", self.info.peer)
            self.close()

    async def _work(self) -> None:
        with self._closed_on_failure():
            while not self._closed:
                frame = await self._queue.get()
                if self._reading_paused and self._queue.qsize() < MAX_QUEUED_REQUESTS // 2:
                    self._reading_paused = False
                    assert self._transport is not None
                    self._transport.resume_reading()
                # A request that may not overtake waits for the answers owed before it.
                settled = not self._owed or self._overtakes(frame)
                if not settled and not await self._owing_at_most(0):
                    return  # the sender failed: nothing more is handled
                try:
                    response = await self._dispatch(frame, self.info)
                except CloseConnectionError as exc:
                    await self._owing_at_most(0)
                    log.info("event=connection_closed peer=%s reason=%s", self.info.peer, exc)
                    self.close()
                    return
                if isinstance(response, asyncio.Future):
                    self._owe(response)
                    await self._owing_at_most(MAX_DEFERRED_ANSWERS - 1)
                elif self._owed:
                    ready: Deferred = asyncio.get_running_loop().create_future()
                    ready.set_result(response)
                    self._owe(ready)
                elif response is not None:
                    await self._send(response)

    def _owe(self, answer: Deferred) -> None:
        self._owed.append(answer)
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(
                self._send_owed(), name=f"conn-{self.info.connection_id}-answers"
            )

    async def _owing_at_most(self, count: int) -> bool:
        """Wait until at most ``count`` answers are owed; False if the connection closed."""
        while len(self._owed) > count and not self._closed:
            self._answer_sent.clear()
            await self._answer_sent.wait()
        return not self._closed

    async def _send_owed(self) -> None:
        """Send the owed answers in request order, each once it is ready."""
        try:
            with self._closed_on_failure():
                while self._owed and not self._closed:
                    answer = await self._owed[0]
                    if answer is not None:
                        await self._send(answer)
                    # Popped only once sent: while anything is owed, the worker writes nothing.
                    self._owed.popleft()
                    self._answer_sent.set()
        finally:
            self._sender = None
            self._answer_sent.set()

    async def _send(self, chunks: list[Chunk]) -> None:
        transport = self._transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        # Bytes up to the next sendfile go out in one write: a write is a system
        # call, and a fetch answer is bytes, records, bytes, ... per partition.
        pending: list[bytes] = []
        for chunk in chunks:
            if self._closed:
                return
            if not isinstance(chunk, FileRegion):
                pending.append(chunk)
            elif chunk.size >= SENDFILE_MIN_BYTES:
                _write(transport, pending)
                await loop.sendfile(transport, chunk.file, chunk.position, chunk.size)
            else:
                pending.append(os.pread(chunk.file.fileno(), chunk.size, chunk.position))
        _write(transport, pending)
        if not self._writable.is_set():
            await self._writable.wait()


def _write(transport: asyncio.Transport, pending: list[bytes]) -> None:
    """Write what ``pending`` holds, joined, and empty it."""
    if len(pending) == 1:
        transport.write(pending[0])
    elif pending:
        transport.write(b"".join(pending))
    pending.clear()
