"""The HTTP door's pure parts: key partitioning, data types, streamed bodies, errors."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2
from shoal.gateway.http.encoding import (
    DataType,
    EncodingError,
    ObjectStream,
    ReadFormat,
    StreamError,
    decode_data,
    encode_data,
    murmur2,
    partition_for_key,
)
from shoal.gateway.http.errors import ErrorCode, kafka_error, kafka_error_code
from shoal.gateway.http.groups import parse_assignment
from shoal.gateway.http.records import fetched_records

from shoal.records import BatchOptions, NewRecord, build_batch
from shoal.wire import ErrorCode as KafkaCode

# Kafka's own expectations for Utils.murmur2 (UtilsTest.testMurmur2).
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("data", "expected"), JAVA_MURMUR2.items())
def test_murmur2_matches_kafka_s_java_values(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@given(st.binary(max_size=64))
def test_murmur2_matches_kafka_python_s_for_any_bytes(data: bytes) -> None:
    assert murmur2(data) & 0xFFFFFFFF == kafka_python_murmur2(data)


@given(st.binary(max_size=32), st.integers(min_value=1, max_value=500))
def test_a_key_s_partition_is_the_positive_hash_modulo_the_count(key: bytes, count: int) -> None:
    partition = partition_for_key(key, count)
    assert partition == (kafka_python_murmur2(key) & 0x7FFFFFFF) % count
    assert 0 <= partition < count


def test_data_types_store_the_bytes_confluent_s_would() -> None:
    assert encode_data(DataType.BINARY, base64.b64encode(b"\x00\xff").decode()) == b"\x00\xff"
    assert encode_data(DataType.STRING, "\u00e9t\u00e9") == "\u00e9t\u00e9".encode()
    assert (
        encode_data(DataType.JSON, {"a": [1, 2], "b": "\u00e9"})
        == '{"a":[1,2],"b":"\u00e9"}'.encode()
    )
    assert encode_data(DataType.JSON, None) == b"null"
    for data_type, data in (
        (DataType.BINARY, "not base64!"),
        (DataType.BINARY, 12),
        (DataType.STRING, {"not": "a string"}),
        (DataType.JSON, float("nan")),
        (DataType.JSON, [float("inf")]),
    ):
        with pytest.raises(EncodingError):
            encode_data(data_type, data)


@example("AAAA=")
@example("AAAA")
@example("AB==")
@example("QQ")
@given(
    st.text(alphabet="AZaz09+/=-_ \n\u00e9", max_size=12)
    | st.binary().map(base64.b64encode).map(bytes.decode)
)
def test_binary_data_is_accepted_as_strict_base64_decoding_and_java_s_decoder_accept_it(
    text: str,
) -> None:
    try:
        expected: bytes | None = base64.b64decode(text, validate=True)
    except ValueError:
        expected = None
    data = text.rstrip("=")
    if len(data) < len(text) and len(data) % 4 == 0:
        expected = None  # "AAAA=": Java's Base64 decoder refuses padding after a whole quantum
    try:
        stored: bytes | None = encode_data(DataType.BINARY, text)
    except EncodingError:
        stored = None
    assert stored == expected


def test_read_formats_show_bytes_or_refuse_them_clearly() -> None:
    assert decode_data(b"\x00\xff", ReadFormat.BINARY, "v") == "AP8="
    assert decode_data("\u00e9".encode(), ReadFormat.STRING, "v") == "\u00e9"
    assert decode_data(b'{"n":1}', ReadFormat.JSON, "v") == {"n": 1}
    assert decode_data(None, ReadFormat.JSON, "v") is None
    with pytest.raises(EncodingError, match="not UTF-8"):
        decode_data(b"\xff", ReadFormat.STRING, "the value at offset 3")
    with pytest.raises(EncodingError, match="not JSON"):
        decode_data(b"plain", ReadFormat.JSON, "v")


OBJECTS = [
    {"value": {"data": 'braces } { and "quotes" and \\ backslashes'}},
    {"key": {"type": "STRING", "data": "\u00e9t\u00e9 \u2603"}, "headers": []},
    {"value": {"data": {"nested": {"deep": [1, {"x": "}"}]}}}},
]


def test_a_stream_is_cut_into_objects_wherever_the_chunks_split() -> None:
    body = (
        json.dumps(OBJECTS[0]) + "\n" + json.dumps(OBJECTS[1]) + "  " + json.dumps(OBJECTS[2])
    ).encode()
    for size in range(1, 12):
        stream = ObjectStream(1000)
        found = []
        for start in range(0, len(body), size):
            found += stream.feed(body[start : start + size])
        stream.close()
        assert [json.loads(text) for text in found] == OBJECTS


def test_a_stream_refuses_what_is_not_a_sequence_of_objects() -> None:
    with pytest.raises(StreamError, match="expected a JSON object"):
        ObjectStream(1000).feed(b'{"a": 1} [2]')
    truncated = ObjectStream(1000)
    assert truncated.feed(b'{"a": {"b": 1}') == []
    with pytest.raises(StreamError, match="ends inside"):
        truncated.close()
    with pytest.raises(StreamError, match="longer than"):
        ObjectStream(10).feed(b'{"a": "' + b"x" * 20)


def test_kafka_errors_map_to_stable_http_codes() -> None:
    assert kafka_error_code(KafkaCode.unknown_topic_or_partition) == ErrorCode.TOPIC_NOT_FOUND
    assert (
        kafka_error_code(KafkaCode.unknown_topic_or_partition, partition_scoped=True)
        == ErrorCode.PARTITION_NOT_FOUND
    )
    assert kafka_error_code(KafkaCode.topic_authorization_failed) == ErrorCode.KAFKA_AUTHORIZATION
    assert kafka_error_code(KafkaCode.message_too_large) == ErrorCode.RECORD_TOO_LARGE
    assert kafka_error_code(KafkaCode.not_leader_or_follower) == ErrorCode.KAFKA_RETRIABLE
    assert kafka_error_code(KafkaCode.unknown_server_error) == ErrorCode.KAFKA_ERROR
    error = kafka_error(KafkaCode.topic_already_exists, "Topic 'x' already exists.")
    assert (error.status, error.message) == (409, "TOPIC_ALREADY_EXISTS: Topic 'x' already exists.")


def test_error_codes_are_unique_and_carry_their_http_status() -> None:
    values = [member.value for member in ErrorCode.__members__.values()]
    assert len(values) == len(set(values))
    assert all(100 <= value // 100 < 600 for value in values)


def _assignment(topics: dict[str, list[int]], user_data: bytes = b"") -> bytes:
    out = struct.pack(">hi", 1, len(topics))
    for topic, partitions in topics.items():
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name + struct.pack(">i", len(partitions))
        out += b"".join(struct.pack(">i", p) for p in partitions)
    return out + struct.pack(">i", len(user_data)) + user_data


def test_consumer_assignments_are_read_and_malformed_ones_ignored() -> None:
    data = _assignment({"orders": [0, 2], "\u00e9v\u00e9nements": [1]}, b"sticky")
    assert parse_assignment(data) == {"orders": [0, 2], "\u00e9v\u00e9nements": [1]}
    assert parse_assignment(data[:9]) == {}
    assert parse_assignment(b"") == {}


def test_fetched_batches_are_read_from_the_asked_offset_and_a_cut_tail_is_left() -> None:
    first = bytearray(build_batch([NewRecord(b"k%d" % i, b"v%d" % i) for i in range(3)], 10))
    marker = build_batch([NewRecord(None, b"\x00\x00\x00\x00")], 13, BatchOptions(control=True))
    last = build_batch([NewRecord(None, b"late", (("h", None),))], 14)
    fetched = bytes(first) + marker + last[:-5]
    decoded = list(fetched_records(fetched, 11))
    records = [r for r, _ in decoded if r is not None]
    assert [(r.offset, r.key, r.value) for r in records] == [(11, b"k1", b"v1"), (12, b"k2", b"v2")]
    # Each whole batch ends with its next offset, the control batch's included.
    assert [end for r, end in decoded if r is None] == [13, 14]
