"""Responses whose record bytes stay in segment files until the socket sends them.

kio encodes a response from dataclasses into one bytes object; a Fetch
response, though, should carry its records straight from the log's files
(``sendfile``), not through Python memory. So a handler puts a 16-byte
placeholder in each ``records`` field, kio encodes the response around it,
and :meth:`RecordsSplicer.splice` cuts the encoding at each placeholder and
puts the real length prefix and the file regions there. The placeholders
start with 12 random bytes per response, so they cannot be mistaken for
anything else kio wrote (names, ids, offsets).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Final

from shoal.wire.varint import encode_uvarint

_MARKER_SIZE: Final = 16
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class FileRegion:
    """``size`` bytes of an open file from ``position``; the file stays open while queued."""

    file: BinaryIO
    position: int
    size: int


Chunk = bytes | FileRegion
"""A piece of an encoded response: bytes, or a region of a file to send as it is."""


def chunk_size(chunk: Chunk) -> int:
    return chunk.size if isinstance(chunk, FileRegion) else len(chunk)


def _compact_length(size: int) -> bytes:
    return encode_uvarint(size + 1)


class RecordsSplicer:
    """Placeholders for one response's records fields, and the splice that fills them."""

    def __init__(self) -> None:
        self._prefix = os.urandom(_MARKER_SIZE - 4)
        self._records: dict[bytes, list[Chunk]] = {}

    def placeholder(self, chunks: list[Chunk]) -> bytes:
        marker = self._prefix + _UINT32.pack(len(self._records))
        self._records[marker] = chunks
        return marker

    def splice(self, encoded: bytes, flexible: bool) -> list[Chunk]:
        """Replace each placeholder (and its length prefix) in ``encoded`` with its records."""
        old_prefix = _compact_length(_MARKER_SIZE) if flexible else _INT32.pack(_MARKER_SIZE)
        found = sorted((encoded.find(marker), marker) for marker in self._records)
        out: list[Chunk] = []
        start = 0
        for at, marker in found:
            head = at - len(old_prefix)
            if at < 0 or encoded[head:at] != old_prefix:
                raise AssertionError("records placeholder missing from the encoded response")
            chunks = self._records[marker]
            size = sum(chunk_size(c) for c in chunks)
            new_prefix = _compact_length(size) if flexible else _INT32.pack(size)
            out.append(encoded[start:head] + new_prefix)
            out.extend(c for c in chunks if chunk_size(c))
            start = at + _MARKER_SIZE
        out.append(encoded[start:])
        return out
