"""FrameReader as asyncio.BufferedProtocol drives it.

Each test plays the transport: ask ``get_buffer()``, copy at most that many
bytes into the returned memoryview, then report them with ``received(n)``.
"""

from __future__ import annotations

import random
import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.wire import FrameReader, FrameSizeError
from shoal.wire.framing import STAGING_SIZE


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _deliver(reader: FrameReader, data: bytes, chunk: int | None = None) -> list[bytes]:
    """Feed ``data`` as the transport would, ``chunk`` bytes per receive at most."""
    frames: list[bytes] = []
    pos = 0
    while pos < len(data):
        buf = reader.get_buffer()
        assert len(buf) > 0, "the reader must always offer room for more bytes"
        n = min(len(buf), len(data) - pos)
        if chunk is not None:
            n = min(n, chunk)
        buf[:n] = data[pos : pos + n]
        pos += n
        frames.extend(bytes(f) for f in reader.received(n))
    return frames


def _bodies(count: int, seed: int, max_size: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(0, max_size)) for _ in range(count)]


def test_many_small_frames_in_one_receive_all_come_out_in_order() -> None:
    bodies = [f"request-{i}".encode() for i in range(500)]
    data = b"".join(_frame(b) for b in bodies)
    reader = FrameReader(max_frame_size=1 << 20)

    buf = reader.get_buffer()
    buf[: len(data)] = data
    frames = reader.received(len(data))

    assert [bytes(f) for f in frames] == bodies


def test_a_frame_split_byte_by_byte_comes_out_once_whole() -> None:
    body = bytes(range(256)) * 3
    reader = FrameReader(max_frame_size=1 << 20)
    data = _frame(body)
    results: list[list[bytes]] = []

    for i in range(len(data)):
        buf = reader.get_buffer()
        buf[:1] = data[i : i + 1]
        results.append([bytes(f) for f in reader.received(1)])

    assert results[:-1] == [[]] * (len(data) - 1)
    assert results[-1] == [body]


def test_size_prefix_split_across_receives() -> None:
    reader = FrameReader(max_frame_size=100)

    assert _deliver(reader, b"\x00\x00") == []
    assert _deliver(reader, b"\x00") == []
    assert _deliver(reader, b"\x03ab") == []
    assert _deliver(reader, b"c\x00\x00\x00\x01z") == [b"abc", b"z"]


def test_zero_size_frame_is_returned_as_empty() -> None:
    reader = FrameReader(max_frame_size=100)
    data = _frame(b"") + _frame(b"next") + _frame(b"")

    assert _deliver(reader, data) == [b"", b"next", b""]


def test_frame_of_exactly_max_frame_size_is_accepted() -> None:
    reader = FrameReader(max_frame_size=1_000)
    body = b"m" * 1_000

    assert _deliver(reader, _frame(body)) == [body]


def test_frame_one_byte_above_max_frame_size_raises() -> None:
    reader = FrameReader(max_frame_size=1_000)

    with pytest.raises(FrameSizeError, match="1001"):
        _deliver(reader, struct.pack(">i", 1_001))


@pytest.mark.parametrize("size", [-1, -(2**31)])
def test_negative_size_raises(size: int) -> None:
    reader = FrameReader(max_frame_size=1_000)

    with pytest.raises(FrameSizeError):
        _deliver(reader, struct.pack(">i", size))


def test_oversized_request_raises_on_its_prefix_before_its_body_arrives() -> None:
    """A client claiming 2 GB is refused after four bytes, with nothing allocated for it."""
    reader = FrameReader(max_frame_size=100 * 1024 * 1024)
    buf = reader.get_buffer()
    buf[:4] = struct.pack(">i", 2**31 - 1)

    with pytest.raises(FrameSizeError, match=re.escape("(socket.request.max.bytes)")):
        reader.received(4)


def test_oversized_frame_after_good_ones_raises() -> None:
    reader = FrameReader(max_frame_size=10)

    with pytest.raises(FrameSizeError):
        _deliver(reader, _frame(b"ok") + _frame(b"x" * 11))


def test_frame_size_error_is_a_value_error() -> None:
    assert issubclass(FrameSizeError, ValueError)


def test_large_frame_gets_a_buffer_of_its_own_sized_to_the_frame() -> None:
    """No copy: the transport writes straight into the frame that is returned."""
    body = random.Random(1).randbytes(STAGING_SIZE * 4)
    data = _frame(body)
    reader = FrameReader(max_frame_size=len(body))

    first = reader.get_buffer()
    first[:1_000] = data[:1_000]
    assert reader.received(1_000) == []

    large = reader.get_buffer()
    assert len(large) == len(body) - (1_000 - 4)
    large[:] = data[1_000:]
    frames = reader.received(len(large))

    assert len(frames) == 1
    assert frames[0] == body
    assert large.obj is frames[0]


