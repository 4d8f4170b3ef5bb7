"""Network faults under recorded clients: every process in a network namespace of its own.

Three etcd members, three brokers (RF3, min.insync.replicas 2), the gateway
and the clients each get a namespace on one bridge (netns.py). A seeded
schedule, mixed with kills and freezes, takes links away: a partition leader
cut from etcd and its followers but not from the gateway (the case where a
zombie leader could acknowledge what the new one never has), a leader or the
controller isolated from everyone, etcd isolated from its users, the etcd
leader cut from the other members (a minority every broker still reaches);
etcd stops and starts again; a leader's
log directory (a tmpfs of its own) fills up until space comes back; and the
gateway restarts. The history checker then finds no lost, duplicated or
reordered write, no phantom read, no split brain and no committed offset going
backwards.

The seed is printed; ``SHOAL_FAULT_SEED=<seed>`` replays a schedule and
``SHOAL_FAULT_SECONDS`` lengthens it (``make soak``: half an hour). Each run
prints a summary: records acknowledged, anomalies, failovers and the gap a
producer saw per kind of fault (median and max).

The anchor (``soak`` marker, run by ``make soak``, not by ``make test``): the
same schedule, same seed, against Apache Kafka (a KRaft controller and three
brokers, each in a namespace of its own), its summary printed beside Shoal's.
Kafka's clients connect to its brokers directly (it has no gateway); its
controller is the KRaft node, so ``controller`` and ``etcd`` both isolate it
(the coordination store out of reach) and ``etcd_restart`` restarts it;
``etcd_minority`` (one KRaft voter, no minority) and ``gateway`` apply nothing
there (the schedule keeps their time so the two runs stay in step).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from faults import Fault, FaultInjector, fault_seed, schedule
from gateway_env import GatewayProcess
from harness import BrokerProcess, etcd_healthy, start_all, wait_until
from netns import Network, Node, call_in, namespaces_available
from shoal.benchmarks.apache_kafka import ApacheKafka, KafkaNode, default_kafka_home
from small_disk import SmallDisk

from shoal.etcd_process import etcd_binary
from shoal.history.checker import check, longest_ack_gap
from shoal.history.events import write_history
from shoal.history.summary import LEAD_S, FaultSpan, SoakSummary, render, summarize
from shoal.history.workload import Run, Workload

PARTITIONS = 3
SECONDS = float(os.environ.get("SHOAL_FAULT_SECONDS", "0"))
"""0: each kind of fault once (about two minutes)."""
KINDS = (
    "cut", "isolate", "controller", "etcd", "etcd_minority", "etcd_restart", "kill", "pause",
    "disk", "gateway",
)  # fmt: skip
DISK_SIZE = "256m"
"""Each broker's log directory is a filesystem this big (tmpfs: only what is written
takes memory); the ``disk`` fault fills it."""
BROKER_PORT = 9092
ETCD_PORT = 2379
ETCD_MEMBERS = 3
SESSION_TIMEOUT_S = 3.0
"""The brokers' etcd session (``SHOAL_BROKER_SESSION_TIMEOUT_MS``'s default)."""

# Kafka's run takes longer than the schedule: each JVM a fault restarts takes seconds.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(1.5 * SECONDS) + 900)]

log = logging.getLogger(__name__)

SEED = fault_seed()
"""One seed for the module: Shoal and the anchor run the same schedule."""
SUMMARIES: list[SoakSummary] = []
"""Each system's summary, in the order they ran: the anchor prints them side by side."""


class NamespacedEtcdMember:
    def __init__(self, node: Node, directory: Path, initial_cluster: str) -> None:
        self.node = node
        self.directory = directory
        self.initial_cluster = initial_cluster
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.node.address}:{ETCD_PORT}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.node.address}:{ETCD_PORT + 1}"

    def start(self) -> None:
        command = [
            str(etcd_binary()),
            f"--name={self.node.name}",
            f"--data-dir={self.directory / 'data'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={self.initial_cluster}",
            "--log-level=warn",
        ]
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(self.node.command(command), stdout=log, stderr=log)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def status(self) -> dict[str, Any]:
        """This member's view of the cluster (etcd's JSON gateway for Maintenance/Status)."""
        request = urllib.request.Request(f"{self.url}/v3/maintenance/status", data=b"{}")
        with urllib.request.urlopen(request, timeout=2) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer


