"""The idempotent producer: exactly once and in order through cut connections, retries
answered with their original offsets, gaps and old epochs refused, state kept across
restarts. Transactional producers are tests/integration/test_transactions.py's."""

from __future__ import annotations

import datetime
import random
import threading
import time

import pytest
from chaos_proxy import ChaosProxy
from confluent_kafka import Producer
from conftest import BrokerFactory
from harness import free_port, wait_until
from kafka_clients import confluent_consume, create_topic
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, request_class

from shoal.records import BatchOptions, NewRecord, build_batch, iter_batches


def init_producer_id(
    bootstrap: str, transactional_id: str | None = None
) -> tuple[ErrorCode, int, int]:
    request = request_class(22, 4)(
        transactional_id=transactional_id,
        transaction_timeout=datetime.timedelta(seconds=60),
    )
    with RawConnection(bootstrap) as conn:
        response = conn.call(request)
    return response.error_code, int(response.producer_id), int(response.producer_epoch)


def produce(
    conn: RawConnection,
    topic: str,
    producer_id: int,
    epoch: int,
    sequence: int,
    values: list[bytes],
) -> tuple[ErrorCode, int]:
    batch = build_batch(
        [NewRecord(None, v) for v in values],
        options=BatchOptions(producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence),
    )
    cls = request_class(0, 9)
    request = cls(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            request_class(0, 9, "TopicProduceData")(
                name=topic,
                partition_data=(
                    request_class(0, 9, "PartitionProduceData")(index=0, records=batch),
                ),
            ),
        ),
    )
    result = conn.call(request).responses[0].partition_responses[0]
    return result.error_code, int(result.base_offset)


def test_idempotent_producer_through_cut_connections_writes_each_record_once_in_order(
    broker_factory: BrokerFactory,
) -> None:
    proxy_port = free_port()
    broker = broker_factory(extra_args=(f"--advertise=127.0.0.1:{proxy_port}",))
    with ChaosProxy(broker.port, proxy_port) as proxy:
        bootstrap = f"127.0.0.1:{proxy_port}"
        topic = create_topic(bootstrap, 3)
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "batch.num.messages": 200,
                "message.timeout.ms": 180000,
                "reconnect.backoff.ms": 10,
                "reconnect.backoff.max.ms": 200,
            }
        )
        errors: list[str] = []
        stop = threading.Event()
        rng = random.Random(7)

        def chaos() -> None:
            # Cuts far apart enough for librdkafka to reconnect and resend in
            # between: every cut then lands on requests in flight.
            while not stop.wait(rng.uniform(0.3, 0.9)):
                if rng.random() < 0.5:
                    proxy.cut()
                else:
                    proxy.cut_after_next_produce_response()

        expected: dict[int, list[bytes]] = {0: [], 1: [], 2: []}

        def send(i: int) -> None:
            partition = i % 3
            value = f"{partition}-{i:06d}".encode()
            expected[partition].append(value)
            producer.produce(
                topic,
                value,
                partition=partition,
                on_delivery=lambda err, _m: errors.append(err.str()) if err else None,
            )

        send(0)
        assert producer.flush(30) == 0, "the producer id must come before the chaos"
        cutter = threading.Thread(target=chaos)
        cutter.start()
        try:
            deadline = time.monotonic() + 12
            i = 1
            while time.monotonic() < deadline:
                for _ in range(50):
                    send(i)
                    i += 1
                producer.poll(0.05)
            remaining = producer.flush(120)
        finally:
            stop.set()
            cutter.join()
        assert remaining == 0
        assert not errors, errors[:5]
        assert proxy.cuts >= 10, f"only {proxy.cuts} cuts happened"
        print(f"{proxy.cuts} connection cuts while producing")

        counts = {p: len(values) for p, values in expected.items()}
        stored = confluent_consume(bootstrap, topic, counts)
    for partition, values in expected.items():
        in_log = [
            r.value for r in sorted(stored, key=lambda r: r.offset or 0) if r.partition == partition
        ]
        assert in_log == values, f"partition {partition}: duplicates, gaps or reordering"
    retries = broker.log_tail(10_000_000).count("event=produce_duplicate")
    print(f"{proxy.lost_responses} responses lost; {retries} retried batches recognised")
    assert retries > 0, "no retry of an already stored batch happened: the test proved nothing"


