"""Kafka Streams against Shoal, through the gateway: Kafka's own word count demo.

``org.apache.kafka.streams.examples.wordcount.WordCountDemo`` (the
``kafka-streams-examples`` artifact, which ``make kafka`` installs with the
rest of Kafka 4.3.1, so this test never skips) reads lines from
``streams-plaintext-input``, splits them into words, re-keys them by word
(``groupBy``: a repartition topic), counts them in a RocksDB state store (its
changelog topic) and writes every new count to ``streams-wordcount-output``.
The demo takes one argument, a properties file: here the tenant's API key
(SASL/PLAIN over SASL_PLAINTEXT to the gateway) and
``processing.guarantee=at_least_once``. The demo itself sets
``statestore.cache.max.bytes=0``, so every update of a count is written out.

The app runs with a key that has what Kafka's documentation tells a Streams
application to be given (READ on its input, WRITE on its output, everything
on the topics prefixed by its application id, READ on its group,
IDEMPOTENT_WRITE on the cluster), plus DESCRIBE on the cluster, not the
tenant's default bindings; ``test_kafka_documented_acls_are_enough`` runs it
with exactly Kafka's list (Kafka answers DescribeCluster, which its Admin
client sends before describeTopics, to every principal, and so does the
gateway).

What the test proves: Streams creates its repartition and changelog topics
inside the tenant's namespace (the brokers hold ``<tenant>.<name>``, the
tenant's admin client lists them under the app's names) with the partitions,
replication and configs it asks for; its group (Streams' own assignor on the
classic protocol) forms and commits every input offset; and the counts (the
last value per word in the output topic, and in the changelog) are exactly
those of the words that went in, each intermediate count written once; and
what it has consumed from its repartition topic is purged (Admin.deleteRecords,
DeleteRecords through the gateway, every ``repartition.purge.interval.ms``).
"""

from __future__ import annotations

import re
import struct
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from gateway_env import TenantKey
from harness import wait_until
from shoal.benchmarks.apache_kafka import ApacheKafka, default_kafka_home
from shoal.tenancy.model import AclBinding, Operation, PatternType, ResourceType

# A cold `make kafka` downloads about 150 MB from Maven Central.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
TENANT = "kstreams"
WORD_COUNT = "org.apache.kafka.streams.examples.wordcount.WordCountDemo"
APP_ID = "streams-wordcount"  # the demo's default, written in the properties anyway
INPUT = "streams-plaintext-input"  # fixed by the demo
OUTPUT = "streams-wordcount-output"  # fixed by the demo
PARTITIONS = 2
RUNNING = "State transition from REBALANCING to RUNNING"

