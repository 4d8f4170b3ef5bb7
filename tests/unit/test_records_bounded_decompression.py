"""Bounded decompression: ``decompress(codec, data, max_size)`` and ``iter_records``.

Output up to ``max_size`` decodes as without a limit; one byte more is refused
with DecompressedTooLargeError. A bomb (a few kilobytes that stand for a
gigabyte) is refused quickly, having held no more than about ``max_size`` bytes.
"""

from __future__ import annotations

import gzip
import random
import time
import tracemalloc
import zlib

import lz4.frame
import pytest
import snappy
import zstandard
from kafka.codec import snappy_encode

from shoal.records import (
    BatchOptions,
    Compression,
    CompressionError,
    DecompressedTooLargeError,
    NewRecord,
    build_batch,
    iter_records,
)
from shoal.records.compression import compress, decompress

MiB = 2**20
_random = random.Random(20240607)
PAYLOAD = _random.randbytes(20_000) + b"\x00" * 300_000 + b"shoal " * 10_000

# The encoders Kafka clients use, besides our own (compress).
REFERENCE = {
    "gzip-stdlib": (Compression.GZIP, gzip.compress),
    "snappy-raw": (Compression.SNAPPY, snappy.compress),
    "snappy-xerial": (Compression.SNAPPY, lambda d: snappy_encode(d, xerial_compatible=True)),
    "lz4-frame": (Compression.LZ4, lz4.frame.compress),
    "zstd": (Compression.ZSTD, lambda d: zstandard.ZstdCompressor().compress(d)),
}
ENCODED = {c.name.lower(): (c, lambda d, c=c: compress(c, d)) for c in Compression} | REFERENCE


@pytest.mark.parametrize(("codec", "encode"), ENCODED.values(), ids=ENCODED.keys())
def test_output_of_exactly_max_size_decodes(codec: Compression, encode: object) -> None:
    assert callable(encode)
    data = encode(PAYLOAD)

    assert decompress(codec, data, len(PAYLOAD)) == PAYLOAD
    assert decompress(codec, memoryview(data), 10 * len(PAYLOAD)) == PAYLOAD


@pytest.mark.parametrize(("codec", "encode"), ENCODED.values(), ids=ENCODED.keys())
def test_output_one_byte_over_max_size_is_refused(codec: Compression, encode: object) -> None:
    assert callable(encode)
    data = encode(PAYLOAD)

    with pytest.raises(DecompressedTooLargeError) as refused:
        decompress(codec, data, len(PAYLOAD) - 1)

    assert refused.value.codec is codec
    assert refused.value.max_size == len(PAYLOAD) - 1
    assert isinstance(refused.value, CompressionError)  # old callers still catch it


@pytest.mark.parametrize("codec", list(Compression))
def test_empty_payload_decodes_with_max_size_zero(codec: Compression) -> None:
    assert decompress(codec, compress(codec, b""), 0) == b""


@pytest.mark.parametrize("codec", [c for c in Compression if c is not Compression.NONE])
def test_corrupt_payload_is_a_compression_error_not_too_large(codec: Compression) -> None:
    data = compress(codec, PAYLOAD)
    cut = data[: len(data) // 2]

    with pytest.raises(CompressionError) as failed:
        decompress(codec, cut, 10 * len(PAYLOAD))

    assert not isinstance(failed.value, DecompressedTooLargeError)


def test_concatenated_gzip_members_decode_as_one_stream() -> None:
    data = gzip.compress(b"one ") + gzip.compress(b"two")

    assert decompress(Compression.GZIP, data, 7) == b"one two"
    with pytest.raises(DecompressedTooLargeError):
        decompress(Compression.GZIP, data, 6)


def test_snappy_refuses_a_stated_length_over_max_size_without_decoding() -> None:
    # A preamble stating 4 GiB - 1, then nothing a decoder would accept.
    data = b"\xff\xff\xff\xff\x0f" + b"\x00" * 10

    with pytest.raises(DecompressedTooLargeError):
        decompress(Compression.SNAPPY, data, MiB)


# -- bombs ---------------------------------------------------------------------------


def _gzip_bomb() -> bytes:
    """1 GiB of zeros in ~1 MB: 64 gzip members of 16 MiB each (concatenated members
    are one stream); a single member of this ratio takes seconds to write."""
    member = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return (member.compress(bytes(16 * MiB)) + member.flush()) * 64


def _zstd_bomb() -> bytes:
    """1 GiB of zeros as a single zstd frame (its header states the size)."""
    packer = zstandard.ZstdCompressor(level=1).compressobj(size=1024 * MiB)
    zeros = bytes(16 * MiB)
    return b"".join(packer.compress(zeros) for _ in range(64)) + packer.flush()


def _lz4_bomb() -> bytes:
    """1 GiB of zeros as lz4 frames (lz4's ratio is at most ~255, hence several)."""
    return lz4.frame.compress(bytes(64 * MiB)) * 16


BOMBS = {
    "gzip": (Compression.GZIP, _gzip_bomb),
    "zstd": (Compression.ZSTD, _zstd_bomb),
    "lz4": (Compression.LZ4, _lz4_bomb),
}


@pytest.mark.parametrize(("codec", "make"), BOMBS.values(), ids=BOMBS.keys())
def test_a_bomb_is_refused_fast_without_allocating_its_output(
    codec: Compression, make: object
) -> None:
    assert callable(make)
    bomb = make()
    assert len(bomb) < 8 * MiB
    cap = 4 * MiB

    tracemalloc.start()
    try:
        started = time.monotonic()
        with pytest.raises(DecompressedTooLargeError):
            decompress(codec, bomb, cap)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert elapsed < 1.0
    assert peak < 3 * cap  # the output buffer (cap + 1) and a copy at most, not 1 GiB


# -- iter_records ---------------------------------------------------------------------


@pytest.mark.parametrize("codec", list(Compression))
def test_iter_records_refuses_a_batch_over_its_cap_before_any_record(codec: Compression) -> None:
    records = [NewRecord(key=None, value=bytes(100_000)) for _ in range(5)]
    batch = build_batch(records, options=BatchOptions(compression=codec))

    decoded = list(iter_records(batch, 1 * MiB))
    assert [r.value for r in decoded] == [r.value for r in records]
    with pytest.raises(DecompressedTooLargeError):
        next(iter_records(batch, 400_000))