def test_a_retried_batch_gets_its_original_offset_and_is_stored_once(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory()
    topic = create_topic(broker.bootstrap, 1)
    code, producer_id, epoch = init_producer_id(broker.bootstrap)
    assert code == ErrorCode.none and producer_id >= 0 and epoch == 0
    with RawConnection(broker.bootstrap) as conn:
        assert produce(conn, topic, producer_id, 0, 0, [b"a", b"b"]) == (ErrorCode.none, 0)
        assert produce(conn, topic, producer_id, 0, 2, [b"c"]) == (ErrorCode.none, 2)
        assert produce(conn, topic, producer_id, 0, 0, [b"a", b"b"]) == (ErrorCode.none, 0)
        assert produce(conn, topic, producer_id, 0, 2, [b"c"]) == (ErrorCode.none, 2)
        assert (
            produce(conn, topic, producer_id, 0, 5, [b"gap"])[0]
            == ErrorCode.out_of_order_sequence_number
        )
        assert produce(conn, topic, producer_id, 0, 3, [b"d"]) == (ErrorCode.none, 3)
    stored = confluent_consume(broker.bootstrap, topic, {0: 4})
    assert [r.value for r in stored] == [b"a", b"b", b"c", b"d"]


def test_an_older_epoch_is_fenced_and_a_new_producer_id_is_unique(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory()
    topic = create_topic(broker.bootstrap, 1)
    ids = {init_producer_id(broker.bootstrap)[1] for _ in range(5)}
    assert len(ids) == 5
    producer_id = min(ids)
    with RawConnection(broker.bootstrap) as conn:
        assert produce(conn, topic, producer_id, 1, 0, [b"epoch 1"])[0] == ErrorCode.none
        assert (
            produce(conn, topic, producer_id, 0, 1, [b"old"])[0] == ErrorCode.invalid_producer_epoch
        )
        assert produce(conn, topic, producer_id, 2, 3, [b"new epoch"])[0] == (
            ErrorCode.out_of_order_sequence_number
        )


@pytest.mark.parametrize("crash", [False, True])
def test_producer_state_and_ids_survive_a_restart(
    broker_factory: BrokerFactory, crash: bool
) -> None:
    broker = broker_factory()
    topic = create_topic(broker.bootstrap, 1)
    _, producer_id, _ = init_producer_id(broker.bootstrap)
    with RawConnection(broker.bootstrap) as conn:
        produce(conn, topic, producer_id, 0, 0, [b"a", b"b", b"c"])
        produce(conn, topic, producer_id, 0, 3, [b"d", b"e", b"f"])
    if crash:
        broker.kill()
    else:
        assert broker.stop() == 0
    broker.start()
    with RawConnection(broker.bootstrap) as conn:
        assert produce(conn, topic, producer_id, 0, 3, [b"d", b"e", b"f"]) == (ErrorCode.none, 3)
        assert (
            produce(conn, topic, producer_id, 0, 7, [b"x"])[0]
            == ErrorCode.out_of_order_sequence_number
        )
        assert produce(conn, topic, producer_id, 0, 6, [b"g"]) == (ErrorCode.none, 6)
    assert init_producer_id(broker.bootstrap)[1] > producer_id


def test_kafka_python_is_idempotent_by_default_and_its_batches_carry_its_producer_id(
    broker_factory: BrokerFactory,
) -> None:
    from kafka import KafkaProducer

    broker = broker_factory()
    topic = create_topic(broker.bootstrap, 1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)  # kafka-python 3 defaults
    for i in range(10):
        producer.send(topic, f"v{i}".encode(), partition=0).get(timeout=30)
    producer.close()
    segment = broker.data_dir / f"{topic}-0" / f"{0:020d}.log"
    headers = [header for _pos, header in iter_batches(segment.read_bytes())]
    assert headers, "nothing was written"
    assert {h.producer_id for h in headers} != {-1}
    assert len({h.producer_id for h in headers}) == 1
    assert [h.base_sequence for h in headers] == list(range(len(headers)))


def test_the_transaction_apis_refuse_an_id_that_has_no_producer(broker: object) -> None:
    """On its coordinator, a transactional id that never ran InitProducerId maps to no
    producer id: Kafka's INVALID_PRODUCER_ID_MAPPING."""
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    who = {"transactional_id": "txn", "producer_id": 7, "producer_epoch": 0}
    topic = create_topic(bootstrap, 2)
    with RawConnection(bootstrap) as conn:

        def coordinator_found() -> bool:
            found = conn.call(request_class(10, 3)(key="txn", key_type=1))
            return bool(found.error_code == ErrorCode.none)

        wait_until(coordinator_found, 60, "the transaction coordinator")
        ended = conn.call(request_class(26, 3)(**who, committed=True))
        assert ended.error_code == ErrorCode.invalid_producer_id_mapping
        offsets = conn.call(request_class(25, 3)(**who, group_id="g"))
        assert offsets.error_code == ErrorCode.invalid_producer_id_mapping
        partitions = conn.call(
            request_class(24, 3)(
                v3_and_below_transactional_id="txn",
                v3_and_below_producer_id=7,
                v3_and_below_producer_epoch=0,
                v3_and_below_topics=(
                    request_class(24, 3, "AddPartitionsToTxnTopic")(name=topic, partitions=(0, 1)),
                ),
            )
        )
        codes = {
            p.partition_error_code
            for t in partitions.results_by_topic_v3_and_below
            for p in t.results_by_partition
        }
        assert codes == {ErrorCode.invalid_producer_id_mapping}
