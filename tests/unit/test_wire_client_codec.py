"""shoal.wire's client side: encode_request and decode_response, against our server side.

Replica fetchers are clients of other brokers: what ``encode_request`` writes
must decode with the server's ``decode_request`` exactly as built, and what
the server's ``encode_response`` writes (records spliced in from a segment
file included) must decode with ``decode_response``. The request header is
also checked against the protocol guide byte by byte, so the two sides
cannot merely agree with each other.
"""

from __future__ import annotations

import datetime
import io
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from shoal.records import NewRecord, build_batch, iter_batches
from shoal.wire import (
    ErrorCode,
    FileRegion,
    MalformedRequestError,
    RecordsSplicer,
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    schema,
)

FETCH, API_VERSIONS, OFFSET_FOR_LEADER_EPOCH = 1, 18, 23
SUPPORTED = {FETCH: (4, 12), API_VERSIONS: (0, 3), OFFSET_FOR_LEADER_EPOCH: (2, 4)}
BATCH = build_batch(
    [NewRecord(b"k", b"value", (("h", b"1"),), 1_700_000_000_000) for _ in range(3)], 40
)


def _fetch_request(version: int = 12) -> Any:
    """A follower's fetch, built as the replica fetcher builds it."""
    api = schema(FETCH, version)
    partitions = tuple(
        api.make_request(
            "FetchPartition",
            partition=index,
            current_leader_epoch=7,
            fetch_offset=1000 + index,
            last_fetched_epoch=6,
            log_start_offset=3,
            partition_max_bytes=1 << 20,
        )
        for index in (0, 5)
    )
    return api.request(
        cluster_id=None,
        replica_id=2,
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=10 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(api.make_request("FetchTopic", topic="orders", partitions=partitions),),
        forgotten_topics_data=(),
        rack_id="",
    )


def _fetch_response(version: int, records: bytes | None) -> Any:
    api = schema(FETCH, version)
    part = api.make(
        "PartitionData",
        partition_index=5,
        error_code=ErrorCode.none,
        high_watermark=43,
        last_stable_offset=43,
        log_start_offset=3,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=records,
    )
    return api.response(
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(api.make("FetchableTopicResponse", topic="orders", partitions=(part,)),),
    )


def _frame(chunks: list[Any]) -> bytes:
    """What the socket sends for ``chunks``, file regions read from their files."""
    out = bytearray()
    for chunk in chunks:
        if isinstance(chunk, FileRegion):
            out += os.pread(chunk.file.fileno(), chunk.size, chunk.position)
        else:
            out += chunk
    return bytes(out)


def _unframe(frame: bytes) -> bytes:
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    return frame[4:]


# -- requests ------------------------------------------------------------------------


def test_fetch_v12_request_decodes_on_the_server_as_built() -> None:
    api = schema(FETCH, 12)
    request = _fetch_request()
    frame = encode_request(api, 321, "shoal-replica-2", request)
    header, decoded_api, body = decode_request(_unframe(frame), SUPPORTED)
    assert header == RequestHeader(FETCH, 12, 321, "shoal-replica-2")
    assert decoded_api is api
    assert body == request
    assert body.replica_id == 2
    assert [p.fetch_offset for p in body.topics[0].partitions] == [1000, 1005]


def _body(api: Any, request: Any) -> bytes:
    out = io.BytesIO()
    api.write_request(out, request)
    return out.getvalue()


@pytest.mark.parametrize(("version", "tagged"), [(4, b""), (12, b"\x00")])
def test_request_header_is_v2_for_flexible_versions_and_v1_before(version, tagged) -> None:
    # The protocol guide: api key, version, correlation id, client id as an int16-length
    # string; header v2 (flexible versions) adds an empty tagged-field section.
    client = "shoal-replica-2"
    api = schema(FETCH, version)
    request = _fetch_request(version)
    header = struct.pack(">hhih", FETCH, version, 9, len(client)) + client.encode() + tagged
    assert _unframe(encode_request(api, 9, client, request)) == header + _body(api, request)


def test_fetch_v4_request_round_trips() -> None:
    request = _fetch_request(4)
    frame = encode_request(schema(FETCH, 4), 1, "c", request)
    header, _, body = decode_request(_unframe(frame), SUPPORTED)
    assert (header.api_key, header.api_version) == (FETCH, 4)
    assert body == request


