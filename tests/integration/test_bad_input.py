"""Bad input gets a Kafka error code or a closed connection, and nothing else breaks.

Every case runs against one broker that must keep serving a well-behaved
connection opened before the bad one, and new connections after it.
"""

from __future__ import annotations

import datetime
import os
import random
import socket
import struct
from collections.abc import Iterator

import pytest
from harness import BrokerProcess
from kafka_clients import create_topic
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, encode_request, frame, request_class

from shoal.records import NewRecord, build_batch

PRODUCE_V = 9
METADATA_V = 12


def metadata_request(topics: list[str] | None = None) -> object:
    cls = request_class(3, METADATA_V)
    topic_cls = request_class(3, METADATA_V, "MetadataRequestTopic")
    return cls(
        topics=None if topics is None else tuple(topic_cls(topic_id=None, name=t) for t in topics),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def produce_request(topic: str, partition: int, records: bytes | None, acks: int = 1) -> object:
    cls = request_class(0, PRODUCE_V)
    topic_cls = request_class(0, PRODUCE_V, "TopicProduceData")
    partition_cls = request_class(0, PRODUCE_V, "PartitionProduceData")
    return cls(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            topic_cls(
                name=topic, partition_data=(partition_cls(index=partition, records=records),)
            ),
        ),
    )


def produce_error(
    conn: RawConnection, topic: str, partition: int, records: bytes | None
) -> ErrorCode:
    response = conn.call(produce_request(topic, partition, records))
    return response.responses[0].partition_responses[0].error_code


def a_batch(size: int = 10) -> bytes:
    return build_batch([NewRecord(b"k", os.urandom(size))])


@pytest.fixture(scope="module")
def topic(broker: BrokerProcess) -> str:
    return create_topic(broker.bootstrap, 2, **{"max.message.bytes": "2000"})


@pytest.fixture
def bystander(broker: BrokerProcess) -> Iterator[RawConnection]:
    """A connection opened before the bad input, which must keep working after it."""
    with RawConnection(broker.bootstrap) as conn:
        assert conn.call(metadata_request()).brokers
        yield conn
        response = conn.call(metadata_request())
        assert response.brokers, "the bystander connection stopped working"
    assert broker.running
    with RawConnection(broker.bootstrap) as fresh:
        assert fresh.call(metadata_request()).brokers


