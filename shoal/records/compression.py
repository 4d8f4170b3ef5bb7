"""Compression codecs of record batches, through cramjam.

The broker keeps producers' compressed bytes as they are; it decompresses only
off the hot path (a timestamp search inside one batch, building batches of its
own). Kafka's framing choices, which a plain codec call does not know:

* gzip: a gzip member (RFC 1952).
* snappy: Java clients write xerial-framed snappy (an 8-byte magic, two int32
  versions, then int32-length-prefixed raw blocks); librdkafka writes a raw
  block. Both are read; raw is written, which every client reads.
* lz4: the LZ4 frame format with independent blocks and no content
  checksum, as Kafka's own writer has it: the Java client decodes every block
  on its own and refuses a frame whose blocks are linked ("Dependent block
  stream is unsupported").
* zstd: a zstd frame.

``compress`` takes Kafka's per-codec levels (KIP-390: ``compression.gzip.level``,
``compression.lz4.level``, ``compression.zstd.level``); None is the codec's
default, which for gzip is also what Kafka's -1 means.

``decompress(codec, data, max_size)`` refuses (:class:`DecompressedTooLargeError`)
a payload whose output would exceed ``max_size`` bytes, without holding more
than about ``max_size`` bytes of output: a few compressed bytes can stand for
gigabytes (a decompression bomb). How each codec is bounded:

* gzip: zlib's ``decompressobj`` with ``max_length``, member after member;
  it stops after ``max_size + 1`` bytes of output.
* zstd and lz4: cramjam's ``decompress_into`` an output buffer of fixed size,
  which fails once the output fills it. The buffer starts at a guess from the
  input's size and grows fourfold (decoding again from the start) up to
  ``max_size + 1``; the repeated work is at most a third of the final pass.
  zstd and lz4 frame headers may state the content size, but optionally and
  unchecked until the end, so they are not trusted.
* snappy: every raw block starts with its uncompressed length (a varint) and
  the decoder allocates exactly that and refuses output that disagrees, so the
  stated lengths are summed and checked before decoding.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import Final

import cramjam

from shoal.records.batch import Compression

_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE: Final = 16
_BLOCK_LENGTH = struct.Struct(">i")
_FIRST_GUESS: Final = 256 * 1024
"""The smallest first output buffer of a bounded zstd or lz4 decode."""
_GUESS_RATIO: Final = 8
"""The first output buffer of a bounded decode: this times the input's size."""
_BUFFER_FULL: Final = "failed to write whole buffer"
"""cramjam's message (Rust's io::ErrorKind::WriteZero) when ``decompress_into`` runs out of room."""


class CompressionError(ValueError):
    """The payload does not decode with the codec its batch names."""


class DecompressedTooLargeError(CompressionError):
    """The payload decompresses to more than the caller's ``max_size``."""

    def __init__(self, codec: Compression, max_size: int) -> None:
        super().__init__(f"{codec.name.lower()} payload decompresses to over {max_size} bytes")
        self.codec = codec
        self.max_size = max_size


def compress(codec: Compression, data: bytes, level: int | None = None) -> bytes:
    """``data`` as ``codec``'s payload; ``level`` is ignored by none and snappy."""
    match codec:
        case Compression.NONE:
            return data
        case Compression.GZIP:
            return bytes(cramjam.gzip.compress(data, level=level))
        case Compression.SNAPPY:
            return bytes(cramjam.snappy.compress_raw(data))
        case Compression.LZ4:
            # cramjam.lz4.compress links blocks; only the streaming Compressor
            # writes the independent blocks Java clients need.
            frame = cramjam.lz4.Compressor(level=level, content_checksum=False, block_linked=False)
            frame.compress(data)
            return bytes(frame.finish())
        case Compression.ZSTD:
            return bytes(cramjam.zstd.compress(data, level=level))


def decompress(codec: Compression, data: bytes | memoryview, max_size: int | None = None) -> bytes:
    """The payload decompressed; with ``max_size``, refused beyond that many bytes."""
    if max_size is not None:
        return _decompress_bounded(codec, data, max_size)
    try:
        match codec:
            case Compression.NONE:
                return bytes(data)
            case Compression.GZIP:
                return bytes(cramjam.gzip.decompress(data))
            case Compression.SNAPPY:
                return _snappy_decompress(bytes(data))
            case Compression.LZ4:
                return bytes(cramjam.lz4.decompress(data))
            case Compression.ZSTD:
                return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as exc:
        raise CompressionError(f"{codec.name.lower()} payload does not decompress: {exc}") from exc


