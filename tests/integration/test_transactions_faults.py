"""Exactly-once consume-transform-produce with confluent-kafka while processes die (KIP-98).

What a user of Kafka's exactly-once promise checks: a transform (its own process, so a
SIGKILL is a real crash) reads an input topic in a group, writes one result per input
record in a transaction, and sends its offsets with it. Mid-transaction (records written,
not committed) we kill, in turn, the transform process (a new one with the same
transactional id takes over and fences it), the broker coordinating its transaction, and
the leader of an output partition, restarting each broker once the transform has gone on
without it. In the end the output read with read_committed holds every input's result
exactly once, and the group's committed offsets are exactly the inputs consumed.

The clients are a tenant's, through the gateway; the test looks up the coordinators and
the leaders straight from the brokers, under the tenant's broker-side names. The group's
coordinator is never killed (see the test for the librdkafka bug that would hang the
transform); its failover is test_replication.py's.

Run as a script (``python test_transactions_faults.py SPEC_JSON``) this module is the
transform; see :func:`transform`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from conftest import GatewayCluster, module_gateway_cluster
from gateway_env import GatewayProcess
from harness import EtcdServer, wait_until
from raw_kafka import RawConnection, request_class
from replicated import Cluster
from test_transactions import PARTITIONS, TXN_ENV, Route, read_messages

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

INPUTS = 600
BATCH = 5
"""Input records per transaction at most: 120 transactions or more."""
PAUSE_S = 0.25
"""How long the transform holds each transaction open with its records written, the
window the kills aim at (and what keeps the run long enough for three faults)."""
TIMEOUT_S = 60
FAULT_TIMEOUT_S = 120
"""How long the transform may take to commit again after a fault."""
TRANSACTION_STATE, CONSUMER_OFFSETS = "__transaction_state", "__consumer_offsets"
CLIENT_TUNING: dict[str, Any] = {
    # Find a failed-over leader or coordinator within a second or two, not minutes.
    "reconnect.backoff.max.ms": 500,
    "retry.backoff.ms": 100,
    "retry.backoff.max.ms": 500,
    "topic.metadata.refresh.interval.ms": 1000,
}


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "txn-faults", TXN_ENV)


# -- the transform: a child process -----------------------------------------------------------


def retrying(call: Callable[[], Any]) -> Any:
    """``call()`` again while it fails with a retriable error (as librdkafka asks)."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            return call()
        except KafkaException as raised:
            if not raised.args[0].retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def rewind(consumer: Consumer) -> None:
    """Back to the group's committed offsets, after an aborted transaction."""
    committed = consumer.committed(consumer.assignment(), timeout=TIMEOUT_S)
    for tp in committed:
        offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
        consumer.seek(TopicPartition(tp.topic, tp.partition, offset))


def transform(spec: dict[str, Any]) -> None:
    """Kafka's exactly-once loop: consume, begin, produce, send offsets, commit.

    Each result goes to the input's partition of the output, keyed ``partition:offset``
    of its input, so a duplicate or a gap is visible. After writing a transaction's
    records (flushed, so they are in the log) it appends ``open <n>`` to the progress
    file, holds the transaction open for PAUSE_S, commits and appends ``commit <n>``;
    an abortable error aborts and rewinds to the committed offsets (``abort``). A fatal
    error ends the process, which the test treats as a failure.
    """
    progress = open(spec["progress"], "a", buffering=1)  # noqa: SIM115
    producer = Producer(
        {
            **spec["settings"],
            **CLIENT_TUNING,
            "transactional.id": spec["transactional_id"],
            "transaction.timeout.ms": 30_000,
            "debug": "eos,protocol",  # the transaction's steps and every request, in its log
        }
    )
    # Before joining the group: fences the previous instance and aborts what it left open.
    producer.init_transactions(TIMEOUT_S)
    consumer = Consumer(
        {
            **spec["settings"],
            **CLIENT_TUNING,
            "group.id": spec["group"],
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # A killed predecessor leaves the group within seconds.
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        }
    )
    consumer.subscribe([spec["source"]])
    while True:
        polled = consumer.consume(BATCH, 1.0)
        for message in polled:
            if message.error() is not None:
                progress.write(f"consumer-error {message.error()}\n")
        messages = [m for m in polled if m.error() is None]
        if not messages:
            continue
        try:
            producer.begin_transaction()
            for message in messages:
                producer.produce(
                    spec["sink"],
                    key=f"{message.partition()}:{message.offset()}".encode(),
                    value=b"out-" + message.value(),
                    partition=message.partition(),
                )
            producer.flush(TIMEOUT_S)
            progress.write(f"open {len(messages)}\n")
            time.sleep(PAUSE_S)
            retrying(
                lambda: producer.send_offsets_to_transaction(
                    consumer.position(consumer.assignment()),
                    consumer.consumer_group_metadata(),
                    TIMEOUT_S,
                )
            )
            progress.write("offsets-sent\n")
            retrying(lambda: producer.commit_transaction(TIMEOUT_S))
            progress.write(f"commit {len(messages)}\n")
        except KafkaException as raised:
            error = raised.args[0]
            if not error.txn_requires_abort():
                raise
            progress.write(f"abort {error}\n")
            retrying(lambda: producer.abort_transaction(TIMEOUT_S))
            rewind(consumer)


