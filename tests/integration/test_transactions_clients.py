"""Transactions with the clients other than confluent-kafka: on three brokers, and through
the gateway as a tenant.

What each client's user checks (test_transactions.py does the same with confluent-kafka):

* kafka-python's and aiokafka's transactional producers: a committed and an aborted
  transaction; the same library's read_committed consumer gets the committed records once
  and the aborted ones never, read_uncommitted gets both, and neither gets a marker (each
  ends at the partition's end offset, the markers' offsets skipped);
* kcat (librdkafka 2.0) with ``-X isolation.level=read_committed`` and
  ``read_uncommitted``, also while a transaction is still open;
* the Java client's transactional producer (a dozen lines of Java, run from source with
  Kafka's jars from ``make kafka``) commits and aborts, and ``kafka-console-consumer
  --isolation-level`` reads as told;
* ``kafka-transactions.sh`` (TransactionsCommand) lists and describes a transaction while
  it is open, and after its commit; through the gateway it shows the tenant's own names,
  and another tenant does not see it;
* ``kafka-transactions.sh abort --start-offset``, straight against the brokers, ends an
  open transaction by hand (``describe-producers`` shows where it starts, ``find-hanging
  --broker-id`` on a follower does not call it hanging, a stale producer epoch is
  refused) and read_committed consumers read past it; as a tenant, through the gateway,
  it fails with Kafka's cluster authorization error and ``shoal txn abort`` ends it;
* TransactionalMessageCopier, Kafka's consume-transform-produce loop on the Java client,
  copies a topic with random aborts, and the copy, read_committed, holds every input
  record exactly once.

TransactionalMessageCopier takes only ``--broker-list`` (no client config file), so it
cannot log in to the gateway: it runs straight against the brokers only.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from conftest import GatewayCluster, module_gateway_cluster
from gateway_env import TenantKey
from harness import EtcdServer
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaPythonTopicPartition
from shoal.benchmarks.apache_kafka import ApacheKafka, default_kafka_home
from test_java_clients import TROUBLE, clean, failed, plain_settings
from test_transactions import PARTITIONS, TIMEOUT_S, TXN_ENV, Route, produce_in_transaction
from test_txn_cli import properties, shoal_txn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SETTLE_S = 2.0
TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"
COPIER = "org.apache.kafka.tools.TransactionalMessageCopier"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"

# The Java client's transactional producer, as a user writes it (no Kafka tool takes a
# transactional producer's config file): one line of stdin a record, BEGIN, COMMIT and
# ABORT between them. Run by java's single-file source launcher, with Kafka's jars.
TRANSACTIONAL_LINES = """
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.Reader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class TransactionalLines {
    // args: client config file, topic, transactional id, partitions
    public static void main(String[] args) throws Exception {
        Properties config = new Properties();
        try (Reader in = Files.newBufferedReader(Path.of(args[0]))) {
            config.load(in);
        }
        config.put("transactional.id", args[2]);
        int partitions = Integer.parseInt(args[3]);
        StringSerializer strings = new StringSerializer();
        try (KafkaProducer<String, String> producer =
                new KafkaProducer<>(config, strings, strings)) {
            producer.initTransactions();
            BufferedReader lines = new BufferedReader(new InputStreamReader(System.in));
            int sent = 0;
            for (String line; (line = lines.readLine()) != null; ) {
                switch (line) {
                    case "BEGIN" -> producer.beginTransaction();
                    case "COMMIT" -> producer.commitTransaction();
                    case "ABORT" -> {
                        producer.flush();
                        producer.abortTransaction();
                    }
                    default -> producer.send(
                        new ProducerRecord<>(args[1], sent++ % partitions, null, line));
                }
            }
        }
    }
}
"""


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    yield from module_gateway_cluster(
        etcd, tmp_path_factory, request, "transactions-clients", TXN_ENV
    )


@dataclass
class Reach:
    """One way to the cluster, in each client's spelling: straight to the brokers, or as a
    tenant (SASL/PLAIN with an API key) through the gateway."""

    name: str
    bootstrap: str
    key: TenantKey | None

    @property
    def route(self) -> Route:
        """confluent-kafka's settings, and topics created with them."""
        return Route(self.name, self.key.librdkafka() if self.key else self.librdkafka_plain())

    def librdkafka_plain(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap}

    def python_client(self) -> dict[str, Any]:
        """kafka-python's and aiokafka's keyword arguments."""
        return self.key.python_client() if self.key else {"bootstrap_servers": self.bootstrap}

    def kcat(self, directory: Path) -> list[str]:
        """kcat's connection flags: ``-b`` straight, ``-F client.properties`` as a tenant."""
        if self.key is None:
            return ["-b", self.bootstrap]
        path = self.key.properties_file(directory / f"kcat-{uuid.uuid4().hex[:6]}.properties")
        return ["-F", str(path)]

    def java_config(self, directory: Path) -> Path:
        """A Java client's config file: the bootstrap servers and, as a tenant, the key."""
        settings = {"bootstrap.servers": self.bootstrap}
        if self.key is not None:
            settings.update(plain_settings(self.key))
        path = directory / f"java-client-{uuid.uuid4().hex[:6]}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def java_admin(self, directory: Path) -> list[str]:
        """``--bootstrap-server`` and, as a tenant, ``--command-config``."""
        if self.key is None:
            return ["--bootstrap-server", self.bootstrap]
        path = directory / f"java-{uuid.uuid4().hex[:6]}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in plain_settings(self.key).items()))
        return ["--bootstrap-server", self.key.bootstrap(), "--command-config", str(path)]


