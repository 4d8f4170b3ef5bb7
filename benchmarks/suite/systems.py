"""The systems under test: installed if missing, started on loopback, stopped afterwards.

Each system is a context manager that yields :class:`Target`s: one way to
reach it with one set of durability settings. Shoal yields three from one
cluster (RF=3 through the gateway and directly, RF=1 directly), so the
three share the same processes, as they would share a deployment. Apache
Kafka yields two from one cluster (RF=3 and RF=1, the same durability as
Shoal's direct targets), driven by the same client and load generator. Both
get the same untimed :func:`warm_up` before their first target, for the
seconds each starter is given (NATS and Redis, with no JIT, ignore them).

Apache Kafka is the reference: the pinned release's jars from Maven Central
(``make kafka``, run by :func:`install_kafka` when they are missing), run by
:class:`~shoal.benchmarks.apache_kafka.ApacheKafka` (a KRaft controller and
three brokers, Kafka's defaults: page cache, no fsync per write). The other
peers come from Debian (``nats-server``, ``redis-server``); their versions
are whatever the machine's release ships. Every version is recorded in the
results. The settings, and why they are the closest match to Shoal's, are
in :data:`DURABILITY` and ``benchmarks/README.md``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.apache_kafka import ApacheKafka, default_kafka_home
from shoal.benchmarks.common import (
    GatewayProcess,
    LocalCluster,
    create_tenant,
    free_port,
    free_port_block,
)

from shoal.cli import loadgen
from shoal.cli.wire_admin import WireAdmin, WireAdminError
from shoal.wire import ErrorCode

SHOAL_BROKERS = 3
MIN_INSYNC_REPLICAS = 2
TENANT = "bench"
NATS_NODES = 3
START_TIMEOUT_S = 60.0
WARMUP_RECORDS = 20_000
CHECKOUT = Path(__file__).resolve().parents[2]
"""The checkout this module's file is in (the editable install links back to it): where
``make kafka`` runs."""


@dataclass(frozen=True)
class Target:
    """One system as the workloads see it.

    ``kind`` picks the client (``kafka``, ``nats``, ``redis``); ``connection``
    is what that client needs (librdkafka settings, server URLs, a port).
    ``copies`` is how many times the machine stores each byte produced, which
    sets the write ceiling it is held against. ``pids`` are its server
    processes, for CPU accounting.
    """

    name: str
    kind: str
    connection: dict[str, Any]
    copies: int
    durability: str
    version: str
    pids: dict[str, int] = field(default_factory=dict)
    topic_prefix: str = ""
    """Put before a topic name on the way to Shoal's admin API: a tenant's topics live in
    its namespace, so ``events`` through the gateway is ``bench.events`` on the brokers."""
    replicas: int = 1


DURABILITY = {
    "shoal-gw-rf3": "3 replicas, min.insync.replicas=2, acks=all, idempotent producer;"
    " page cache (no fsync per write, as Kafka); SASL/PLAIN through the gateway",
    "shoal-rf3": "as shoal-gw-rf3, straight to the brokers",
    "shoal-rf1": "1 replica, acks=1 (the leader has it in its page cache)",
    "kafka-rf3": "Apache Kafka, 3 brokers and a KRaft controller; 3 replicas,"
    " min.insync.replicas=2, acks=all, idempotent producer; page cache (Kafka's default:"
    " no fsync per write)",
    "kafka-rf1": "the same cluster; 1 replica, acks=1 (the leader has it in its page cache)",
    "nats-r3": "JetStream file storage, 3 replicas: a publish is acknowledged once a"
    " quorum (2 of 3) has it; written to the OS, fsync every 2 min (NATS default)",
    "redis-aof": "one server, no replica; AOF with appendfsync everysec: XADD answers"
    " from memory, the AOF is written at once and fsynced each second",
}


def install_debian(*packages: str) -> None:
    """apt-get install what is missing (through sudo unless root); each package is
    named after the program it installs."""
    missing = [p for p in packages if shutil.which(p) is None]
    if not missing:
        return
    print(f"installing {' '.join(missing)} (Debian packages)", file=sys.stderr)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True)
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", *missing], check=True)


def _version(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def _nats_version() -> str:
    return _version(["nats-server", "--version"]).replace("nats-server: v", "nats-server ")


def _redis_version() -> str:
    words = _version(["redis-server", "--version"]).split()
    number = next((w[2:] for w in words if w.startswith("v=")), "?")
    return f"redis-server {number}"


def _shoal_version() -> str:
    git = ["git", "rev-parse", "--short", "HEAD"]
    here = Path(__file__).resolve().parent
    commit = subprocess.run(git, check=False, capture_output=True, text=True, cwd=here).stdout
    return f"shoal {metadata.version('shoal')} {commit.strip()}".strip()


def warm_up(bootstrap: str, seconds: float) -> None:
    """Produce (acks=all, idempotent) and read back 1 KiB records on a throwaway topic of
    replication factor 3 for ``seconds``, untimed, then delete the topic.

    For Kafka's JVMs: a fresh broker runs its hot paths interpreted until the JIT has
    compiled them, and a run of a few seconds would measure that (a fresh cluster on the
    two-core machine, 1,000 records/s, acks=all: p50 139 ms for the first 5,000 records,
    7 ms for the next 10,000). Shoal gets the same, so that both are treated alike.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"warm-up-{uuid.uuid4().hex[:6]}"
    config = {"min.insync.replicas": str(MIN_INSYNC_REPLICAS)}
    for future in admin.create_topics([NewTopic(topic, 1, 3, config=config)]).values():
        future.result()
    wait_for_topic({"bootstrap.servers": bootstrap}, topic)
    producer = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            loadgen.produce({**producer, "linger.ms": 5}, topic, WARMUP_RECORDS, 1024)
            loadgen.consume({"bootstrap.servers": bootstrap}, topic, WARMUP_RECORDS)
    finally:
        for future in admin.delete_topics([topic]).values():
            future.result(60)