# -- the test's side ----------------------------------------------------------------------------


class Transform:
    """The transform's processes, one at a time, and what they report."""

    def __init__(self, spec: dict[str, Any], directory: Path, gateway: GatewayProcess) -> None:
        self.gateway = gateway
        self.spec = {**spec, "progress": str(directory / "progress")}
        self.directory = directory
        self.progress = directory / "progress"
        self.progress.touch()
        self.process: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []

    def start(self) -> None:
        log = self.directory / f"transform-{len(self.logs)}.log"
        self.logs.append(log)
        tests = str(Path(__file__).parents[1])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]),
        }
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, __file__, json.dumps(self.spec)], stdout=out, stderr=out, env=env
            )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def lines(self) -> list[str]:
        return self.progress.read_text().splitlines()

    def committed(self) -> int:
        """Input records whose transaction committed, as the transform counts them."""
        return sum(int(line.split()[1]) for line in self.lines() if line.startswith("commit "))

    def alive(self) -> bool:
        """True, or an AssertionError if the transform or the gateway it uses has died."""
        assert self.process is not None
        gateway = self.gateway.process
        if gateway is not None and gateway.poll() is not None:
            raise AssertionError(f"the gateway exited with {gateway.returncode}")
        if self.process.poll() is not None:
            raise AssertionError(
                f"the transform exited with {self.process.returncode}:\n{self.log_tail()}"
            )
        return True

    def log_tail(self) -> str:
        return (
            "".join(
                f"----- {log.name} -----\n{log.read_text(errors='replace')[-3000:]}\n"
                for log in self.logs
            )
            + "----- progress (last lines) -----\n"
            + "\n".join(self.lines()[-30:])
        )

    def wait_committed(self, records: int, timeout: float = FAULT_TIMEOUT_S) -> None:
        wait_until(
            lambda: self.alive() and self.committed() >= records,
            timeout,
            f"the transform to commit {records} records",
            interval=0.05,
        )

    def wait_open_transaction(self) -> None:
        """Until the transform has a transaction with records written and not committed."""
        seen = len(self.lines())

        def open_now() -> bool:
            lines = self.lines()
            return self.alive() and len(lines) > seen and lines[-1].startswith("open ")

        wait_until(open_now, FAULT_TIMEOUT_S, "an open transaction", interval=0.02)
        assert self.committed() < INPUTS, "the transform finished before the fault"


GROUP_KEY, TRANSACTION_KEY = 0, 1


def coordinator(cluster: Cluster, key_type: int, key: str) -> int:
    """The node id of the broker coordinating a group or a transactional id (FindCoordinator
    v4, asked of the brokers under the broker-side name)."""
    found: list[int] = []

    def lookup() -> bool:
        with RawConnection(cluster.live_bootstrap().split(",")[0]) as conn:
            answer = conn.call(request_class(10, 4)(key_type=key_type, coordinator_keys=(key,)))
        if answer.coordinators[0].error_code != 0:
            return False
        found.append(int(answer.coordinators[0].node_id))
        return True

    wait_until(lookup, TIMEOUT_S, f"the coordinator of {key}", interval=0.2)
    return found[-1]


def committed_offsets(route: Route, group: str, topic: str) -> dict[int, int]:
    checker = route.consumer("read_committed", **{"group.id": group})
    try:
        tps = checker.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=TIMEOUT_S
        )
    finally:
        checker.close()
    return {tp.partition: tp.offset for tp in tps}


def read_output(
    route: Route, topic: str, expected: int, isolation: str = "read_committed"
) -> list[tuple[int, str, str]]:
    """(partition, key, value) of every record, until ``expected`` came and 3 s more
    passed."""
    return [
        (m.partition(), m.key().decode(), m.value().decode())
        for m in read_messages(route.consumer(isolation), topic, expected, settle_s=3)
    ]


@dataclass
class Fault:
    what: str
    node: int | None
    killed_after_s: float
    recovered_after_s: float


