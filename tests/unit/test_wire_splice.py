"""RecordsSplicer: Fetch responses whose records come from files.

The reference for every spliced response is the same response encoded by kio
with the records inline: sending the spliced chunks (bytes as they are, file
regions read from the file) must put exactly those bytes on the wire.
"""

from __future__ import annotations

import datetime
import os
import random
import struct
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import pytest
from kio.serial import entity_reader

from shoal.records import BatchOptions, Compression, NewRecord, build_batch, iter_records
from shoal.wire import (
    Chunk,
    ErrorCode,
    FileRegion,
    RecordsSplicer,
    RequestHeader,
    chunk_size,
    encode_response,
    schema,
)

FETCH = 1


def _batch(base_offset: int, count: int, value_size: int = 20) -> bytes:
    rng = random.Random(base_offset)
    records = [
        NewRecord(f"key-{i}".encode(), rng.randbytes(value_size), timestamp=1_000 + i)
        for i in range(count)
    ]
    return build_batch(records, base_offset, BatchOptions(compression=Compression.NONE))


class Segment:
    """A log file with batches at known positions, junk around them."""

    def __init__(self, file: BinaryIO, batches: dict[str, tuple[int, bytes]]) -> None:
        self.file = file
        self.batches = batches

    def region(self, name: str) -> FileRegion:
        position, data = self.batches[name]
        return FileRegion(self.file, position, len(data))

    def data(self, name: str) -> bytes:
        return self.batches[name][1]


@pytest.fixture
def segment(tmp_path) -> Iterator[Segment]:
    batches = {
        "a": _batch(0, 3),
        "b1": _batch(3, 2),
        "b2": _batch(5, 4),
        # Larger than 16383 bytes, so a flexible length prefix takes three bytes.
        "large": _batch(9, 5, value_size=4_000),
    }
    path = tmp_path / "00000000000000000000.log"
    placed: dict[str, tuple[int, bytes]] = {}
    with path.open("wb") as out:
        for name, data in batches.items():
            out.write(b"\xee" * 13)
            placed[name] = (out.tell(), data)
            out.write(data)
        out.write(b"\xee" * 13)
    with path.open("rb") as file:
        yield Segment(file, placed)


def _materialize(chunks: list[Chunk]) -> bytes:
    out = bytearray()
    for chunk in chunks:
        if isinstance(chunk, FileRegion):
            out += os.pread(chunk.file.fileno(), chunk.size, chunk.position)
        else:
            out += chunk
    return bytes(out)


def _fetch_response(version: int, records: Callable[[str], Any]) -> Any:
    """A Fetch response over two topics; ``records(partition)`` fills each records field."""
    api = schema(FETCH, version)

    def partition(index: int, key: str) -> Any:
        return api.make(
            "PartitionData",
            partition_index=index,
            error_code=ErrorCode.none,
            high_watermark=100 + index,
            last_stable_offset=100 + index,
            log_start_offset=0,
            aborted_transactions=None,
            preferred_read_replica=-1,
            records=records(key),
        )

    topics = (
        api.make(
            "FetchableTopicResponse",
            topic="orders",
            topic_id=None,
            partitions=(partition(0, "p0"), partition(1, "p1"), partition(2, "p2")),
        ),
        api.make(
            "FetchableTopicResponse",
            topic="events",
            topic_id=None,
            partitions=(partition(0, "e0"),),
        ),
    )
    return api.response(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=topics,
    )


def _spliced_and_inline(
    version: int, chunks_for: dict[str, list[Chunk]], inline_for: dict[str, bytes | None]
) -> tuple[list[Chunk], bytes, Any]:
    api = schema(FETCH, version)
    header = RequestHeader(FETCH, version, 4_711, "consumer")
    splicer = RecordsSplicer()
    placeholders = {key: splicer.placeholder(chunks) for key, chunks in chunks_for.items()}

    def with_placeholder(key: str) -> Any:
        return placeholders[key] if key in placeholders else inline_for.get(key)

    def inline(key: str) -> Any:
        return inline_for.get(key)

    spliced = encode_response(header, api, _fetch_response(version, with_placeholder), splicer)
    reference = encode_response(header, api, _fetch_response(version, inline))
    assert len(reference) == 1
    assert isinstance(reference[0], bytes)
    return spliced, reference[0], _fetch_response(version, inline)