def test_frame_claiming_two_gigabytes_closes_the_connection(
    broker: BrokerProcess, bystander: RawConnection
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        conn.send_raw(struct.pack(">i", 2_000_000_000) + b"\x00" * 64)
        assert conn.is_closed_by_peer()


def test_negative_frame_size_closes_the_connection(
    broker: BrokerProcess, bystander: RawConnection
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        conn.send_raw(struct.pack(">i", -5))
        assert conn.is_closed_by_peer()


def test_truncated_frame_then_hang_up_leaves_the_broker_serving(
    broker: BrokerProcess, bystander: RawConnection
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        conn.send_raw(struct.pack(">i", 1000) + b"\x00\x03\x00\x0c" + b"x" * 20)
        conn.sock.shutdown(socket.SHUT_WR)
        assert conn.is_closed_by_peer()


def test_frame_shorter_than_a_request_header_closes_the_connection(
    broker: BrokerProcess, bystander: RawConnection
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        conn.send_raw(frame(b"\x00\x03"))
        assert conn.is_closed_by_peer()


@pytest.mark.parametrize("seed", range(5))
def test_garbage_bytes_close_the_connection(
    broker: BrokerProcess, bystander: RawConnection, seed: int
) -> None:
    payload = struct.pack(">hhi", 3, METADATA_V, 1) + os.urandom(37 + seed * 101)
    with RawConnection(broker.bootstrap) as conn:
        conn.send_raw(frame(payload))
        assert conn.is_closed_by_peer()


def test_unknown_api_key_closes_the_connection(
    broker: BrokerProcess, bystander: RawConnection
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        conn.send_raw(frame(struct.pack(">hhih", 4242, 0, 7, -1)))
        assert conn.is_closed_by_peer()


def test_unsupported_metadata_version_closes_the_connection(
    broker: BrokerProcess, bystander: RawConnection
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        conn.send_raw(frame(struct.pack(">hhih", 3, 99, 7, -1) + b"\x00" * 8))
        assert conn.is_closed_by_peer()


def test_unsupported_api_versions_version_answers_unsupported_version_with_our_range(
    broker: BrokerProcess, bystander: RawConnection
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        conn.send_raw(frame(struct.pack(">hhih", 18, 99, 42, -1) + b"\x00" * 4))
        data = conn.read_frame()
    correlation_id, error_code, count = struct.unpack_from(">ihi", data)
    assert correlation_id == 42
    assert error_code == ErrorCode.unsupported_version
    versions = {
        struct.unpack_from(">h", data, 10 + 6 * i)[0]: struct.unpack_from(">hh", data, 12 + 6 * i)
        for i in range(count)
    }
    assert versions[18] == (0, 4)
    assert versions[0][0] == 3


def test_wrong_crc_is_corrupt_message_and_appends_nothing(
    broker: BrokerProcess, bystander: RawConnection, topic: str
) -> None:
    batch = bytearray(a_batch(100))
    batch[-1] ^= 0xFF
    with RawConnection(broker.bootstrap) as conn:
        assert produce_error(conn, topic, 0, bytes(batch)) == ErrorCode.corrupt_message
        response = conn.call(produce_request(topic, 0, a_batch()))
        partition = response.responses[0].partition_responses[0]
        assert partition.error_code == ErrorCode.none
        assert partition.base_offset == 0, "the corrupt batch must not have taken offsets"


def test_batch_cut_short_is_corrupt_message(
    broker: BrokerProcess, bystander: RawConnection, topic: str
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        assert produce_error(conn, topic, 1, a_batch(100)[:-10]) == ErrorCode.corrupt_message


def test_two_batches_for_one_partition_are_an_invalid_record(
    broker: BrokerProcess, bystander: RawConnection, topic: str
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        assert produce_error(conn, topic, 1, a_batch() + a_batch()) == ErrorCode.invalid_record


def test_old_magic_is_an_invalid_record(
    broker: BrokerProcess, bystander: RawConnection, topic: str
) -> None:
    batch = bytearray(a_batch())
    batch[16] = 1
    with RawConnection(broker.bootstrap) as conn:
        assert produce_error(conn, topic, 1, bytes(batch)) == ErrorCode.invalid_record


def test_batch_over_max_message_bytes_is_message_too_large(
    broker: BrokerProcess, bystander: RawConnection, topic: str
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        assert produce_error(conn, topic, 1, a_batch(5000)) == ErrorCode.message_too_large


def test_produce_to_unknown_topic_is_unknown_topic_or_partition(
    broker: BrokerProcess, bystander: RawConnection, topic: str
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        assert (
            produce_error(conn, "no-such-topic", 0, a_batch())
            == ErrorCode.unknown_topic_or_partition
        )
        assert produce_error(conn, topic, 7, a_batch()) == ErrorCode.unknown_topic_or_partition


def test_invalid_acks_are_refused(
    broker: BrokerProcess, bystander: RawConnection, topic: str
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        response = conn.call(produce_request(topic, 0, a_batch(), acks=2))
        assert (
            response.responses[0].partition_responses[0].error_code
            == ErrorCode.invalid_required_acks
        )


def test_acks_zero_gets_no_response_and_an_error_closes_the_connection(
    broker: BrokerProcess, bystander: RawConnection, topic: str
) -> None:
    with RawConnection(broker.bootstrap) as conn:
        conn.send(produce_request(topic, 0, a_batch(), acks=0))
        sent = conn.send(metadata_request([topic]))
        correlation_id, _ = conn.receive(request_class(3, METADATA_V))
        assert correlation_id == sent, "acks=0 must not be answered"
        conn.send(produce_request("no-such-topic", 0, a_batch(), acks=0))
        assert conn.is_closed_by_peer()


def test_pipelined_requests_are_answered_in_order(broker: BrokerProcess, topic: str) -> None:
    metadata = metadata_request([topic])
    with RawConnection(broker.bootstrap) as conn:
        kinds = []
        for i in range(60):
            request = metadata if i % 2 else produce_request(topic, i % 2, a_batch())
            kinds.append((conn.send(request), type(request)))
        for sent, kind in kinds:
            correlation_id, body = conn.receive(kind)
            assert correlation_id == sent
            assert body is not None


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def test_an_array_claiming_billions_of_elements_closes_only_that_connection(
    broker: BrokerProcess, bystander: RawConnection
) -> None:
    header = struct.pack(">hhih", 3, METADATA_V, 9, -1) + b"\x00"
    with RawConnection(broker.bootstrap) as conn:
        conn.send_raw(frame(header + _uvarint(2**34) + b"\x00\x00"))
        assert conn.is_closed_by_peer()


def test_mutated_requests_never_take_the_broker_down(
    broker: BrokerProcess, bystander: RawConnection, topic: str
) -> None:
    """Flip, cut and insert bytes in valid requests; each gets an answer or a closed socket."""
    rng = random.Random(20261122)
    valid = [
        encode_request(metadata_request([topic]), 1)[4:],
        encode_request(metadata_request(), 2)[4:],
        encode_request(produce_request(topic, 0, a_batch(50)), 3)[4:],
    ]
    for case in range(300):
        payload = bytearray(rng.choice(valid))
        for _ in range(rng.randrange(1, 4)):
            position = rng.randrange(max(len(payload), 1))
            match rng.randrange(3):
                case 0:
                    payload[position] ^= 1 << rng.randrange(8)
                case 1:
                    del payload[position:]
                case _:
                    payload[position:position] = os.urandom(rng.randrange(1, 6))
        with RawConnection(broker.bootstrap, timeout=10) as conn:
            conn.send_raw(frame(bytes(payload)))
            conn.sock.shutdown(socket.SHUT_WR)
            try:
                while conn.sock.recv(65536):
                    pass
            except ConnectionResetError:
                pass
        assert broker.running, f"the broker died on mutated request {case}"


def test_an_unknown_compression_codec_is_an_invalid_record(
    broker: BrokerProcess, bystander: RawConnection, topic: str
) -> None:
    from shoal.records.batch import CRC_OFFSET, compute_crc

    batch = bytearray(a_batch())
    batch[22] |= 0x06
    struct.pack_into(">I", batch, CRC_OFFSET, compute_crc(batch, 0, len(batch)))
    with RawConnection(broker.bootstrap) as conn:
        assert produce_error(conn, topic, 1, bytes(batch)) == ErrorCode.invalid_record
