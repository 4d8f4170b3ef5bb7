"""Kafka Streams with ``processing.guarantee=exactly_once_v2`` against Shoal, through the gateway.

The same demo as ``test_kafka_streams.py`` (Kafka's ``WordCountDemo``: lines in,
a repartition topic, counts in a RocksDB store with a changelog, every new count
out), with exactly-once v2: each stream thread has one transactional producer
(``transactional.id`` = ``<application.id>-<process id>-<thread>``) that writes
the repartition, changelog and output records and the input offsets (KIP-447,
with the group's generation) in one transaction per commit interval, and its
consumers read with ``isolation.level=read_committed``.

The key has what Kafka's documentation tells a Streams application to be given
(``streams_bindings`` of the at-least-once test, without the extra DESCRIBE on
the cluster), plus what it adds for exactly-once: WRITE and DESCRIBE on the
transactional ids prefixed with the application id. IDEMPOTENT_WRITE on the
cluster is in the first list already.

What the test proves: an instance killed with SIGKILL while a transaction is
open (its records are in the output topic, the offsets they came from are not
committed) leaves nothing a read_committed reader can see; a new instance with
the same application id on another "machine" (its own state directory, so a new
process id and transactional id: nothing fences the old one, the coordinator
aborts its transaction at ``transaction.timeout.ms``) restores the counts from
the changelog's committed records, reprocesses the lines whose offsets were not
committed, and carries on. Read committed, the output holds every count of
every word once, in order: 1, 2, ..., n for a word seen n times. Any line
counted twice would make a count repeat or overshoot; any lost one would leave
a gap or stop short. Read uncommitted, the aborted counts are there too: the
kill did land inside a transaction.
"""

from __future__ import annotations

import struct
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import EtcdServer, GatewayCluster, module_gateway_cluster
from gateway_env import TenantKey
from harness import wait_until
from shoal.benchmarks.apache_kafka import default_kafka_home
from shoal.tenancy.model import AclBinding, Operation, PatternType, ResourceType
from test_kafka_streams import (
    INPUT,
    OUTPUT,
    PARTITIONS,
    REPO,
    TENANT,
    App,
    counts,
    internal_topics,
    produce,
    start_app,
    streams_bindings,
)
from test_transactions import TXN_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APP_ID = "wordcount-eos"
# Streams commits (ends its transaction) every COMMIT_INTERVAL_MS: long enough that the
# test sees a second batch processed but not committed, and kills the app then. The
# producer's transaction timeout must be longer (Streams refuses to start otherwise);
# it is how long the coordinator leaves the dead instance's transaction open.
COMMIT_INTERVAL_MS = 15_000
TRANSACTION_TIMEOUT_MS = 20_000
# How soon the group drops the dead instance's member (Kafka's default is 45 s).
SESSION_TIMEOUT_MS = 10_000

COMMITTED_BEFORE_KILL = [
    "the quick brown fox jumps over the lazy dog",
    "exactly once means every word is counted once",
]
OPEN_AT_KILL = [
    "the fox is counted again after the kill",
    "a transaction left open is aborted",
]
AFTER_RESTART = [
    "the new instance counts the fox once more",
    "once and only once",
]


def eos_bindings(app_id: str) -> list[AclBinding]:
    """Kafka's documented ACLs for a Streams app, and for exactly-once its transactional ids."""
    transactional_ids = [
        AclBinding(TENANT, "KEY", ResourceType.TRANSACTIONAL_ID, PatternType.PREFIXED, app_id, op)
        for op in (Operation.WRITE, Operation.DESCRIBE)
    ]
    return streams_bindings(app_id, describe_cluster=False) + transactional_ids


EXACTLY_ONCE_V2 = {
    "processing.guarantee": "exactly_once_v2",
    "commit.interval.ms": str(COMMIT_INTERVAL_MS),
    "producer.transaction.timeout.ms": str(TRANSACTION_TIMEOUT_MS),
    "consumer.session.timeout.ms": str(SESSION_TIMEOUT_MS),
}


def start_eos_app(kafka_home: Path, key: TenantKey, directory: Path) -> App:
    """The demo with exactly-once v2; ``directory`` holds its state (and process id)."""
    return start_app(kafka_home, key, directory, APP_ID, EXACTLY_ONCE_V2)


def kill(app: App) -> None:
    """SIGKILL: no shutdown hook, no last commit, no leaving the group."""
    if app.process.poll() is None:
        app.process.kill()
    app.process.wait(30)


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kafka_home() -> Path:
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=540)
    return home


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    """Three brokers set up for transactions as in ``test_transactions.py``, and a gateway."""
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "kafka-streams-eos", TXN_ENV)


@pytest.fixture(scope="module")
def owner(cluster: GatewayCluster) -> TenantKey:
    """The tenant's default key: makes the demo's input and output, writes and reads them."""
    key: TenantKey = cluster.tenant(TENANT)
    admin = AdminClient(key.librdkafka())
    topics = [NewTopic(INPUT, PARTITIONS, 3), NewTopic(OUTPUT, PARTITIONS, 3)]
    for future in admin.create_topics(topics).values():
        future.result(30)
    return key