class NamespacedEtcdCluster:
    """Three etcd members, each in a namespace of its own, so that one can be cut off
    with a minority while the others keep a quorum."""

    def __init__(self, network: Network, root: Path) -> None:
        nodes = [network.add(f"etcd{n}") for n in range(ETCD_MEMBERS)]
        initial = ",".join(f"{n.name}=http://{n.address}:{ETCD_PORT + 1}" for n in nodes)
        self.members = [NamespacedEtcdMember(node, root / node.name, initial) for node in nodes]
        self.url = ",".join(m.url for m in self.members)
        """Every member, as Shoal's components take them (etcdctl's --endpoints)."""

    @property
    def nodes(self) -> list[Node]:
        return [m.node for m in self.members]

    def start(self) -> None:
        for member in self.members:
            member.start()
        for member in self.members:
            wait_until(
                lambda m=member: call_in(m.node, etcd_healthy, m.url),
                30,
                f"{member.node.name} healthy",
            )

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def leader(self) -> NamespacedEtcdMember:
        """The member raft elected, as the members say (until one does)."""

        def elected() -> list[NamespacedEtcdMember] | None:
            for member in self.members:
                try:
                    status = call_in(member.node, member.status)
                except OSError:
                    continue
                if status.get("leader") and status["leader"] == status["header"]["member_id"]:
                    return [member]
            return None

        [member] = wait_until(elected, 30, "an etcd leader")
        return member


class NamespacedBroker(BrokerProcess):
    def __init__(
        self, node: Node, etcd_url: str, data_dir: Path, node_id: int, env: dict[str, str]
    ) -> None:
        super().__init__(etcd_url, data_dir, node_id, port=BROKER_PORT, env=env)
        self.node = node
        self.disk = SmallDisk(data_dir, DISK_SIZE)

    @property
    def bootstrap(self) -> str:
        return f"{self.node.address}:{self.port}"

    def command(self) -> list[str]:
        return self.node.command(
            [a.replace("127.0.0.1", self.node.address) for a in super().command()]
        )


class NamespacedGateway(GatewayProcess):
    def __init__(self, node: Node, etcd_url: str, upstream: str, directory: Path) -> None:
        super().__init__(etcd_url, upstream, directory, brokers=3)
        self.node = node

    @property
    def bootstrap(self) -> str:
        return f"{self.node.address}:{self.port}"

    def command(self) -> list[str]:
        return self.node.command(
            [a.replace("127.0.0.1", self.node.address) for a in super().command()]
        )


