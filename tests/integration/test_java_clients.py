"""Apache Kafka's Java client and its command-line tools against Shoal, through the gateway.

No Java is written here: Kafka 4.3.1's own tools (``make kafka`` installs them,
on a fresh machine too, so these tests never skip) run as ``java -cp
'libs/*' <main class>`` with a tenant's API key in a ``--command-config``
file (SASL/PLAIN over SASL_PLAINTEXT), as a user would run ``bin/kafka-*.sh``:

* ``kafka-topics`` (TopicCommand) creates, lists, describes, grows and deletes
  a topic; the tenant sees its own topics under its own names, never a
  neighbour's, though the brokers hold them as ``<tenant>.<name>``;
* ``kafka-configs`` (ConfigCommand) describes, sets and removes topic configs;
* the Java producer (VerifiableProducer, idempotent, ``acks=all``) writes with
  every codec, the Java consumer (VerifiableConsumer, classic group protocol)
  reads every acknowledged record exactly once and in order per partition,
  and Kafka's DumpLogSegments reads the brokers' segments as Kafka's own;
* ``kafka-console-producer``/``-consumer`` and ``kafka-consumer-groups``
  (list, describe with lag, reset offsets, delete) on one group's life;
* ``kafka-cluster`` and ``kafka-broker-api-versions`` see the gateway's
  advertised brokers (plain and TLS listeners), never the internal ones;
* SASL/OAUTHBEARER: the Java client's own OAuthBearerLoginCallbackHandler
  fetches tokens from the gateway's token endpoint (client credentials);
* SASL/SCRAM-SHA-256 and -512 with the key (Kafka's ScramLoginModule): the
  Java producer and consumer, and a wrong password refused as Kafka refuses it;
* mutual TLS (``security.protocol=SSL``, a PEM keystore): a certificate whose
  subject a key names signs in as that key; one from an unknown CA, or
  expired, fails with ``SslAuthenticationException``, as on Kafka's SSL listener.

* the Java consumer with the KIP-848 protocol (``--group-protocol consumer``,
  the broker's ``range`` assignor) reads and commits, and
  ``kafka-consumer-groups`` describes the group it leaves.

Tools print errors on stderr and sometimes still exit 0, so every run checks
both. One cluster (three brokers and the gateway) and one tenant serve the
module; each test has its own topics and groups.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from gateway_env import ClientCertificate, TenantKey, client_certificate, tenancy
from harness import wait_until
from shoal.benchmarks.apache_kafka import ApacheKafka, default_kafka_home

# A cold `make kafka` downloads about 150 MB from Maven Central.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
TENANT = "jclients"
NEIGHBOUR = "jneighbour"
TOOL_TIMEOUT_S = 120

TOPICS = "org.apache.kafka.tools.TopicCommand"
CONFIGS = "kafka.admin.ConfigCommand"
GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
CLUSTER = "org.apache.kafka.tools.ClusterTool"
API_VERSIONS = "org.apache.kafka.tools.BrokerApiVersionsCommand"
VERIFIABLE_PRODUCER = "org.apache.kafka.tools.VerifiableProducer"
VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
DUMP_LOG_SEGMENTS = "org.apache.kafka.tools.DumpLogSegments"

# What a tool prints on stderr when something went wrong (log4j's levels, a
# stack trace, "Error: ..." lines). Benign notes (ConsoleConsumer's "Processed
# a total of N messages") match none of these.
TROUBLE = re.compile(r"\b(ERROR|WARN|FATAL)\b|Exception|\bError\b")


# -- running Kafka's tools -------------------------------------------------------------------


@dataclass
class Java:
    """Kafka's tools for one tenant key, through the gateway."""

    launcher: ApacheKafka  # for java_command() only: this Kafka cluster never starts
    key: TenantKey
    directory: Path

    @property
    def bootstrap(self) -> str:
        return self.key.bootstrap()

    def properties(self, name: str, settings: Mapping[str, str]) -> Path:
        path = self.directory / f"{name}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def plain(self, name: str = "client", **extra: str) -> Path:
        """A client config with the key over SASL/PLAIN, and ``extra`` settings."""
        return self.properties(name, {**plain_settings(self.key), **extra})

    def admin(self, config: Path | None = None) -> list[str]:
        """``--bootstrap-server`` and ``--command-config``, as every tool takes them."""
        return [
            "--bootstrap-server",
            self.bootstrap,
            "--command-config",
            str(config or self.plain()),
        ]

    def command(self, main_class: str, *args: str, jvm: Sequence[str] = ()) -> list[str]:
        java, *rest = self.launcher.java_command(main_class, *args)
        return [java, *jvm, *rest]

    def run(
        self, main_class: str, *args: str, jvm: Sequence[str] = (), stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(main_class, *args, jvm=jvm),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT_S,
        )

    def ok(
        self, main_class: str, *args: str, jvm: Sequence[str] = (), stdin: str | None = None
    ) -> str:
        """The tool's stdout, once it has exited 0 and printed no trouble on stderr."""
        return clean(self.run(main_class, *args, jvm=jvm, stdin=stdin))

    def start(self, name: str, main_class: str, *args: str, jvm: Sequence[str] = ()) -> Running:
        """A tool in the background, its output in files (no pipe fills up)."""
        out, err = self.directory / f"{name}.out", self.directory / f"{name}.err"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            process = subprocess.Popen(
                self.command(main_class, *args, jvm=jvm),
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        return Running(process, out, err)


@dataclass
class Running:
    process: subprocess.Popen[str]
    out: Path
    err: Path

    def finish(self, timeout: float = TOOL_TIMEOUT_S) -> str:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        return clean(
            subprocess.CompletedProcess(
                self.process.args, code, self.out.read_text(), self.err.read_text()
            )
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # the JVM's shutdown hooks close the client
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def clean(done: subprocess.CompletedProcess[str]) -> str:
    trouble = [line for line in done.stderr.splitlines() if TROUBLE.search(line)]
    assert done.returncode == 0 and not trouble, (
        f"{done.args[-8:]} exited {done.returncode}\n"
        f"--- stdout ---\n{done.stdout[-4000:]}\n--- stderr ---\n{done.stderr[-6000:]}"
    )
    return done.stdout


def failed(done: subprocess.CompletedProcess[str]) -> str:
    """What a tool that must fail printed (stdout and stderr): Kafka's tools print
    their errors on either stream."""
    return done.stdout + done.stderr


def plain_settings(key: TenantKey) -> dict[str, str]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{key.key_id}" password="{key.secret}";'
        ),
    }