def wait_for_topic(client: Mapping[str, Any], topic: str, timeout_s: float = 30.0) -> None:
    """Until every broker's metadata has ``topic`` with a leader for each partition;
    ``client`` is the librdkafka configuration that reaches them.

    Kafka answers CreateTopics once its controller has the topic; the brokers learn it
    from the metadata log a moment later, and a client asking one of them first is told
    the topic does not exist (which ends a load generator's run)."""
    deadline = time.monotonic() + timeout_s
    for address in str(client["bootstrap.servers"]).split(","):
        while True:
            # Our own Metadata request, sent to ``address`` itself: librdkafka's
            # admin client may ask any broker it has learned of, which let a broker
            # that did not know the topic yet slip through.
            try:
                with WireAdmin({**client, "bootstrap.servers": address}, timeout_s=5) as admin:
                    answer = admin.metadata([topic])
                described = next((t for t in answer.topics if t.name == topic), None)
            except (WireAdminError, OSError):
                described = None
            if (
                described is not None
                and described.error_code == ErrorCode.none
                and described.partitions
                and all(p.leader_id >= 0 for p in described.partitions)
            ):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{address} had no metadata for {topic} in {timeout_s:.0f} s")
            time.sleep(0.1)


# -- Shoal ----------------------------------------------------------------------------------


def shoal_settings() -> dict[str, str]:
    """The brokers' settings for the suite: three replicas and min.insync.replicas=2 by
    default, as Kafka's cluster is set."""
    return {
        "SHOAL_DEFAULT_REPLICATION_FACTOR": str(SHOAL_BROKERS),
        "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": str(SHOAL_BROKERS),
        "SHOAL_TOPIC_DEFAULTS": json.dumps({"min.insync.replicas": str(MIN_INSYNC_REPLICAS)}),
    }


@contextmanager
def shoal(root: Path, warm_up_s: float) -> Iterator[list[Target]]:
    """etcd, three brokers and a gateway; a tenant with a key for the gateway route."""
    root.mkdir(parents=True, exist_ok=True)
    with LocalCluster(root, brokers=SHOAL_BROKERS, env=shoal_settings()) as cluster:
        key_id, secret = create_tenant(cluster.etcd_url, TENANT)
        with GatewayProcess(root, cluster.etcd_url, cluster.bootstrap, SHOAL_BROKERS) as gateway:
            version = _shoal_version()
            assert cluster.etcd is not None
            # etcd is Shoal's coordination service, as the KRaft controller is Kafka's:
            # its CPU is part of the cost, as the controller's is.
            pids = {"etcd": cluster.etcd.pid}
            pids |= {f"broker-{n}": cluster.pid(n) for n in range(SHOAL_BROKERS)}
            warm_up(cluster.bootstrap, warm_up_s)
            direct = {"bootstrap.servers": cluster.bootstrap}
            all_acks = {"acks": "all", "enable.idempotence": True}
            gateway_connection = {
                "bootstrap.servers": gateway.bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "PLAIN",
                "sasl.username": key_id,
                "sasl.password": secret,
            }
            admin = {"admin": direct}
            http = {"url": gateway.http_url, "username": key_id, "password": secret}
            yield [
                Target(
                    "shoal-gw-rf3", "kafka",
                    {**admin, "client": gateway_connection, "producer": all_acks, "http": http},
                    copies=3, durability=DURABILITY["shoal-gw-rf3"], version=version,
                    pids={**pids, "gateway": gateway.pid}, topic_prefix=f"{TENANT}.", replicas=3,
                ),
                Target(
                    "shoal-rf3", "kafka", {**admin, "client": direct, "producer": all_acks},
                    copies=3, durability=DURABILITY["shoal-rf3"], version=version, pids=pids,
                    replicas=3,
                ),
                Target(
                    "shoal-rf1", "kafka", {**admin, "client": direct, "producer": {"acks": 1}},
                    copies=1, durability=DURABILITY["shoal-rf1"], version=version, pids=pids,
                    replicas=1,
                ),
            ]  # fmt: skip


