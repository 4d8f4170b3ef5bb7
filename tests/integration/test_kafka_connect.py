"""Kafka Connect (distributed mode) against Shoal, through the gateway.

A Connect worker of Kafka 4.3.1 (``org.apache.kafka.connect.cli.ConnectDistributed``;
``make kafka`` installs connect-runtime and connect-file, so this test never
skips) runs with a worker properties file: the gateway as bootstrap, the
tenant's API key over SASL/PLAIN for the worker and for its ``producer.``,
``consumer.`` and ``admin.`` clients, a group, the three storage topics under
the tenant's own names with replication factor 3, StringConverter keys and
values, and a REST listener on a free loopback port. Through the REST API the
test creates a FileStreamSource (a file -> topic ``lines``) and a
FileStreamSink (``lines`` -> another file) connector.

What it proves: the worker's group (Connect's own protocol on the classic
group APIs) forms; Connect creates its config, offset and status topics (one,
25 and 5 partitions, compacted) in the tenant's namespace and keeps its
connectors' configs, offsets and statuses there; every line appended to the
source file reaches the sink file once, in order. Then the worker stops
(SIGTERM, a graceful shutdown that commits both tasks' offsets), more lines
are appended, and a new worker with the same configuration carries on: the
source from the file position stored in the offsets topic, the sink from the
group offsets it committed, so the sink file ends with every line exactly
once, none lost and none repeated.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from gateway_env import TenantKey
from harness import free_port_block, wait_until
from shoal.benchmarks.apache_kafka import ApacheKafka, default_kafka_home

# A cold `make kafka` downloads about 150 MB from Maven Central.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
TENANT = "kconnect"
CONNECT = "org.apache.kafka.connect.cli.ConnectDistributed"
TOPIC = "lines"
STORAGE = {  # topic -> partitions (Connect's defaults)
    "connect-configs": 1,
    "connect-offsets": 25,
    "connect-status": 5,
}
SOURCE = "file-source"
SINK = "file-sink"

# Connect logs at INFO to a file (printed after the module); warnings and
# errors also go to stderr, which the test reads.
LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.append = true
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
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
"""


def worker_settings(key: TenantKey, rest_port: int) -> dict[str, str]:
    sasl = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{key.key_id}" password="{key.secret}";'
        ),
    }
    return {
        "bootstrap.servers": key.bootstrap(),
        **sasl,
        **{
            f"{client}.{k}": v
            for client in ("producer", "consumer", "admin")
            for k, v in sasl.items()
        },
        "group.id": "connect-cluster",
        "config.storage.topic": "connect-configs",
        "offset.storage.topic": "connect-offsets",
        "status.storage.topic": "connect-status",
        "config.storage.replication.factor": "3",
        "offset.storage.replication.factor": "3",
        "status.storage.replication.factor": "3",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "listeners": f"http://127.0.0.1:{rest_port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(rest_port),
        # Source offsets are flushed this often while running (and on shutdown).
        "offset.flush.interval.ms": "1000",
    }


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    rest: str
    log: Path
    err: Path
    err_offset: int

    def stderr(self) -> str:
        with open(self.err, "rb") as err:
            err.seek(self.err_offset)
            return err.read().decode(errors="replace")

    def errors(self) -> list[str]:
        return [line for line in self.stderr().splitlines() if " ERROR " in line]

    def diagnosis(self) -> str:
        log = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- stderr ---\n{self.stderr()[-6000:]}\n--- log ---\n{log[-6000:]}"

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.rest + path, data, {"Content-Type": "application/json"}, method=method
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def ready(self) -> bool:
        assert self.process.poll() is None, f"the worker exited:\n{self.diagnosis()}"
        assert not self.errors(), self.diagnosis()
        try:
            return isinstance(self.call("GET", "/connectors"), list)
        except (urllib.error.URLError, ConnectionError, TimeoutError):  # HTTPError too
            return False

    def running(self, connector: str) -> bool:
        """The connector and each of its tasks RUNNING (a FAILED one fails the test)."""
        assert not self.errors(), self.diagnosis()
        try:
            status = self.call("GET", f"/connectors/{connector}/status")
        except urllib.error.HTTPError:
            return False
        states = [status["connector"]["state"], *(t["state"] for t in status["tasks"])]
        assert "FAILED" not in states, json.dumps(status, indent=2)
        return bool(status["tasks"]) and set(states) == {"RUNNING"}

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()  # Connect's shutdown hook stops the herder gracefully
            try:
                return self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


@dataclass
class Setup:
    kafka_home: Path
    key: TenantKey
    directory: Path
    config: Path
    rest_port: int

    def start(self) -> Worker:
        log, err = self.directory / "connect.log", self.directory / "connect.err"
        log4j = self.directory / "log4j2.properties"
        log4j.write_text(LOG4J2.format(log=log))
        command = ApacheKafka(self.directory / "kafka-tools", self.kafka_home).java_command(
            CONNECT, str(self.config)
        )
        at = command.index("-cp")  # later JVM flags win: a heap for a worker, our logging
        command[at:at] = ["-Xmx512m", f"-Dlog4j2.configurationFile={log4j}"]
        offset = err.stat().st_size if err.exists() else 0
        with open(self.directory / "connect.out", "ab") as out, open(err, "ab") as stderr:
            process = subprocess.Popen(command, stdout=out, stderr=stderr, stdin=subprocess.DEVNULL)
        worker = Worker(process, f"http://127.0.0.1:{self.rest_port}", log, err, offset)
        try:
            wait_until(worker.ready, 120, "the Connect worker's REST API", interval=0.5)
        except BaseException:
            worker.stop()
            raise
        return worker