# -- what the tools print --------------------------------------------------------------------


@dataclass
class TopicDescription:
    fields: dict[str, str]
    configs: dict[str, str]
    partitions: list[dict[str, str]]


def describe_topic(text: str) -> TopicDescription:
    """``kafka-topics --describe`` of one topic: a header line, then a line per partition."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, text

    def fields(line: str) -> dict[str, str]:
        pairs = (cell.partition(":") for cell in line.strip().split("\t"))
        return {name.strip(): value.strip() for name, _, value in pairs}

    header = fields(lines[0])
    configs = dict(c.split("=", 1) for c in header["Configs"].split(",") if c)
    return TopicDescription(header, configs, [fields(line) for line in lines[1:]])


def topic_configs(text: str) -> dict[str, str]:
    """``kafka-configs --describe`` of a topic: ``  name=value sensitive=... synonyms=...``."""
    return dict(re.findall(r"^\s+([\w.]+)=(\S*) sensitive=", text, re.MULTILINE))


def table(text: str, first: str) -> list[dict[str, str]]:
    """The rows of an aligned table whose header starts with the column ``first``."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            header = None
        elif header is None:
            if cells[0] == first:
                header = cells
        else:
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def flags(text: str) -> list[str]:
    """A tool's flags written as one line (no value here has a space)."""
    return text.split()


def json_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# -- the cluster, the tenant and its neighbour -----------------------------------------------


@pytest.fixture(scope="module")
def kafka_home() -> Path:
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=840)
    return home


@pytest.fixture(scope="module")
def java(
    kafka_home: Path, gateway_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Java]:
    """Kafka's tools (installed first), and a key of tenant ``jclients`` with the default
    bindings: everything on its own topics and groups, Describe and Create on the cluster."""
    directory = tmp_path_factory.mktemp("java-clients")
    launcher = ApacheKafka(directory / "kafka-tools", kafka_home)
    yield Java(launcher, gateway_cluster.tenant(TENANT), directory)