# -- Apache Kafka ---------------------------------------------------------------------------


def kafka_installed() -> bool:
    libs = default_kafka_home() / "libs"
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java") or (java_home and (Path(java_home) / "bin" / "java").exists())
    return any(libs.glob("kafka_2.13-*.jar")) and bool(java)


def install_kafka() -> None:
    """``make kafka`` in the checkout when Apache Kafka's jars (or Java) are missing: it
    installs Java from Debian and fetches the jars of the version tools/kafka/pom.xml pins
    from Maven Central, checksums checked, into the cache :class:`ApacheKafka` reads."""
    if kafka_installed():
        return
    if not (CHECKOUT / "Makefile").exists() or not (CHECKOUT / "tools" / "kafka").is_dir():
        raise RuntimeError(
            f"Apache Kafka's jars are not in {default_kafka_home() / 'libs'} and {CHECKOUT}"
            " is no Shoal checkout to run `make kafka` in"
        )
    print("installing Apache Kafka (make kafka)", file=sys.stderr)
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=CHECKOUT, check=True)
    if not kafka_installed():
        raise RuntimeError(f"`make kafka` ran but {home / 'libs'} has no Kafka jars")


def _kafka_version(cluster: ApacheKafka) -> str:
    """The version and commit a broker logged at start (the jar's name if it did not),
    and the JVM's version."""
    log = cluster.brokers[0].log_tail(2_000_000)
    number = re.search(r"Kafka version: (\S+)", log)
    commit = re.search(r"Kafka commitId: (\w+)", log)
    if number is None:
        jars = sorted((cluster.kafka_home / "libs").glob("kafka_2.13-*.jar"))
        found = jars[-1].stem.removeprefix("kafka_2.13-") if jars else "?"
    else:
        found = number.group(1)
    java_binary = cluster.java_command("-version")[0]  # the java the cluster runs on
    java = subprocess.run([java_binary, "-version"], capture_output=True, text=True, check=False)
    java_version = re.search(r'version "([^"]+)"', java.stderr)
    return " ".join(
        [
            f"Apache Kafka {found}",
            *([commit.group(1)] if commit else []),
            "(KRaft)",
            *([f"Java {java_version.group(1)}"] if java_version else []),
        ]
    )


@contextmanager
def kafka(root: Path, warm_up_s: float) -> Iterator[list[Target]]:
    """A KRaft controller and three brokers (:class:`ApacheKafka`, Kafka's defaults but
    replication factor 3 and ``min.insync.replicas=2``, as Shoal's cluster)."""
    install_kafka()
    root.mkdir(parents=True, exist_ok=True)
    with ApacheKafka(root) as cluster:
        controller = cluster.controller.process
        assert controller is not None
        # The controller's CPU counts, as etcd's does for Shoal.
        pids = {"controller": controller.pid}
        for broker in cluster.brokers:
            assert broker.process is not None
            pids[f"broker-{broker.node_id}"] = broker.process.pid
        version = _kafka_version(cluster)
        warm_up(cluster.bootstrap, warm_up_s)
        direct = {"bootstrap.servers": cluster.bootstrap}
        admin = {"admin": direct}
        all_acks = {"acks": "all", "enable.idempotence": True}
        yield [
            Target(
                "kafka-rf3", "kafka", {**admin, "client": direct, "producer": all_acks},
                copies=3, durability=DURABILITY["kafka-rf3"], version=version, pids=pids,
                replicas=3,
            ),
            Target(
                "kafka-rf1", "kafka", {**admin, "client": direct, "producer": {"acks": 1}},
                copies=1, durability=DURABILITY["kafka-rf1"], version=version, pids=pids,
                replicas=1,
            ),
        ]  # fmt: skip