def _snappy_decompress(data: bytes) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out = bytearray()
    pos = _XERIAL_HEADER_SIZE
    while pos < len(data):
        if pos + 4 > len(data):
            raise CompressionError("xerial snappy block length is cut off")
        (length,) = _BLOCK_LENGTH.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > len(data):
            raise CompressionError("xerial snappy block runs past the payload")
        out += cramjam.snappy.decompress_raw(data[pos : pos + length])
        pos += length
    return bytes(out)


def _decompress_bounded(codec: Compression, data: bytes | memoryview, max_size: int) -> bytes:
    if max_size < 0:
        raise ValueError("max_size must not be negative")
    match codec:
        case Compression.NONE:
            if len(data) > max_size:
                raise DecompressedTooLargeError(codec, max_size)
            return bytes(data)
        case Compression.GZIP:
            return _gzip_bounded(data, max_size)
        case Compression.SNAPPY:
            return _snappy_bounded(bytes(data), max_size)
        case Compression.LZ4:
            return _into_bounded(codec, cramjam.lz4.decompress_into, data, max_size)
        case Compression.ZSTD:
            return _into_bounded(codec, cramjam.zstd.decompress_into, data, max_size)


def _gzip_bounded(data: bytes | memoryview, max_size: int) -> bytes:
    out = bytearray()
    rest: bytes | memoryview = data
    try:
        while True:  # concatenated members decode as one stream, as cramjam's does
            member = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            # max_length is at least 1 here (0 would mean no limit).
            out += member.decompress(rest, max_size + 1 - len(out))
            if len(out) > max_size:
                raise DecompressedTooLargeError(Compression.GZIP, max_size)
            if not member.eof:
                raise CompressionError("gzip payload does not decompress: it is cut off")
            rest = member.unused_data
            if not rest:
                return bytes(out)
    except zlib.error as exc:
        raise CompressionError(f"gzip payload does not decompress: {exc}") from exc


def _into_bounded(
    codec: Compression,
    decompress_into: Callable[..., int],
    data: bytes | memoryview,
    max_size: int,
) -> bytes:
    size = min(max_size + 1, max(_FIRST_GUESS, _GUESS_RATIO * len(data)))
    while True:
        buffer = bytearray(size)
        try:
            written = int(decompress_into(data, buffer))
        except cramjam.DecompressionError as exc:
            if _BUFFER_FULL not in str(exc):
                raise CompressionError(
                    f"{codec.name.lower()} payload does not decompress: {exc}"
                ) from exc
            if size > max_size:
                raise DecompressedTooLargeError(codec, max_size) from None
            size = min(max_size + 1, 4 * size)
            continue
        if written > max_size:
            raise DecompressedTooLargeError(codec, max_size)
        del buffer[written:]
        return bytes(buffer)


def _uvarint(data: bytes, pos: int) -> int:
    """The unsigned varint at ``pos`` (snappy's stated uncompressed length)."""
    value = 0
    for shift in range(0, 35, 7):
        if pos >= len(data):
            break
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
    raise CompressionError("snappy payload does not decompress: a bad length preamble")


def _snappy_bounded(data: bytes, max_size: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        if _uvarint(data, 0) > max_size:
            raise DecompressedTooLargeError(Compression.SNAPPY, max_size)
    else:
        stated = 0
        pos = _XERIAL_HEADER_SIZE
        while pos + 4 <= len(data):
            (length,) = _BLOCK_LENGTH.unpack_from(data, pos)
            pos += 4
            if length < 0 or pos + length > len(data):
                break  # _snappy_decompress says what is wrong
            stated += _uvarint(data, pos)
            if stated > max_size:
                raise DecompressedTooLargeError(Compression.SNAPPY, max_size)
            pos += length
    try:
        return _snappy_decompress(data)
    except cramjam.DecompressionError as exc:
        raise CompressionError(f"snappy payload does not decompress: {exc}") from exc
