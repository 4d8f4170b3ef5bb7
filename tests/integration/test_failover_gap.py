"""The gap a producer sees when a partition leader dies or freezes, through the gateway.

An idempotent acks=all confluent-kafka producer writes through the gateway
to a one-partition topic (RF3, min.insync.replicas 2) with the brokers'
default settings. Its leader is SIGKILLed, or frozen with SIGSTOP; the
longest wait between two acknowledgements must stay under :data:`GAP_S`,
and the history checker must find nothing lost, duplicated or reordered.
A frozen leader, woken, must rejoin as a follower without acknowledging
anything it later truncates (the checker's split-brain and loss checks).

What bounds the gap (docs/faults.md): a killed broker's listener refuses
connections, so its peers fence it at once (shoal.broker.cluster.liveness);
a frozen one accepts connections and answers nothing, so only its etcd
session ends it (SHOAL_BROKER_SESSION_TIMEOUT_MS); then the controller's
election, the gateway's check of the live brokers, and librdkafka's own
metadata refresh. Each test prints that timeline from the processes' logs.

A shorter session risks false failovers: a broker too busy to renew its
lease in time is fenced while alive. The last test keeps the brokers busy
(both cores) for half a minute and finds no leader change and no lapsed
session.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from itertools import pairwise
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import EtcdServer, GatewayCluster, module_gateway_cluster
from faults import FaultInjector
from harness import wait_until

from shoal.history.checker import check, longest_ack_gap
from shoal.history.events import Event
from shoal.history.workload import Run, Workload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GAP_S = 5.0
"""The issue's goal for the gap a producer sees, for SIGKILL and for SIGSTOP."""
FAULT_S = 12.0
"""How long the victim stays dead or frozen: well past the session timeout."""
LOAD_S = 30.0

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (.*)$")
_MILESTONES = (
    "event=broker_fenced",
    "event=broker_lease_expired",
    "event=broker_heartbeat_withheld",
    "event=partition_state_changed",
    "event=gateway_broker_gone",
    "event=event_loop_stalled",
    "event=broker_heartbeat_late",
)


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "failover-gap")


def _log_lines(cluster: GatewayCluster) -> Iterator[tuple[str, float, str]]:
    sources = [(f"broker-{b.node_id}", b.log_text()) for b in cluster.brokers]
    sources.append(("gateway", cluster.gateway.log_text()))
    for name, text in sources:
        for line in text.splitlines():
            found = _STAMP.match(line)
            if found is None:
                continue
            stamp = datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            yield name, stamp, found[2]


def timeline(cluster: GatewayCluster, fault_wall: float, topic: str, until_s: float) -> list[str]:
    """The milestones of one failover in every process's log, in seconds since the fault."""
    rows = []
    for name, stamp, message in _log_lines(cluster):
        at = stamp - fault_wall
        if not -1.0 <= at <= until_s or not any(m in message for m in _MILESTONES):
            continue
        if "partition_state_changed" in message and f"topic={topic} " not in message:
            continue
        text = re.sub(r"^level=\w+ logger=\S+ ", "", message)
        rows.append((at, f"{at:+7.3f} s  {name:9}  {text}"))
    return [row for _, row in sorted(rows)]


def acks_after(events: list[Event], since: float) -> list[float]:
    return sorted(e.time for e in events if e.kind == "ack" and not e.error and e.time > since)


def _fail_over(cluster: GatewayCluster, name: str, fault: str) -> None:
    key = cluster.tenant(name)
    settings = key.librdkafka()
    admin = AdminClient(settings)
    admin.create_topics([NewTopic("orders", 1, 3, config={"min.insync.replicas": "2"})])[
        "orders"
    ].result(30)
    broker_topic = f"{name}.orders"
    injector = FaultInjector(cluster, broker_topic, time.monotonic)
    wait_until(lambda: injector.leader_of(0) >= 0, 30, f"a leader for {broker_topic}")

    run = Run(Workload(settings, "orders", producers=1, consumers=0, rate=200)).start()
    time.sleep(4)
    victim = injector.broker(injector.leader_of(0))
    fault_at, fault_wall = run.history.now(), time.time()
    if fault == "kill":
        victim.kill()
    else:
        victim.pause()
    try:
        time.sleep(FAULT_S)
    finally:
        if fault == "kill":
            victim.start()
        else:
            victim.resume()
    # The victim comes back as a follower and catches up into the ISR.
    wait_until(
        lambda: _isr(injector, broker_topic) == 3, 60, f"broker {victim.node_id} back in the ISR"
    )
    time.sleep(2)
    events = run.finish()

    report = check(events)
    print(report.summary())
    print(f"\n{fault} of broker {victim.node_id}, the leader of {broker_topic}:")
    for row in timeline(cluster, fault_wall, broker_topic, FAULT_S):
        print(row)
    gap = longest_ack_gap(events, fault_at - 1.0, fault_at + FAULT_S)
    acks = acks_after(events, fault_at - 1.0)
    ends = [after for before, after in pairwise(acks) if after - before >= gap - 1e-6]
    if ends:
        print(f"{ends[0] - fault_at:+7.3f} s  producer   acknowledgements resume")
    print(f"longest gap between acknowledgements: {gap:.2f} s")
    assert report.ok, report.summary()
    if fault == "pause":
        assert injector.leader_of(0) != victim.node_id, "no failover happened"
        # Woken, it found its lease gone and registered again as a follower.
        assert "event=broker_lease_expired" in victim.log_text()
    assert gap < GAP_S, f"producer waited {gap:.2f} s for an acknowledgement"


