"""Compression codecs: our output reads with the reference libraries, and theirs with us.

The reference encoders are the ones Kafka clients use: the stdlib's gzip,
python-snappy (raw blocks, as librdkafka writes them), kafka-python's
xerial-framed snappy (as the Java client writes it), lz4's frame format and
zstandard.
"""

from __future__ import annotations

import gzip
import random
import struct

import lz4.frame
import pytest
import snappy
import zstandard
from kafka.codec import snappy_encode

from shoal.records import Compression, CompressionError
from shoal.records.compression import compress, decompress

XERIAL_MAGIC = b"\x82SNAPPY\x00"
CODECS = [c for c in Compression if c is not Compression.NONE]
_random = random.Random(20240601)

PAYLOADS = {
    "empty": b"",
    "one-byte": b"\x00",
    "repetitive": b"kafka record batch " * 4_000,
    "random": _random.randbytes(5_000),
    "mixed": _random.randbytes(300) + b"\x00" * 70_000 + _random.randbytes(300),
}


@pytest.mark.parametrize("codec", list(Compression))
@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_compress_then_decompress_gives_back_the_payload(
    codec: Compression, payload: bytes
) -> None:
    assert decompress(codec, compress(codec, payload)) == payload


def test_none_passes_bytes_through_unchanged() -> None:
    payload = PAYLOADS["random"]

    assert compress(Compression.NONE, payload) == payload
    assert decompress(Compression.NONE, memoryview(payload)) == payload


@pytest.mark.parametrize("codec", CODECS)
def test_compress_shrinks_a_repetitive_payload(codec: Compression) -> None:
    payload = PAYLOADS["repetitive"]

    assert len(compress(codec, payload)) < len(payload) // 10


@pytest.mark.parametrize("codec", list(Compression))
def test_decompress_accepts_a_memoryview_slice(codec: Compression) -> None:
    payload = PAYLOADS["mixed"]
    framed = b"HEAD" + compress(codec, payload) + b"TAIL"

    assert decompress(codec, memoryview(framed)[4:-4]) == payload


# -- what we write, read by the reference decoders ----------------------------------


REFERENCE_DECODERS = {
    Compression.GZIP: gzip.decompress,
    Compression.SNAPPY: snappy.decompress,
    Compression.LZ4: lz4.frame.decompress,
    Compression.ZSTD: lambda data: zstandard.ZstdDecompressor().decompressobj().decompress(data),
}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_reference_decoder_reads_what_we_compress(codec: Compression, payload: bytes) -> None:
    assert REFERENCE_DECODERS[codec](compress(codec, payload)) == payload


def test_snappy_is_written_as_a_raw_block_not_xerial_framed() -> None:
    out = compress(Compression.SNAPPY, PAYLOADS["repetitive"])

    assert not out.startswith(XERIAL_MAGIC)


def test_gzip_is_written_as_a_gzip_member() -> None:
    assert compress(Compression.GZIP, b"abc")[:2] == b"\x1f\x8b"


def test_lz4_is_written_as_an_lz4_frame() -> None:
    assert compress(Compression.LZ4, b"abc")[:4] == b"\x04\x22\x4d\x18"


def test_lz4_frame_has_independent_blocks_as_the_java_client_requires() -> None:
    # Kafka's Lz4BlockInputStream decodes each block alone and refuses FLG
    # without the block-independence bit; a payload over one 64 KiB block.
    out = compress(Compression.LZ4, PAYLOADS["mixed"])
    flg, bd = out[4], out[5]

    assert flg >> 6 == 1  # frame version 1
    assert flg & 0x20  # blocks independent
    assert not flg & 0x04  # no content checksum, as Kafka's writer
    assert 4 <= (bd >> 4) & 7 <= 7  # a block size Kafka's BD accepts
    assert lz4.frame.decompress(out) == PAYLOADS["mixed"]


@pytest.mark.parametrize(
    ("codec", "levels"),
    [
        (Compression.GZIP, (1, 9)),
        (Compression.LZ4, (1, 17)),
        (Compression.ZSTD, (-5, 1, 3, 19)),
    ],
)
def test_compression_levels_are_applied_and_every_level_reads_back(
    codec: Compression, levels: tuple[int, ...]
) -> None:
    payload = b"".join(b"record %d of a batch, " % (i % 977) for i in range(20_000))
    sizes = [len(out) for out in (compress(codec, payload, level) for level in levels)]

    for level in levels:
        assert decompress(codec, compress(codec, payload, level)) == payload
    assert sizes[0] > sizes[-1]  # the fastest level compresses least


def test_zstd_is_written_as_a_zstd_frame() -> None:
    assert compress(Compression.ZSTD, b"abc")[:4] == b"\x28\xb5\x2f\xfd"


# -- what clients write, read by us ---------------------------------------------------