def test_every_input_is_transformed_exactly_once_through_kills(
    cluster: GatewayCluster, tmp_path: Path
) -> None:
    tenant_name = f"t{uuid.uuid4().hex[:6]}"
    route = Route("gateway", cluster.tenant(tenant_name).librdkafka())

    def inward(name: str) -> str:
        return f"{tenant_name}.{name}"

    brokers = Cluster(cluster.brokers)
    source, sink = route.create_topic(), route.create_topic()
    inputs: dict[str, str] = {}
    """key an input's result has (partition:offset) -> the result's value"""

    def delivered(error: KafkaError | None, message: Any) -> None:
        assert error is None, error
        inputs[f"{message.partition()}:{message.offset()}"] = "out-" + message.value().decode()

    filler = Producer({**route.settings, "enable.idempotence": True})
    for i in range(INPUTS):
        filler.produce(
            source, value=f"in-{i}".encode(), partition=i % PARTITIONS, on_delivery=delivered
        )
    assert filler.flush(TIMEOUT_S) == 0
    assert len(inputs) == INPUTS
    per_partition = Counter(int(key.split(":")[0]) for key in inputs)
    for topic in (source, sink):
        brokers.wait_full_isr(inward(topic))

    # The group's coordinator is kept apart from the transaction's, and no kill hits it:
    # librdkafka 2.16's send_offsets_to_transaction() hangs for good, past its timeout,
    # when the group coordinator it cached leaves the cluster's metadata
    # (confluentinc/librdkafka#5511 and #5456), against Apache Kafka as against Shoal.
    transactional_id = f"transform-{uuid.uuid4().hex[:6]}"
    txn_node = coordinator(brokers, TRANSACTION_KEY, inward(transactional_id))
    group = next(
        name
        for name in (f"g-{uuid.uuid4().hex[:6]}" for _ in range(100))
        if coordinator(brokers, GROUP_KEY, inward(name)) != txn_node
    )
    transform_ = Transform(
        {
            "settings": route.settings,
            "transactional_id": transactional_id,
            "group": group,
            "source": source,
            "sink": sink,
        },
        tmp_path,
        cluster.gateway,
    )
    faults: list[Fault] = []
    began = time.monotonic()

    def settle(node: int) -> None:
        """Restart a killed broker once the transform has committed without it, and wait
        until every replica is back in sync (so the next kill leaves min.insync.replicas)."""
        transform_.wait_committed(transform_.committed() + 3 * BATCH)
        cluster.brokers[node].start()
        for topic in (inward(source), inward(sink), TRANSACTION_STATE, CONSUMER_OFFSETS):
            brokers.wait_full_isr(topic, timeout=FAULT_TIMEOUT_S)

    try:
        transform_.start()

        # 1. The transform process, mid-transaction; its successor fences it.
        transform_.wait_committed(INPUTS // 10)
        transform_.wait_open_transaction()
        transform_.kill()
        killed = time.monotonic()
        transform_.start()
        transform_.wait_committed(transform_.committed() + 1)
        faults.append(Fault("transform", None, killed - began, time.monotonic() - killed))

        # 2. The broker coordinating the transactions.
        transform_.wait_committed(transform_.committed() + 2 * BATCH)
        txn_node = coordinator(brokers, TRANSACTION_KEY, inward(transactional_id))
        assert txn_node != coordinator(brokers, GROUP_KEY, inward(group))
        transform_.wait_open_transaction()
        cluster.brokers[txn_node].kill()
        killed = time.monotonic()
        settle(txn_node)
        faults.append(Fault("coordinator", txn_node, killed - began, time.monotonic() - killed))

        # 3. The leader of an output partition (a broker coordinating neither).
        transform_.wait_committed(transform_.committed() + 2 * BATCH)

        def uninvolved_leader() -> list[int]:
            """[node] once a broker leads an output partition and coordinates nothing (the
            restarted broker gets its leaderships back from preferred-leader elections)."""
            spared = {
                coordinator(brokers, TRANSACTION_KEY, inward(transactional_id)),
                coordinator(brokers, GROUP_KEY, inward(group)),
            }
            leaders = {brokers.leader_of(inward(sink), p) for p in range(PARTITIONS)}
            return sorted(leaders - spared)[:1]

        [leader] = wait_until(uninvolved_leader, TIMEOUT_S, "a leader coordinating nothing")
        transform_.wait_open_transaction()
        cluster.brokers[leader].kill()
        killed = time.monotonic()
        settle(leader)
        faults.append(Fault("output leader", leader, killed - began, time.monotonic() - killed))

        wait_until(
            lambda: (
                transform_.alive()
                and sum(committed_offsets(route, group, source).values()) >= INPUTS
            ),
            FAULT_TIMEOUT_S * 2,
            f"the group to commit all {INPUTS} inputs",
            interval=1,
        )
        finished = time.monotonic() - began
    except BaseException:
        print(transform_.log_tail())
        raise
    finally:
        transform_.kill()

    print(f"\nfaults: {faults}; all {INPUTS} inputs committed after {finished:.1f}s")
    assert committed_offsets(route, group, source) == dict(per_partition)

    records = read_output(route, sink, INPUTS)
    keys = Counter(key for _, key, _ in records)
    duplicates = sorted(key for key, count in keys.items() if count > 1)
    assert not duplicates, f"{len(duplicates)} results more than once: {duplicates[:20]}"
    missing = sorted(set(inputs) - set(keys))
    assert not missing, f"{len(missing)} inputs without a result: {missing[:20]}"
    assert set(keys) == set(inputs)
    assert {key: value for _, key, value in records} == inputs
    assert all(key.startswith(f"{partition}:") for partition, key, _ in records)
    # The killed transform's open transaction was in the log, and read_committed left it out.
    written = read_output(route, sink, INPUTS + 1, isolation="read_uncommitted")
    assert len(written) > INPUTS, "no aborted record in the output: nothing was killed mid-way"
    tally = Counter(line.split()[0] for line in transform_.lines())
    print(f"transactions: {tally}; records written and aborted: {len(written) - INPUTS}")


if __name__ == "__main__":
    transform(json.loads(sys.argv[1]))
