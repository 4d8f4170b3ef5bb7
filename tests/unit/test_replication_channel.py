"""The broker-to-broker channel: responses in pieces, large and small, and peers that misbehave."""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import pytest
from shoal.broker.replication.channel import MAX_RESPONSE_BYTES, ChannelError, KafkaChannel

from shoal.wire import ErrorCode, RequestHeader, encode_response, schema

FETCH = schema(1, 12)

Answer = Callable[[asyncio.StreamWriter, int], Awaitable[None]]


def fetch_request() -> object:
    return FETCH.request(
        cluster_id=None,
        replica_id=1,
        max_wait=timedelta(0),
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(),
        forgotten_topics_data=(),
        rack_id="",
    )


def fetch_response(correlation_id: int, records: bytes) -> bytes:
    """A Fetch v12 response frame carrying ``records`` for t-0."""
    partition = FETCH.make(
        "PartitionData",
        partition_index=0,
        error_code=ErrorCode.none,
        high_watermark=7,
        last_stable_offset=7,
        log_start_offset=0,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=records,
    )
    body = FETCH.response(
        throttle_time=timedelta(0),
        error_code=ErrorCode.none,
        session_id=42,
        responses=(FETCH.make("FetchableTopicResponse", topic="t", partitions=(partition,)),),
    )
    (frame,) = encode_response(RequestHeader(1, 12, correlation_id, "test"), FETCH, body)
    assert isinstance(frame, bytes)
    return frame


async def serve(answer: Answer) -> AsyncIterator[KafkaChannel]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with pytest.raises(asyncio.IncompleteReadError):
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                await answer(writer, struct.unpack_from(">i", frame, 4)[0])
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channel = KafkaChannel("127.0.0.1", port, "test")
    await channel.open(5)
    try:
        yield channel
    finally:
        await channel.close()
        server.close()


async def in_pieces(writer: asyncio.StreamWriter, frame: bytes, piece: int) -> None:
    for start in range(0, len(frame), piece):
        writer.write(frame[start : start + piece])
        await writer.drain()
        await asyncio.sleep(0)


@pytest.mark.parametrize("size", [0, 100, 300_000, 3_000_000])
async def test_a_response_sent_in_pieces_arrives_whole(size: int) -> None:
    records = os.urandom(size)

    async def answer(writer: asyncio.StreamWriter, correlation_id: int) -> None:
        await in_pieces(writer, fetch_response(correlation_id, records), 7_001)

    async for channel in serve(answer):
        # Both kept: the second is received into the buffer the first came in.
        responses = [await channel.call(FETCH, fetch_request(), 10) for _ in range(2)]
        for response in responses:
            (topic,) = response.responses
            assert bytes(topic.partitions[0].records or b"") == records
            assert response.session_id == 42


async def test_a_peer_that_closes_mid_response_is_a_channel_error() -> None:
    async def answer(writer: asyncio.StreamWriter, correlation_id: int) -> None:
        writer.write(fetch_response(correlation_id, b"x" * 1000)[:500])
        await writer.drain()
        writer.close()

    async for channel in serve(answer):
        with pytest.raises(ChannelError, match="closed"):
            await channel.call(FETCH, fetch_request(), 10)
        assert not channel.is_open


async def test_a_frame_size_out_of_bounds_is_a_channel_error() -> None:
    async def answer(writer: asyncio.StreamWriter, correlation_id: int) -> None:
        writer.write(struct.pack(">i", MAX_RESPONSE_BYTES + 1))
        await writer.drain()

    async for channel in serve(answer):
        with pytest.raises(ChannelError, match="response frame"):
            await channel.call(FETCH, fetch_request(), 10)
        assert not channel.is_open


async def test_an_answer_to_another_request_is_a_channel_error() -> None:
    async def answer(writer: asyncio.StreamWriter, correlation_id: int) -> None:
        writer.write(fetch_response(correlation_id + 1, b""))
        await writer.drain()

    async for channel in serve(answer):
        with pytest.raises(ChannelError, match="answered request"):
            await channel.call(FETCH, fetch_request(), 10)


async def test_a_silent_peer_times_out() -> None:
    async def answer(writer: asyncio.StreamWriter, correlation_id: int) -> None:
        return None

    async for channel in serve(answer):
        with pytest.raises(ChannelError, match="TimeoutError"):
            await channel.call(FETCH, fetch_request(), 0.2)
        assert not channel.is_open


async def test_callers_sharing_a_channel_take_turns() -> None:
    async def answer(writer: asyncio.StreamWriter, correlation_id: int) -> None:
        await asyncio.sleep(0.01)
        await in_pieces(writer, fetch_response(correlation_id, b"r%d" % correlation_id), 3)

    async for channel in serve(answer):
        responses = await asyncio.gather(
            *(channel.call(FETCH, fetch_request(), 10) for _ in range(5))
        )
        records = sorted(bytes(r.responses[0].partitions[0].records) for r in responses)
        assert records == [b"r%d" % i for i in range(1, 6)]


async def test_a_call_cancelled_with_its_request_out_drops_the_connection() -> None:
    request_in = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, correlation_id: int) -> None:
        request_in.set()
        await asyncio.sleep(0.2)
        writer.write(fetch_response(correlation_id, b"late"))
        await writer.drain()

    async for channel in serve(answer):
        call = asyncio.create_task(channel.call(FETCH, fetch_request(), 10))
        await request_in.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # The late answer can never be taken for a later request's.
        assert not channel.is_open
        with pytest.raises(ChannelError, match="not open"):
            await channel.call(FETCH, fetch_request(), 1)
