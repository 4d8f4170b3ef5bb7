"""A TCP proxy that cuts every connection through it, again and again, on command.

It runs an asyncio loop in a thread: clients connect to ``port``, the proxy
connects them on to the target and copies bytes both ways. ``cut()`` resets
every live connection at once (both sides, mid-request or mid-response),
which is what a flaky network or a load balancer timing out does to a
producer. ``cut_after_next_produce_response()`` waits for the target's next
answer to a Produce request, drops it, and then resets everything: the
batch was stored but its acknowledgement is lost, so the client must retry
something the server already did. For that the proxy reads the Kafka
framing (size prefix, then the request header's api key and correlation id).
A broker that advertises the proxy's address keeps its clients coming
through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading

PRODUCE_API_KEY = 0


class ChaosProxy:
    def __init__(self, target_port: int, port: int) -> None:
        self.target_port = target_port
        self.port = port
        self.cuts = 0
        self.lost_responses = 0
        self._swallow = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ChaosProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._reset_all()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        produce_requests: set[int] = set()
        await asyncio.gather(
            self._forward_requests(reader, up_writer, produce_requests),
            self._forward_responses(up_reader, writer, produce_requests),
            return_exceptions=True,
        )
        self._writers -= {writer, up_writer}

    async def _forward_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, produce: set[int]
    ) -> None:
        try:
            while frame := await _read_frame(reader):
                api_key, _version, correlation_id = struct.unpack_from(">hhi", frame, 4)
                if api_key == PRODUCE_API_KEY:
                    produce.add(correlation_id)
                writer.write(frame)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _forward_responses(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, produce: set[int]
    ) -> None:
        try:
            while frame := await _read_frame(reader):
                (correlation_id,) = struct.unpack_from(">i", frame, 4)
                if correlation_id in produce:
                    produce.discard(correlation_id)
                    if self._swallow:
                        self._swallow = False
                        self.lost_responses += 1
                        self._reset_all()
                        return
                writer.write(frame)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def _reset_all(self) -> None:
        for writer in list(self._writers):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        if self._writers:
            self.cuts += 1
        self._writers.clear()

    def cut(self) -> None:
        """Reset every connection passing through now."""
        self._loop.call_soon_threadsafe(self._reset_all)

    def cut_after_next_produce_response(self) -> None:
        """Drop the target's next Produce response, then reset every connection."""

        def arm() -> None:
            self._swallow = True

        self._loop.call_soon_threadsafe(arm)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    """One whole Kafka frame, size prefix included; empty at end of stream."""
    try:
        prefix = await reader.readexactly(4)
        (size,) = struct.unpack(">i", prefix)
        return prefix + await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        return b""