# -- reading the output ----------------------------------------------------------------------


def read_counts(key: TenantKey, topic: str, isolation: str) -> list[tuple[str, int]]:
    """Every (word, count) record of ``topic`` that ``isolation`` lets a consumer see now,
    in order per partition (a word's records are all in one partition): read up to the
    end, which read_committed puts at the last stable offset, past markers and aborted
    records."""
    consumer = Consumer(
        key.librdkafka(
            **{
                "group.id": f"wordcount-reader-{isolation}",
                "isolation.level": isolation,
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
    )
    try:
        partitions = consumer.list_topics(topic, 10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[tuple[str, int]] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 30
        while at_end != set(partitions):
            assert time.monotonic() < deadline, f"{topic} ({isolation}): no end for {at_end}"
            message = consumer.poll(1)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                at_end.add(message.partition())
                continue
            (count,) = struct.unpack(">q", message.value())
            records.append((message.key().decode(), count))
        return records
    finally:
        consumer.close()


def updates(records: list[tuple[str, int]]) -> dict[str, list[int]]:
    """Each word's counts, in the order they were written."""
    seen: dict[str, list[int]] = {}
    for word, count in records:
        seen.setdefault(word, []).append(count)
    return seen


def exactly_once(expected: Counter[str]) -> dict[str, list[int]]:
    """What read_committed must hold: each count of each word once, 1 to its total."""
    return {word: list(range(1, n + 1)) for word, n in expected.items()}


def wait_for(
    app: App, key: TenantKey, isolation: str, expected: Counter[str], timeout: float
) -> list[tuple[str, int]]:
    """Until the last count of every word, seen with ``isolation``, is ``expected``."""
    records: list[tuple[str, int]] = []

    def done() -> bool:
        nonlocal records
        assert not app.errors() and app.process.poll() is None, app.diagnosis()
        records = read_counts(key, OUTPUT, isolation)
        return dict(records) == dict(expected)

    try:
        wait_until(done, timeout, f"the word counts ({isolation})", interval=0.5)
    except TimeoutError:
        pytest.fail(f"{isolation}: {dict(records)} != {dict(expected)}\n{app.diagnosis()}")
    return records


# -- the test --------------------------------------------------------------------------------


def test_a_killed_instance_counts_nothing_twice(
    kafka_home: Path,
    cluster: GatewayCluster,
    owner: TenantKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    key = cluster.tenant(TENANT, bindings=eos_bindings(APP_ID))
    before = counts(COMMITTED_BEFORE_KILL)
    at_kill = counts(COMMITTED_BEFORE_KILL + OPEN_AT_KILL)
    total = counts(COMMITTED_BEFORE_KILL + OPEN_AT_KILL + AFTER_RESTART)
    apps: list[App] = []
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        first = start_eos_app(kafka_home, key, tmp_path_factory.mktemp("eos-first"))
        apps.append(first)
        first.wait_running(120)
        timings["first running"] = time.monotonic() - started

        # A first batch, counted and committed.
        produce(owner, COMMITTED_BEFORE_KILL)
        wait_for(first, owner, "read_committed", before, 60)
        timings["first batch committed"] = time.monotonic() - started

        # A second batch. Its lines go to the repartition topic in one transaction; the
        # counting side reads that topic read_committed, so it counts them once that
        # transaction commits, and writes the counts in the next one, which stays open
        # for a commit interval: kill the app then.
        produce(owner, OPEN_AT_KILL)
        wait_for(first, owner, "read_uncommitted", at_kill, 2.5 * COMMIT_INTERVAL_MS / 1000)
        kill(first)
        timings["killed"] = time.monotonic() - started
        # The transaction was still open: read_committed stops before it.
        assert dict(read_counts(owner, OUTPUT, "read_committed")) == dict(before)

        # A new instance elsewhere (its own state directory, so its own transactional id).
        second = start_eos_app(kafka_home, key, tmp_path_factory.mktemp("eos-second"))
        apps.append(second)
        produce(owner, AFTER_RESTART)
        second.wait_running(120)
        timings["second running"] = time.monotonic() - started
        committed = wait_for(second, owner, "read_committed", total, 120)
        timings["all committed"] = time.monotonic() - started

        assert updates(committed) == exactly_once(total)
        # The aborted transaction's counts are in the log, where read_uncommitted sees them.
        everything = read_counts(owner, OUTPUT, "read_uncommitted")
        aborted = Counter(everything) - Counter(committed)
        assert aborted, "the kill did not leave an open transaction"
        assert Counter(committed) - Counter(everything) == Counter()
        assert sum(aborted.values()) == sum(counts(OPEN_AT_KILL).values()), aborted

        # The store's changelog, read committed, ends with the same counts.
        _, _, changelog = internal_topics(owner, APP_ID)
        assert dict(read_counts(owner, changelog, "read_committed")) == dict(total)
        assert not second.errors(), "\n".join(second.errors())
    finally:
        for app in apps:
            app.stop()
        print(f"\ntimings (s): { {k: round(v, 1) for k, v in timings.items()} }")
        for n, app in enumerate(apps):
            print(f"----- Kafka Streams instance {n} ({app.log}) -----\n{app.diagnosis()}")
