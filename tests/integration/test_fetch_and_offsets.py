"""Fetch long-polling and size limits, ListOffsets and OffsetForLeaderEpoch, on the wire."""

from __future__ import annotations

import datetime
import threading
import time
import uuid

import pytest
from harness import BrokerProcess
from kafka_clients import create_topic
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, request_class

from shoal.records import NewRecord, build_batch, iter_batches, iter_records


def produce_batch(bootstrap: str, topic: str, partition: int, records: list[NewRecord]) -> int:
    cls = request_class(0, 9)
    topic_cls = request_class(0, 9, "TopicProduceData")
    partition_cls = request_class(0, 9, "PartitionProduceData")
    request = cls(
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            topic_cls(
                name=topic,
                partition_data=(partition_cls(index=partition, records=build_batch(records)),),
            ),
        ),
    )
    with RawConnection(bootstrap) as conn:
        result = conn.call(request).responses[0].partition_responses[0]
    assert result.error_code == ErrorCode.none
    return int(result.base_offset)


def fetch(
    bootstrap: str,
    wanted: list[tuple[str, int, int, int]],
    max_wait_ms: int = 100,
    min_bytes: int = 1,
    max_bytes: int = 50_000_000,
    version: int = 12,
    current_leader_epoch: int = -1,
    topic_ids: dict[str, uuid.UUID] | None = None,
) -> object:
    cls = request_class(1, version)
    topic_cls = request_class(1, version, "FetchTopic")
    partition_cls = request_class(1, version, "FetchPartition")
    topics = []
    for topic, partition, offset, partition_max in wanted:
        partition_request = partition_cls(
            partition=partition,
            current_leader_epoch=current_leader_epoch,
            fetch_offset=offset,
            partition_max_bytes=partition_max,
        )
        if version >= 13:
            topic_id = (topic_ids or {}).get(topic, uuid.uuid4())
            topics.append(topic_cls(topic_id=topic_id, partitions=(partition_request,)))
        else:
            topics.append(topic_cls(topic=topic, partitions=(partition_request,)))
    request = cls(
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        topics=tuple(topics),
        forgotten_topics_data=(),
    )
    with RawConnection(bootstrap, timeout=30) as conn:
        return conn.call(request)


def list_offsets(
    bootstrap: str, topic: str, timestamp: int, version: int = 8
) -> tuple[int, int, int]:
    cls = request_class(2, version)
    topic_cls = request_class(2, version, "ListOffsetsTopic")
    partition_cls = request_class(2, version, "ListOffsetsPartition")
    extra = {"isolation_level": 0} if version >= 2 else {}
    request = cls(
        replica_id=-1,
        **extra,
        topics=(
            topic_cls(
                name=topic, partitions=(partition_cls(partition_index=0, timestamp=timestamp),)
            ),
        ),
    )
    with RawConnection(bootstrap) as conn:
        result = conn.call(request).topics[0].partitions[0]
    assert result.error_code == ErrorCode.none
    return int(result.offset), int(result.timestamp), int(getattr(result, "leader_epoch", -1))


