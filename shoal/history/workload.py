"""A recorded workload: producers and a consumer group that write down all they see.

Every client is confluent-kafka (librdkafka), configured as a careful user
would: idempotent acks=all producers, a group whose members commit what they
read, synchronously. Each runs in its own thread, because librdkafka's calls
block and its callbacks fire from ``poll``. When the run ends, producers
flush, members leave, and one more reader takes the ``final`` events: every
partition read from its start to its end.

Producers send to explicit partitions (round-robin over the topic's), so the
checker can hold each producer's order within a partition.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from shoal.history.events import Event, Kind

POLL_S = 0.2
COMMIT_EVERY_S = 1.0
FINAL_READ_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Workload:
    settings: Mapping[str, Any]
    """librdkafka settings every client shares: bootstrap.servers, SASL, TLS."""
    topic: str
    producers: int = 2
    consumers: int = 2
    rate: float = 100.0
    """Records per second per producer."""
    group: str = field(default_factory=lambda: f"history-{uuid.uuid4().hex[:8]}")


class Recorder:
    """The history, appended to from every client thread."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self.events: list[Event] = []

    def now(self) -> float:
        return time.monotonic() - self._start

    def record(self, kind: Kind, **fields: Any) -> None:
        event = Event(kind, self.now(), **fields)
        with self._lock:
            self.events.append(event)


def partition_count(settings: Mapping[str, Any], topic: str) -> int:
    consumer = Consumer({**settings, "group.id": "history-metadata"})
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        described = metadata.topics[topic]
        if described.error is not None:
            raise KafkaException(described.error)
        return len(described.partitions)
    finally:
        consumer.close()


def _produce(
    workload: Workload, name: str, partitions: int, stop: threading.Event, history: Recorder
) -> None:
    producer = Producer(
        {
            **workload.settings,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "client.id": name,
        }
    )

    def delivered(error: KafkaError | None, message: Message) -> None:
        value = bytes(message.value() or b"").decode()
        if error is not None:
            history.record(Kind.ACK, client=name, value=value, error=error.name())
            return
        epoch = message.leader_epoch()
        history.record(
            Kind.ACK,
            client=name,
            value=value,
            partition=message.partition(),
            offset=-1 if message.offset() is None else message.offset(),
            epoch=-1 if epoch is None else epoch,
        )

    interval = 1.0 / workload.rate
    due = time.monotonic()
    seq = 0
    while not stop.is_set():
        value = f"{name}-{seq}"
        partition = seq % partitions
        history.record(Kind.SEND, client=name, value=value, partition=partition, seq=seq)
        while True:
            try:
                producer.produce(
                    workload.topic, value.encode(), partition=partition, on_delivery=delivered
                )
                break
            except BufferError:
                producer.poll(POLL_S)
        seq += 1
        due += interval
        producer.poll(max(0.0, due - time.monotonic()))
    producer.flush(FINAL_READ_TIMEOUT_S)


def _consume(workload: Workload, name: str, stop: threading.Event, history: Recorder) -> None:
    consumer = Consumer(
        {
            **workload.settings,
            "group.id": workload.group,
            "client.id": name,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([workload.topic])
    last_commit = time.monotonic()
    try:
        while not stop.is_set():
            message = consumer.poll(POLL_S)
            if message is not None and message.error() is None:
                history.record(
                    Kind.POLL,
                    client=name,
                    value=bytes(message.value() or b"").decode(),
                    partition=message.partition(),
                    offset=message.offset(),
                )
            if time.monotonic() - last_commit >= COMMIT_EVERY_S:
                _commit(consumer, workload.group, name, history)
                last_commit = time.monotonic()
    finally:
        _commit(consumer, workload.group, name, history)
        consumer.close()


def _commit(consumer: Consumer, group: str, name: str, history: Recorder) -> None:
    try:
        committed = consumer.commit(asynchronous=False)
    except KafkaException:
        return  # Nothing to commit, or the commit failed: either may happen under faults.
    for tp in committed or ():
        if tp.error is None and tp.offset >= 0:
            history.record(
                Kind.COMMIT, client=name, partition=tp.partition, offset=tp.offset, group=group
            )


def final_read(settings: Mapping[str, Any], topic: str, partitions: int, history: Recorder) -> None:
    """Read every partition from its start to its current end into ``final`` events."""
    reader = Consumer(
        {
            **settings,
            "group.id": f"history-final-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        ends = {
            p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(partitions)
        }
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        positions = dict.fromkeys(range(partitions), 0)
        deadline = time.monotonic() + FINAL_READ_TIMEOUT_S
        while any(positions[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                behind = {p: (positions[p], ends[p]) for p in ends if positions[p] < ends[p]}
                raise TimeoutError(f"the final read did not reach the end of {topic}: {behind}")
            message = reader.poll(POLL_S)
            if message is None or message.error() is not None:
                continue
            positions[message.partition()] = message.offset() + 1
            history.record(
                Kind.FINAL,
                client="final",
                value=bytes(message.value() or b"").decode(),
                partition=message.partition(),
                offset=message.offset(),
            )
    finally:
        reader.close()


class Run:
    """A workload running in the background: ``start()``, faults, then ``finish()``."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.history = Recorder()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failures: list[BaseException] = []
        self._partitions = 0

    def start(self) -> Run:
        self._partitions = partition_count(self.workload.settings, self.workload.topic)
        for n in range(self.workload.producers):
            self._spawn(
                _produce, self.workload, f"p{n}", self._partitions, self._stop, self.history
            )
        for n in range(self.workload.consumers):
            self._spawn(_consume, self.workload, f"c{n}", self._stop, self.history)
        return self

    def _spawn(self, target: Any, *args: Any) -> None:
        def client() -> None:
            try:
                target(*args)
            except BaseException as exc:  # reported by finish(), not lost in a thread
                self._failures.append(exc)
                raise

        thread = threading.Thread(target=client, name=str(args[1]), daemon=True)
        thread.start()
        self._threads.append(thread)

    def finish(self) -> list[Event]:
        """Stop the clients, take the final read, and return the history."""
        self._stop.set()
        for thread in self._threads:
            thread.join(FINAL_READ_TIMEOUT_S * 2)
            if thread.is_alive():
                raise TimeoutError(f"client {thread.name} did not stop")
        if self._failures:
            raise RuntimeError("a client of the workload failed") from self._failures[0]
        final_read(self.workload.settings, self.workload.topic, self._partitions, self.history)
        return list(self.history.events)