class NetworkCluster:
    def __init__(self, network: Network, root: Path) -> None:
        self.network = network
        self.etcd = NamespacedEtcdCluster(network, root / "etcd")
        self.etcd_url = f"{self.etcd.url}/shoal"
        env = {
            "SHOAL_DEFAULT_REPLICATION_FACTOR": "3",
            "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": "3",
            "SHOAL_OFFSETS_TOPIC_NUM_PARTITIONS": "3",
            "SHOAL_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        }
        self.brokers = [
            NamespacedBroker(network.add(f"b{n}"), self.etcd_url, root / f"broker-{n}", n, env)
            for n in range(3)
        ]
        upstream = ",".join(b.bootstrap for b in self.brokers)
        self.gateway = NamespacedGateway(network.add("gw"), self.etcd_url, upstream, root)
        self.client = network.add("client")

    def start(self) -> None:
        self.etcd.start()
        for broker in self.brokers:
            broker.disk.mount()
        start_all(self.brokers)
        self.gateway.start()

    def stop(self) -> None:
        # Every step runs even if one before it fails: no process or mount is left.
        with contextlib.ExitStack() as steps:  # run last to first
            steps.callback(self.etcd.stop)
            for broker in self.brokers:
                steps.callback(broker.disk.unmount)
                if broker.running:
                    steps.callback(broker.kill)
            if self.gateway.running:
                steps.callback(self.gateway.stop)

    def shoal(self, *args: str) -> str:
        """The shoal command, run in the clients' namespace."""
        done = subprocess.run(
            self.client.command([sys.executable, "-m", "shoal", *args]),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


class NetworkFaultInjector(FaultInjector):
    """Kills and freezes as FaultInjector, plus links taken away in the namespaces."""

    def __init__(
        self, cluster: NetworkCluster | KafkaNetworkCluster, broker_topic: str, clock: Any
    ) -> None:
        super().__init__(cluster, broker_topic, clock)
        self.net = cluster

    def _ask(self, question: Any) -> int:
        """A node id from the brokers' metadata, asked from the clients' namespace until
        one is known (just after a fault there may be no leader or controller yet)."""

        def ask() -> int:
            admin = AdminClient({"bootstrap.servers": self.live_bootstrap()})
            try:
                return int(question(admin.list_topics(self.broker_topic, timeout=5)))
            except KafkaException:
                return -1

        def known() -> list[int] | None:
            node = call_in(self.net.client, ask)
            return [node] if node >= 0 else None

        [node] = wait_until(known, 60, "a leader or controller in the metadata", interval=0.5)
        return int(node)

    def leader_of(self, partition: int) -> int:
        return self._ask(lambda found: found.topics[self.broker_topic].partitions[partition].leader)

    def leaders(self) -> dict[int, int]:
        return call_in(self.net.client, super().leaders)

    def apply(self, fault: Fault) -> None:
        self._revive()
        super().apply(fault)

    def _revive(self) -> None:
        """Start any broker that is down: one whose disk filled may still have been
        shutting down when its fault ended, and the rest of the schedule needs it."""
        for broker in self.net.brokers:
            if not broker.running:
                log.warning("fault schedule: broker %d was down, starting it", broker.node_id)
                broker.start()

    def _for(self, fault: Fault, broken: Any) -> None:
        try:
            broken()
            time.sleep(fault.lasts_s)
        finally:
            self.net.network.heal()

    def fault_cut(self, fault: Fault) -> str:
        leader = self.leader_broker(fault.partition)
        others = [b.node for b in self.net.brokers if b is not leader]
        self._for(
            fault, lambda: self.net.network.cut([leader.node], [*others, *self.net.etcd.nodes])
        )
        return f"broker {leader.node_id} cut from etcd and brokers"

    def fault_isolate(self, fault: Fault) -> str:
        leader = self.leader_broker(fault.partition)
        self._for(fault, lambda: self.net.network.isolate(leader.node))
        return f"broker {leader.node_id} isolated"

    def fault_controller(self, fault: Fault) -> str:
        controller = self.broker(self._ask(lambda found: found.controller_id))
        self._for(fault, lambda: self.net.network.isolate(controller.node))
        return f"controller {controller.node_id} isolated"

    def fault_etcd(self, fault: Fault) -> str:
        # The members keep their quorum among themselves; no broker or gateway reaches any.
        users = [*(b.node for b in self.net.brokers), self.net.gateway.node]
        self._for(fault, lambda: self.net.network.cut(self.net.etcd.nodes, users))
        return "etcd isolated"

    def fault_etcd_minority(self, fault: Fault) -> str:
        """The etcd leader cut off from the other two members, still reachable by every
        broker and the gateway: it has no quorum, and what asks it must go elsewhere."""
        leader = self.net.etcd.leader()
        others = [m.node for m in self.net.etcd.members if m is not leader]
        self._for(fault, lambda: self.net.network.cut([leader.node], others))
        return f"etcd leader {leader.node.name} cut from the other members"

    def fault_etcd_restart(self, fault: Fault) -> str:
        self.net.etcd.stop()
        time.sleep(fault.lasts_s)
        self.net.etcd.start()
        return "etcd stopped and started"

    def fault_disk(self, fault: Fault) -> str:
        """The leader's log directory fills up; when space is back, a broker that took
        the directory offline and exited (as it should) is started again."""
        broker = self.leader_broker(fault.partition)
        taken = broker.disk.fill()
        try:
            time.sleep(fault.lasts_s)
        finally:
            broker.disk.free()
        exited = not broker.running
        if exited:
            broker.start()
        outcome = "exited, started again" if exited else "kept running"
        return f"broker {broker.node_id}'s disk full ({taken >> 20} MB taken; {outcome})"


def network_for(cleanup: contextlib.ExitStack) -> Network:
    """A bridge for a cluster's namespaces, removed with ``cleanup``; the test is
    skipped, saying why, where this process may not make namespaces (not root)."""
    unavailable = namespaces_available()
    if unavailable is not None:
        pytest.skip(unavailable)
    network = Network()
    cleanup.callback(network.close)
    return network


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetworkCluster]:
    with contextlib.ExitStack() as cleanup:  # run last to first
        network = network_for(cleanup)
        started = NetworkCluster(network, tmp_path_factory.mktemp("fault-network"))
        cleanup.callback(started.stop)
        started.start()
        yield started


def full_isr(client: Node, bootstrap: str, topic: str) -> bool:
    """Whether every partition of ``topic`` has all three replicas in sync (asked as the
    brokers see it, from the clients' namespace)."""

    def ask() -> bool:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
        return len(partitions) == PARTITIONS and all(len(p.isrs) == 3 for p in partitions.values())

    return call_in(client, ask)


def record_under_faults(
    system: str,
    client: Node,
    settings: dict[str, str],
    injector_for: Callable[[Callable[[], float]], NetworkFaultInjector],
    history: Path,
) -> None:
    """The recorded workload on ``events`` while the seeded schedule runs; the checker's
    report and the run's summary printed beside the runs before it, then judged."""
    seed = SEED
    workload = Workload(settings, "events", producers=2, consumers=2, rate=100)
    run = call_in(client, lambda: Run(workload).start())
    injector = injector_for(run.history.now)
    try:
        time.sleep(3)
        injector.run(schedule(seed, SECONDS, PARTITIONS, KINDS))
    finally:
        # Whatever stopped the schedule, the clients stop and what they saw is kept.
        events = call_in(client, run.finish)
        write_history(history, events)
    report = check(events)
    print(f"\n{system}, seed {seed} (history in {history}):\n{report.summary()}")
    for applied in injector.applied:
        print(
            f"  {applied.fault.kind}: {applied.victim} from {applied.began_s:.1f} s"
            f" to {applied.healed_s:.1f} s"
        )
    # A fault with no victim applied nothing (the gateway's restart on Kafka).
    spans = [
        FaultSpan(a.fault.kind, a.began_s, a.healed_s + a.fault.calm_s)
        for a in injector.applied
        if a.victim
    ]
    summary = summarize(system, report, events, spans, injector.failovers)
    SUMMARIES.append(summary)
    print("\n" + render(SUMMARIES, KINDS))
    assert report.ok, f"{system}, seed {seed}:\n{report.summary()}"
    # A member cut off with a minority leaves a quorum: no broker's session may lapse
    # over it (that would stall its partitions for the session timeout and more). Waits
    # that began while it lasted or in its calm spell, short of the next fault's lead
    # second; not the summary's, which also counts a wait begun in the second before.
    minority = [
        longest_ack_gap(events, a.began_s, a.healed_s + a.fault.calm_s - LEAD_S)
        for a in injector.applied
        if a.fault.kind == "etcd_minority" and a.victim
    ]
    assert max(minority, default=0.0) < SESSION_TIMEOUT_S, (system, minority)
    assert report.acknowledged > 0.5 * report.sent, report.summary()
    assert report.polled > 0 and report.commits > 0, report.summary()


def test_no_anomaly_through_partitions_isolations_kills_and_freezes(
    cluster: NetworkCluster, tmp_path: Path
) -> None:
    print(f"\nnetwork fault seed {SEED}: SHOAL_FAULT_SEED={SEED} replays it")
    cluster.shoal("tenant", "create", "net", "--etcd", cluster.etcd_url)
    key = json.loads(
        cluster.shoal("key", "create", "net", "--etcd", cluster.etcd_url, "-o", "json")
    )
    settings = {
        "bootstrap.servers": cluster.gateway.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": key["key_id"],
        "sasl.password": key["secret"],
    }
    flags = [f"-X{k}={v}" for k, v in settings.items()]
    cluster.shoal(
        "topic", "create", "events", "-p", str(PARTITIONS), "-r", "3",
        "-c", "min.insync.replicas=2", *flags,
    )  # fmt: skip
    bootstrap = cluster.brokers[0].bootstrap
    wait_until(
        lambda: full_isr(cluster.client, bootstrap, "net.events"),
        60,
        "a full ISR on every partition",
    )
    record_under_faults(
        "shoal",
        cluster.client,
        settings,
        lambda clock: NetworkFaultInjector(cluster, "net.events", clock),
        tmp_path / "history.jsonl",
    )


# The anchor: Apache Kafka under the same schedule.


class KRaftController:
    """Kafka's coordination store, where etcd stands in Shoal's cluster: the KRaft node,
    with the stop and start the ``etcd_restart`` fault asks of etcd."""

    def __init__(self, kafka: ApacheKafka, namespace: Node) -> None:
        self.kafka = kafka
        self.node = namespace

    @property
    def nodes(self) -> list[Node]:
        return [self.node]

    def stop(self) -> None:
        self.kafka.controller.signal(signal.SIGKILL)
        self.kafka.controller.wait(10)

    def start(self) -> None:
        self.kafka.start_node(self.kafka.controller)
        wait_until(self.kafka.controller.started, 120, "the KRaft controller to start")


class NamespacedKafkaBroker:
    """A Kafka broker JVM in its namespace, with the handle FaultInjector expects."""

    def __init__(self, kafka: ApacheKafka, node: KafkaNode, namespace: Node) -> None:
        self.kafka = kafka
        self.kafka_node = node
        self.node = namespace
        self.node_id = node.node_id
        self.disk = SmallDisk(node.directory / "data", DISK_SIZE)

    @property
    def bootstrap(self) -> str:
        return self.kafka_node.address

    @property
    def running(self) -> bool:
        process = self.kafka_node.process
        return process is not None and process.poll() is None

    def start(self) -> None:
        self.kafka.start_node(self.kafka_node)
        wait_until(self.kafka_node.started, 120, f"Kafka broker {self.node_id} to start")

    def kill(self) -> None:
        self.kafka_node.signal(signal.SIGKILL)
        self.kafka_node.wait(10)

    def pause(self) -> None:
        self.kafka_node.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.kafka_node.signal(signal.SIGCONT)


class NamespacedKafka(ApacheKafka):
    """Apache Kafka with its controller and each broker in a namespace of their own.

    Kafka's own settings and JVM flags (as the benchmarks run it), not the
    short-run flags of the tests that only ask it a few questions.
    """

    def __init__(self, network: Network, root: Path) -> None:
        super().__init__(root, default_kafka_home())
        self.network = network
        self.client = network.add("client")
        self.controller_namespace = network.add("kraft")
        self.controller.host = self.controller_namespace.address
        self.controller.launcher = self.controller_namespace.command([])
        self.handles: list[NamespacedKafkaBroker] = []
        for broker in self.brokers:
            namespace = network.add(f"k{broker.node_id}")
            broker.host = namespace.address
            broker.launcher = namespace.command([])
            self.handles.append(NamespacedKafkaBroker(self, broker, namespace))

    def _metadata_complete(self) -> bool:
        # The brokers' addresses exist only inside the namespaces.
        return call_in(self.client, super()._metadata_complete)


class KafkaNetworkCluster:
    """What NetworkFaultInjector reaches for, on Apache Kafka: the KRaft controller
    stands where etcd stands in Shoal's cluster (the coordination store)."""

    def __init__(self, kafka: NamespacedKafka) -> None:
        self.kafka = kafka
        self.network = kafka.network
        self.client = kafka.client
        self.brokers = kafka.handles
        self.etcd = KRaftController(kafka, kafka.controller_namespace)


class KafkaFaultInjector(NetworkFaultInjector):
    net: KafkaNetworkCluster

    def fault_controller(self, fault: Fault) -> str:
        self._for(fault, lambda: self.net.network.isolate(self.net.etcd.node))
        return "KRaft controller isolated"

    def fault_etcd(self, fault: Fault) -> str:
        return self.fault_controller(fault)

    def fault_etcd_minority(self, fault: Fault) -> str:
        time.sleep(fault.lasts_s)
        return ""  # one KRaft voter here: no minority to cut off

    def fault_etcd_restart(self, fault: Fault) -> str:
        super().fault_etcd_restart(fault)
        return "KRaft controller stopped and started"

    def fault_gateway(self, fault: Fault) -> str:
        time.sleep(fault.lasts_s)
        return ""  # nothing to restart: Kafka's clients reach the brokers directly


@pytest.fixture
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNetworkCluster]:
    with contextlib.ExitStack() as cleanup:  # run last to first
        network = network_for(cleanup)
        kafka = NamespacedKafka(network, tmp_path_factory.mktemp("fault-network-kafka"))
        for broker in kafka.handles:
            broker.disk.mount()
            cleanup.callback(broker.disk.unmount)
        cleanup.enter_context(kafka)
        yield KafkaNetworkCluster(kafka)


@pytest.mark.soak
def test_apache_kafka_under_the_same_schedule(
    kafka_cluster: KafkaNetworkCluster, tmp_path: Path
) -> None:
    print(f"\nnetwork fault seed {SEED} on Apache Kafka: SHOAL_FAULT_SEED={SEED} replays it")
    settings = {"bootstrap.servers": kafka_cluster.kafka.bootstrap}

    def create() -> None:
        admin = AdminClient(settings)
        topic = NewTopic("events", PARTITIONS, 3, config={"min.insync.replicas": "2"})
        for future in admin.create_topics([topic]).values():
            future.result(30)

    call_in(kafka_cluster.client, create)
    wait_until(
        lambda: full_isr(kafka_cluster.client, settings["bootstrap.servers"], "events"),
        60,
        "a full ISR on every partition",
    )
    record_under_faults(
        "apache-kafka",
        kafka_cluster.client,
        settings,
        lambda clock: KafkaFaultInjector(kafka_cluster, "events", clock),
        tmp_path / "history.jsonl",
    )
