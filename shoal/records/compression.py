"""Compression codecs of record batches, through cramjam.

The broker keeps producers' compressed bytes as they are; it decompresses only
off the hot path (a timestamp search inside one batch, building batches of its
own). Kafka's framing choices, which a plain codec call does not know:

* gzip: a gzip member (RFC 1952).
* snappy: Java clients write xerial-framed snappy (an 8-byte magic, two int32
  versions, then int32-length-prefixed raw blocks); librdkafka writes a raw
  block. Both are read; raw is written, which every client reads.
* lz4: the LZ4 frame format with independent blocks.
* zstd: a zstd frame.
"""

from __future__ import annotations

import struct
from typing import Final

import cramjam

from shoal.records.batch import Compression

_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE: Final = 16
_BLOCK_LENGTH = struct.Struct(">i")


class CompressionError(ValueError):
    """The payload does not decode with the codec its batch names."""


def compress(codec: Compression, data: bytes) -> bytes:
    match codec:
        case Compression.NONE:
            return data
        case Compression.GZIP:
            return bytes(cramjam.gzip.compress(data))
        case Compression.SNAPPY:
            return bytes(cramjam.snappy.compress_raw(data))
        case Compression.LZ4:
            return bytes(cramjam.lz4.compress(data))
        case Compression.ZSTD:
            return bytes(cramjam.zstd.compress(data))


def decompress(codec: Compression, data: bytes | memoryview) -> bytes:
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