REFERENCE_ENCODERS = {
    "gzip": (Compression.GZIP, gzip.compress),
    "gzip-level-1": (Compression.GZIP, lambda d: gzip.compress(d, compresslevel=1)),
    "snappy-raw": (Compression.SNAPPY, snappy.compress),
    "snappy-xerial": (Compression.SNAPPY, lambda d: snappy_encode(d, xerial_compatible=True)),
    "snappy-xerial-small-blocks": (
        Compression.SNAPPY,
        lambda d: snappy_encode(d, xerial_compatible=True, xerial_blocksize=1_000),
    ),
    "lz4-frame": (Compression.LZ4, lz4.frame.compress),
    "lz4-independent-blocks-checksummed": (
        Compression.LZ4,
        lambda d: lz4.frame.compress(
            d,
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=True,
            block_checksum=True,
        ),
    ),
    "zstd": (Compression.ZSTD, lambda d: zstandard.ZstdCompressor().compress(d)),
    "zstd-without-content-size": (
        Compression.ZSTD,
        lambda d: zstandard.ZstdCompressor(write_content_size=False).compress(d),
    ),
}


@pytest.mark.parametrize(("codec", "encode"), REFERENCE_ENCODERS.values(), ids=REFERENCE_ENCODERS)
@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_decompress_reads_what_clients_write(codec: Compression, encode, payload: bytes) -> None:
    assert decompress(codec, encode(payload)) == payload


def test_decompress_reads_a_zstd_stream_written_in_pieces() -> None:
    """A streaming producer writes a frame without a content size, in several blocks."""
    payload = PAYLOADS["mixed"]
    compressor = zstandard.ZstdCompressor().compressobj()
    data = b"".join(
        compressor.compress(payload[i : i + 4_096]) for i in range(0, len(payload), 4_096)
    )
    data += compressor.flush()

    assert decompress(Compression.ZSTD, data) == payload


# -- xerial framing -----------------------------------------------------------------


def _xerial(*blocks: bytes) -> bytes:
    header = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
    return header + b"".join(struct.pack(">i", len(b)) + b for b in blocks)


def test_xerial_snappy_concatenates_its_blocks() -> None:
    data = _xerial(snappy.compress(b"first,"), snappy.compress(b""), snappy.compress(b"second"))

    assert decompress(Compression.SNAPPY, data) == b"first,second"


def test_xerial_snappy_with_many_blocks_matches_kafka_python() -> None:
    payload = PAYLOADS["mixed"]
    framed = snappy_encode(payload, xerial_compatible=True, xerial_blocksize=512)
    assert framed.startswith(XERIAL_MAGIC)

    assert decompress(Compression.SNAPPY, framed) == payload


def test_xerial_header_without_blocks_is_an_empty_payload() -> None:
    assert decompress(Compression.SNAPPY, _xerial()) == b""


def test_xerial_header_version_fields_are_not_interpreted() -> None:
    """Some producers write the version ints little-endian; the blocks still read."""
    block = snappy.compress(b"xyz")
    data = XERIAL_MAGIC + struct.pack("<ii", 1, 1) + struct.pack(">i", len(block)) + block

    assert decompress(Compression.SNAPPY, data) == b"xyz"


@pytest.mark.parametrize("cut", [1, 2, 3], ids=["1-byte", "2-bytes", "3-bytes"])
def test_xerial_block_length_cut_off_is_a_compression_error(cut: int) -> None:
    data = _xerial(snappy.compress(b"abc")) + struct.pack(">i", 10)[:cut]

    with pytest.raises(CompressionError, match="cut off"):
        decompress(Compression.SNAPPY, data)


def test_xerial_block_running_past_the_payload_is_a_compression_error() -> None:
    block = snappy.compress(b"abcdef" * 10)
    data = _xerial(block)[:-3]

    with pytest.raises(CompressionError, match="runs past"):
        decompress(Compression.SNAPPY, data)


def test_xerial_block_with_negative_length_is_a_compression_error() -> None:
    data = _xerial() + struct.pack(">i", -4) + b"abcd"

    with pytest.raises(CompressionError, match="runs past"):
        decompress(Compression.SNAPPY, data)


def test_xerial_block_that_is_not_snappy_is_a_compression_error() -> None:
    data = _xerial(b"\xff\xff\xff\xff\xff\xff")

    with pytest.raises(CompressionError, match="snappy"):
        decompress(Compression.SNAPPY, data)


# -- damaged payloads ---------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    "garbage",
    [b"garbage!" * 4, bytes(range(256)), b""],
    ids=["text", "all-bytes", "empty"],
)
def test_garbage_is_a_compression_error_naming_the_codec(
    codec: Compression, garbage: bytes
) -> None:
    with pytest.raises(CompressionError, match=codec.name.lower()):
        decompress(codec, garbage)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_truncated_payload_is_a_compression_error(codec: Compression) -> None:
    data = compress(codec, PAYLOADS["random"])

    with pytest.raises(CompressionError):
        decompress(codec, data[: len(data) // 2])


def test_compression_error_is_a_value_error() -> None:
    """Callers that catch ValueError for bad client input also catch this."""
    assert issubclass(CompressionError, ValueError)