def test_offset_for_leader_epoch_v4_request_round_trips() -> None:
    api = schema(OFFSET_FOR_LEADER_EPOCH, 4)
    request = api.request(
        replica_id=2,
        topics=(
            api.make_request(
                "OffsetForLeaderTopic",
                topic="orders",
                partitions=(
                    api.make_request(
                        "OffsetForLeaderPartition",
                        partition=0,
                        current_leader_epoch=8,
                        leader_epoch=6,
                    ),
                ),
            ),
        ),
    )
    header, _, body = decode_request(_unframe(encode_request(api, 5, "c", request)), SUPPORTED)
    assert header.correlation_id == 5
    assert body == request


# -- responses ------------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 12])
def test_fetch_response_round_trips_with_its_records(version: int) -> None:
    api = schema(FETCH, version)
    request_header = RequestHeader(FETCH, version, 77, "c")
    response = _fetch_response(version, BATCH)
    chunks = encode_response(request_header, api, response)
    correlation_id, body = decode_response(api, _unframe(_frame(chunks)))
    assert correlation_id == 77
    assert body == response
    data = body.responses[0].partitions[0]
    assert (data.partition_index, data.high_watermark) == (5, 43)
    assert bytes(data.records) == BATCH
    assert [h.base_offset for _, h in iter_batches(data.records)] == [40]


def test_fetch_response_with_records_spliced_from_a_file_decodes(tmp_path: Path) -> None:
    # The fetch handler sends records straight from the segment file.
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(b"x" * 100 + BATCH + b"y" * 50)
    api = schema(FETCH, 12)
    with segment.open("rb") as file:
        splicer = RecordsSplicer()
        placeholder = splicer.placeholder([FileRegion(file, 100, len(BATCH))])
        response = _fetch_response(12, placeholder)
        chunks = encode_response(RequestHeader(FETCH, 12, 78, "c"), api, response, splicer)
        assert any(isinstance(c, FileRegion) for c in chunks)
        correlation_id, body = decode_response(api, _unframe(_frame(chunks)))
    assert correlation_id == 78
    assert bytes(body.responses[0].partitions[0].records) == BATCH


def test_empty_and_null_records_decode(tmp_path: Path) -> None:
    api = schema(FETCH, 12)
    for records in (b"", None):
        chunks = encode_response(
            RequestHeader(FETCH, 12, 1, "c"), api, _fetch_response(12, records)
        )
        _, body = decode_response(api, _unframe(_frame(chunks)))
        assert not body.responses[0].partitions[0].records


def test_offset_for_leader_epoch_v4_response_round_trips() -> None:
    api = schema(OFFSET_FOR_LEADER_EPOCH, 4)
    response = api.response(
        throttle_time=datetime.timedelta(0),
        topics=(
            api.make(
                "OffsetForLeaderTopicResult",
                topic="orders",
                partitions=(
                    api.make(
                        "EpochEndOffset",
                        error_code=ErrorCode.none,
                        partition=0,
                        leader_epoch=6,
                        end_offset=1234,
                    ),
                    api.make(
                        "EpochEndOffset",
                        error_code=ErrorCode.fenced_leader_epoch,
                        partition=1,
                        leader_epoch=-1,
                        end_offset=-1,
                    ),
                ),
            ),
        ),
    )
    chunks = encode_response(RequestHeader(OFFSET_FOR_LEADER_EPOCH, 4, 9, "c"), api, response)
    correlation_id, body = decode_response(api, _unframe(_frame(chunks)))
    assert correlation_id == 9
    assert body == response
    assert body.topics[0].partitions[1].error_code is ErrorCode.fenced_leader_epoch


def test_api_versions_v3_response_with_header_v0_decodes() -> None:
    # ApiVersions answers with response header v0 even at flexible versions.
    api = schema(API_VERSIONS, 3)
    response = api.response(
        error_code=ErrorCode.none,
        api_keys=(api.make("ApiVersion", api_key=FETCH, min_version=4, max_version=12),),
        throttle_time=datetime.timedelta(0),
    )
    chunks = encode_response(RequestHeader(API_VERSIONS, 3, 11, "c"), api, response)
    correlation_id, body = decode_response(api, _unframe(_frame(chunks)))
    assert correlation_id == 11
    assert body == response


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda frame: frame[:-5], id="cut-short"),
        pytest.param(lambda frame: frame[:3], id="no-correlation-id"),
        pytest.param(lambda frame: frame[:5] + b"\xff" * 8, id="garbage-body"),
    ],
)
def test_a_response_that_does_not_parse_is_malformed(damage: Any) -> None:
    api = schema(FETCH, 12)
    chunks = encode_response(RequestHeader(FETCH, 12, 1, "c"), api, _fetch_response(12, BATCH))
    with pytest.raises(MalformedRequestError):
        decode_response(api, damage(_unframe(_frame(chunks))))
