"""A local Apache Kafka cluster in KRaft mode: the reference system next to Shoal.

``make kafka`` fetches Apache Kafka's jars from Maven Central (the version is
pinned in tools/kafka/pom.xml) into ``~/.cache/shoal/kafka-<version>/libs``;
this module runs them::

    with ApacheKafka(data_dir) as kafka:
        producer = Producer({"bootstrap.servers": kafka.bootstrap})

or, in the foreground until Ctrl-C::

    python -m shoal.benchmarks.apache_kafka --data-dir /tmp/kafka

It imports nothing from Shoal, only the standard library, so that anyone can
use it (a benchmark, a differential test, a person at a shell).

Shape: one dedicated KRaft controller and three brokers, four JVMs. That
mirrors Shoal's own shape, etcd (the coordination service) plus three
brokers, so benchmark rows compare like with like: three nodes hold the data
in both, and the controller's CPU time is counted (``pids()``) as etcd's is
for Shoal. A combined controller+broker node would hide the coordination cost
inside a broker and a single broker could not replicate.

Settings are Kafka's defaults, behaviour included (topics are auto-created on
first use, as Kafka does), except:

* ``default.replication.factor=3`` and ``min.insync.replicas=2``, Shoal's dev
  cluster defaults, so that any one broker can stop without losing
  ``acks=all`` writes in both systems; ``num.partitions=1`` (Kafka's default,
  written down because Shoal's is the same). These three are set on the
  controller as well as the brokers: in KRaft the controller fills in a
  CreateTopics request's defaults and uses ``min.insync.replicas`` for
  eligible leader replicas, and Kafka 4.3 warns that from 5.0 brokers will
  ignore the first two (the warnings in the brokers' logs are expected);
* ``offsets.topic.replication.factor=3``,
  ``transaction.state.log.replication.factor=3`` and
  ``transaction.state.log.min.isr=2``: Kafka's defaults too, pinned because
  the internal topics must match the three brokers;
* ``group.initial.rebalance.delay.ms=0``: Kafka waits 3 s by default for more
  members before the first rebalance of a new group; tests and benchmarks
  would only measure that wait (Kafka's own example config sets 0 too).

Durability is Kafka's default: the page cache, no fsync per message
(``log.flush.interval.messages`` unset); replication is what protects
acknowledged records. Heaps: ``-Xmx1g -Xms256m`` per broker (what
``KAFKA_HEAP_OPTS`` would set) and ``-Xmx256m`` for the controller, with the
JVM flags of Kafka's ``kafka-run-class.sh`` (G1, 20 ms pause target).

Each node has a directory under the caller's data directory with its
``server.properties``, its data and its log (``kafka.log``); the cluster id
and ports are kept in ``cluster.json`` there, so the same directory can be
started again.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

__all__ = [
    "BROKER_IDS",
    "CONTROLLER_ID",
    "ApacheKafka",
    "KafkaNode",
    "api_keys",
    "default_kafka_home",
    "main",
    "metadata_brokers",
]

CACHE_ROOT = Path.home() / ".cache" / "shoal"
"""Where ``make kafka`` installs ``kafka-<version>/libs`` (the Makefile's KAFKA_HOME)."""
KAFKA_HOME_ENV = "SHOAL_KAFKA_HOME"
POM = Path(__file__).resolve().parent.parent / "tools" / "kafka" / "pom.xml"

BROKER_IDS = (0, 1, 2)
CONTROLLER_ID = 3000
"""Apart from the brokers' ids, so that logs and tools never leave a doubt which node is which."""
BROKER_HEAP = ("-Xmx1g", "-Xms256m")
CONTROLLER_HEAP = ("-Xmx256m", "-Xms64m")
JVM_OPTS = (
    # kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS.
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
TOPIC_DEFAULTS = {
    "num.partitions": "1",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
}
"""On the controller and the brokers (see the module docstring)."""
BROKER_SETTINGS = {
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "group.initial.rebalance.delay.ms": "0",
}
SHORT_RUN_JVM_OPTS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
"""For a cluster that answers a test's few hundred requests and stops: C1 only and
the serial collector. Same behaviour; on 2 cores the four JVMs start in 15 s and
29 s of CPU rather than 23 s and 46 s, and idle at 60% of the CPU. Not for
benchmarks, whose figures need the JIT and collector Kafka ships with."""
TOOL_JVM_OPTS = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
"""For tools that run for a second: C1 only, no C2, halves the storage tool's time."""
STARTED = b"Kafka Server started"
"""What kafka.Kafka logs once a node serves (a broker: registered and unfenced)."""
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0

LOG4J2 = """\
# Every logger of this node to stdout, which the launcher writes to kafka.log.
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
# As Kafka's own config/log4j2.yaml: one line per request only on WARN.
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

TOOLS_LOG4J2 = """\
# Kafka's tools: warnings and errors on stderr (as Kafka's tools-log4j2.yaml).
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
"""


def default_kafka_home() -> Path:
    """``$SHOAL_KAFKA_HOME``, else where ``make kafka`` installs the pinned version."""
    if env := os.environ.get(KAFKA_HOME_ENV):
        return Path(env)
    if POM.exists():
        match = re.search(r"<kafka\.version>\s*([^<\s]+)\s*</kafka\.version>", POM.read_text())
        if match:
            return CACHE_ROOT / f"kafka-{match.group(1)}"
    # Installed without the checkout (no pom next to it): the newest one made.
    installed = sorted(CACHE_ROOT.glob("kafka-*/libs"), key=lambda p: p.stat().st_mtime)
    if installed:
        return installed[-1].parent
    return CACHE_ROOT / "kafka"


def _libs(kafka_home: Path) -> Path:
    libs = kafka_home / "libs"
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise FileNotFoundError(
            f"no Apache Kafka jars in {libs}: run `make kafka` in the Shoal checkout "
            f"(or point {KAFKA_HOME_ENV} or --kafka-home at a directory with libs/)"
        )
    return libs


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise FileNotFoundError("no `java` on PATH: run `make java` (Kafka 4 needs Java 17+)")
    return java


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(size: int) -> int:
    """A port with the ``size - 1`` ports after it free too.

    From below the kernel's ephemeral range: a free port inside it can become
    an outgoing connection's local port before the server meant for it binds.
    """
    floor = _ephemeral_floor()
    for _ in range(500):
        base = random.randrange(10_000 if floor > 12_000 else 1024, floor - size)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + size):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no free block of {size} ports below {floor}")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def new_cluster_id() -> str:
    """What ``kafka-storage random-uuid`` prints: a UUID in URL-safe base64, unpadded.

    Like Kafka's ``Uuid.randomUuid`` it never starts with ``-``: the storage
    tool's argument parser would read such an id as an option (one start in
    64 failed that way).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


# A few requests of Kafka's wire protocol, enough to see that a node answers
# and how many brokers a broker's metadata holds, without a client library.


def _request(
    port: int,
    api_key: int,
    version: int,
    body: bytes,
    timeout: float = 2.0,
    host: str = "127.0.0.1",
) -> bytes:
    client_id = b"shoal-apache-kafka"
    header = struct.pack(">hhih", api_key, version, 1, len(client_id)) + client_id
    message = header + body
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.sendall(struct.pack(">i", len(message)) + message)
        size = struct.unpack(">i", _read(conn, 4))[0]
        response = _read(conn, size)
    return response[4:]  # past the correlation id (response header v0)


def _read(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        data += chunk
    return bytes(data)


def api_keys(port: int) -> dict[int, tuple[int, int]]:
    """ApiVersions v0: each API the node serves, with its version range."""
    body = _request(port, 18, 0, b"")
    error, count = struct.unpack_from(">hi", body)
    if error:
        raise ConnectionError(f"ApiVersions error {error}")
    keys = {}
    for i in range(count):
        key, low, high = struct.unpack_from(">hhh", body, 6 + 6 * i)
        keys[key] = (low, high)
    return keys


def metadata_brokers(port: int, host: str = "127.0.0.1") -> list[int]:
    """Metadata v1 without topics: the ids of the brokers this broker knows."""
    body = _request(port, 3, 1, struct.pack(">i", 0), host=host)
    (count,) = struct.unpack_from(">i", body)
    offset, ids = 4, []
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", body, offset)
        offset += 6 + host_len + 4  # node id, host, port
        (rack_len,) = struct.unpack_from(">h", body, offset)
        offset += 2 + max(rack_len, 0)
        ids.append(node_id)
    return sorted(ids)


class KafkaNode:
    """One JVM: the controller or a broker, with its directory, config and log."""

    def __init__(
        self, node_id: int, role: str, directory: Path, port: int, host: str = "127.0.0.1"
    ) -> None:
        self.node_id = node_id
        self.role = role
        self.directory = directory
        self.port = port
        self.host = host
        """Where it listens: loopback, or a network namespace's address (the fault tests)."""
        self.launcher: list[str] = []
        """Prepended to the JVM's command line, e.g. ``ip netns exec <namespace>``."""
        self.config_path = directory / "server.properties"
        self.log_path = directory / "kafka.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def write_config(self, settings: dict[str, str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in settings.items()]
        self.config_path.write_text(
            "# Written by shoal.benchmarks.apache_kafka; anything unset is Kafka's default.\n"
            + "\n".join(lines)
            + "\n"
        )

    def start(self, argv: Sequence[str]) -> None:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            # A session of its own: Ctrl-C in a terminal reaches the launcher,
            # which stops brokers before the controller, not every JVM at once.
            self.process = subprocess.Popen(
                [*self.launcher, *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def started(self) -> bool:
        """The node logged that it serves (since this start); raises if it exited."""
        if self.process is None:
            return False
        if self.process.poll() is not None:
            raise RuntimeError(
                f"Kafka {self.role} {self.node_id} exited with {self.process.returncode}; "
                f"the end of {self.log_path}:\n{self.log_tail()}"
            )
        with open(self.log_path, "rb") as log:
            log.seek(self._log_offset)
            return STARTED in log.read()

    def log_tail(self, chars: int = 4000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def wait(self, timeout: float) -> bool:
        """Whether the process has exited within ``timeout`` seconds."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


class ApacheKafka:
    """A KRaft cluster on loopback: one dedicated controller and three brokers.

    ``start()`` returns once every broker is registered, unfenced and answers
    Metadata with all three brokers; ``stop()`` stops the brokers (SIGTERM,
    a controlled shutdown), then the controller, killing whatever has not
    exited after ``stop_timeout`` seconds.
    """

    def __init__(
        self,
        data_dir: Path | str,
        kafka_home: Path | str | None = None,
        *,
        broker_heap: Sequence[str] = BROKER_HEAP,
        controller_heap: Sequence[str] = CONTROLLER_HEAP,
        jvm_opts: Sequence[str] = JVM_OPTS,
        overrides: dict[str, str] | None = None,
        start_timeout: float = START_TIMEOUT_S,
        stop_timeout: float = STOP_TIMEOUT_S,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.kafka_home = Path(kafka_home) if kafka_home is not None else default_kafka_home()
        self.broker_heap = tuple(broker_heap)
        self.controller_heap = tuple(controller_heap)
        self.jvm_opts = tuple(jvm_opts)
        self.overrides = dict(overrides or {})
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.cluster_id, base_port = self._identity()
        self.controller = KafkaNode(
            CONTROLLER_ID, "controller", self.data_dir / f"controller-{CONTROLLER_ID}", base_port
        )
        self.brokers = [
            KafkaNode(node_id, "broker", self.data_dir / f"broker-{node_id}", base_port + 1 + i)
            for i, node_id in enumerate(BROKER_IDS)
        ]

    # Identity: a fresh directory gets a new cluster id and free ports; a
    # formatted one keeps both (the controller's address is in its quorum state).

    def _identity(self) -> tuple[str, int]:
        state = self.data_dir / "cluster.json"
        if state.exists():
            saved = json.loads(state.read_text())
            return str(saved["cluster_id"]), int(saved["base_port"])
        return new_cluster_id(), free_port_block(1 + len(BROKER_IDS))

    @property
    def nodes(self) -> list[KafkaNode]:
        return [self.controller, *self.brokers]

    @property
    def bootstrap(self) -> str:
        """The brokers' addresses, comma-separated, for ``bootstrap.servers``."""
        return ",".join(broker.address for broker in self.brokers)

    @property
    def bootstrap_controller(self) -> str:
        """The controller's address (``--bootstrap-controller`` of Kafka's tools)."""
        return self.controller.address

    def pids(self) -> list[int]:
        """The running JVMs' process ids, controller first, for CPU and memory accounting."""
        return [
            node.process.pid
            for node in self.nodes
            if node.process is not None and node.process.poll() is None
        ]

    def java_command(self, main_class: str, *args: str) -> list[str]:
        """``java`` running one of this Kafka's tools, e.g.

        ``java_command("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
        kafka.bootstrap, "--list")``: flags for a short-lived JVM, and warnings
        and errors only, on stderr, as Kafka's ``bin/`` scripts log their tools.
        """
        libs = _libs(self.kafka_home)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log4j = self.data_dir / "tools-log4j2.properties"
        if not log4j.exists():
            log4j.write_text(TOOLS_LOG4J2)
        return [
            _java(),
            *TOOL_JVM_OPTS,
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            f"{libs}/*",
            main_class,
            *args,
        ]

    def _settings(self, node: KafkaNode) -> dict[str, str]:
        common = {
            "node.id": str(node.node_id),
            "controller.quorum.bootstrap.servers": self.controller.address,
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(node.directory / "data"),
        }
        if node.role == "controller":
            return {
                **common,
                "process.roles": "controller",
                "listeners": f"CONTROLLER://{node.address}",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
                **TOPIC_DEFAULTS,
                **self.overrides,
            }
        return {
            **common,
            "process.roles": "broker",
            "listeners": f"PLAINTEXT://{node.address}",
            "advertised.listeners": f"PLAINTEXT://{node.address}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            **TOPIC_DEFAULTS,
            **BROKER_SETTINGS,
            **self.overrides,
        }

    def _format(self) -> None:
        """Kafka's storage tool on every node, all with the one cluster id.

        Kafka 4 quorums are dynamic (KIP-853): the controller is formatted
        ``--standalone`` (a quorum of itself, its address recorded in its own
        log) and the brokers ``--no-initial-controllers``; all four find the
        quorum through ``controller.quorum.bootstrap.servers``, and none sets
        ``controller.quorum.voters``. ``--ignore-formatted`` makes it a no-op
        on a directory started before.
        """
        jobs = []
        for node in self.nodes:
            mode = "--standalone" if node.role == "controller" else "--no-initial-controllers"
            argv = self.java_command(
                "kafka.tools.StorageTool",
                "format",
                "--config",
                str(node.config_path),
                "--cluster-id",
                self.cluster_id,
                "--ignore-formatted",
                mode,
            )
            # All four at once: each is a JVM start, mostly waiting on class loading.
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            jobs.append((node, process))
        for node, process in jobs:
            output, _ = process.communicate()
            if process.returncode != 0:
                text = output.decode(errors="replace")
                raise RuntimeError(f"formatting {node.role} {node.node_id} failed:\n{text}")

    def start(self) -> ApacheKafka:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        state = self.data_dir / "cluster.json"
        taken = [node.port for node in self.nodes if not _port_free(node.port)]
        if taken:
            raise RuntimeError(
                f"ports {taken} of the cluster in {self.data_dir} are taken: is it running already?"
            )
        log4j = self.data_dir / "log4j2.properties"
        log4j.write_text(LOG4J2)
        for node in self.nodes:
            node.write_config(self._settings(node))
        self._format()
        state.write_text(
            json.dumps({"cluster_id": self.cluster_id, "base_port": self.controller.port}) + "\n"
        )
        deadline = time.monotonic() + self.start_timeout
        try:
            for node in self.nodes:
                self.start_node(node)
            self._wait(deadline, lambda: all(node.started() for node in self.nodes), "to start")
            self._wait(deadline, self._metadata_complete, "to see all brokers")
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, node: KafkaNode) -> None:
        """Launch one node of a formatted cluster (again, after it was killed)."""
        heap = self.controller_heap if node.role == "controller" else self.broker_heap
        node.start(
            [
                _java(),
                *heap,
                *self.jvm_opts,
                f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={node.directory}",
                "-cp",
                f"{_libs(self.kafka_home)}/*",
                "kafka.Kafka",
                str(node.config_path),
            ]
        )

    def _metadata_complete(self) -> bool:
        expected = sorted(BROKER_IDS)
        for broker in self.brokers:
            broker.started()  # raises if it exited
            try:
                if metadata_brokers(broker.port, broker.host) != expected:
                    return False
            except (OSError, struct.error):
                return False
        return True

    def _wait(self, deadline: float, ready: Callable[[], bool], what: str) -> None:
        while not ready():
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"--- {node.role} {node.node_id} ({node.log_path}):\n{node.log_tail(1500)}"
                    for node in self.nodes
                )
                raise TimeoutError(
                    f"Apache Kafka took over {self.start_timeout:.0f}s {what}\n{tails}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """Brokers first (a controlled shutdown needs the controller), then the controller."""
        self._stop(self.brokers)
        self._stop([self.controller])

    def _stop(self, nodes: Sequence[KafkaNode]) -> None:
        for node in nodes:
            node.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for node in nodes:
            if not node.wait(max(deadline - time.monotonic(), 0)):
                node.signal(signal.SIGKILL)
                node.wait(10)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shoal.benchmarks.apache_kafka",
        description="Run Apache Kafka (KRaft: a controller and three brokers) until Ctrl-C.",
    )
    parser.add_argument(
        "--kafka-home",
        type=Path,
        default=None,
        help=f"a directory with libs/ (default: ${KAFKA_HOME_ENV}, else `make kafka`'s cache)",
    )
    parser.add_argument(
        "--data-dir", type=Path, required=True, help="where the nodes keep data and logs"
    )
    args = parser.parse_args(argv)
    try:
        kafka = ApacheKafka(args.data_dir, args.kafka_home)
        started = time.monotonic()
        kafka.start()
    except (FileNotFoundError, RuntimeError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Apache Kafka ({kafka.kafka_home.name}) up in {time.monotonic() - started:.1f}s")
    print(f"bootstrap: {kafka.bootstrap}")
    print(f"controller: {kafka.bootstrap_controller} (node {CONTROLLER_ID})")
    print(f"logs: {kafka.data_dir}/*/kafka.log; Ctrl-C stops the cluster", flush=True)
    stopping = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stopping.wait(1.0):
            for node in kafka.nodes:
                if node.process is not None and node.process.poll() is not None:
                    print(f"error: {node.role} {node.node_id} exited", file=sys.stderr)
                    stopping.set()
    finally:
        print("stopping Apache Kafka", flush=True)
        kafka.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
