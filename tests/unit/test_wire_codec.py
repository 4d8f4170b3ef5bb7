"""shoal.wire.codec: request decoding and response encoding around kio.

Requests are written the way a client writes them: a request header built by
hand from the protocol guide (v1: api key, version, correlation id, client id
as a legacy nullable string; v2: the same plus a tagged-field count), then
the body encoded by kio's own writer. Responses are checked by reading them
back with kio's reader and against frames kio assembles itself.
"""

from __future__ import annotations

import datetime
import io
import struct
import subprocess
import sys
import uuid
from typing import Any

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsRequestV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest as ApiVersionsRequestV3
from kio.schema.index import api_key_map
from kio.schema.metadata.v0.request import MetadataRequest as MetadataRequestV0
from kio.schema.metadata.v0.request import MetadataRequestTopic as MetadataRequestTopicV0
from kio.schema.metadata.v1.request import MetadataRequest as MetadataRequestV1
from kio.schema.metadata.v9.request import MetadataRequest as MetadataRequestV9
from kio.schema.metadata.v9.request import MetadataRequestTopic as MetadataRequestTopicV9
from kio.schema.metadata.v12.request import MetadataRequest as MetadataRequestV12
from kio.schema.metadata.v12.request import MetadataRequestTopic as MetadataRequestTopicV12
from kio.schema.produce.v3 import request as produce_v3
from kio.schema.produce.v9 import request as produce_v9
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

from shoal.records import NewRecord, build_batch
from shoal.wire import (
    ApiSchema,
    ErrorCode,
    FrameReader,
    MalformedRequestError,
    RequestHeader,
    UnknownApiKeyError,
    UnsupportedVersionError,
    WireError,
    decode_request,
    encode_response,
    known_api_keys,
    schema,
)
from shoal.wire.framing import STAGING_SIZE

PRODUCE, METADATA, API_VERSIONS = 0, 3, 18
SUPPORTED = {PRODUCE: (3, 9), METADATA: (0, 12), API_VERSIONS: (0, 3)}
RECORDS = build_batch([NewRecord(b"k", b"v", [("h", b"1")], 1_700_000_000_000)])


def _legacy_nullable_string(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff"
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _request_header(
    api_key: int, version: int, correlation_id: int, client_id: str | None, flexible: bool
) -> bytes:
    """RequestHeader v1, or v2 with an empty tagged-field section, written by hand."""
    head = struct.pack(">hhi", api_key, version, correlation_id)
    head += _legacy_nullable_string(client_id)
    return head + (b"\x00" if flexible else b"")


def _body(request: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(request))(out, request)
    return out.getvalue()


def _frame(request: Any, correlation_id: int = 42, client_id: str | None = "shoal-test") -> bytes:
    cls = type(request)
    header = _request_header(
        cls.__api_key__, cls.__version__, correlation_id, client_id, cls.__flexible__
    )
    return header + _body(request)


REQUESTS: dict[str, Any] = {
    "metadata-v0": MetadataRequestV0(
        topics=(MetadataRequestTopicV0(name="orders"), MetadataRequestTopicV0(name="events"))
    ),
    "metadata-v1-all-topics": MetadataRequestV1(topics=None),
    "metadata-v9": MetadataRequestV9(
        topics=(MetadataRequestTopicV9(name="orders"),),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=True,
        include_topic_authorized_operations=True,
    ),
    "metadata-v12-by-id": MetadataRequestV12(
        topics=(
            MetadataRequestTopicV12(topic_id=uuid.UUID(int=0x1234), name=None),
            MetadataRequestTopicV12(topic_id=None, name="orders"),
        ),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    ),
    "produce-v3": produce_v3.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            produce_v3.TopicProduceData(
                name="orders",
                partition_data=(
                    produce_v3.PartitionProduceData(index=0, records=RECORDS),
                    produce_v3.PartitionProduceData(index=7, records=None),
                ),
            ),
        ),
    ),
    "produce-v9": produce_v9.ProduceRequest(
        transactional_id="tx-1",
        acks=1,
        timeout=datetime.timedelta(milliseconds=1_500),
        topic_data=(
            produce_v9.TopicProduceData(
                name="orders",
                partition_data=(produce_v9.PartitionProduceData(index=3, records=RECORDS),),
            ),
        ),
    ),
    "api-versions-v0": ApiVersionsRequestV0(),
    "api-versions-v3": ApiVersionsRequestV3(
        client_software_name="shoal-tests", client_software_version="1.2.3"
    ),
}

