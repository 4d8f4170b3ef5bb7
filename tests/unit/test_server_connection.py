"""The connection layer on a real loopback socket: ordering, deferred answers, file regions,
closing."""

from __future__ import annotations

import asyncio
import os
import struct
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from shoal.broker.server.connection import (
    MAX_DEFERRED_ANSWERS,
    SENDFILE_MIN_BYTES,
    CloseConnectionError,
    ConnectionInfo,
    Deferred,
    KafkaConnection,
)

from shoal.wire import Chunk, FileRegion

Dispatch = Callable[[bytes | bytearray, ConnectionInfo], Awaitable[list[Chunk] | None]]


async def serve(dispatch: Dispatch, max_bytes: int = 1 << 20) -> tuple[asyncio.Server, int]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: KafkaConnection(dispatch, max_bytes), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


async def test_responses_come_back_in_request_order_even_when_handlers_take_turns() -> None:
    async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> list[Chunk]:
        await asyncio.sleep(0.01 * (data[0] % 3))
        return [frame(b"re:" + bytes(data))]

    server, port = await serve(dispatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(frame(bytes([i]) * 5) for i in range(40)))
    for i in range(40):
        assert await read_frame(reader) == b"re:" + bytes([i]) * 5
    writer.close()
    server.close()


async def test_file_regions_are_sent_exactly_large_ones_by_sendfile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sendfile_calls: list[int] = []
    real_sendfile = os.sendfile

    def counting_sendfile(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        sendfile_calls.append(count)
        return real_sendfile(out_fd, in_fd, offset, count)

    monkeypatch.setattr(os, "sendfile", counting_sendfile)
    content = os.urandom(3 * SENDFILE_MIN_BYTES + 17)
    with tempfile.TemporaryFile() as f:
        f.write(content)
        f.flush()
        big = FileRegion(f, 5, 2 * SENDFILE_MIN_BYTES)
        small = FileRegion(f, 100, 50)

        async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> list[Chunk]:
            total = 3 + big.size + small.size
            return [struct.pack(">i", total) + b"abc", big, small]

        server, port = await serve(dispatch)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):
            writer.write(frame(b"fetch"))
            body = await read_frame(reader)
            assert body == b"abc" + content[5 : 5 + big.size] + content[100:150]
        assert sendfile_calls, "large regions must go out by sendfile (zero-copy)"
        writer.close()
        server.close()


async def test_the_bytes_between_sendfiles_go_out_in_one_write_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes: list[int] = []
    real_write = asyncio.selector_events._SelectorSocketTransport.write  # type: ignore[attr-defined]

    def counting_write(self: asyncio.Transport, data: bytes) -> None:
        writes.append(len(data))
        real_write(self, data)

    monkeypatch.setattr(
        asyncio.selector_events._SelectorSocketTransport,  # type: ignore[attr-defined]
        "write",
        counting_write,
    )
    content = os.urandom(3 * SENDFILE_MIN_BYTES)
    with tempfile.TemporaryFile() as f:
        f.write(content)
        f.flush()
        small, big, tail = (
            FileRegion(f, 7, 40),
            FileRegion(f, 100, 2 * SENDFILE_MIN_BYTES),
            (FileRegion(f, 50, 9)),
        )
        parts = [b"ab", small, b"cd", big, tail, b"ef"]
        expected = b"ab" + content[7:47] + b"cd" + content[100 : 100 + big.size]
        expected += content[50:59] + b"ef"

        async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> list[Chunk]:
            return [struct.pack(">i", len(expected)), *parts]

        server, port = await serve(dispatch)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame(b"fetch"))
        writes.clear()  # the client's own
        assert await read_frame(reader) == expected
        # Length, bytes, small region and bytes before the sendfile; region and
        # bytes after it.
        assert writes == [4 + 2 + 40 + 2, 9 + 2]
        writer.close()
        server.close()


async def test_a_frame_above_the_limit_closes_only_that_connection() -> None:
    async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> list[Chunk]:
        return [frame(b"ok")]

    server, port = await serve(dispatch, max_bytes=1000)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    other_reader, other_writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(struct.pack(">i", 5000) + b"x" * 100)
    assert await reader.read() == b""
    other_writer.write(frame(b"hello"))
    assert await read_frame(other_reader) == b"ok"
    other_writer.close()
    server.close()