VERSIONS = pytest.mark.parametrize("version", [4, 12], ids=["v4-legacy", "v12-flexible"])


@VERSIONS
def test_spliced_fetch_response_sends_exactly_what_kio_encodes_inline(
    segment: Segment, version: int
) -> None:
    chunks_for: dict[str, list[Chunk]] = {
        "p0": [segment.region("a")],
        "p1": [segment.region("b1"), segment.region("b2")],
        "e0": [segment.region("large")],
    }
    inline_for: dict[str, bytes | None] = {
        "p0": segment.data("a"),
        "p1": segment.data("b1") + segment.data("b2"),
        "p2": None,
        "e0": segment.data("large"),
    }

    spliced, reference, _ = _spliced_and_inline(version, chunks_for, inline_for)

    assert _materialize(spliced) == reference


@VERSIONS
def test_spliced_response_passes_the_file_regions_through_in_order(
    segment: Segment, version: int
) -> None:
    regions = [segment.region("a"), segment.region("b1"), segment.region("b2")]
    chunks_for: dict[str, list[Chunk]] = {"p0": [regions[0]], "p1": regions[1:]}

    spliced, _, _ = _spliced_and_inline(
        version,
        chunks_for,
        {"p0": segment.data("a"), "p1": b"".join(segment.data(n) for n in ("b1", "b2"))},
    )

    passed = [c for c in spliced if isinstance(c, FileRegion)]
    assert passed == regions
    assert all(a is b for a, b in zip(passed, regions, strict=True))
    assert all(isinstance(c, bytes) for c in spliced if not isinstance(c, FileRegion))


@VERSIONS
def test_spliced_frame_size_prefix_counts_the_file_regions(segment: Segment, version: int) -> None:
    chunks_for: dict[str, list[Chunk]] = {"p0": [segment.region("large")]}

    spliced, _, _ = _spliced_and_inline(version, chunks_for, {"p0": segment.data("large")})

    first = spliced[0]
    assert isinstance(first, bytes)
    (size,) = struct.unpack_from(">i", first)
    assert size == sum(chunk_size(c) for c in spliced) - 4


@VERSIONS
def test_spliced_response_reads_back_with_kio_and_the_records_decode(
    segment: Segment, version: int
) -> None:
    chunks_for: dict[str, list[Chunk]] = {
        "p0": [segment.region("a")],
        "p1": [segment.region("b1"), segment.region("b2")],
        "e0": [segment.region("large")],
    }
    inline_for = {
        "p0": segment.data("a"),
        "p1": segment.data("b1") + segment.data("b2"),
        "e0": segment.data("large"),
    }
    api = schema(FETCH, version)

    spliced, _, expected = _spliced_and_inline(version, chunks_for, inline_for)
    frame = _materialize(spliced)

    head = 5 if api.flexible else 4
    body, consumed = entity_reader(api.response_class)(memoryview(frame), 4 + head)
    assert 4 + head + consumed == len(frame)
    assert body == expected
    p1 = body.responses[0].partitions[1].records
    assert [r.offset for r in iter_records(p1[: len(segment.data("b1"))])] == [3, 4]
    assert [r.offset for r in iter_records(p1[len(segment.data("b1")) :])] == [5, 6, 7, 8]


@VERSIONS
def test_empty_chunk_lists_splice_as_empty_records(segment: Segment, version: int) -> None:
    chunks_for: dict[str, list[Chunk]] = {"p0": [], "p1": [], "p2": [], "e0": []}
    inline_for: dict[str, bytes | None] = {"p0": b"", "p1": b"", "p2": b"", "e0": b""}

    spliced, reference, _ = _spliced_and_inline(version, chunks_for, inline_for)

    assert _materialize(spliced) == reference
    assert not any(isinstance(c, FileRegion) for c in spliced)