FLEXIBLE = {
    "metadata-v0": False,
    "metadata-v1-all-topics": False,
    "metadata-v9": True,
    "metadata-v12-by-id": True,
    "produce-v3": False,
    "produce-v9": True,
    "api-versions-v0": False,
    "api-versions-v3": True,
}


# -- our picture of the request header matches Kafka's (and kio's) -------------------


@pytest.mark.parametrize("name", REQUESTS)
def test_each_request_uses_header_v2_exactly_when_flexible(name: str) -> None:
    cls = type(REQUESTS[name])

    assert cls.__flexible__ is FLEXIBLE[name]
    expected = RequestHeaderV2 if FLEXIBLE[name] else RequestHeaderV1
    assert cls.__header_schema__ is expected


@pytest.mark.parametrize("header_class", [RequestHeaderV1, RequestHeaderV2])
@pytest.mark.parametrize("client_id", ["client", None, "ünïcode-клиент"])
def test_hand_written_request_header_matches_what_kio_writes(
    header_class: type[Any], client_id: str | None
) -> None:
    """client_id stays a legacy nullable string in v2, as RequestHeader.json says."""
    out = io.BytesIO()
    entity_writer(header_class)(
        out,
        header_class(
            request_api_key=3, request_api_version=9, correlation_id=77, client_id=client_id
        ),
    )

    flexible = header_class is RequestHeaderV2
    assert out.getvalue() == _request_header(3, 9, 77, client_id, flexible)


# -- decode_request -----------------------------------------------------------------


@pytest.mark.parametrize("name", REQUESTS)
def test_decode_request_reads_header_and_body_of_real_requests(name: str) -> None:
    request = REQUESTS[name]
    cls = type(request)

    header, api, body = decode_request(_frame(request, 1_234_567), SUPPORTED)

    assert header == RequestHeader(cls.__api_key__, cls.__version__, 1_234_567, "shoal-test")
    assert (api.api_key, api.version, api.flexible) == (
        cls.__api_key__,
        cls.__version__,
        FLEXIBLE[name],
    )
    assert api.request_class is cls
    assert type(body) is cls
    assert body == request


def test_decoded_produce_request_keeps_the_record_bytes_intact() -> None:
    _, _, body = decode_request(_frame(REQUESTS["produce-v9"]), SUPPORTED)

    assert body.topic_data[0].partition_data[0].records == RECORDS


@pytest.mark.parametrize("name", ["metadata-v1-all-topics", "metadata-v12-by-id"])
@pytest.mark.parametrize("client_id", [None, "", "ünïcode-клиент"])
def test_decode_request_reads_any_client_id(name: str, client_id: str | None) -> None:
    header, _, _ = decode_request(_frame(REQUESTS[name], client_id=client_id), SUPPORTED)

    assert header.client_id == client_id


@pytest.mark.parametrize("correlation_id", [0, -1, 2**31 - 1, -(2**31)])
def test_decode_request_keeps_the_correlation_id_verbatim(correlation_id: int) -> None:
    header, _, _ = decode_request(_frame(REQUESTS["metadata-v9"], correlation_id), SUPPORTED)

    assert header.correlation_id == correlation_id


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_decode_request_accepts_any_buffer(wrap: Any) -> None:
    _, _, body = decode_request(wrap(_frame(REQUESTS["produce-v3"])), SUPPORTED)

    assert body == REQUESTS["produce-v3"]