# Streams logs at INFO to a file (printed after the module); warnings and
# errors also go to stderr, which the tests read. The TaskManager's DEBUG
# lines say why a purge of a repartition topic failed.
LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
appender.err.filter.threshold.type = ThresholdFilter
appender.err.filter.threshold.level = WARN
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
rootLogger.appenderRef.err.ref = STDERR
logger.tasks.name = org.apache.kafka.streams.processor.internals.TaskManager
logger.tasks.level = DEBUG
"""

LINES_BEFORE = [
    "the quick brown fox jumps over the lazy dog",
    "Streams counts words, and the gateway forwards them",
    "all the brokers hold the topics of the tenant",
    "a repartition topic and a changelog topic",
]
LINES_AFTER = [
    "the fox counts again",
    "The Quick fox and THE lazy dog",
    "words words words",
]


def words(line: str) -> list[str]:
    """The demo's split: lower case, then Java's ``split("\\\\W+")`` (ASCII word characters;
    no line here starts with a separator, which Java would count as an empty word)."""
    return [w for w in re.split(r"\W+", line.lower(), flags=re.ASCII) if w]


def counts(lines: list[str]) -> Counter[str]:
    return Counter(w for line in lines for w in words(line))


def streams_bindings(app_id: str, describe_cluster: bool) -> list[AclBinding]:
    """What Kafka's documentation grants a Streams application (at least once), and,
    with ``describe_cluster``, DESCRIBE on the cluster, which the gateway wants too."""

    def allow(kind: ResourceType, pattern: PatternType, name: str, op: Operation) -> AclBinding:
        return AclBinding(TENANT, "KEY", kind, pattern, name, op)

    cluster = "kafka-cluster"
    bindings = [
        allow(ResourceType.TOPIC, PatternType.LITERAL, INPUT, Operation.READ),
        allow(ResourceType.TOPIC, PatternType.LITERAL, OUTPUT, Operation.WRITE),
        allow(ResourceType.TOPIC, PatternType.PREFIXED, app_id, Operation.ALL),
        allow(ResourceType.GROUP, PatternType.LITERAL, app_id, Operation.READ),
        allow(ResourceType.CLUSTER, PatternType.LITERAL, cluster, Operation.IDEMPOTENT_WRITE),
    ]
    if describe_cluster:
        bindings.append(
            allow(ResourceType.CLUSTER, PatternType.LITERAL, cluster, Operation.DESCRIBE)
        )
    return bindings


# -- the app ---------------------------------------------------------------------------------


@dataclass
class App:
    process: subprocess.Popen[bytes]
    log: Path
    err: Path

    def errors(self) -> list[str]:
        text = self.err.read_text(errors="replace") if self.err.exists() else ""
        return [line for line in text.splitlines() if " ERROR " in line]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def diagnosis(self) -> str:
        stderr = self.err.read_text(errors="replace") if self.err.exists() else ""
        return f"--- stderr ---\n{stderr[-6000:]}\n--- log ---\n{self.log_text()[-6000:]}"

    def wait_running(self, timeout: float) -> None:
        """Until Streams reports RUNNING; fails at once if it logs an error or exits."""

        def running() -> bool:
            assert not self.errors(), self.diagnosis()
            assert self.process.poll() is None, f"exited {self.process.returncode}"
            return RUNNING in self.log_text()

        wait_until(running, timeout, "Kafka Streams to run", interval=0.5)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # the demo's shutdown hook closes KafkaStreams
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


AT_LEAST_ONCE: Final = {
    "processing.guarantee": "at_least_once",
    "commit.interval.ms": "500",
    "repartition.purge.interval.ms": "500",
}


def start_app(
    kafka_home: Path,
    key: TenantKey,
    directory: Path,
    app_id: str,
    guarantee: Mapping[str, str] = AT_LEAST_ONCE,
) -> App:
    """The demo as the tenant ``key``, its state in ``directory``; ``guarantee`` holds the
    processing guarantee and the settings that go with it."""
    directory.mkdir(parents=True, exist_ok=True)
    settings = {
        "application.id": app_id,
        "bootstrap.servers": key.bootstrap(),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{key.key_id}" password="{key.secret}";'
        ),
        "state.dir": str(directory / "state"),
        "num.stream.threads": "1",
        "replication.factor": "3",
        **guarantee,
        # The demo sets these only if absent; written here so that the test reads whole.
        "auto.offset.reset": "earliest",
        "statestore.cache.max.bytes": "0",
    }
    config = directory / "streams.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    log, err = directory / "streams.log", directory / "streams.err"
    log4j = directory / "log4j2.properties"
    log4j.write_text(LOG4J2.format(log=log))
    command = ApacheKafka(directory / "kafka-tools", kafka_home).java_command(
        WORD_COUNT, str(config)
    )
    at = command.index("-cp")  # later JVM flags win: a heap for a long-lived app, our logging
    command[at:at] = ["-Xmx384m", f"-Dlog4j2.configurationFile={log4j}"]
    with open(directory / "streams.out", "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
    return App(process, log, err)


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kafka_home() -> Path:
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=840)
    return home


@pytest.fixture(scope="module")
def owner(gateway_cluster: Any) -> TenantKey:
    """The tenant's default key: makes the demo's input and output, writes and reads them."""
    key: TenantKey = gateway_cluster.tenant(TENANT)
    admin = AdminClient(key.librdkafka())
    topics = [NewTopic(INPUT, PARTITIONS, 3), NewTopic(OUTPUT, PARTITIONS, 3)]
    for future in admin.create_topics(topics).values():
        future.result(30)
    return key


@pytest.fixture(scope="module")
def app(
    kafka_home: Path,
    gateway_cluster: Any,
    owner: TenantKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[App]:
    key = gateway_cluster.tenant(TENANT, bindings=streams_bindings(APP_ID, True))
    running = start_app(kafka_home, key, tmp_path_factory.mktemp("kafka-streams"), APP_ID)
    try:
        yield running
    finally:
        running.stop()
        print(f"\n----- Kafka Streams log ({running.log}) -----\n{running.log_text()[-8000:]}")


# -- reading topics --------------------------------------------------------------------------


def produce(key: TenantKey, lines: list[str]) -> None:
    producer = Producer(key.librdkafka(**{"acks": "all", "enable.idempotence": True}))
    for line in lines:
        producer.produce(INPUT, value=line.encode())
    assert producer.flush(30) == 0


def read_counts(key: TenantKey, topic: str) -> list[tuple[str, int]]:
    """Every (word, count) record of ``topic`` up to its end, in order per partition
    (a word's records are all in one partition)."""
    consumer = Consumer(key.librdkafka(**{"group.id": "wordcount-reader"}))
    try:
        partitions = consumer.list_topics(topic, 10).topics[topic].partitions
        ends = {}
        for p in partitions:
            end = consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
            if end:
                ends[p] = end
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        records: list[tuple[str, int]] = []
        positions = dict.fromkeys(ends, 0)
        while any(positions[p] < ends[p] for p in ends):
            message = consumer.poll(5)
            assert message is not None, f"{topic} stopped before {ends}: at {positions}"
            assert message.error() is None, message.error()
            (count,) = struct.unpack(">q", message.value())
            records.append((message.key().decode(), count))
            positions[message.partition()] = message.offset() + 1
        return records
    finally:
        consumer.close()


def wait_for_counts(app: App, owner: TenantKey, expected: Counter[str]) -> list[tuple[str, int]]:
    records: list[tuple[str, int]] = []

    def done() -> bool:
        nonlocal records
        assert not app.errors() and app.process.poll() is None, app.diagnosis()
        records = read_counts(owner, OUTPUT)
        return dict(records) == dict(expected)

    try:
        wait_until(done, 120, "the word counts", interval=1)
    except TimeoutError:
        pytest.fail(f"counts {dict(records)} != {dict(expected)}\n{app.diagnosis()}")
    return records


def watermarks(key: TenantKey, topic: str) -> dict[int, tuple[int, int]]:
    consumer = Consumer(key.librdkafka(**{"group.id": "watermarks"}))
    try:
        partitions = consumer.list_topics(topic, 10).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10, cached=False)
            for p in partitions
        }
    finally:
        consumer.close()


