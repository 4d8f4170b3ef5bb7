"""A buffered produce body of several records reaches the stream parser in slices.

The event loop gets to run between slices, as between a chunked body's chunks,
so a 64 MiB body does not hold it for the whole split-and-encode.
"""

from __future__ import annotations

import asyncio

from shoal.gateway.http.encoding import ObjectStream
from shoal.gateway.http.records import MAX_OBJECT_BYTES
from shoal.gateway.http.routes import BODY_SLICE_BYTES, _slices


async def test_a_buffered_body_is_sliced_and_the_loop_runs_between_slices() -> None:
    record = b'{"value": {"type": "STRING", "data": "%s"}}\n' % (b"x" * 1000)
    body = record * (3 * BODY_SLICE_BYTES // len(record) + 7)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    background = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    chunks: list[bytes] = []
    seen_ticks: list[int] = []
    async for chunk in _slices(body):
        chunks.append(chunk)
        seen_ticks.append(ticks)
    background.cancel()

    assert b"".join(chunks) == body
    assert len(chunks) == 4
    assert all(len(c) <= BODY_SLICE_BYTES for c in chunks)
    assert seen_ticks == sorted(set(seen_ticks))  # the ticker ran before every next slice

    stream = ObjectStream(MAX_OBJECT_BYTES)
    texts = [text for chunk in chunks for text in stream.feed(chunk)]
    stream.close()
    assert len(texts) == body.count(b"\n")  # objects cut across slices come out whole


async def test_an_empty_body_gives_no_slice() -> None:
    assert [c async for c in _slices(b"")] == []