def test_a_request_larger_than_the_staging_buffer_decodes_from_the_frame_reader() -> None:
    """Large frames come out of the FrameReader as its own bytearray, not bytes."""
    big = build_batch([NewRecord(None, bytes(range(256)) * 4_096, timestamp=1)])
    request = produce_v9.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            produce_v9.TopicProduceData(
                name="big", partition_data=(produce_v9.PartitionProduceData(index=0, records=big),)
            ),
        ),
    )
    frame = _frame(request)
    data = struct.pack(">i", len(frame)) + frame
    reader = FrameReader(max_frame_size=len(frame))
    frames: list[bytes | bytearray] = []
    pos = 0
    while pos < len(data):
        buf = reader.get_buffer()
        n = min(len(buf), len(data) - pos)
        buf[:n] = data[pos : pos + n]
        pos += n
        frames.extend(reader.received(n))
    assert len(frame) > STAGING_SIZE
    assert len(frames) == 1
    assert isinstance(frames[0], bytearray)

    _, _, body = decode_request(frames[0], SUPPORTED)

    assert body == request


@pytest.mark.parametrize("api_key", [9_999, -1, 1])
def test_decode_request_refuses_an_api_key_outside_the_supported_map(api_key: int) -> None:
    """Key 1 (Fetch) is known to kio but not served here; that is unknown to this broker."""
    frame = _request_header(api_key, 0, 5, "c", flexible=False) + b"\x00" * 16

    with pytest.raises(UnknownApiKeyError, match=str(api_key)):
        decode_request(frame, SUPPORTED)


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(METADATA, 13), (METADATA, -1), (PRODUCE, 2), (PRODUCE, 10), (API_VERSIONS, 4)],
)
def test_decode_request_refuses_a_version_outside_the_supported_range(
    api_key: int, version: int
) -> None:
    """Judged before the body is read, so that ApiVersions from a newer client gets its answer."""
    frame = _request_header(api_key, version, 987, "c", flexible=True) + b"garbage"

    with pytest.raises(UnsupportedVersionError) as caught:
        decode_request(frame, SUPPORTED)

    assert caught.value.header.api_key == api_key
    assert caught.value.header.api_version == version
    assert caught.value.header.correlation_id == 987
    assert isinstance(caught.value, WireError)


@pytest.mark.parametrize("size", [0, 1, 7])
def test_decode_request_refuses_a_frame_shorter_than_the_header_prefix(size: int) -> None:
    frame = _frame(REQUESTS["metadata-v9"])[:size]

    with pytest.raises(MalformedRequestError, match="no header"):
        decode_request(frame, SUPPORTED)


def _garbage_frames() -> dict[str, bytes]:
    v1 = _request_header(METADATA, 1, 1, "c", flexible=False)
    v9 = _request_header(METADATA, 9, 1, "c", flexible=True)
    produce = _frame(REQUESTS["produce-v3"])
    return {
        "empty-body": v1,
        "truncated-array": v1 + b"\x00\x00\x00\x02\x00\x01",
        "array-longer-than-frame": v1 + b"\x7f\xff\xff\xff",
        "negative-array-length": v1 + b"\xff\xff\xff\xfe",
        "string-not-utf8": v1 + b"\x00\x00\x00\x01\x00\x02\xff\xfe",
        "client-id-not-utf8": _request_header(METADATA, 1, 1, None, False)[:-2]
        + b"\x00\x02\xff\xfe"
        + b"\x00\x00\x00\x00",
        "client-id-past-the-end": struct.pack(">hhih", METADATA, 1, 1, 50) + b"abc",
        "flexible-header-without-tag-section": _request_header(METADATA, 9, 1, "c", False),
        "flexible-body-cut": v9 + b"\x02\x07orde",
        "produce-records-past-the-end": produce[:-10],
    }