def committed(key: TenantKey, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(key.librdkafka(**{"group.id": APP_ID}))
    try:
        offsets = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in offsets}


def internal_topics(key: TenantKey, app_id: str) -> tuple[set[str], str, str]:
    """Every topic the tenant lists, and the app's repartition and changelog topic."""
    listed = set(AdminClient(key.librdkafka()).list_topics(timeout=30).topics)
    internal = [t for t in listed if t.startswith(f"{app_id}-")]
    repartition = [t for t in internal if t.endswith("-repartition")]
    changelog = [t for t in internal if t.endswith("-changelog")]
    assert len(repartition) == 1 and len(changelog) == 1, listed
    return listed, repartition[0], changelog[0]


# -- the tests -------------------------------------------------------------------------------


def test_word_count_runs_through_the_gateway(
    app: App, owner: TenantKey, gateway_cluster: Any
) -> None:
    produce(owner, LINES_BEFORE)  # perhaps before the app has its group: it reads from the start
    wait_for_counts(app, owner, counts(LINES_BEFORE))

    # More input while the app runs: the counts carry on from the store.
    produce(owner, LINES_AFTER)
    expected = counts(LINES_BEFORE + LINES_AFTER)
    records = wait_for_counts(app, owner, expected)

    # Every update of every count, once each and in order (the demo disables the
    # cache; one instance that never fails reprocesses nothing, even at least once).
    updates: dict[str, list[int]] = {}
    for word, count in records:
        updates.setdefault(word, []).append(count)
    assert updates == {word: list(range(1, n + 1)) for word, n in expected.items()}

    # The group committed every input record. The producer spreads keyless lines at
    # random, so a partition may have none (one run in 64): Streams, like any consumer,
    # commits nothing for a partition it never read from.
    ends = {p: high for p, (_, high) in watermarks(owner, INPUT).items()}
    seen: dict[int, int] = {}

    def all_committed() -> bool:
        nonlocal seen
        seen = committed(owner, INPUT, PARTITIONS)
        return all(seen[p] == high if high else seen[p] < 0 for p, high in ends.items())

    try:
        wait_until(all_committed, 30, "the app's commits")
    except TimeoutError:
        pytest.fail(f"committed {seen}, input ends {ends}\n{app.diagnosis()}")

    # Its internal topics: the tenant's, named after the app, made as Streams asked.
    listed, repartition, changelog = internal_topics(owner, APP_ID)
    assert listed == {INPUT, OUTPUT, repartition, changelog}, listed
    platform = AdminClient({"bootstrap.servers": gateway_cluster.internal_bootstrap})
    on_brokers = set(platform.list_topics(timeout=30).topics)
    assert {f"{TENANT}.{t}" for t in listed} <= on_brokers
    assert not {t for t in on_brokers if t.startswith(APP_ID)}, on_brokers

    admin = AdminClient(owner.librdkafka())
    described = admin.list_topics(timeout=30).topics
    for topic in (repartition, changelog):
        partitions = described[topic].partitions
        assert sorted(partitions) == list(range(PARTITIONS)), (topic, partitions)
        assert all(len(p.replicas) == 3 for p in partitions.values()), (topic, partitions)
    resources = [ConfigResource("topic", changelog), ConfigResource("topic", repartition)]
    configs = {
        resource.name: {name: entry.value for name, entry in future.result(30).items()}
        for resource, future in admin.describe_configs(resources).items()
    }
    assert configs[changelog]["cleanup.policy"] == "compact"
    assert configs[repartition]["cleanup.policy"] == "delete"
    assert configs[repartition]["retention.ms"] == "-1"

    # The store's changelog ends with the same counts.
    assert dict(read_counts(owner, changelog)) == dict(expected)
    assert not app.errors(), "\n".join(app.errors())


