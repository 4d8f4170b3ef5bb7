"""A broker pod deleted under load: nothing a producer saw acknowledged is lost.

Topic `events` has three replicas and min.insync.replicas 2, so with one of
the three brokers gone, acks=all writes go on; the StatefulSet brings the
pod back on its volume and it rejoins the ISRs. Every record acknowledged
before, during and after must then be readable.

Needs the kind cluster e2e/run.sh makes (see conftest.py); skipped elsewhere.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from conftest import CLUSTER, client_config, get, is_ready, kubectl, wait_for
from shoal.operator.endpoints import broker_pod

pytestmark = pytest.mark.timeout(900)
VICTIM = 1


def produce_until(stop: threading.Event, config: dict[str, str], run: str) -> set[bytes]:
    """Produce numbered records until ``stop``; the ones acknowledged."""
    acknowledged: set[bytes] = set()

    def delivered(err: KafkaError | None, message: Message) -> None:
        if err is None:
            acknowledged.add(message.value())

    producer = Producer({**config, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    n = 0
    while not stop.is_set():
        try:
            producer.produce("events", value=f"{run}-{n}".encode(), on_delivery=delivered)
            n += 1
        except BufferError:
            producer.poll(0.1)
        producer.poll(0)
        time.sleep(0.002)
    producer.flush(120)
    return acknowledged


def test_deleting_a_broker_pod_under_load_loses_no_acknowledged_record(gateway: str) -> None:
    config = client_config("app", gateway)
    run = uuid.uuid4().hex
    stop = threading.Event()
    result: list[set[bytes]] = []
    writer = threading.Thread(target=lambda: result.append(produce_until(stop, config, run)))
    writer.start()
    try:
        time.sleep(5)  # load before the loss, not a wait for a condition
        pod = broker_pod(CLUSTER, VICTIM)
        old_uid = get("pod", pod)["metadata"]["uid"]
        kubectl("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false")
        wait_for(
            f"{pod} to come back",
            lambda: _recreated_and_ready(pod, old_uid),
            timeout=300,
        )
        wait_for(
            "no under-replicated partitions",
            lambda: get("cluster", CLUSTER)["status"]["partitions"]["underReplicated"] == 0,
            timeout=300,
        )
        time.sleep(5)  # load after the broker is back
    finally:
        stop.set()
        writer.join(timeout=180)
    (acknowledged,) = result
    assert len(acknowledged) > 100

    consumer = Consumer({**config, "group.id": f"e2e-loss-{run}", "auto.offset.reset": "earliest"})
    consumer.subscribe(["events"])
    received: set[bytes] = set()
    try:
        idle = 0
        while idle < 15 and not acknowledged <= received:
            batch = consumer.consume(num_messages=1000, timeout=1.0)
            idle = 0 if batch else idle + 1
            for message in batch:
                if message.error():
                    raise KafkaException(message.error())
                if message.value().startswith(run.encode()):
                    received.add(message.value())
    finally:
        consumer.close()
    lost = acknowledged - received
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:5]}"
    cluster = get("cluster", CLUSTER)
    assert is_ready(cluster)


def _recreated_and_ready(pod: str, old_uid: str) -> bool:
    try:
        current = get("pod", pod)
    except subprocess.CalledProcessError:  # absent while the StatefulSet recreates it
        return False
    return current["metadata"]["uid"] != old_uid and is_ready(current)
