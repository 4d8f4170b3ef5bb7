"""A seeded schedule of faults under recorded clients, judged by the history checker.

Three brokers (RF3, min.insync.replicas 2) behind the gateway; idempotent
acks=all producers and a consumer group, all confluent-kafka through the
gateway with a tenant's key, record what they see while leaders are killed
and frozen and the gateway restarts. The checker then finds no lost,
duplicated or reordered write, no phantom read, no split brain and no
committed offset going backwards.

The seed is printed; ``SHOAL_FAULT_SEED=<seed>`` replays a schedule, and
``SHOAL_FAULT_SECONDS`` lengthens it (``make soak``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import EtcdServer, GatewayCluster, module_gateway_cluster
from faults import FaultInjector, fault_seed, schedule
from harness import wait_until

from shoal.history.checker import check, longest_ack_gap
from shoal.history.events import write_history
from shoal.history.workload import Run, Workload

PARTITIONS = 3
SECONDS = float(os.environ.get("SHOAL_FAULT_SECONDS", "60"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(SECONDS) + 900)]


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "fault-schedule")


def full_isr(cluster: GatewayCluster, broker_topic: str) -> bool:
    live = ",".join(b.bootstrap for b in cluster.brokers if b.running)
    found = AdminClient({"bootstrap.servers": live}).list_topics(broker_topic, timeout=10)
    partitions = found.topics[broker_topic].partitions.values()
    return len(partitions) == PARTITIONS and all(len(p.isrs) == 3 for p in partitions)


def test_no_anomaly_through_kills_pauses_and_gateway_restarts(
    cluster: GatewayCluster, tmp_path: Path
) -> None:
    seed = fault_seed()
    print(f"\nfault schedule seed {seed} ({SECONDS:.0f} s): SHOAL_FAULT_SEED={seed} replays it")
    key = cluster.tenant("faults")
    settings = key.librdkafka()
    admin = AdminClient(settings)  # alive until its future resolves
    topic = NewTopic("events", PARTITIONS, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic])["events"].result(30)
    wait_until(lambda: full_isr(cluster, "faults.events"), 60, "a full ISR on every partition")

    run = Run(Workload(settings, "events", producers=2, consumers=2, rate=100)).start()
    injector = FaultInjector(cluster, "faults.events", run.history.now)
    time.sleep(3)
    faults = schedule(seed, SECONDS, PARTITIONS)
    injector.run(faults)
    events = run.finish()
    write_history(tmp_path / "history.jsonl", events)

    report = check(events)
    print(report.summary())
    for applied in injector.applied:
        gap = longest_ack_gap(events, applied.began_s - 1, applied.healed_s)
        print(
            f"  {applied.fault.kind} {applied.victim} from {applied.began_s:.1f} s"
            f" to {applied.healed_s:.1f} s: producers waited up to {gap:.1f} s"
        )
    assert report.ok, f"seed {seed}:\n{report.summary()}"
    assert report.acknowledged > 0.5 * report.sent, report.summary()
    assert report.polled > 0 and report.commits > 0, report.summary()