def test_consumed_repartition_records_are_purged(app: App, owner: TenantKey) -> None:
    app.wait_running(60)
    produce(owner, ["purge what was consumed"])
    _, repartition, _ = internal_topics(owner, APP_ID)

    def consumed() -> bool:
        """Records in the repartition topic, and the group's commits at its end."""
        done = committed(owner, repartition, PARTITIONS)
        ends = {p: high for p, (_, high) in watermarks(owner, repartition).items() if high}
        return bool(ends) and all(done[p] == high for p, high in ends.items())

    wait_until(consumed, 60, "the app to commit what it read from its repartition topic")

    def purged() -> bool:
        return all(low == high for low, high in watermarks(owner, repartition).values())

    try:
        wait_until(purged, 10, "the repartition topic's log start to reach the commits")
    except TimeoutError:
        failures = [line for line in app.log_text().splitlines() if "delete-records" in line]
        pytest.fail(
            f"watermarks {watermarks(owner, repartition)} after commits "
            f"{committed(owner, repartition, PARTITIONS)}; Streams says:\n"
            + "\n".join(failures[-1:])
        )


def test_kafka_documented_acls_are_enough(
    kafka_home: Path,
    gateway_cluster: Any,
    owner: TenantKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The word count with exactly the ACLs Kafka's documentation gives a Streams app."""
    app_id = "wordcount-documented-acls"
    key = gateway_cluster.tenant(TENANT, bindings=streams_bindings(app_id, False))
    started = time.monotonic()
    app = start_app(kafka_home, key, tmp_path_factory.mktemp("documented-acls"), app_id)
    try:
        app.wait_running(60)
    finally:
        app.stop()
        print(f"documented ACLs: {time.monotonic() - started:.1f}s\n{app.diagnosis()}")
