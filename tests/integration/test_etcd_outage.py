"""etcd away: current leaders keep serving, and a broker told to stop still stops.

Three brokers on an etcd of their own (this module stops and starts it).
While etcd is down nothing can change leadership or the ISR, but partitions
whose replicas are all in step need neither: acks=all writes go on being
acknowledged and read back, also after the brokers' session timeout has
passed without a renewal (shoal.broker.cluster.session), and an idempotent
producer started during the outage gets its producer id from the block its
broker fetched ahead. When etcd returns the cluster carries on. A
broker sent SIGTERM while etcd is gone skips its controlled shutdown (no
one can move its leadership) and exits rather than waiting on etcd.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness import BrokerProcess, EtcdServer, start_all
from raw_kafka import RawConnection, request_class
from replicated import Cluster, read_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STOP_WITHIN_S = 20
SESSION_TIMEOUT_S = 9


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    yield etcd
    etcd.stop()


def produce(producer: Producer, topic: str, values: list[bytes]) -> int:
    """How many of ``values`` were acknowledged."""
    failed = []
    for value in values:
        producer.produce(
            topic, value, on_delivery=lambda err, _msg: failed.append(err) if err else None
        )
    producer.flush(30)
    return len(values) - len(failed)


def test_leaders_serve_through_an_etcd_outage_and_brokers_still_stop(
    own_etcd: EtcdServer, tmp_path: Path
) -> None:
    chroot = own_etcd.chroot_url()
    env = {"SHOAL_DEFAULT_REPLICATION_FACTOR": "3", "SHOAL_OFFSETS_TOPIC_NUM_PARTITIONS": "3"}
    brokers = [BrokerProcess(chroot, tmp_path / f"b{n}", n, env=env) for n in range(3)]
    start_all(brokers)
    try:
        cluster = Cluster(brokers)
        topic = cluster.create_topic("steady", 3, **{"min.insync.replicas": "2"})
        cluster.wait_full_isr(topic)
        settings = {
            "bootstrap.servers": cluster.bootstrap,
            "enable.idempotence": True,
            "message.timeout.ms": 20_000,
        }
        producer = Producer(settings)
        before = [b"before-%d" % i for i in range(100)]
        assert produce(producer, topic, before) == len(before)

        own_etcd.process.kill()  # type: ignore[union-attr]
        own_etcd.process.wait()  # type: ignore[union-attr]
        # Past the brokers' session timeout: renewals fail, yet no one can have been
        # replaced (etcd renews every lease when it returns), so leaders go on leading.
        time.sleep(SESSION_TIMEOUT_S + 3)
        during = [b"during-%d" % i for i in range(100)]
        assert produce(producer, topic, during) == len(during)
        # Started now: its InitProducerId is served from a block fetched before etcd left,
        # whichever broker it asks; so is one asked of each broker.
        newcomer = [b"newcomer-%d" % i for i in range(50)]
        assert produce(Producer(settings), topic, newcomer) == len(newcomer)
        init_producer_id = request_class(22, 4)
        given = []
        for broker in brokers:
            with RawConnection(broker.bootstrap) as connection:
                answer = connection.call(
                    init_producer_id(
                        transactional_id=None,
                        transaction_timeout=timedelta(seconds=60),
                        producer_id=-1,
                        producer_epoch=-1,
                    )
                )
            assert answer.error_code == 0, (broker.node_id, answer)
            given.append(answer.producer_id)
        assert len(set(given)) == len(brokers), given

        own_etcd.start()
        after = [b"after-%d" % i for i in range(100)]
        assert produce(producer, topic, after) == len(after)
        stored = read_all(cluster.bootstrap, topic, 3)
        values = sorted(value for records in stored.values() for _, value in records)
        assert values == sorted(before + during + newcomer + after)

        own_etcd.process.kill()  # type: ignore[union-attr]
        own_etcd.process.wait()  # type: ignore[union-attr]
        began = time.monotonic()
        for broker in brokers:
            broker.process.terminate()  # type: ignore[union-attr]
        codes = [broker.process.wait(STOP_WITHIN_S) for broker in brokers]  # type: ignore[union-attr]
        print(f"three brokers stopped {time.monotonic() - began:.1f} s after SIGTERM, etcd gone")
        assert codes == [0, 0, 0], [b.log_tail() for b in brokers]
    finally:
        for broker in brokers:
            if broker.running:
                broker.kill()