# -- NATS JetStream -------------------------------------------------------------------------


NATS_CONFIG = """\
server_name: {name}
listen: 127.0.0.1:{client}
http: 127.0.0.1:{monitor}
max_payload: 1048576
jetstream {{
  store_dir: "{store}"
  max_file_store: 64G
  max_memory_store: 1G
}}
cluster {{
  name: shoal-bench
  listen: 127.0.0.1:{route}
  routes: [{routes}]
}}
"""


@contextmanager
def nats(root: Path, warm_up_s: float) -> Iterator[list[Target]]:
    """A three-node JetStream cluster; streams are created with file storage and R3."""
    install_debian("nats-server")
    root.mkdir(parents=True, exist_ok=True)
    clients = [free_port() for _ in range(NATS_NODES)]
    routes = [free_port() for _ in range(NATS_NODES)]
    monitors = [free_port() for _ in range(NATS_NODES)]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(NATS_NODES):
            config = root / f"n{n}.conf"
            config.write_text(
                NATS_CONFIG.format(
                    name=f"n{n}", client=clients[n], monitor=monitors[n], route=routes[n],
                    store=root / f"n{n}",
                    routes=", ".join(f"nats-route://127.0.0.1:{p}" for p in routes),
                )
            )  # fmt: skip
            with open(root / f"n{n}.log", "ab") as log:
                processes.append(
                    subprocess.Popen(["nats-server", "-c", str(config)], stdout=log, stderr=log)
                )
        urls = [f"nats://127.0.0.1:{p}" for p in clients]
        _wait_for_jetstream(urls, processes, root)
        yield [
            Target(
                "nats-r3", "nats", {"servers": urls}, copies=3,
                durability=DURABILITY["nats-r3"], version=_nats_version(),
                pids={f"nats-{n}": p.pid for n, p in enumerate(processes)}, replicas=3,
            )
        ]  # fmt: skip
    finally:
        _stop(processes)


def _wait_for_jetstream(
    urls: list[str], processes: list[subprocess.Popen[bytes]], root: Path
) -> None:
    """Until the cluster has a JetStream meta leader: before that, creating a stream fails."""
    import nats as nats_py

    async def quiet(_error: Exception) -> None:
        """Refused connections are expected while the servers start."""

    async def ready() -> bool:
        try:
            client = await nats_py.connect(
                urls, connect_timeout=1, max_reconnect_attempts=0, error_cb=quiet
            )
        except Exception:
            return False
        try:
            await client.jetstream().account_info()
            return True
        except Exception:
            return False
        finally:
            await client.close()

    deadline = time.monotonic() + START_TIMEOUT_S
    while not asyncio.run(ready()):
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            logs = "\n".join((root / f"n{n}.log").read_text()[-1500:] for n in range(NATS_NODES))
            raise RuntimeError(f"the NATS cluster did not come up:\n{logs}")
        time.sleep(0.5)


# -- Redis ----------------------------------------------------------------------------------


@contextmanager
def redis(root: Path, warm_up_s: float) -> Iterator[list[Target]]:
    """One redis-server with the append-only file, fsynced every second."""
    install_debian("redis-server")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port_block(1)
    argv = [
        "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(root),
        "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
        "--daemonize", "no", "--protected-mode", "no", "--logfile", str(root / "redis.log"),
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(port):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"redis-server did not start:\n{_tail(root / 'redis.log')}")
            time.sleep(0.1)
        yield [
            Target(
                "redis-aof", "redis", {"host": "127.0.0.1", "port": port}, copies=1,
                durability=DURABILITY["redis-aof"],
                version=_redis_version(), pids={"redis": process.pid},
            )
        ]  # fmt: skip
    finally:
        _stop([process])


def _answers(port: int) -> bool:
    import redis as redis_py

    try:
        return bool(redis_py.Redis(port=port, socket_connect_timeout=1).ping())
    except redis_py.RedisError:
        return False


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


SYSTEMS = {"shoal": shoal, "kafka": kafka, "nats": nats, "redis": redis}
"""Each system's starter, in the order the suite runs them: ``starter(root, warm_up_s)``."""