@VERSIONS
def test_zero_size_regions_are_dropped_from_the_chunks(segment: Segment, version: int) -> None:
    empty = FileRegion(segment.file, 5, 0)
    chunks_for: dict[str, list[Chunk]] = {
        "p0": [empty],
        "p1": [empty, segment.region("b1"), b"", empty],
    }
    inline_for = {"p0": b"", "p1": segment.data("b1")}

    spliced, reference, _ = _spliced_and_inline(version, chunks_for, inline_for)

    assert _materialize(spliced) == reference
    assert all(chunk_size(c) > 0 for c in spliced)
    assert [c for c in spliced if isinstance(c, FileRegion)] == [segment.region("b1")]


@VERSIONS
def test_bytes_chunks_splice_like_file_regions(segment: Segment, version: int) -> None:
    """A handler may hand over records it holds in memory (a cached batch, say)."""
    chunks_for: dict[str, list[Chunk]] = {
        "p0": [segment.data("a")],
        "p1": [segment.region("b1"), segment.data("b2")],
    }
    inline_for = {"p0": segment.data("a"), "p1": segment.data("b1") + segment.data("b2")}

    spliced, reference, _ = _spliced_and_inline(version, chunks_for, inline_for)

    assert _materialize(spliced) == reference


@VERSIONS
@pytest.mark.parametrize("size", [1, 125, 126, 127, 128, 16_382, 16_383, 16_384])
def test_length_prefix_is_right_at_every_varint_boundary(tmp_path, version: int, size: int) -> None:
    """Compact lengths are size + 1: 126 is the last one-byte, 16382 the last two-byte."""
    data = bytes(i % 251 for i in range(size))
    path = tmp_path / "records"
    path.write_bytes(b"head" + data)
    with path.open("rb") as file:
        region = FileRegion(file, 4, size)

        spliced, reference, _ = _spliced_and_inline(version, {"p0": [region]}, {"p0": data})

        assert _materialize(spliced) == reference


@VERSIONS
def test_placeholders_may_be_created_in_any_order(segment: Segment, version: int) -> None:
    api = schema(FETCH, version)
    header = RequestHeader(FETCH, version, 1, None)
    splicer = RecordsSplicer()
    # e0 comes last in the encoding but gets the first placeholder.
    order = ["e0", "p2", "p0", "p1"]
    sources = {"e0": "large", "p2": "b2", "p0": "a", "p1": "b1"}
    placeholders = {key: splicer.placeholder([segment.region(sources[key])]) for key in order}

    spliced = encode_response(
        header, api, _fetch_response(version, placeholders.__getitem__), splicer
    )
    reference = encode_response(
        header, api, _fetch_response(version, lambda key: segment.data(sources[key]))
    )

    assert _materialize(spliced) == reference[0]


def test_placeholder_is_sixteen_bytes_and_unique_per_call_and_per_splicer() -> None:
    first, second = RecordsSplicer(), RecordsSplicer()

    markers = [first.placeholder([]) for _ in range(3)] + [second.placeholder([])]

    assert all(len(m) == 16 for m in markers)
    assert len(set(markers)) == 4
    assert markers[0][:12] == markers[1][:12] == markers[2][:12]
    assert markers[3][:12] != markers[0][:12]


def test_splice_refuses_an_encoding_that_lost_a_placeholder(segment: Segment) -> None:
    api = schema(FETCH, 12)
    splicer = RecordsSplicer()
    splicer.placeholder([segment.region("a")])

    with pytest.raises(AssertionError, match="placeholder missing"):
        encode_response(
            RequestHeader(FETCH, 12, 1, None),
            api,
            _fetch_response(12, lambda key: b""),
            splicer,
        )


def test_splice_of_a_response_without_placeholders_is_the_encoding_itself() -> None:
    encoded = b"\x00\x01\x02 some response"

    assert RecordsSplicer().splice(encoded, flexible=True) == [encoded]
    assert RecordsSplicer().splice(encoded, flexible=False) == [encoded]


def test_chunk_size_of_bytes_and_regions(segment: Segment) -> None:
    assert chunk_size(b"abc") == 3
    assert chunk_size(b"") == 0
    assert chunk_size(segment.region("a")) == len(segment.data("a"))