@pytest.fixture(params=["direct", "gateway"])
def reach(request: pytest.FixtureRequest, cluster: GatewayCluster) -> Reach:
    if request.param == "direct":
        return Reach("direct", cluster.internal_bootstrap, None)
    key = cluster.tenant(f"t{uuid.uuid4().hex[:6]}")
    return Reach("gateway", key.bootstrap(), key)


@dataclass
class Batches:
    """What one transactional producer wrote: committed, then aborted, then committed."""

    first: list[str]
    aborted: list[str]
    last: list[str]

    @classmethod
    def make(cls, client: str) -> Batches:
        return cls(
            [f"{client}-first-{i}" for i in range(12)],
            [f"{client}-aborted-{i}" for i in range(7)],
            [f"{client}-last-{i}" for i in range(5)],
        )

    @property
    def committed(self) -> list[str]:
        return sorted(self.first + self.last)

    @property
    def everything(self) -> list[str]:
        return sorted(self.first + self.aborted + self.last)


def end_offsets(reach: Reach, topic: str, isolation: str = "read_uncommitted") -> dict[int, int]:
    """Each partition's end offset, as a consumer sees it: the high watermark, or
    read_committed the last stable offset (where an open transaction begins)."""
    consumer = KafkaConsumer(**reach.python_client(), isolation_level=isolation)
    try:
        partitions = [KafkaPythonTopicPartition(topic, p) for p in range(PARTITIONS)]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


# -- kafka-python ----------------------------------------------------------------------------


@dataclass
class ReadBack:
    values: list[str]
    positions: dict[int, int]  # where the consumer stands in each partition afterwards