def _isr(injector: FaultInjector, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": injector.live_bootstrap()})
    found = admin.list_topics(topic, timeout=10).topics[topic]
    return len(found.partitions[0].isrs)


_LOAD_SCRIPT = """
import sys, time
from confluent_kafka import Producer
bootstrap, topic, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
              "enable.idempotence": True, "queue.buffering.max.kbytes": 65536})
value = b"x" * 1024
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    try:
        p.produce(topic, value, partition=n % 6)
        n += 1
    except BufferError:
        p.poll(0.01)
    if n % 1000 == 0:
        p.poll(0)
p.flush(60)
print(n)
"""


def _busy_cores() -> tuple[float, float]:
    """The machine's busy and total CPU time so far (from /proc/stat), in seconds."""
    with open("/proc/stat") as stat:
        fields = [int(f) for f in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, sum(fields) / tick


_LAPSES = (
    "event=broker_fenced",
    "event=broker_lease_expired",
    "event=broker_heartbeat_withheld",
    "event=gateway_broker_gone",
)
_EPOCH = re.compile(r"topic=(\S+) partition=(\d+) leader=-?\d+ leader_epoch=(\d+)")


def _leader_epochs(cluster: GatewayCluster) -> dict[tuple[str, int], int]:
    """Each partition's highest leader epoch the controllers logged (an ISR change keeps it)."""
    epochs: dict[tuple[str, int], int] = {}
    for _, _, message in _log_lines(cluster):
        found = _EPOCH.search(message) if "partition_state_changed" in message else None
        if found is not None:
            key = (found[1], int(found[2]))
            epochs[key] = max(epochs.get(key, 0), int(found[3]))
    return epochs


def _lapses(cluster: GatewayCluster) -> list[str]:
    """Every sign of a broker taken for dead: fenced, lease expired, session lapsed, or
    its clients disconnected by the gateway."""
    return [
        f"{name}: {message}"
        for name, _, message in _log_lines(cluster)
        if any(m in message for m in _LAPSES)
    ]


def test_no_failover_while_the_brokers_are_busy(cluster: GatewayCluster) -> None:
    """Three flat-out producers against the brokers (both cores busy) for half a minute:
    no broker loses its session, no leader changes. First in the module, while every
    partition is led by its preferred replica (no preferred-leader election due)."""
    bootstrap = ",".join(b.bootstrap for b in cluster.brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("load.busy", 6, 3, config={"min.insync.replicas": "2"})])[
        "load.busy"
    ].result(30)
    wait_until(
        lambda: all(
            p.leader >= 0
            for p in admin.list_topics("load.busy", timeout=10)
            .topics["load.busy"]
            .partitions.values()
        ),
        30,
        "leaders for load.busy",
    )
    time.sleep(2)
    epochs_before, lapses_before = _leader_epochs(cluster), _lapses(cluster)
    busy_before, total_before = _busy_cores()
    started = time.monotonic()
    loads: list[subprocess.Popen[Any]] = [
        subprocess.Popen(
            [sys.executable, "-c", _LOAD_SCRIPT, bootstrap, "load.busy", str(LOAD_S)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    sent = [int(load.communicate(timeout=LOAD_S + 120)[0].strip() or 0) for load in loads]
    elapsed = time.monotonic() - started
    busy, total = _busy_cores()
    cores = os.cpu_count() or 1
    busy_share = (busy - busy_before) / (total - total_before)
    time.sleep(2)
    epochs_after, lapses_after = _leader_epochs(cluster), _lapses(cluster)
    # Its gigabytes would slow the recovery of the brokers the next tests kill.
    admin.delete_topics(["load.busy"])["load.busy"].result(30)
    stalls = [
        f"{name}: {message}"
        for name, _, message in _log_lines(cluster)
        if "event_loop_stalled" in message or "heartbeat_late" in message or "gc_pause" in message
    ]
    print(f"records sent: {sent} in {elapsed:.1f} s; CPU busy {busy_share:.0%} of {cores} cores")
    print("\n".join(stalls) or "no event loop stall logged")
    assert sum(sent) > 10_000, sent
    assert busy_share > 0.8, f"the load kept the cores only {busy_share:.0%} busy"
    moved = {
        p: (epochs_before.get(p), e) for p, e in epochs_after.items() if epochs_before.get(p) != e
    }
    assert not moved, f"leaders changed under load (epoch before, after): {moved}"
    lapsed = list((Counter(lapses_after) - Counter(lapses_before)).elements())
    assert not lapsed, "brokers taken for dead under load:\n" + "\n".join(lapsed)


def test_producer_gap_when_the_leader_is_killed(cluster: GatewayCluster) -> None:
    _fail_over(cluster, "killed", "kill")


def test_producer_gap_when_the_leader_is_frozen(cluster: GatewayCluster) -> None:
    _fail_over(cluster, "frozen", "pause")