@pytest.fixture(scope="module")
def neighbour(gateway_cluster: Any) -> TenantKey:
    """Another tenant with a topic of the same name as ours, one of its own, and a group."""
    key: TenantKey = gateway_cluster.tenant(NEIGHBOUR)
    admin = AdminClient(key.librdkafka())
    for future in admin.create_topics([NewTopic("orders", 1), NewTopic("theirs", 1)]).values():
        future.result(30)
    settings: dict[str, Any] = {"group.id": "their-group", "enable.auto.commit": False}
    consumer = Consumer(key.librdkafka(**settings))
    try:
        consumer.commit(offsets=[TopicPartition("theirs", 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    return key


def platform(gateway_cluster: Any) -> AdminClient:
    """The brokers' own view (the internal listeners), as the platform team has it."""
    return AdminClient({"bootstrap.servers": gateway_cluster.internal_bootstrap})


# -- kafka-topics ----------------------------------------------------------------------------


def test_kafka_topics_creates_lists_describes_grows_and_deletes(
    java: Java, neighbour: TenantKey, gateway_cluster: Any
) -> None:
    admin = java.admin()
    created = java.ok(
        TOPICS,
        *admin,
        *flags("--create --topic orders --partitions 3 --replication-factor 3"),
        *flags("--config retention.ms=86400000 --config cleanup.policy=delete"),
    )
    assert created.strip() == "Created topic orders."

    again = java.run(TOPICS, *admin, *flags("--create --topic orders --partitions 1"))
    assert again.returncode == 1, failed(again)
    assert "TopicExistsException: Topic 'orders' already exists." in failed(again)

    # --list: the tenant's topics, by the tenant's names; the brokers hold them
    # (and the neighbour's "orders") under each tenant's prefix.
    listed = java.ok(TOPICS, *admin, "--list").split()
    on_brokers = set(platform(gateway_cluster).list_topics(timeout=30).topics)
    assert {f"{TENANT}.orders", f"{NEIGHBOUR}.orders", f"{NEIGHBOUR}.theirs"} <= on_brokers
    ours = {t.removeprefix(f"{TENANT}.") for t in on_brokers if t.startswith(f"{TENANT}.")}
    assert sorted(listed) == sorted(ours), listed
    assert "orders" in listed
    assert "theirs" not in listed
    assert not [t for t in listed if t.startswith(("__", f"{TENANT}."))], listed

    topic = describe_topic(java.ok(TOPICS, *admin, *flags("--describe --topic orders")))
    assert topic.fields["Topic"] == "orders"
    assert topic.fields["PartitionCount"] == "3"
    assert topic.fields["ReplicationFactor"] == "3"
    assert topic.fields["TopicId"] not in ("", "AAAAAAAAAAAAAAAAAAAAAA")
    assert topic.configs == {"retention.ms": "86400000", "cleanup.policy": "delete"}
    assert [p["Partition"] for p in topic.partitions] == ["0", "1", "2"]
    for partition in topic.partitions:
        assert partition["Topic"] == "orders"
        replicas = partition["Replicas"].split(",")
        assert sorted(replicas) == ["0", "1", "2"], partition
        assert partition["Leader"] in replicas, partition
        assert sorted(partition["Isr"].split(",")) == sorted(replicas), partition

    assert java.ok(TOPICS, *admin, *flags("--alter --topic orders --partitions 5")) == ""
    grown = describe_topic(java.ok(TOPICS, *admin, *flags("--describe --topic orders")))
    assert grown.fields["PartitionCount"] == "5"
    assert [p["Partition"] for p in grown.partitions] == ["0", "1", "2", "3", "4"]
    assert grown.fields["TopicId"] == topic.fields["TopicId"]
    assert grown.configs == topic.configs

    # Kafka refuses to shrink a topic (InvalidPartitionsException).
    shrink = java.run(TOPICS, *admin, *flags("--alter --topic orders --partitions 2"))
    assert shrink.returncode == 1, failed(shrink)
    assert "InvalidPartitionsException" in failed(shrink)

    # The neighbour's topic does not exist for this tenant.
    theirs = java.run(TOPICS, *admin, *flags("--describe --topic theirs"))
    assert theirs.returncode == 1, failed(theirs)
    assert "Topic 'theirs' does not exist as expected" in failed(theirs)

    java.ok(TOPICS, *admin, *flags("--delete --topic orders"))
    wait_until(
        lambda: "orders" not in java.ok(TOPICS, *admin, "--list").split(), 30, "orders to go"
    )
    # The neighbour's topic of the same name is untouched.
    assert "orders" in AdminClient(neighbour.librdkafka()).list_topics(timeout=30).topics


# -- kafka-configs ---------------------------------------------------------------------------


def test_kafka_configs_describes_alters_and_deletes_topic_configs(
    java: Java, gateway_cluster: Any
) -> None:
    admin = java.admin()
    create = "--create --topic settings --partitions 1 --config retention.ms=86400000"
    java.ok(TOPICS, *admin, *flags(create))
    entity = flags("--entity-type topics --entity-name settings")

    def describe(*extra: str) -> str:
        return java.ok(CONFIGS, *admin, "--describe", *entity, *extra)

    described = describe()
    assert "Dynamic configs for topic settings are:" in described
    assert topic_configs(described) == {"retention.ms": "86400000"}

    settings = "retention.ms=3600000,max.message.bytes=200000"
    altered = java.ok(CONFIGS, *admin, "--alter", *entity, "--add-config", settings)
    assert "Completed updating config for topic settings." in altered
    assert topic_configs(describe()) == {"retention.ms": "3600000", "max.message.bytes": "200000"}
    # The brokers have it, on the tenant's topic.
    resource = ConfigResource(ConfigResource.Type.TOPIC, f"{TENANT}.settings")
    brokers_view = platform(gateway_cluster)  # kept: its futures die with it
    on_brokers = brokers_view.describe_configs([resource])[resource].result(30)
    assert on_brokers["retention.ms"].value == "3600000"
    assert on_brokers["max.message.bytes"].value == "200000"

    java.ok(CONFIGS, *admin, "--alter", *entity, *flags("--delete-config max.message.bytes"))
    assert topic_configs(describe()) == {"retention.ms": "3600000"}
    every = topic_configs(describe("--all"))
    assert every["retention.ms"] == "3600000"
    assert every["max.message.bytes"] == "1048588"  # back to Kafka's default
    assert every["cleanup.policy"] == "delete"
    assert "min.insync.replicas" in every

    # A value the broker refuses: InvalidConfigurationException, exit 1, nothing changed.
    refused = java.run(CONFIGS, *admin, "--alter", *entity, *flags("--add-config retention.ms=x"))
    assert refused.returncode == 1, failed(refused)
    assert "InvalidConfigurationException" in failed(refused)
    assert topic_configs(describe()) == {"retention.ms": "3600000"}


# -- the Java producer and consumer ----------------------------------------------------------

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PER_CODEC = 300
KEYS = 7
BATCH = re.compile(
    r"^baseOffset: (\d+) lastOffset: (\d+) count: (\d+) .*producerId: (-?\d+) .*"
    r"compresscodec: (\w+) crc: \d+ isvalid: (\w+)$",
    re.MULTILINE,
)


def test_java_producer_with_each_codec_and_java_consumer_read_each_record_once(
    java: Java, gateway_cluster: Any
) -> None:
    topic, partitions = "codecs", 3
    java.ok(TOPICS, *java.admin(), *flags(f"--create --topic {topic} --partitions {partitions}"))

    # One idempotent acks=all producer per codec, all at once; values are
    # "<codec number>.<n>", keys n % 7 (so each key stays on one partition).
    producers = {}
    for number, codec in enumerate(CODECS, 1):
        config = java.plain(
            f"producer-{codec}",
            **{
                "compression.type": codec,
                "enable.idempotence": "true",
                "acks": "all",
                "retries": "2147483647",  # VerifiableProducer sets 0 unless told
                "linger.ms": "5",
            },
        )
        producers[codec] = java.start(
            f"producer-{codec}",
            VERIFIABLE_PRODUCER,
            *java.admin(config),
            *flags(f"--topic {topic} --max-messages {PER_CODEC} --repeating-keys {KEYS}"),
            *flags(f"--value-prefix {number}"),
        )

    acked: dict[tuple[int, int], tuple[str, str]] = {}  # (partition, offset) -> (key, value)
    for number, (codec, producer) in enumerate(producers.items(), 1):
        events = json_events(producer.finish())
        assert not [e for e in events if e["name"] == "producer_send_error"], codec
        sent = [e for e in events if e["name"] == "producer_send_success"]
        assert len(sent) == PER_CODEC, codec
        summary = events[-1]
        assert summary["name"] == "tool_data", summary
        assert summary["sent"] == summary["acked"] == PER_CODEC, summary
        for event in sent:
            assert event["topic"] == topic
            where = (event["partition"], event["offset"])
            assert where not in acked, f"{codec}: offset {where} acknowledged twice"
            acked[where] = (event["key"], event["value"])
        numbers = sorted(int(e["value"].split(".")[1]) for e in sent)
        assert numbers == list(range(PER_CODEC)), codec
        assert all(e["value"].startswith(f"{number}.") for e in sent)
        assert all(e["key"] == str(int(e["value"].split(".")[1]) % KEYS) for e in sent)
    total = len(CODECS) * PER_CODEC
    assert len(acked) == total
    # Every offset of every partition holds an acknowledged record: no gaps.
    ends = Counter(p for p, _ in acked)
    for partition, end in ends.items():
        assert sorted(o for p, o in acked if p == partition) == list(range(end))

    # The Java consumer, classic group protocol, reads them all back.
    read = java.ok(
        VERIFIABLE_CONSUMER,
        *java.admin(),
        *flags(f"--topic {topic} --group-id codecs-readers --max-messages {total}"),
        *flags("--verbose --reset-policy earliest"),
    )
    events = json_events(read)
    records = [e for e in events if e["name"] == "record_data"]
    consumed = [(e["partition"], e["offset"], e["key"], e["value"]) for e in records]
    assert len(consumed) == total
    assert {(p, o): (k, v) for p, o, k, v in consumed} == acked  # each exactly once
    assert all(e["topic"] == topic for e in records)
    for partition, end in ends.items():
        offsets = [o for p, o, _, _ in consumed if p == partition]
        assert offsets == list(range(end)), f"partition {partition} read out of order"
        for number in range(1, len(CODECS) + 1):
            sequence = [
                int(v.split(".")[1])
                for p, _, _, v in consumed
                if p == partition and v.startswith(f"{number}.")
            ]
            assert sequence == sorted(sequence), f"producer {number} reordered in {partition}"
    commits = [e for e in events if e["name"] == "offsets_committed"]
    assert commits and all(c["success"] for c in commits), commits
    committed = {o["partition"]: o["offset"] for c in commits for o in c["offsets"]}
    assert committed == dict(ends)

    # The leaders' segments, read by Kafka's own DumpLogSegments: Kafka's format,
    # valid CRCs, each producer's batches compressed with its codec, as sent.
    described = describe_topic(
        java.ok(TOPICS, *java.admin(), *flags(f"--describe --topic {topic}"))
    )
    brokers = {b.node_id: b for b in gateway_cluster.brokers}
    segments = []
    for row in described.partitions:
        leader = brokers[int(row["Leader"])]
        directory = leader.data_dir / f"{TENANT}.{topic}-{row['Partition']}"
        segments += sorted(str(s) for s in directory.glob("*.log"))
    dump = java.ok(DUMP_LOG_SEGMENTS, "--files", ",".join(segments))
    batches = BATCH.findall(dump)
    assert sum(int(count) for _, _, count, _, _, _ in batches) == total, dump[-3000:]
    assert all(valid == "true" for *_, valid in batches), dump[-3000:]
    codec_of: dict[str, set[str]] = {}
    for _, _, _, producer_id, codec, _ in batches:
        codec_of.setdefault(producer_id, set()).add(codec)
    assert sorted(c for codecs in codec_of.values() for c in codecs) == sorted(CODECS), codec_of
    assert all(len(codecs) == 1 for codecs in codec_of.values()), codec_of


def test_java_consumer_with_the_consumer_group_protocol_reads_and_commits(java: Java) -> None:
    topic, group, total = "kip848", "kip848-readers", 30
    java.ok(TOPICS, *java.admin(), *flags(f"--create --topic {topic} --partitions 3"))
    producer = Producer(java.key.librdkafka(acks="all"))
    for i in range(total):
        producer.produce(topic, str(i).encode(), partition=i % 3)
    assert producer.flush(30) == 0

    read = java.ok(
        VERIFIABLE_CONSUMER,
        *java.admin(),
        *flags(f"--topic {topic} --group-id {group} --max-messages {total}"),
        *flags("--group-protocol consumer --group-remote-assignor range"),
        *flags("--verbose --reset-policy earliest"),
    )

    events = json_events(read)
    values = sorted(int(e["value"]) for e in events if e["name"] == "record_data")
    assert values == list(range(total))
    assigned = [e for e in events if e["name"] == "partitions_assigned"]
    assert {p["partition"] for e in assigned for p in e["partitions"]} == {0, 1, 2}
    commits = [e for e in events if e["name"] == "offsets_committed"]
    assert commits and all(c["success"] for c in commits), commits
    committed = {o["partition"]: o["offset"] for c in commits for o in c["offsets"]}
    assert committed == {0: 10, 1: 10, 2: 10}
    described = java.ok(GROUPS, *java.admin(), *flags(f"--describe --group {group} --state"))
    # Empty, the group names Kafka's default assignor, as Kafka's does.
    assert re.search(rf"{group}\s+\S+\s+\(\d+\)\s+uniform\s+Empty\s+0", described), described


# -- console producer/consumer and kafka-consumer-groups --------------------------------------

CONSOLE_RECORDS = 30
EXTRA_PER_PARTITION = 4
SHOW = flags(
    "--formatter-property print.partition=true --formatter-property print.offset=true "
    "--formatter-property print.headers=true --formatter-property print.key=true"
)
Line = tuple[int, int, str, str, str]  # partition, offset, headers, key, value


def console_lines(text: str) -> list[Line]:
    """ConsoleConsumer's lines with print.partition/offset/headers/key: tab-separated."""
    out = []
    for line in text.splitlines():
        partition, offset, headers, key, value = line.split("\t")
        where = int(partition.removeprefix("Partition:")), int(offset.removeprefix("Offset:"))
        out.append((*where, headers, key, value))
    return out


def test_console_clients_and_kafka_consumer_groups_list_describe_reset_delete(
    java: Java, neighbour: TenantKey
) -> None:
    topic, group, partitions = "ledger", "ledger-readers", 3
    admin = java.admin()
    java.ok(TOPICS, *admin, *flags(f"--create --topic {topic} --partitions {partitions}"))

    # kafka-console-producer: keys and headers parsed from each line.
    lines = "".join(
        f"source:console,n:{i}\tk{i:02d}\tv{i:02d}-{'x' * i}\n" for i in range(CONSOLE_RECORDS)
    )
    producer_config = java.plain("console-producer", acks="all", **{"enable.idempotence": "true"})
    java.ok(
        CONSOLE_PRODUCER,
        *java.admin(producer_config),
        *flags(f"--topic {topic} --reader-property parse.key=true"),
        *flags("--reader-property parse.headers=true"),
        stdin=lines,
    )

    # kafka-console-consumer as a member of the group; it commits on the way out.
    consume = f"--topic {topic} --group {group} --from-beginning --max-messages {CONSOLE_RECORDS}"
    first = console_lines(java.ok(CONSOLE_CONSUMER, *admin, *flags(consume), *SHOW))
    assert sorted((k, v, h) for _, _, h, k, v in first) == [
        (f"k{i:02d}", f"v{i:02d}-{'x' * i}", f"source:console,n:{i}")
        for i in range(CONSOLE_RECORDS)
    ]
    counts = Counter(p for p, *_ in first)
    for partition, count in counts.items():
        assert sorted(o for p, o, *_ in first if p == partition) == list(range(count))

    # --list: this tenant's group, not the neighbour's.
    listed = java.ok(GROUPS, *admin, "--list").split()
    assert group in listed
    assert "their-group" not in listed
    states = table(java.ok(GROUPS, *admin, *flags("--list --state")), "GROUP")
    assert {r["GROUP"]: r["STATE"] for r in states}[group] == "Empty"

    # More records arrive (4 per partition) while nobody reads: the lag.
    extra: list[Line] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        assert err is None, err
        key, value = msg.key().decode(), msg.value().decode()
        extra.append((msg.partition(), msg.offset(), "source:confluent", key, value))

    confluent = Producer(java.key.librdkafka(acks="all"))
    for i in range(EXTRA_PER_PARTITION * partitions):
        confluent.produce(
            topic,
            key=f"e{i:02d}",
            value=f"extra-{i:02d}",
            partition=i % partitions,
            headers=[("source", b"confluent")],
            on_delivery=delivered,
        )
    assert confluent.flush(30) == 0
    assert len(extra) == EXTRA_PER_PARTITION * partitions
    ends = {p: counts[p] + EXTRA_PER_PARTITION for p in range(partitions)}

    def offsets_table() -> dict[int, dict[str, str]]:
        rows = table(java.ok(GROUPS, *admin, *flags(f"--describe --group {group}")), "GROUP")
        assert all(r["GROUP"] == group and r["TOPIC"] == topic for r in rows), rows
        return {int(r["PARTITION"]): r for r in rows}

    def group_state() -> dict[str, str]:
        (row,) = table(
            java.ok(GROUPS, *admin, *flags(f"--describe --group {group} --state")), "GROUP"
        )
        return row

    described = offsets_table()
    assert sorted(described) == list(range(partitions))
    for partition, row in described.items():
        assert int(row["CURRENT-OFFSET"]) == counts[partition], row
        assert int(row["LOG-END-OFFSET"]) == ends[partition], row
        assert int(row["LAG"]) == EXTRA_PER_PARTITION, row
        assert row["CONSUMER-ID"] == row["HOST"] == row["CLIENT-ID"] == "-", row
    state = group_state()
    assert state["STATE"] == "Empty" and state["#MEMBERS"] == "0", state

    # --reset-offsets: the plan (--dry-run) changes nothing; --execute applies it.
    reset = flags(f"--reset-offsets --group {group} --topic {topic} --to-earliest")
    plan = table(java.ok(GROUPS, *admin, *reset, "--dry-run"), "GROUP")
    assert sorted((int(r["PARTITION"]), r["NEW-OFFSET"]) for r in plan) == [
        (p, "0") for p in range(partitions)
    ]
    assert {p: int(r["CURRENT-OFFSET"]) for p, r in offsets_table().items()} == dict(counts)
    done = table(java.ok(GROUPS, *admin, *reset, "--execute"), "GROUP")
    assert sorted((int(r["PARTITION"]), r["NEW-OFFSET"]) for r in done) == [
        (p, "0") for p in range(partitions)
    ]
    for partition, row in offsets_table().items():
        assert row["CURRENT-OFFSET"] == "0", row
        assert int(row["LAG"]) == ends[partition], row

    # The group's next member starts where the group's offsets say: the beginning.
    consume = f"--topic {topic} --group {group} --max-messages {sum(ends.values())}"
    again = console_lines(java.ok(CONSOLE_CONSUMER, *admin, *flags(consume), *SHOW))
    assert sorted(again) == sorted(first + extra)
    assert {p: max(o for q, o, *_ in again if q == p) + 1 for p in ends} == ends

    # A live member: describe shows it, and offsets cannot be reset under it.
    member = java.start(
        "console-member",
        CONSOLE_CONSUMER,
        *admin,
        *flags(f"--topic {topic} --group {group} --command-property client.id=member-a"),
    )
    try:
        wait_until(lambda: group_state()["STATE"] == "Stable", 60, "the member", interval=0.5)
        state = group_state()
        assert state["#MEMBERS"] == "1" and state["ASSIGNMENT-STRATEGY"] == "range", state
        members = java.ok(GROUPS, *admin, *flags(f"--describe --group {group} --members"))
        (joined,) = table(members, "GROUP")
        assert joined["CLIENT-ID"] == "member-a", joined
        assert joined["CONSUMER-ID"].startswith("member-a-"), joined
        assert joined["#PARTITIONS"] == str(partitions), joined
        for row in offsets_table().values():
            assert row["CONSUMER-ID"] == joined["CONSUMER-ID"], row
            assert row["LAG"] == "0", row
        refused = java.run(GROUPS, *admin, *reset, "--execute")
        assert (
            f"Assignments can only be reset if the group '{group}' is inactive, "
            "but the current state is Stable." in failed(refused)
        )
        assert all(r["CURRENT-OFFSET"] != "0" for r in offsets_table().values())
    finally:
        member.stop()

    # --delete, once the member has left (closing, it sent LeaveGroup).
    wait_until(lambda: group_state()["STATE"] == "Empty", 30, "the member to leave", interval=0.5)
    deleted = java.ok(GROUPS, *admin, *flags(f"--delete --group {group}"))
    assert f"Deletion of requested consumer groups ('{group}') was successful." in deleted
    assert group not in java.ok(GROUPS, *admin, "--list").split()


# -- the cluster as the gateway advertises it ------------------------------------------------

TENANT_APIS = flags(
    "Produce(0) Fetch(1) ListOffsets(2) Metadata(3) OffsetCommit(8) OffsetFetch(9) "
    "FindCoordinator(10) JoinGroup(11) Heartbeat(12) LeaveGroup(13) SyncGroup(14) "
    "DescribeGroups(15) ListGroups(16) SaslHandshake(17) ApiVersions(18) CreateTopics(19) "
    "DeleteTopics(20) DeleteRecords(21) InitProducerId(22) DescribeConfigs(32) "
    "SaslAuthenticate(36) CreatePartitions(37) DeleteGroups(42) IncrementalAlterConfigs(44) "
    "OffsetDelete(47) DescribeCluster(60)"
)


def test_kafka_cluster_and_broker_api_versions_see_the_gateways_brokers(
    java: Java, gateway_cluster: Any
) -> None:
    gateway = gateway_cluster.gateway
    admin = java.admin()
    internal_ports = {b.port for b in gateway_cluster.brokers}

    cluster_id = java.ok(CLUSTER, "cluster-id", *admin).strip()
    assert re.fullmatch(r"Cluster ID: [A-Za-z0-9_-]{22}", cluster_id), cluster_id
    seen_by_librdkafka = AdminClient(java.key.librdkafka()).list_topics(timeout=30).cluster_id
    assert cluster_id == f"Cluster ID: {seen_by_librdkafka}"

    def endpoints(text: str) -> set[tuple[int, str, int, str, str]]:
        return {
            (int(r["ID"]), r["HOST"], int(r["PORT"]), r["STATE"], r["ENDPOINT_TYPE"])
            for r in table(text, "ID")
        }

    # Broker n is at the gateway's port + 1 + n, on each listener.
    assert endpoints(java.ok(CLUSTER, "list-endpoints", *admin)) == {
        (n, "127.0.0.1", gateway.port + 1 + n, "unfenced", "broker") for n in range(3)
    }
    tls = java.properties(
        "tls",
        {
            **plain_settings(java.key),
            "security.protocol": "SASL_SSL",
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(gateway.tls.ca),
        },
    )
    over_tls = java.ok(
        CLUSTER,
        "list-endpoints",
        *flags(f"--bootstrap-server {gateway.tls_bootstrap}"),
        *flags(f"--command-config {tls}"),
    )
    assert endpoints(over_tls) == {
        (n, "127.0.0.1", gateway.tls_port + 1 + n, "unfenced", "broker") for n in range(3)
    }

    # kafka-broker-api-versions: every advertised broker answers ApiVersions, with
    # versions the Java client can use for what tenants do.
    versions = java.ok(API_VERSIONS, *admin)
    brokers = re.findall(r"^(\S+):(\d+) \(id: (\d+) rack: [^)]*\) -> \($", versions, re.MULTILINE)
    assert {(host, int(port), int(node)) for host, port, node in brokers} == {
        ("127.0.0.1", gateway.port + 1 + n, n) for n in range(3)
    }, versions[:2000]
    assert not internal_ports & {int(port) for _, port, _ in brokers}
    blocks = versions.split(" -> (")[1:]
    assert len(blocks) == 3
    for block in blocks:
        apis = dict(re.findall(r"^\t(\w+\(\d+\)): (.*?),?$", block, re.MULTILINE))
        for api in TENANT_APIS:
            assert "[usable: " in apis.get(api, ""), f"{api}: {apis.get(api)}"


# -- SASL/OAUTHBEARER with the Java client's own login handler ---------------------------------


def test_java_client_oauthbearer_with_the_gateways_token_endpoint(
    java: Java, gateway_cluster: Any
) -> None:
    gateway = gateway_cluster.gateway
    token_url = gateway.http_url + "/oauth2/token"
    # Kafka 4 fetches tokens only from URLs the JVM allows (KIP-1089's allow-list).
    jvm = [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={token_url}"]

    def oauth(name: str, secret: str, **extra: str) -> Path:
        return java.properties(
            name,
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "OAUTHBEARER",
                "sasl.login.callback.handler.class": (
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
                ),
                "sasl.oauthbearer.token.endpoint.url": token_url,
                "sasl.oauthbearer.client.credentials.client.id": java.key.key_id,
                "sasl.oauthbearer.client.credentials.client.secret": secret,
                "sasl.jaas.config": (
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;"
                ),
                **extra,
            },
        )

    admin = java.admin(oauth("oauth", java.key.secret))
    log_start = len(gateway.log_text())

    topic, count = "oauth-orders", 200
    java.ok(TOPICS, *admin, *flags(f"--create --topic {topic} --partitions 3"), jvm=jvm)
    producer_config = oauth(
        "oauth-producer",
        java.key.secret,
        **{"enable.idempotence": "true", "acks": "all", "retries": "2147483647"},
        **{"compression.type": "lz4"},
    )
    produced = json_events(
        java.ok(
            VERIFIABLE_PRODUCER,
            *java.admin(producer_config),
            *flags(f"--topic {topic} --max-messages {count} --repeating-keys 5"),
            jvm=jvm,
        )
    )
    acked = {
        (e["partition"], e["offset"]): (e["key"], e["value"])
        for e in produced
        if e["name"] == "producer_send_success"
    }
    assert len(acked) == count
    assert not [e for e in produced if e["name"] == "producer_send_error"]

    consume = f"--topic {topic} --group-id oauth-readers --max-messages {count} --verbose"
    consumed = json_events(java.ok(VERIFIABLE_CONSUMER, *admin, *flags(consume), jvm=jvm))
    records = [
        (e["partition"], e["offset"], e["key"], e["value"])
        for e in consumed
        if e["name"] == "record_data"
    ]
    assert len(records) == count
    assert {(p, o): (k, v) for p, o, k, v in records} == acked

    # The gateway issued the tokens to this key and the connections logged in with them.
    log = gateway.log_text()[log_start:]
    assert re.search(rf"event=oauth_token_issued tenant={TENANT} key={java.key.key_id}\b", log)
    logins = re.findall(
        rf"event=gateway_authenticated .*key={java.key.key_id} mechanism=(\w+)", log
    )
    assert logins and set(logins) == {"OAUTHBEARER"}, logins

    # A wrong secret: the token endpoint's RFC 6749 error reaches the user.
    wrong = java.admin(oauth("oauth-wrong", "not-the-secret"))
    refused = java.run(TOPICS, *wrong, "--list", jvm=jvm)
    assert refused.returncode != 0, failed(refused)
    assert "invalid_client" in failed(refused)


# -- SASL/SCRAM with Kafka's ScramLoginModule -----------------------------------------------------


def scram_settings(key: TenantKey, mechanism: str, password: str | None = None) -> dict[str, str]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{key.key_id}" password="{password or key.secret}";'
        ),
    }


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_java_clients_sign_in_with_scram(java: Java, gateway_cluster: Any, mechanism: str) -> None:
    gateway = gateway_cluster.gateway
    suffix = mechanism.rsplit("-", 1)[1]
    config = java.properties(f"scram-{suffix}", scram_settings(java.key, mechanism))
    admin = java.admin(config)
    log_start = len(gateway.log_text())
    topic, count = f"scram-{suffix}", 50
    java.ok(TOPICS, *admin, *flags(f"--create --topic {topic} --partitions 2"))
    produced = json_events(
        java.ok(VERIFIABLE_PRODUCER, *admin, *flags(f"--topic {topic} --max-messages {count}"))
    )
    acked = [e for e in produced if e["name"] == "producer_send_success"]
    assert len(acked) == count
    consume = f"--topic {topic} --group-id scram-{suffix} --max-messages {count} --verbose"
    consumed = json_events(java.ok(VERIFIABLE_CONSUMER, *admin, *flags(consume)))
    assert len([e for e in consumed if e["name"] == "record_data"]) == count
    logins = re.findall(
        rf"event=gateway_authenticated .*key={java.key.key_id} mechanism=(\S+)",
        gateway.log_text()[log_start:],
    )
    assert logins and set(logins) == {mechanism}, logins

    wrong = java.properties(
        f"scram-{suffix}-wrong", scram_settings(java.key, mechanism, password="not-the-secret")
    )
    refused = java.run(TOPICS, *java.admin(wrong), "--list")
    assert refused.returncode != 0, failed(refused)
    assert "SaslAuthenticationException" in failed(refused)
    assert "invalid API key or secret" in failed(refused)


# -- mutual TLS with a PEM keystore ----------------------------------------------------------------


def mtls_settings(gateway: Any, certificate: ClientCertificate, directory: Path) -> dict[str, str]:
    """The Java client's SSL settings (KIP-651 PEM stores); its PEM keystore wants the
    key as PKCS#8, followed by the certificate."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(certificate.key.read_bytes(), password=None)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    keystore = directory / f"{certificate.cert.stem}-keystore.pem"
    keystore.write_bytes(pkcs8 + certificate.cert.read_bytes())
    return {
        "security.protocol": "SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(gateway.tls.ca),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(keystore),
    }


def test_java_clients_sign_in_with_a_client_certificate(
    java: Java, gateway_cluster: Any, tmp_path: Path
) -> None:
    gateway = gateway_cluster.gateway
    key: TenantKey = gateway_cluster.tenant(TENANT)
    certificate = client_certificate(tmp_path, gateway.tls.client_authority, "java-app")
    tenancy(
        gateway.etcd_url,
        lambda store: store.set_certificate_subject(key.key_id, certificate.subject),
    )
    config = java.properties("mtls", mtls_settings(gateway, certificate, tmp_path))
    admin = ["--bootstrap-server", gateway.mtls_bootstrap, "--command-config", str(config)]
    log_start = len(gateway.log_text())
    topic, count = "signed-by-cert", 50
    java.ok(TOPICS, *admin, *flags(f"--create --topic {topic} --partitions 2"))
    produced = json_events(
        java.ok(VERIFIABLE_PRODUCER, *admin, *flags(f"--topic {topic} --max-messages {count}"))
    )
    assert len([e for e in produced if e["name"] == "producer_send_success"]) == count
    consume = f"--topic {topic} --group-id by-cert --max-messages {count} --verbose"
    consumed = json_events(java.ok(VERIFIABLE_CONSUMER, *admin, *flags(consume)))
    assert len([e for e in consumed if e["name"] == "record_data"]) == count
    logins = re.findall(
        rf"event=gateway_authenticated .*key={key.key_id} mechanism=(\S+)",
        gateway.log_text()[log_start:],
    )
    assert logins and set(logins) == {"SSL"}, logins


@pytest.mark.parametrize("problem", ["unknown CA", "expired"])
def test_java_clients_with_a_refused_certificate_get_ssl_authentication_exception(
    java: Java, gateway_cluster: Any, tmp_path: Path, problem: str
) -> None:
    import trustme

    gateway = gateway_cluster.gateway
    if problem == "unknown CA":
        certificate = client_certificate(tmp_path, trustme.CA(), "java-stranger")
    else:
        yesterday = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
        certificate = client_certificate(
            tmp_path, gateway.tls.client_authority, "java-expired", not_after=yesterday
        )
    config = java.properties(
        f"mtls-{problem.replace(' ', '-')}", mtls_settings(gateway, certificate, tmp_path)
    )
    refused = java.run(
        TOPICS, "--bootstrap-server", gateway.mtls_bootstrap, "--command-config", str(config),
        "--list",
    )  # fmt: skip
    assert refused.returncode != 0, failed(refused)
    assert "SslAuthenticationException" in failed(refused)
