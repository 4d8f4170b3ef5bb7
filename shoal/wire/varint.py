"""Unsigned varints, as flexible Kafka messages use them for lengths and tags.

Seven bits a byte, low group first, high bit set on every byte but the last.
kio has its own, natively; these serve the code that works around kio (the
request guard, the records splicer, the coordinator's offsets-topic records),
which read and write a few lengths.
"""

from __future__ import annotations

from typing import Final

MAX_BYTES: Final = 5


class VarintError(ValueError):
    pass


def encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """(value, next position); VarintError past ``end`` or beyond five bytes."""
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise VarintError("varint runs past the end")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 7 * MAX_BYTES:
            raise VarintError("varint is too long")