def test_large_frame_buffer_never_reaches_into_the_next_frame() -> None:
    big = b"B" * 5_000
    data = _frame(big) + _frame(b"after")
    reader = FrameReader(max_frame_size=10_000, staging_size=1_024)
    offered: list[int] = []
    frames: list[bytes] = []
    pos = 0

    while pos < len(data):
        buf = reader.get_buffer()
        offered.append(len(buf))
        n = min(len(buf), len(data) - pos)
        buf[:n] = data[pos : pos + n]
        pos += n
        frames.extend(bytes(f) for f in reader.received(n))

    assert frames == [big, b"after"]
    assert offered[1] == len(big) - (1_024 - 4)


def test_large_frames_interleaved_with_small_ones() -> None:
    rng = random.Random(7)
    bodies = []
    for i in range(30):
        size = rng.choice([0, 1, 10, 100, 3_000, 20_000]) if i % 3 else 70_000
        bodies.append(rng.randbytes(size))
    data = b"".join(_frame(b) for b in bodies)
    reader = FrameReader(max_frame_size=100_000, staging_size=4_096)

    assert _deliver(reader, data) == bodies


@pytest.mark.parametrize("chunk", [999, 16_384, 65_537, None])
def test_frames_straddling_the_end_of_the_default_staging_buffer(chunk: int | None) -> None:
    """Frames up to the staging size force compaction again and again."""
    bodies = _bodies(count=40, seed=3, max_size=30_000)
    bodies += [b"n" * (STAGING_SIZE - 4), b"", b"x" * (STAGING_SIZE - 3)]
    bodies += _bodies(count=40, seed=4, max_size=30_000)
    data = b"".join(_frame(b) for b in bodies)
    reader = FrameReader(max_frame_size=STAGING_SIZE * 2)

    assert _deliver(reader, data, chunk) == bodies


def test_frame_exactly_filling_the_staging_buffer_stays_in_it() -> None:
    staging = 64
    body = b"s" * (staging - 4)
    reader = FrameReader(max_frame_size=1_000, staging_size=staging)

    assert _deliver(reader, _frame(body) + _frame(b"t"), chunk=10) == [body, b"t"]


def test_frame_one_byte_larger_than_the_staging_buffer_uses_its_own() -> None:
    staging = 64
    body = b"s" * (staging - 3)
    reader = FrameReader(max_frame_size=1_000, staging_size=staging)

    assert _deliver(reader, _frame(body) + _frame(b"t"), chunk=10) == [body, b"t"]


def test_reader_is_reusable_after_a_large_frame() -> None:
    reader = FrameReader(max_frame_size=10_000, staging_size=128)

    assert _deliver(reader, _frame(b"L" * 5_000)) == [b"L" * 5_000]
    assert _deliver(reader, _frame(b"small")) == [b"small"]
    assert _deliver(reader, _frame(b"M" * 6_000) + _frame(b"s")) == [b"M" * 6_000, b"s"]


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=400), max_size=25),
    staging=st.integers(min_value=8, max_value=300),
    chunks=st.lists(st.integers(min_value=1, max_value=200), min_size=1, max_size=20),
)
def test_any_frames_in_any_receive_sizes_come_out_whole_and_in_order(
    sizes: list[int], staging: int, chunks: list[int]
) -> None:
    bodies = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    data = b"".join(_frame(b) for b in bodies)
    reader = FrameReader(max_frame_size=400, staging_size=staging)
    frames: list[bytes] = []
    pos = 0
    turn = 0

    while pos < len(data):
        buf = reader.get_buffer()
        assert len(buf) > 0
        n = min(len(buf), len(data) - pos, chunks[turn % len(chunks)])
        turn += 1
        buf[:n] = data[pos : pos + n]
        pos += n
        frames.extend(bytes(f) for f in reader.received(n))

    assert frames == bodies


def test_reused_large_buffers_carry_each_frame_whole_and_are_allocated_once() -> None:
    reader = FrameReader(max_frame_size=1 << 24, staging_size=4_096, reuse_large=True)
    bodies = _bodies(6, seed=7, max_size=300_000)
    buffers = set()
    for body in sorted(bodies, key=len, reverse=True):
        data = _frame(body)
        frames = []
        pos = 0
        while pos < len(data):
            buf = reader.get_buffer()
            n = min(len(buf), len(data) - pos, 10_000)
            buf[:n] = data[pos : pos + n]
            pos += n
            frames.extend(reader.received(n))
        (frame,) = frames
        assert bytes(frame) == body
        if isinstance(frame, memoryview):
            buffers.add(id(frame.obj))
    # Largest first, so every later large frame fits the first one's buffer.
    assert len(buffers) == 1