@pytest.mark.parametrize("frame", _garbage_frames().values(), ids=_garbage_frames().keys())
def test_decode_request_reports_bytes_that_do_not_parse_as_malformed(frame: bytes) -> None:
    with pytest.raises(MalformedRequestError, match=r"API key \d+ v\d+ "):
        decode_request(frame, SUPPORTED)


def test_unknown_tagged_field_in_the_request_header_is_ignored() -> None:
    """Kafka ignores tagged fields it does not know: they are how fields are
    added without a new version. kio raises on them, so the guard drops them."""
    header_without_tags = _request_header(API_VERSIONS, 3, 5, "c", flexible=False)
    one_tag = b"\x01" + b"\x00\x03xyz"  # one tagged field: tag 0, three bytes
    frame = header_without_tags + one_tag + _body(REQUESTS["api-versions-v3"])
    plain = _request_header(API_VERSIONS, 3, 5, "c", flexible=True) + _body(
        REQUESTS["api-versions-v3"]
    )

    assert decode_request(frame, SUPPORTED) == decode_request(plain, SUPPORTED)


def test_unknown_tagged_field_in_the_request_body_is_ignored() -> None:
    body = _body(REQUESTS["api-versions-v3"])
    assert body.endswith(b"\x00")
    one_tag = b"\x01" + b"\x09\x00"  # one tagged field: tag 9, empty
    header = _request_header(API_VERSIONS, 3, 5, "c", flexible=True)

    header_back, _, request = decode_request(header + body[:-1] + one_tag, SUPPORTED)
    assert header_back.correlation_id == 5
    assert request == decode_request(header + body, SUPPORTED)[2]


def test_tagged_field_that_overruns_the_frame_is_malformed() -> None:
    body = _body(REQUESTS["api-versions-v3"])
    overrun = b"\x01" + b"\x09\x10" + b"ab"  # claims 16 bytes, has 2
    frame = _request_header(API_VERSIONS, 3, 5, "c", flexible=True) + body[:-1] + overrun

    with pytest.raises(MalformedRequestError):
        decode_request(frame, SUPPORTED)


