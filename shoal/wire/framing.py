"""Size-prefixed frames: how Kafka requests sit on a TCP stream.

Every request is an int32 size followed by that many bytes. :class:`FrameReader`
is fed by ``asyncio.BufferedProtocol`` (the transport ``recv_into``\\ s our own
buffer): small requests land in a staging buffer and are cut out of it in bulk;
a request larger than the staging buffer gets a buffer of its own, sized from
its prefix, so a 1 MB produce request is received without a single copy.

A size above ``max_frame_size`` (Kafka's ``socket.request.max.bytes``) or
below zero raises :class:`FrameSizeError` before anything is allocated: the
connection is closed, as Kafka closes it.
"""

from __future__ import annotations

import struct
from typing import Final

_SIZE = struct.Struct(">i")
STAGING_SIZE: Final = 256 * 1024
_MIN_FREE: Final = 16 * 1024


class FrameSizeError(ValueError):
    pass


class FrameReader:
    """Turns received bytes into whole frames (without their size prefix)."""

    def __init__(
        self, max_frame_size: int, staging_size: int = STAGING_SIZE, reuse_large: bool = False
    ) -> None:
        """``reuse_large``: receive every large frame into one buffer, kept from frame to
        frame, and return it as a memoryview that is good only until the next call of
        :meth:`received`. For a caller that is done with each frame before more bytes
        come (one request at a time): a new buffer per frame costs a zero-filled
        allocation of its size (a follower's 1 MB fetch responses: 5% of its samples).
        """
        self.max_frame_size = max_frame_size
        self._staging = bytearray(staging_size)
        self._start = 0
        self._end = 0
        self._large: bytearray | memoryview | None = None
        self._large_filled = 0
        self._reuse_large = reuse_large
        self._spare = bytearray()

    def get_buffer(self) -> memoryview:
        """Where the next received bytes go."""
        if self._large is not None:
            return memoryview(self._large)[self._large_filled :]
        if len(self._staging) - self._end < _MIN_FREE:
            pending = self._end - self._start
            self._staging[:pending] = self._staging[self._start : self._end]
            self._start, self._end = 0, pending
        return memoryview(self._staging)[self._end :]

    def _large_buffer(self, size: int) -> bytearray | memoryview:
        if not self._reuse_large:
            return bytearray(size)
        if len(self._spare) < size:
            self._spare = bytearray(size)
        return memoryview(self._spare)[:size]

    def received(self, nbytes: int) -> list[bytes | bytearray | memoryview]:
        """Account for ``nbytes`` written into the last buffer; return completed frames."""
        if self._large is not None:
            self._large_filled += nbytes
            if self._large_filled < len(self._large):
                return []
            frame, self._large = self._large, None
            return [frame]
        self._end += nbytes
        frames: list[bytes | bytearray | memoryview] = []
        staging = self._staging
        while self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(staging, self._start)
            if size < 0 or size > self.max_frame_size:
                raise FrameSizeError(
                    f"request of {size} bytes is outside 0-{self.max_frame_size}"
                    " (socket.request.max.bytes)"
                )
            body_start = self._start + 4
            available = self._end - body_start
            if available >= size:
                frames.append(bytes(staging[body_start : body_start + size]))
                self._start = body_start + size
                continue
            if size + 4 > len(staging):
                self._large = self._large_buffer(size)
                self._large[:available] = staging[body_start : self._end]
                self._large_filled = available
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0
        return frames