@pytest.fixture(scope="module")
def kafka_home() -> Path:
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=840)
    return home


@pytest.fixture(scope="module")
def setup(
    kafka_home: Path, gateway_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    key: TenantKey = gateway_cluster.tenant(TENANT)
    admin = AdminClient(key.librdkafka())
    for future in admin.create_topics([NewTopic(TOPIC, 1, 3)]).values():
        future.result(30)
    directory = tmp_path_factory.mktemp("kafka-connect")
    rest_port = free_port_block(1)
    config = directory / "worker.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in worker_settings(key, rest_port).items()))
    yield Setup(kafka_home, key, directory, config, rest_port)
    log = directory / "connect.log"
    if log.exists():
        print(f"\n----- Connect log ({log}) -----\n{log.read_text(errors='replace')[-8000:]}")


def append(path: Path, lines: list[str]) -> None:
    with open(path, "a") as file:
        file.writelines(f"{line}\n" for line in lines)


def wait_for_sink(worker: Worker, sink: Path, expected: list[str]) -> None:
    def arrived() -> bool:
        assert not worker.errors(), worker.diagnosis()
        got = sink.read_text().splitlines() if sink.exists() else []
        assert got == expected[: len(got)], f"out of order or repeated: {got}"
        return got == expected

    try:
        wait_until(arrived, 60, "the sink file to have every line", interval=0.5)
    except TimeoutError:
        got = sink.read_text().splitlines() if sink.exists() else []
        pytest.fail(f"the sink file has {len(got)} of {len(expected)} lines\n{worker.diagnosis()}")


def test_file_source_to_sink_survives_a_worker_restart(setup: Setup, gateway_cluster: Any) -> None:
    source, sink = setup.directory / "source.txt", setup.directory / "sink.txt"
    source.touch()
    first = [f"line {i:04d} before the restart" for i in range(200)]
    second = [f"line {i:04d} after the restart" for i in range(200, 350)]

    worker = setup.start()
    try:
        worker.call(
            "POST",
            "/connectors",
            {
                "name": SOURCE,
                "config": {
                    "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
                    "tasks.max": "1",
                    "file": str(source),
                    "topic": TOPIC,
                },
            },
        )
        worker.call(
            "POST",
            "/connectors",
            {
                "name": SINK,
                "config": {
                    "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector",
                    "tasks.max": "1",
                    "file": str(sink),
                    "topics": TOPIC,
                },
            },
        )
        for name in (SOURCE, SINK):
            wait_until(lambda n=name: worker.running(n), 60, f"{name} to run", interval=0.5)
        assert sorted(worker.call("GET", "/connectors")) == [SINK, SOURCE]
        append(source, first)
        wait_for_sink(worker, sink, first)
    finally:
        code = worker.stop()
    assert code in (0, 143), worker.diagnosis()  # 143: exited on SIGTERM, after the hooks
    assert not worker.errors(), worker.diagnosis()

    # The worker is gone; the file grows.
    append(source, second)
    time.sleep(0.5)
    assert sink.read_text().splitlines() == first

    # A new worker of the same configuration finds the connectors, their offsets and
    # the sink's group offsets in the tenant's topics, and carries on from there.
    worker = setup.start()
    try:
        assert sorted(worker.call("GET", "/connectors")) == [SINK, SOURCE]
        for name in (SOURCE, SINK):
            wait_until(lambda n=name: worker.running(n), 60, f"{name} to run again", interval=0.5)
        wait_for_sink(worker, sink, first + second)
        time.sleep(2)  # nothing more comes: no line is written twice
        assert sink.read_text().splitlines() == first + second
        assert not worker.errors(), worker.diagnosis()
    finally:
        worker.stop()

    # Connect's storage topics: the tenant's own, compacted, replicated three times.
    admin = AdminClient(setup.key.librdkafka())
    topics = admin.list_topics(timeout=30).topics
    assert set(topics) == {TOPIC, *STORAGE}, sorted(topics)
    for name, partitions in STORAGE.items():
        assert len(topics[name].partitions) == partitions, name
        assert all(len(p.replicas) == 3 for p in topics[name].partitions.values()), name
    described = admin.describe_configs([ConfigResource("topic", name) for name in STORAGE])
    for resource, future in described.items():
        assert future.result(30)["cleanup.policy"].value == "compact", resource.name
    platform = AdminClient({"bootstrap.servers": gateway_cluster.internal_bootstrap})
    on_brokers = set(platform.list_topics(timeout=30).topics)
    assert {f"{TENANT}.{name}" for name in (TOPIC, *STORAGE)} <= on_brokers
    assert not on_brokers & set(STORAGE), on_brokers

    # The sink's group committed the whole topic.
    group = f"connect-{SINK}"
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    committed = offsets[group].result(30)
    assert [(tp.topic, tp.partition, tp.offset) for tp in committed.topic_partitions] == [
        (TOPIC, 0, len(first) + len(second))
    ]
