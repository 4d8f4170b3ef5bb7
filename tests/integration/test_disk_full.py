"""A broker whose log directory fills up (issue 24): KIP-112's offline directory.

Broker 0's data directory is a 48 MB filesystem of its own (tmpfs); a filler
writes large records to a replicated topic until broker 0 runs out of space,
while a steady idempotent ``acks=all`` producer writes to another topic.
Broker 0 must take its directory offline at the first failed write: answer
KAFKA_STORAGE_ERROR, log the directory once, stop as SIGTERM would (leadership
moves, it leaves every ISR), and exit 1. The steady producer loses nothing
and waits seconds, not the 30 s of a follower timing out of the ISR. Once
space is back, broker 0 starts again, recovers its logs (a torn batch is cut)
and catches up.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from conftest import BrokerFactory
from harness import wait_until
from replicated import SteadyProducer, read_all, start_cluster

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a broker's own small filesystem is a tmpfs mount, which needs root"
)

SMALL = "48m"
BALLAST_VALUE = 100_000
GAP_BOUND_S = 12.0
"""Broker lease 3 s (REPLICATED_ENV), the controlled shutdown, the clients' retries."""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """Where broker 0 keeps its data: a filesystem of SMALL bytes."""
    where = tmp_path / "broker-0"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL}", "tmpfs", str(where)], check=True)
    yield where
    subprocess.run(["umount", "--lazy", str(where)], check=False)


class Filler(threading.Thread):
    """Writes BALLAST_VALUE-byte records, acks=all, until stopped; counts what failed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.errors: list[KafkaError] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "queue.buffering.max.kbytes": 8192,
            }
        )
        value = os.urandom(BALLAST_VALUE)
        while not self._stopping.is_set():
            try:
                producer.produce(self.topic, value, on_delivery=self._delivered)
            except BufferError:
                producer.poll(0.05)
            producer.poll(0)
        producer.purge()
        producer.flush(30)

    def _delivered(self, err: KafkaError | None, _msg: object) -> None:
        if err is not None and err.code() not in (
            KafkaError._PURGE_QUEUE,
            KafkaError._PURGE_INFLIGHT,
        ):
            self.errors.append(err)

    def stop(self) -> None:
        self._stopping.set()
        self.join(60)


def test_a_full_log_directory_goes_offline_and_the_cluster_moves_on_without_loss(
    small_disk: Path, broker_factory: BrokerFactory
) -> None:
    cluster = start_cluster(broker_factory)
    full = cluster.brokers[0]
    assert full.data_dir == small_disk
    steady_topic = cluster.create_topic("steady", 3)
    ballast = cluster.create_topic("ballast", 3)
    cluster.wait_full_isr(steady_topic)
    steady = SteadyProducer(cluster.bootstrap, steady_topic).start()
    filler = Filler(cluster.bootstrap, ballast)
    wait_until(lambda: steady.acked_count() > 200, 30, "steady acknowledgements")
    filler.start()
    try:
        wait_until(lambda: not full.running, 180, "broker 0 to stop on its full disk")
        stopped_at = time.monotonic()
        assert full.process is not None and full.process.returncode == 1
        text = full.log_text()
        offline = [line for line in text.splitlines() if "event=log_dir_offline" in line]
        assert len(offline) == 1, offline
        assert str(small_disk) in offline[0]
        assert "Traceback" not in text
        wait_until(
            lambda: any(t > stopped_at + 1 for *_, t in steady.acked), 30, "acks after the stop"
        )
        filler.stop()

        # Space is back: the broker recovers its logs and catches up.
        subprocess.run(["mount", "-o", "remount,size=1g", str(small_disk)], check=True)
        cluster.restart(0)
        cluster.wait_full_isr(steady_topic, timeout=90)
    finally:
        if filler.is_alive():
            filler.stop()
        steady.stop()

    times = sorted(t for *_, t in steady.acked)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    print(f"\nlongest wait for an ack: {max(gaps):.2f} s; {len(times)} acknowledged")
    assert max(gaps) < GAP_BOUND_S, f"the steady producer waited {max(gaps):.1f} s for an ack"
    assert not steady.errors, steady.errors[:3]
    stored = read_all(cluster.bootstrap, steady_topic, 3)
    for seq, partition, offset, _ in steady.acked:
        assert (offset, b"seq-%d" % seq) in stored[partition], (seq, partition, offset)
    values = [value for records in stored.values() for _, value in records]
    assert len(values) == len(set(values)), "a record stored twice"
