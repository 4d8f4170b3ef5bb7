"""A broker killed with SIGKILL, or with its files cut by hand, comes back without losing
acknowledged records and without serving damaged ones."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec
from conftest import BrokerFactory
from harness import BrokerProcess
from kafka_clients import Rec, confluent_consume, create_topic

from shoal.records import iter_batches


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    specs = {CTopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    return {tp.partition: f.result(30).offset for tp, f in admin.list_offsets(specs).items()}


def produce_until_stopped(
    bootstrap: str, topic: str, stop: threading.Event, acked: list[Rec]
) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 2,
            "message.timeout.ms": 4000,
            "reconnect.backoff.max.ms": 200,
        }
    )

    def delivered(err: object, msg: object) -> None:
        if err is None:
            m = msg  # confluent Message
            acked.append(Rec(m.partition(), m.key(), m.value(), offset=m.offset()))  # type: ignore[attr-defined]

    i = 0
    while not stop.is_set():
        try:
            producer.produce(topic, key=b"%d" % i, value=b"value-%08d" % i, on_delivery=delivered)
            i += 1
        except BufferError:
            pass
        producer.poll(0 if i % 100 else 0.001)
    producer.flush(10)


def test_acknowledged_records_survive_sigkill_under_load(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    topic = create_topic(broker.bootstrap, 3, **{"segment.bytes": "200000"})
    acked: list[Rec] = []
    stop = threading.Event()
    writer = threading.Thread(
        target=produce_until_stopped, args=(broker.bootstrap, topic, stop, acked)
    )
    writer.start()
    time.sleep(2.5)
    broker.kill()
    stop.set()
    writer.join(30)
    assert len(acked) > 1000, "the producer should have written plenty before the kill"

    broker.start()
    counts = end_offsets(broker.bootstrap, topic, 3)
    stored = confluent_consume(broker.bootstrap, topic, counts)
    by_position = {(r.partition, r.offset): r.value for r in stored}
    missing = [r for r in acked if by_position.get((r.partition, r.offset)) != r.value]
    assert not missing, f"{len(missing)} acknowledged records lost or changed, first {missing[:3]}"


def _last_segment(broker: BrokerProcess, topic: str, partition: int) -> Path:
    return sorted(Path(broker.data_dir, f"{topic}-{partition}").glob("*.log"))[-1]


def _produce_batches(bootstrap: str, topic: str, batches: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "1"})
    for i in range(batches):
        producer.produce(topic, partition=0, value=b"record-%04d" % i)
        producer.flush(10)


def _tear_tail(segment: Path) -> tuple[int, int]:
    """Cut the file in its last batch; returns (whole batches kept, the offset after them)."""
    data = segment.read_bytes()
    batches = list(iter_batches(data))
    position, last = batches[-1]
    with open(segment, "r+b") as f:
        f.truncate(position + last.size // 2)
    return len(batches) - 1, last.base_offset


def test_torn_tail_after_sigkill_is_cut_back_to_the_last_whole_batch(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory()
    topic = create_topic(broker.bootstrap, 1)
    _produce_batches(broker.bootstrap, topic, 20)
    broker.kill()
    kept, next_offset = _tear_tail(_last_segment(broker, topic, 0))

    broker.start()
    assert end_offsets(broker.bootstrap, topic, 1) == {0: next_offset}
    records = confluent_consume(broker.bootstrap, topic, {0: next_offset})
    assert [r.value for r in records] == [b"record-%04d" % i for i in range(kept)]
    _produce_batches(broker.bootstrap, topic, 1)
    assert end_offsets(broker.bootstrap, topic, 1) == {0: next_offset + 1}
    assert "event=log_truncated" in broker.log_text()


def test_tail_cut_by_hand_after_a_clean_shutdown_is_caught_too(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory()
    topic = create_topic(broker.bootstrap, 1)
    _produce_batches(broker.bootstrap, topic, 10)
    assert broker.stop() == 0
    assert Path(broker.data_dir, ".kafka_cleanshutdown").exists()
    kept, next_offset = _tear_tail(_last_segment(broker, topic, 0))

    broker.start()
    assert end_offsets(broker.bootstrap, topic, 1) == {0: next_offset}
    records = confluent_consume(broker.bootstrap, topic, {0: next_offset})
    assert [r.value for r in records] == [b"record-%04d" % i for i in range(kept)]


def test_topics_and_configs_survive_a_restart(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    topic = create_topic(broker.bootstrap, 4, **{"retention.ms": "123456"})
    _produce_batches(broker.bootstrap, topic, 3)
    assert broker.stop() == 0

    broker.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    metadata = admin.list_topics(topic, timeout=30).topics[topic]
    assert metadata.error is None
    assert len(metadata.partitions) == 4
    resource = ConfigResource("topic", topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["retention.ms"].value == "123456"
    assert end_offsets(broker.bootstrap, topic, 4)[0] == 3