def topic_id_of(bootstrap: str, topic: str) -> uuid.UUID:
    cls = request_class(3, 12)
    topic_cls = request_class(3, 12, "MetadataRequestTopic")
    request = cls(
        topics=(topic_cls(topic_id=None, name=topic),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    with RawConnection(bootstrap) as conn:
        return conn.call(request).topics[0].topic_id


def records_of(partition_data: object) -> list[tuple[int, bytes | None]]:
    data = partition_data.records or b""  # type: ignore[attr-defined]
    return [
        (r.offset, r.value)
        for pos, h in iter_batches(data)
        for r in iter_records(data[pos : pos + h.size])
    ]


@pytest.fixture
def topic(broker: BrokerProcess) -> str:
    return create_topic(broker.bootstrap, 2)


def test_fetch_at_the_end_waits_max_wait_ms(broker: BrokerProcess, topic: str) -> None:
    started = time.monotonic()
    response = fetch(broker.bootstrap, [(topic, 0, 0, 65536)], max_wait_ms=600)
    elapsed = time.monotonic() - started
    assert 0.55 <= elapsed < 3
    assert response.responses[0].partitions[0].error_code == ErrorCode.none
    assert not response.responses[0].partitions[0].records


def test_fetch_returns_as_soon_as_data_arrives(broker: BrokerProcess, topic: str) -> None:
    timer = threading.Timer(
        0.3, produce_batch, (broker.bootstrap, topic, 0, [NewRecord(b"k", b"late")])
    )
    timer.start()
    started = time.monotonic()
    response = fetch(broker.bootstrap, [(topic, 0, 0, 65536)], max_wait_ms=20_000)
    elapsed = time.monotonic() - started
    timer.join()
    assert elapsed < 5
    assert records_of(response.responses[0].partitions[0]) == [(0, b"late")]


def test_fetch_waits_for_min_bytes_until_max_wait(broker: BrokerProcess, topic: str) -> None:
    produce_batch(broker.bootstrap, topic, 0, [NewRecord(None, b"small")])
    started = time.monotonic()
    response = fetch(broker.bootstrap, [(topic, 0, 0, 65536)], max_wait_ms=700, min_bytes=100_000)
    assert time.monotonic() - started >= 0.65
    assert records_of(response.responses[0].partitions[0]) == [(0, b"small")]


def test_partition_max_bytes_returns_only_whole_batches(broker: BrokerProcess, topic: str) -> None:
    for i in range(10):
        produce_batch(broker.bootstrap, topic, 0, [NewRecord(None, bytes([i]) * 1000)])
    response = fetch(broker.bootstrap, [(topic, 0, 0, 2500)])
    partition = response.responses[0].partitions[0]
    assert len(partition.records) <= 2500
    assert [offset for offset, _ in records_of(partition)] == [0, 1]
    assert partition.high_watermark == 10


def test_first_batch_larger_than_the_limits_is_returned_whole(
    broker: BrokerProcess, topic: str
) -> None:
    produce_batch(broker.bootstrap, topic, 1, [NewRecord(None, b"x" * 5000)])
    response = fetch(broker.bootstrap, [(topic, 1, 0, 1000)], max_bytes=1000)
    assert records_of(response.responses[0].partitions[0]) == [(0, b"x" * 5000)]


def test_response_max_bytes_spans_partitions(broker: BrokerProcess, topic: str) -> None:
    for partition in (0, 1):
        for _ in range(3):
            produce_batch(broker.bootstrap, topic, partition, [NewRecord(None, b"y" * 1000)])
    response = fetch(broker.bootstrap, [(topic, 0, 0, 65536), (topic, 1, 0, 65536)], max_bytes=2500)
    first, second = response.responses[0].partitions
    assert len(records_of(first)) == 2
    assert records_of(second) == []


def test_fetch_beyond_the_log_end_is_out_of_range(broker: BrokerProcess, topic: str) -> None:
    produce_batch(broker.bootstrap, topic, 0, [NewRecord(None, b"one")])
    response = fetch(broker.bootstrap, [(topic, 0, 5, 65536)])
    assert response.responses[0].partitions[0].error_code == ErrorCode.offset_out_of_range


def test_fetch_with_a_newer_leader_epoch_is_unknown_leader_epoch(
    broker: BrokerProcess, topic: str
) -> None:
    response = fetch(broker.bootstrap, [(topic, 0, 0, 65536)], current_leader_epoch=7)
    assert response.responses[0].partitions[0].error_code == ErrorCode.unknown_leader_epoch


def test_fetch_by_topic_id(broker: BrokerProcess, topic: str) -> None:
    produce_batch(broker.bootstrap, topic, 0, [NewRecord(None, b"by-id")])
    topic_id = topic_id_of(broker.bootstrap, topic)
    response = fetch(
        broker.bootstrap, [(topic, 0, 0, 65536)], version=16, topic_ids={topic: topic_id}
    )
    assert response.responses[0].topic_id == topic_id
    assert records_of(response.responses[0].partitions[0]) == [(0, b"by-id")]
    unknown = fetch(broker.bootstrap, [("other", 0, 0, 65536)], version=16)
    assert unknown.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_id


def test_list_offsets_earliest_latest_by_timestamp_and_max_timestamp(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 1)
    base = 1_700_000_000_000
    produce_batch(broker.bootstrap, topic, 0, [NewRecord(None, b"a", timestamp=base + 1000)])
    produce_batch(
        broker.bootstrap,
        topic,
        0,
        [
            NewRecord(None, b"b", timestamp=base + 2000),
            NewRecord(None, b"c", timestamp=base + 5000),
        ],
    )
    produce_batch(broker.bootstrap, topic, 0, [NewRecord(None, b"d", timestamp=base + 3000)])
    assert list_offsets(broker.bootstrap, topic, -2)[0] == 0
    assert list_offsets(broker.bootstrap, topic, -1)[0] == 4
    assert list_offsets(broker.bootstrap, topic, base)[:2] == (0, base + 1000)
    assert list_offsets(broker.bootstrap, topic, base + 1500)[:2] == (1, base + 2000)
    assert list_offsets(broker.bootstrap, topic, base + 2500)[:2] == (2, base + 5000)
    assert list_offsets(broker.bootstrap, topic, base + 6000)[:2] == (-1, -1)
    assert list_offsets(broker.bootstrap, topic, -3)[:2] == (2, base + 5000)
    assert list_offsets(broker.bootstrap, topic, base + 1500, version=1)[:2] == (1, base + 2000)


def test_offset_for_leader_epoch_answers_from_the_epoch_cache(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, 1)
    produce_batch(broker.bootstrap, topic, 0, [NewRecord(None, b"a"), NewRecord(None, b"b")])
    cls = request_class(23, 4)
    topic_cls = request_class(23, 4, "OffsetForLeaderTopic")
    partition_cls = request_class(23, 4, "OffsetForLeaderPartition")

    def ask(epoch: int) -> tuple[int, int]:
        request = cls(
            replica_id=-1,
            topics=(
                topic_cls(
                    topic=topic, partitions=(partition_cls(partition=0, leader_epoch=epoch),)
                ),
            ),
        )
        with RawConnection(broker.bootstrap) as conn:
            result = conn.call(request).topics[0].partitions[0]
        assert result.error_code == ErrorCode.none
        return int(result.leader_epoch), int(result.end_offset)

    assert ask(0) == (0, 2)
    assert ask(3) == (-1, -1)