_HUGE_COMPACT_ARRAY_PROBE = """
import sys
from shoal.wire import MalformedRequestError, decode_request

frame = bytes.fromhex(sys.argv[1])
try:
    decode_request(frame, {3: (0, 12)})
except MalformedRequestError:
    print("malformed")
"""


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def test_a_compact_array_claiming_2_to_the_34_elements_is_malformed_not_fatal(
    tmp_path,
) -> None:
    """A 15-byte Metadata request must not be able to take the broker process down.

    Run in a child process: kio 0.6.5 reserves memory for the claimed element
    count (8 bytes each, here 128 GiB) before reading any element, and when
    that allocation fails the Rust runtime aborts the whole interpreter, which
    no ``except`` can catch. (Counts above 2**35 need a sixth varint byte,
    which kio refuses cleanly.)
    """
    frame = _request_header(METADATA, 12, 1, "c", flexible=True) + _uvarint(2**34 + 1)

    child = subprocess.run(
        [sys.executable, "-c", _HUGE_COMPACT_ARRAY_PROBE, frame.hex()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert (child.returncode, child.stdout.strip()) == (0, "malformed"), child.stderr[-2_000:]


# -- schema, ApiSchema --------------------------------------------------------------


def test_schema_is_cached_per_api_and_version() -> None:
    assert schema(METADATA, 9) is schema(METADATA, 9)
    assert schema(METADATA, 9) is not schema(METADATA, 10)


@pytest.mark.parametrize(("api_key", "version"), [(9_999, 0), (METADATA, 99)])
def test_schema_of_something_kio_does_not_know_is_a_lookup_error(
    api_key: int, version: int
) -> None:
    with pytest.raises(LookupError):
        schema(api_key, version)


def test_known_api_keys_are_kios_api_keys() -> None:
    keys = known_api_keys()

    assert keys == frozenset(api_key_map)
    assert {PRODUCE, 1, METADATA, API_VERSIONS} <= keys


def test_api_schema_names_its_request_and_response_classes() -> None:
    api = schema(METADATA, 12)

    assert api.request_class is MetadataRequestV12
    assert api.response_class.__name__ == "MetadataResponse"
    assert api.response_class.__version__ == 12


def test_make_drops_fields_the_version_does_not_have() -> None:
    topic_id = uuid.UUID(int=99)
    fields = {
        "error_code": ErrorCode.none,
        "name": "orders",
        "topic_id": topic_id,
        "is_internal": False,
        "partitions": (),
        "topic_authorized_operations": -2_147_483_648,
    }

    v9 = schema(METADATA, 9).make("MetadataResponseTopic", **fields)
    v10 = schema(METADATA, 10).make("MetadataResponseTopic", **fields)
    v0 = schema(METADATA, 0).make("MetadataResponseTopic", **fields)

    assert not hasattr(v9, "topic_id")
    assert v9.name == "orders"
    assert v9.topic_authorized_operations == -2_147_483_648
    assert v10.topic_id == topic_id
    assert not hasattr(v0, "is_internal")
    assert not hasattr(v0, "topic_authorized_operations")


def test_make_fails_loudly_when_a_required_field_is_missing() -> None:
    api = schema(METADATA, 10)

    with pytest.raises(TypeError, match="topic_id"):
        api.make("MetadataResponseTopic", error_code=ErrorCode.none, name="t", partitions=())


def test_make_of_an_unknown_struct_fails() -> None:
    with pytest.raises(AttributeError):
        schema(METADATA, 9).make("NoSuchStruct", name="x")


def test_make_leaves_defaults_to_the_schema() -> None:
    broker = schema(METADATA, 9).make("MetadataResponseBroker", node_id=1, host="h", port=9092)

    assert broker.rack is None


def test_has_class_tells_which_structs_a_version_carries() -> None:
    assert schema(1, 12).has_class("SnapshotId")
    assert not schema(1, 4).has_class("SnapshotId")
    assert schema(1, 4).has_class("PartitionData")
    assert not schema(1, 4).has_class("NoSuchStruct")


# -- encode_response ----------------------------------------------------------------


def _metadata_response(version: int) -> Any:
    api = schema(METADATA, version)
    partition = api.make(
        "MetadataResponsePartition",
        error_code=ErrorCode.none,
        partition_index=0,
        leader_id=1,
        leader_epoch=5,
        replica_nodes=(1, 2),
        isr_nodes=(1,),
        offline_replicas=(),
    )
    topic = api.make(
        "MetadataResponseTopic",
        error_code=ErrorCode.none,
        name="orders",
        topic_id=uuid.UUID(int=7),
        is_internal=False,
        partitions=(partition,),
        topic_authorized_operations=-2_147_483_648,
    )
    broker = api.make("MetadataResponseBroker", node_id=1, host="broker-1", port=9092, rack="a")
    return api.response(
        throttle_time=datetime.timedelta(0),
        brokers=(broker,),
        cluster_id="shoal",
        controller_id=1,
        topics=(topic,),
        cluster_authorized_operations=-2_147_483_648,
    )


def _api_versions_response(version: int) -> Any:
    api = schema(API_VERSIONS, version)
    keys = tuple(
        api.make("ApiVersion", api_key=k, min_version=lo, max_version=hi)
        for k, (lo, hi) in sorted(SUPPORTED.items())
    )
    return api.response(
        error_code=ErrorCode.none, api_keys=keys, throttle_time=datetime.timedelta(0)
    )


def _kio_frame(api: ApiSchema, correlation_id: int, response: Any) -> bytes:
    """The frame as kio would assemble it from the response's declared header schema."""
    header_class = api.response_class.__header_schema__
    out = io.BytesIO()
    entity_writer(header_class)(out, header_class(correlation_id=correlation_id))
    entity_writer(api.response_class)(out, response)
    payload = out.getvalue()
    return struct.pack(">i", len(payload)) + payload


RESPONSES = {
    # name: (api key, version, response header size)
    "metadata-v1": (METADATA, 1, 4),
    "metadata-v8": (METADATA, 8, 4),
    "metadata-v9": (METADATA, 9, 5),
    "metadata-v12": (METADATA, 12, 5),
    "api-versions-v0": (API_VERSIONS, 0, 4),
    "api-versions-v3": (API_VERSIONS, 3, 4),
}


def _response_for(api_key: int, version: int) -> Any:
    if api_key == METADATA:
        return _metadata_response(version)
    return _api_versions_response(version)


@pytest.mark.parametrize(("api_key", "version", "head_size"), RESPONSES.values(), ids=RESPONSES)
def test_encode_response_frames_size_header_and_body(
    api_key: int, version: int, head_size: int
) -> None:
    api = schema(api_key, version)
    response = _response_for(api_key, version)
    header = RequestHeader(api_key, version, 0x01020304, "c")

    chunks = encode_response(header, api, response)

    assert len(chunks) == 1
    frame = chunks[0]
    assert isinstance(frame, bytes)
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    assert frame[4:8] == b"\x01\x02\x03\x04"
    if head_size == 5:
        assert frame[8] == 0, "response header v1 ends with an empty tagged-field section"
    decoded, consumed = entity_reader(api.response_class)(memoryview(frame), 4 + head_size)
    assert decoded == response
    assert 4 + head_size + consumed == len(frame)


@pytest.mark.parametrize(("api_key", "version", "head_size"), RESPONSES.values(), ids=RESPONSES)
def test_encode_response_matches_kio_reading_its_declared_header(
    api_key: int, version: int, head_size: int
) -> None:
    api = schema(api_key, version)
    response = _response_for(api_key, version)

    frame = encode_response(RequestHeader(api_key, version, -7, None), api, response)[0]

    assert frame == _kio_frame(api, -7, response)
    header_class = ResponseHeaderV1 if head_size == 5 else ResponseHeaderV0
    assert api.response_class.__header_schema__ is header_class
    read_header, consumed = entity_reader(header_class)(memoryview(frame), 4)
    assert read_header.correlation_id == -7
    assert consumed == head_size


def test_api_versions_v3_answers_with_header_v0_although_it_is_flexible() -> None:
    api = schema(API_VERSIONS, 3)
    assert api.flexible

    frame = encode_response(RequestHeader(API_VERSIONS, 3, 9, "c"), api, _api_versions_response(3))[
        0
    ]

    body = frame[8:]
    assert body == _body(_api_versions_response(3))


def test_encode_response_takes_a_body_encoded_earlier() -> None:
    api = schema(METADATA, 12)
    response = _metadata_response(12)
    header = RequestHeader(METADATA, 12, 3, "c")

    cached = api.encode_body(response)

    assert encode_response(header, api, cached) == encode_response(header, api, response)


def test_response_header_follows_kio_for_every_api_and_version() -> None:
    """Header v1 for flexible versions, v0 otherwise, v0 for ApiVersions always."""
    checked = 0
    for api_key in sorted(known_api_keys()):
        for version in range(0, 30):
            try:
                api = schema(api_key, version)
            except LookupError:
                continue
            frame = encode_response(RequestHeader(api_key, version, 1, None), api, b"")[0]
            header_class = api.response_class.__header_schema__
            expected = io.BytesIO()
            entity_writer(header_class)(expected, header_class(correlation_id=1))
            assert frame[4:] == expected.getvalue(), (api_key, version)
            checked += 1

    assert checked > 250