def kafka_python_read(reach: Reach, topic: str, isolation: str, expected: int) -> ReadBack:
    consumer = KafkaConsumer(
        **reach.python_client(),
        isolation_level=isolation,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    partitions = [KafkaPythonTopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning()
    values: list[str] = []
    deadline = time.monotonic() + TIMEOUT_S
    quiet_until: float | None = None
    while time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            values.extend(r.value.decode() for r in records)
        if len(values) >= expected:
            quiet_until = quiet_until or time.monotonic() + SETTLE_S
            if time.monotonic() >= quiet_until:
                break
    positions = {tp.partition: consumer.position(tp) for tp in partitions}
    consumer.close()
    return ReadBack(values, positions)


def test_kafka_python_commits_and_aborts_and_its_consumer_honours_isolation(
    reach: Reach,
) -> None:
    topic = reach.route.create_topic()
    batches = Batches.make("kafka-python")
    producer = KafkaProducer(
        **reach.python_client(), transactional_id=f"kafka-python-{uuid.uuid4().hex[:6]}"
    )
    producer.init_transactions()

    def transaction(values: list[str], commit: bool) -> None:
        producer.begin_transaction()
        for i, value in enumerate(values):
            producer.send(topic, value=value.encode(), partition=i % PARTITIONS)
        if commit:
            producer.commit_transaction()
        else:
            producer.flush()
            producer.abort_transaction()

    transaction(batches.first, commit=True)
    transaction(batches.aborted, commit=False)
    transaction(batches.last, commit=True)
    producer.close()

    ends = end_offsets(reach, topic)
    committed = kafka_python_read(reach, topic, "read_committed", len(batches.committed))
    assert sorted(committed.values) == batches.committed, "committed once, aborted never"
    everything = kafka_python_read(reach, topic, "read_uncommitted", len(batches.everything))
    assert sorted(everything.values) == batches.everything
    # Both read to the end: the markers (one per partition and transaction) take offsets,
    # and neither consumer handed one to the application.
    assert sum(ends.values()) == len(batches.everything) + 3 * PARTITIONS
    assert committed.positions == ends
    assert everything.positions == ends


# -- aiokafka --------------------------------------------------------------------------------


async def aiokafka_read(reach: Reach, topic: str, isolation: str, expected: int) -> ReadBack:
    consumer = AIOKafkaConsumer(
        **reach.python_client(),
        isolation_level=isolation,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        partitions = [AioTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning()
        values: list[str] = []
        deadline = time.monotonic() + TIMEOUT_S
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                values.extend(r.value.decode() for r in records if r.value is not None)
            if len(values) >= expected:
                quiet_until = quiet_until or time.monotonic() + SETTLE_S
                if time.monotonic() >= quiet_until:
                    break
        positions = {tp.partition: await consumer.position(tp) for tp in partitions}
        return ReadBack(values, positions)
    finally:
        await consumer.stop()


class AbortError(Exception):
    """Raised inside ``producer.transaction()`` to abort it, as aiokafka's docs show."""


def test_aiokafka_commits_and_aborts_and_its_consumer_honours_isolation(reach: Reach) -> None:
    topic = reach.route.create_topic()
    batches = Batches.make("aiokafka")

    async def produce() -> None:
        producer = AIOKafkaProducer(
            **reach.python_client(), transactional_id=f"aiokafka-{uuid.uuid4().hex[:6]}"
        )
        await producer.start()
        try:

            async def transaction(values: list[str]) -> None:
                async with producer.transaction():
                    sent = [
                        await producer.send(topic, value=v.encode(), partition=i % PARTITIONS)
                        for i, v in enumerate(values)
                    ]
                    await asyncio.gather(*sent)

            await transaction(batches.first)
            with pytest.raises(AbortError):
                async with producer.transaction():
                    for i, value in enumerate(batches.aborted):
                        await producer.send_and_wait(
                            topic, value=value.encode(), partition=i % PARTITIONS
                        )
                    raise AbortError
            await transaction(batches.last)
        finally:
            await producer.stop()

    asyncio.run(produce())
    ends = end_offsets(reach, topic)
    committed = asyncio.run(aiokafka_read(reach, topic, "read_committed", len(batches.committed)))
    assert sorted(committed.values) == batches.committed, "committed once, aborted never"
    everything = asyncio.run(
        aiokafka_read(reach, topic, "read_uncommitted", len(batches.everything))
    )
    assert sorted(everything.values) == batches.everything
    assert sum(ends.values()) == len(batches.everything) + 3 * PARTITIONS
    assert committed.positions == ends
    assert everything.positions == ends


# -- kcat ------------------------------------------------------------------------------------


def kcat_read(reach: Reach, directory: Path, topic: str, isolation: str) -> list[str]:
    """Every partition from the beginning to its end (``-e``), one value a line."""
    done = subprocess.run(
        ["kcat", *reach.kcat(directory), "-C", "-t", topic, "-o", "beginning", "-e", "-q",
         "-f", "%s\n", "-X", f"isolation.level={isolation}"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_kcat_reads_committed_or_uncommitted_as_told(reach: Reach, tmp_path: Path) -> None:
    route = reach.route
    topic = route.create_topic()
    batches = Batches.make("kcat")
    producer = route.producer(f"for-kcat-{uuid.uuid4().hex[:6]}")
    producer.init_transactions(TIMEOUT_S)
    produce_in_transaction(producer, topic, batches.first, commit=True)
    produce_in_transaction(producer, topic, batches.aborted, commit=False)
    produce_in_transaction(producer, topic, batches.last, commit=True)

    assert sorted(kcat_read(reach, tmp_path, topic, "read_committed")) == batches.committed
    assert sorted(kcat_read(reach, tmp_path, topic, "read_uncommitted")) == batches.everything

    # A transaction still open: read_uncommitted shows its records, read_committed stops
    # before them (at the last stable offset) and says so by ending there.
    pending = [f"kcat-pending-{i}" for i in range(PARTITIONS)]
    producer.begin_transaction()
    for i, value in enumerate(pending):
        producer.produce(topic, value=value.encode(), partition=i)
    assert producer.flush(TIMEOUT_S) == 0
    assert sorted(kcat_read(reach, tmp_path, topic, "read_committed")) == batches.committed
    assert sorted(kcat_read(reach, tmp_path, topic, "read_uncommitted")) == sorted(
        batches.everything + pending
    )
    producer.commit_transaction(TIMEOUT_S)
    assert sorted(kcat_read(reach, tmp_path, topic, "read_committed")) == sorted(
        batches.committed + pending
    )


# -- Kafka's Java tools ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def kafka_tools(tmp_path_factory: pytest.TempPathFactory) -> ApacheKafka:
    """Kafka's jars (``make kafka``); only its ``java_command`` is used, no Kafka starts."""
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=840)
    return ApacheKafka(tmp_path_factory.mktemp("kafka-tools"), home)


def java_tool(tools: ApacheKafka, main_class: str, *args: str) -> str:
    """A Kafka tool's stdout, once it has exited 0 with no trouble on stderr."""
    return clean(
        subprocess.run(
            tools.java_command(main_class, *args),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S * 2,
        )
    )


def tab_table(text: str) -> list[dict[str, str]]:
    """kafka-transactions' output: a header line and a line per row, cells padded and
    ended by a tab (an empty cell, such as no partitions, is still one)."""
    header, *rows = [line.split("\t") for line in text.splitlines() if line.strip()]
    names = [name.strip() for name in header]
    return [dict(zip(names, (cell.strip() for cell in row), strict=True)) for row in rows]


def test_kafka_transactions_lists_and_describes_an_open_transaction(
    reach: Reach, cluster: GatewayCluster, kafka_tools: ApacheKafka, tmp_path: Path
) -> None:
    route = reach.route
    topic = route.create_topic()
    transactional_id = f"listed-{uuid.uuid4().hex[:6]}"
    producer = route.producer(transactional_id)
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    for partition in (0, 2):
        producer.produce(topic, value=b"open", partition=partition)
    assert producer.flush(TIMEOUT_S) == 0
    admin = reach.java_admin(tmp_path)

    def listed() -> dict[str, dict[str, str]]:
        rows = tab_table(java_tool(kafka_tools, TRANSACTIONS, *admin, "list"))
        return {row["TransactionalId"]: row for row in rows}

    def described() -> dict[str, str]:
        text = java_tool(
            kafka_tools, TRANSACTIONS, *admin, "describe", "--transactional-id", transactional_id
        )
        [row] = tab_table(text)
        return row

    ours = listed()[transactional_id]
    assert ours["TransactionState"] == "Ongoing", ours
    open_now = described()
    assert open_now["TransactionState"] == "Ongoing", open_now
    assert open_now["ProducerId"] == ours["ProducerId"]
    assert open_now["CoordinatorId"] == ours["Coordinator"]
    # Through the gateway, the tenant's names: no prefix on the id or the topic.
    assert sorted(open_now["TopicPartitions"].split(",")) == [f"{topic}-0", f"{topic}-2"]
    assert int(open_now["TransactionDurationMs"]) >= 0

    producer.commit_transaction(TIMEOUT_S)
    after = described()
    assert after["TransactionState"] == "CompleteCommit", after
    assert after["TopicPartitions"] == "", after
    assert listed()[transactional_id]["TransactionState"] == "CompleteCommit"
    if reach.key is not None:
        # Another tenant does not see this tenant's transactions.
        stranger = Reach("gateway", reach.bootstrap, cluster.tenant(f"t{uuid.uuid4().hex[:6]}"))
        theirs = tab_table(
            java_tool(kafka_tools, TRANSACTIONS, *stranger.java_admin(tmp_path), "list")
        )
        assert transactional_id not in [row["TransactionalId"] for row in theirs], theirs


OPEN_FOR_MS = 300_000
"""A transaction the tests end themselves: its timeout is longer than the test."""


def describe_producers(
    tools: ApacheKafka, admin: list[str], topic: str, partition: int
) -> list[dict[str, str]]:
    return tab_table(
        java_tool(
            tools, TRANSACTIONS, *admin,
            "describe-producers", "--topic", topic, "--partition", str(partition),
        )
    )  # fmt: skip


def java_tool_fails(tools: ApacheKafka, main_class: str, *args: str) -> str:
    """What a Kafka tool that must fail (exit 1) printed, stdout and stderr."""
    done = subprocess.run(
        tools.java_command(main_class, *args),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S * 2,
    )
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    return failed(done)


def test_kafka_transactions_aborts_an_open_transaction_on_the_brokers(
    cluster: GatewayCluster, kafka_tools: ApacheKafka, tmp_path: Path
) -> None:
    """An operator ends a transaction by hand, straight against the brokers (Kafka's
    Admin.abortTransaction: DescribeProducers, then WriteTxnMarkers to the partition's
    leader): the last stable offset moves past it and read_committed consumers read on,
    without its records."""
    reach = Reach("direct", cluster.internal_bootstrap, None)
    route = reach.route
    topic = route.create_topic()
    plain = Producer(route.settings)
    for value in (b"before-0", b"before-1"):
        plain.produce(topic, value=value, partition=1)
    assert plain.flush(TIMEOUT_S) == 0
    transactional_id = f"hand-aborted-{uuid.uuid4().hex[:6]}"
    # A first instance of the id, fenced by the second: the open transaction's producer
    # epoch is past 0, so an older epoch is one the partition has seen.
    fenced = route.producer(transactional_id)
    fenced.init_transactions(TIMEOUT_S)
    producer = route.producer(transactional_id, **{"transaction.timeout.ms": OPEN_FOR_MS})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=f"open-{i}".encode(), partition=1)
    assert producer.flush(TIMEOUT_S) == 0
    plain.produce(topic, value=b"after", partition=1)
    assert plain.flush(TIMEOUT_S) == 0
    assert end_offsets(reach, topic)[1] == 6
    assert end_offsets(reach, topic, "read_committed")[1] == 2, "held at the open transaction"

    admin = reach.java_admin(tmp_path)
    [row] = [
        r
        for r in describe_producers(kafka_tools, admin, topic, 1)
        if r["CurrentTransactionStartOffset"] != "None"
    ]
    assert row["CurrentTransactionStartOffset"] == "2", row
    epoch = int(row["ProducerEpoch"])
    assert epoch >= 1, row

    # find-hanging on a replica that is not the leader (DescribeProducers to that broker):
    # the transaction is open, but its coordinator still has the partition in it, so it
    # is not hanging.
    metadata = AdminClient(route.settings).list_topics(topic, timeout=TIMEOUT_S)
    partition = metadata.topics[topic].partitions[1]
    follower = next(r for r in partition.replicas if r != partition.leader)
    hanging = java_tool(
        kafka_tools, TRANSACTIONS, *admin, "find-hanging",
        "--broker-id", str(follower), "--topic", topic, "--max-transaction-timeout", "0",
    )  # fmt: skip
    assert tab_table(hanging) == [], hanging

    # A marker with an epoch older than the partition's: Kafka's INVALID_PRODUCER_EPOCH,
    # and nothing is written.
    stale = java_tool_fails(
        kafka_tools, TRANSACTIONS, *admin, "abort", "--topic", topic, "--partition", "1",
        "--producer-id", row["ProducerId"], "--producer-epoch", str(epoch - 1),
        "--coordinator-epoch", "0",
    )  # fmt: skip
    assert "Failed to abort transaction" in stale, stale
    assert "invalid producer epoch" in stale, stale
    assert end_offsets(reach, topic)[1] == 6

    java_tool(
        kafka_tools, TRANSACTIONS, *admin, "abort",
        "--topic", topic, "--partition", "1", "--start-offset", "2",
    )  # fmt: skip

    # The abort marker took offset 6; nothing holds read_committed consumers back.
    ends = end_offsets(reach, topic)
    assert ends[1] == 7
    assert end_offsets(reach, topic, "read_committed") == ends
    read = kafka_python_read(reach, topic, "read_committed", 3)
    assert sorted(read.values) == ["after", "before-0", "before-1"], "open-* never"
    assert read.positions == ends
    producer.abort_transaction(TIMEOUT_S)


def test_kafka_transactions_abort_through_the_gateway_is_refused(
    cluster: GatewayCluster, kafka_tools: ApacheKafka, tmp_path: Path
) -> None:
    """Writing markers is the brokers' own business (Kafka: CLUSTER_ACTION on the
    cluster, which a tenant never has): ``kafka-transactions abort`` as a tenant fails
    with Kafka's cluster authorization error and changes nothing. ``shoal txn abort``
    is the tenant's way: it fences the producer and the coordinator aborts."""
    key = cluster.tenant(f"t{uuid.uuid4().hex[:6]}")
    reach = Reach("gateway", key.bootstrap(), key)
    route = reach.route
    topic = route.create_topic()
    transactional_id = f"tenant-open-{uuid.uuid4().hex[:6]}"
    producer = route.producer(transactional_id, **{"transaction.timeout.ms": OPEN_FOR_MS})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=1)
    assert producer.flush(TIMEOUT_S) == 0
    plain = Producer(route.settings)
    plain.produce(topic, value=b"after", partition=1)
    assert plain.flush(TIMEOUT_S) == 0
    admin = reach.java_admin(tmp_path)
    [row] = describe_producers(kafka_tools, admin, topic, 1)
    assert row["CurrentTransactionStartOffset"] == "0", row

    refused = java_tool_fails(
        kafka_tools, TRANSACTIONS, *admin, "abort",
        "--topic", topic, "--partition", "1", "--start-offset", "0",
    )  # fmt: skip
    assert "Failed to abort transaction" in refused, refused
    assert "cluster authorization" in refused, refused
    assert end_offsets(reach, topic, "read_committed")[1] == 0, "still held back"

    aborted = shoal_txn(properties(route, tmp_path), "abort", transactional_id)
    assert aborted["state_before"] == "Ongoing"
    read = kafka_python_read(reach, topic, "read_committed", 1)
    assert read.values == ["after"]
    assert read.positions == end_offsets(reach, topic)


def test_java_transactional_message_copier_copies_each_record_exactly_once(
    cluster: GatewayCluster, kafka_tools: ApacheKafka
) -> None:
    """The Java client's consume-transform-produce, with Kafka's own random aborts: the
    copy, read_committed, holds every input record once, and the group's offset is at
    the end of the input."""
    route = Route("direct", {"bootstrap.servers": cluster.internal_bootstrap})
    source, sink = route.create_topic(partitions=1), route.create_topic()
    inputs = [f"copy-{i}" for i in range(500)]
    plain = Producer(route.settings)
    for value in inputs:
        plain.produce(source, value=value.encode(), partition=0)
    assert plain.flush(TIMEOUT_S) == 0
    group = f"copier-{uuid.uuid4().hex[:6]}"

    out = java_tool(
        kafka_tools,
        COPIER,
        "--broker-list", cluster.internal_bootstrap,
        "--input-topic", source,
        "--input-partition", "0",
        "--output-topic", sink,
        "--transactional-id", f"copier-{uuid.uuid4().hex[:6]}",
        "--consumer-group", group,
        "--transaction-size", "50",
        "--use-group-metadata",
        "--enable-random-aborts",
    )  # fmt: skip
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    # Its last word: every input copied (in a committed transaction), none left.
    done = events[-1]
    assert done["stage"] == "ShutdownComplete", events[-3:]
    assert (done["totalProcessed"], done["remaining"]) == (len(inputs), 0), done

    reach = Reach("direct", cluster.internal_bootstrap, None)
    copied = kafka_python_read(reach, sink, "read_committed", len(inputs))
    assert sorted(copied.values) == sorted(inputs), "each input once in the copy"
    consumer = KafkaConsumer(**reach.python_client(), group_id=group, enable_auto_commit=False)
    try:
        committed = consumer.committed(KafkaPythonTopicPartition(source, 0))
    finally:
        consumer.close()
    assert committed == len(inputs)


def test_java_producer_commits_and_aborts_and_java_consumer_honours_isolation(
    reach: Reach, kafka_tools: ApacheKafka, tmp_path: Path
) -> None:
    topic = reach.route.create_topic()
    batches = Batches.make("java")
    source = tmp_path / "TransactionalLines.java"
    source.write_text(TRANSACTIONAL_LINES)
    config = reach.java_config(tmp_path)
    script = "".join(
        f"BEGIN\n{''.join(v + chr(10) for v in values)}{end}\n"
        for values, end in (
            (batches.first, "COMMIT"),
            (batches.aborted, "ABORT"),
            (batches.last, "COMMIT"),
        )
    )
    transactional_id = f"java-{uuid.uuid4().hex[:6]}"
    clean(
        subprocess.run(
            kafka_tools.java_command(
                str(source), str(config), topic, transactional_id, str(PARTITIONS)
            ),
            input=script,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S * 2,
        )
    )

    def console(isolation: str) -> list[str]:
        done = subprocess.run(
            kafka_tools.java_command(
                CONSOLE_CONSUMER,
                *reach.java_admin(tmp_path),
                "--topic", topic,
                "--from-beginning",
                "--isolation-level", isolation,
                "--timeout-ms", "5000",
            ),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S * 2,
        )  # fmt: skip
        # --timeout-ms ends it with a logged TimeoutException (Kafka's way); nothing else
        # may look like trouble.
        trouble = [
            line
            for line in done.stderr.splitlines()
            if TROUBLE.search(line)
            and "Error processing message, terminating consumer process" not in line
            and line != "org.apache.kafka.common.errors.TimeoutException"
        ]
        assert done.returncode == 0 and not trouble, done.stderr
        lines = done.stdout.splitlines()
        assert f"Processed a total of {len(lines)} messages" in done.stderr, done.stderr
        return sorted(lines)

    assert console("read_committed") == batches.committed, "committed once, aborted never"
    assert console("read_uncommitted") == batches.everything
    # kafka-python agrees, and the markers took offsets no consumer handed out.
    ends = end_offsets(reach, topic)
    assert sum(ends.values()) == len(batches.everything) + 3 * PARTITIONS
    committed = kafka_python_read(reach, topic, "read_committed", len(batches.committed))
    assert sorted(committed.values) == batches.committed
    assert committed.positions == ends
