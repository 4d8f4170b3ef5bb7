"""Retention deletes whole old segments; the log start offset and ListOffsets(earliest)
move with it; fetching below it is OFFSET_OUT_OF_RANGE. A retention.ms lowered on a
live topic takes effect at the next check."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
)
from conftest import BrokerFactory
from harness import wait_until
from kafka_clients import confluent_consume, create_topic
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, request_class

FAST_RETENTION = {"SHOAL_LOG_RETENTION_CHECK_INTERVAL_MS": "200"}


def earliest(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = CTopicPartition(topic, 0)
    return int(admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(30).offset)


def set_retention_ms(bootstrap: str, topic: str, retention_ms: int) -> None:
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry(
                "retention.ms", str(retention_ms), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(30)


def produce(bootstrap: str, topic: str, count: int, timestamp: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, partition=0, value=b"v" * 200 + b"%d" % i, timestamp=timestamp)
        producer.flush(10)


def fetch_error(bootstrap: str, topic: str, offset: int) -> ErrorCode:
    version = 12
    cls = request_class(1, version)
    topic_cls = request_class(1, version, "FetchTopic")
    partition_cls = request_class(1, version, "FetchPartition")
    request = cls(
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=1,
        topics=(
            topic_cls(
                topic=topic,
                partitions=(
                    partition_cls(partition=0, fetch_offset=offset, partition_max_bytes=65536),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    with RawConnection(bootstrap) as conn:
        response = conn.call(request)
    return response.responses[0].partitions[0].error_code


def segments(data_dir: Path, topic: str) -> list[Path]:
    return sorted(Path(data_dir, f"{topic}-0").glob("*.log"))


def test_time_retention_deletes_old_segments_and_moves_the_log_start(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(env=FAST_RETENTION)
    # The hour-old records are within the default week of retention: nothing
    # may go until retention.ms is lowered below their age.
    topic = create_topic(
        broker.bootstrap, 1, **{"segment.bytes": "1000", "file.delete.delay.ms": "0"}
    )
    now = int(time.time() * 1000)
    produce(broker.bootstrap, topic, 20, now - 3_600_000)
    produce(broker.bootstrap, topic, 10, now)
    time.sleep(0.5)  # two of the broker's retention checks: neither may delete anything
    assert earliest(broker.bootstrap, topic) == 0
    set_retention_ms(broker.bootstrap, topic, 600_000)

    new_start = wait_until(
        lambda: earliest(broker.bootstrap, topic) or None, 20, "retention to delete segments"
    )
    assert 0 < new_start <= 20
    remaining = confluent_consume(broker.bootstrap, topic, {0: 30 - new_start})
    assert [r.offset for r in remaining] == list(range(new_start, 30))
    assert all(r.timestamp == now for r in remaining if r.offset >= 20)
    assert fetch_error(broker.bootstrap, topic, 0) == ErrorCode.offset_out_of_range
    assert fetch_error(broker.bootstrap, topic, new_start) == ErrorCode.none
    wait_until(
        lambda: not list(Path(broker.data_dir, f"{topic}-0").glob("*.deleted")),
        10,
        "deleted segment files to go",
    )
    assert min(int(p.stem) for p in segments(broker.data_dir, topic)) == new_start


def test_size_retention_keeps_the_log_under_retention_bytes(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(env=FAST_RETENTION)
    topic = create_topic(
        broker.bootstrap,
        1,
        **{"segment.bytes": "1000", "retention.bytes": "3000", "file.delete.delay.ms": "0"},
    )
    produce(broker.bootstrap, topic, 40, int(time.time() * 1000))
    wait_until(lambda: earliest(broker.bootstrap, topic) > 0, 20, "size retention")
    wait_until(
        lambda: sum(p.stat().st_size for p in segments(broker.data_dir, topic)) <= 3000 + 1000,
        10,
        "the log to shrink",
    )
    assert fetch_error(broker.bootstrap, topic, 0) == ErrorCode.offset_out_of_range