async def test_a_dispatcher_refusal_closes_the_connection_after_earlier_answers() -> None:
    async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> list[Chunk] | None:
        if data == b"bad":
            raise CloseConnectionError("refused")
        if data == b"silent":
            return None
        return [frame(bytes(data))]

    server, port = await serve(dispatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(frame(b"one") + frame(b"silent") + frame(b"two") + frame(b"bad") + frame(b"three"))
    assert await read_frame(reader) == b"one"
    assert await read_frame(reader) == b"two"
    assert await reader.read() == b""
    server.close()


async def test_many_pipelined_requests_are_all_answered() -> None:
    count = 2000

    async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> list[Chunk]:
        return [frame(bytes(data))]

    server, port = await serve(dispatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(frame(struct.pack(">i", i) * 50) for i in range(count)))
    for i in range(count):
        assert await read_frame(reader) == struct.pack(">i", i) * 50
    writer.close()
    server.close()


async def serve_deferring(
    dispatch: Callable[[bytes | bytearray, ConnectionInfo], Awaitable[Any]],
) -> tuple[asyncio.Server, int]:
    """A server whose requests starting with ``p`` (a produce) may overtake deferred answers."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: KafkaConnection(dispatch, 1 << 20, lambda f: bytes(f[:1]) == b"p"),
        "127.0.0.1",
        0,
    )
    return server, server.sockets[0].getsockname()[1]


async def test_produces_are_handled_while_earlier_answers_wait_and_answered_in_order() -> None:
    loop = asyncio.get_running_loop()
    commits: dict[bytes, asyncio.Future[None]] = {}
    all_handled = asyncio.Event()

    async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> Deferred:
        name = bytes(data)
        commit = commits[name] = loop.create_future()
        if len(commits) == 3:
            all_handled.set()

        async def answer() -> list[Chunk]:
            await commit
            return [frame(b"re:" + name)]

        return asyncio.ensure_future(answer())

    server, port = await serve_deferring(dispatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(frame(b"p1") + frame(b"p2") + frame(b"p3"))
    async with asyncio.timeout(5):
        await all_handled.wait()
    # The last commits first; nothing may go out before p1's answer.
    commits[b"p3"].set_result(None)
    commits[b"p2"].set_result(None)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await read_frame(reader)
    commits[b"p1"].set_result(None)
    assert [await read_frame(reader) for _ in range(3)] == [b"re:p1", b"re:p2", b"re:p3"]
    writer.close()
    server.close()


async def test_other_requests_wait_until_earlier_deferred_answers_are_sent() -> None:
    loop = asyncio.get_running_loop()
    commit: asyncio.Future[None] = loop.create_future()
    handled: list[bytes] = []

    async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> Deferred | list[Chunk]:
        name = bytes(data)
        handled.append(name)
        if name == b"p1":

            async def answer() -> list[Chunk]:
                await commit
                return [frame(b"re:p1")]

            return asyncio.ensure_future(answer())
        return [frame(b"re:" + name)]

    server, port = await serve_deferring(dispatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(frame(b"p1") + frame(b"p2") + frame(b"list-offsets") + frame(b"p3"))
    await asyncio.sleep(0.1)
    assert handled == [b"p1", b"p2"], "a request that is not a produce waits for p1's answer"
    commit.set_result(None)
    answers = [await read_frame(reader) for _ in range(4)]
    assert answers == [b"re:p1", b"re:p2", b"re:list-offsets", b"re:p3"]
    assert handled == [b"p1", b"p2", b"list-offsets", b"p3"]
    writer.close()
    server.close()


async def test_a_connection_owes_a_bounded_number_of_answers() -> None:
    loop = asyncio.get_running_loop()
    release: asyncio.Future[None] = loop.create_future()
    handled = 0

    async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> Deferred:
        nonlocal handled
        handled += 1

        async def answer() -> list[Chunk]:
            await release
            return [frame(bytes(data))]

        return asyncio.ensure_future(answer())

    server, port = await serve_deferring(dispatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    count = MAX_DEFERRED_ANSWERS + 5
    writer.write(b"".join(frame(b"p%d" % i) for i in range(count)))
    await asyncio.sleep(0.1)
    assert handled == MAX_DEFERRED_ANSWERS
    release.set_result(None)
    assert [await read_frame(reader) for _ in range(count)] == [b"p%d" % i for i in range(count)]
    writer.close()
    server.close()


async def test_a_refusal_after_a_deferred_answer_closes_the_connection_once_it_is_sent() -> None:
    loop = asyncio.get_running_loop()
    commit: asyncio.Future[None] = loop.create_future()

    async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> Deferred:
        if bytes(data) == b"p-bad":
            loop.call_later(0.05, commit.set_result, None)
            raise CloseConnectionError("acks=0 produce failed")

        async def answer() -> list[Chunk]:
            await commit
            return [frame(b"re:" + bytes(data))]

        return asyncio.ensure_future(answer())

    server, port = await serve_deferring(dispatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(frame(b"p1") + frame(b"p-bad") + frame(b"p2"))
    assert await read_frame(reader) == b"re:p1"
    assert await reader.read() == b""
    server.close()


async def test_a_failed_deferred_answer_closes_the_connection() -> None:
    async def dispatch(data: bytes | bytearray, info: ConnectionInfo) -> Deferred:
        async def answer() -> list[Chunk]:
            raise RuntimeError("the handler broke")

        return asyncio.ensure_future(answer())

    server, port = await serve_deferring(dispatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(frame(b"p1"))
    assert await reader.read() == b""
    server.close()
