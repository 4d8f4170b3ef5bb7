"""The operator's roller against three real brokers: it refuses unsafe restarts, rolls safe ones.

The restart callback really stops (SIGTERM) and starts a broker process, as
deleting a pod does in Kubernetes; the roller learns everything else from
the cluster over the Kafka protocol. Topics use the cluster's defaults:
replication factor 3, min.insync.replicas=2.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Iterator

import pytest
from harness import BrokerProcess, EtcdServer, start_all, wait_until
from kafka_clients import confluent_consume
from replicated import REPLICATED_ENV, Cluster, SteadyProducer
from shoal.operator.kafka_admin import ClusterAdmin
from shoal.operator.roller import RollBlocked, Roller, RollStalled

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    """Three brokers shared by the module's tests; each test leaves them all running."""
    root = tmp_path_factory.mktemp("roller-cluster")
    chroot = etcd.chroot_url()
    brokers = [
        BrokerProcess(chroot, root / f"broker-{n}", n, env=dict(REPLICATED_ENV)) for n in range(3)
    ]
    start_all(brokers)
    yield Cluster(brokers)
    failed = any(
        getattr(item, "report_call", None) is not None and item.report_call.failed
        for item in request.session.items
        if item.module is request.module
    )
    for broker in brokers:
        if broker.running:
            broker.kill()
        if failed:
            print(f"\n----- broker {broker.node_id} log ({broker.log_path}) -----")
            print(broker.log_tail())
    shutil.rmtree(root, ignore_errors=True)


def new_topic(cluster: Cluster, prefix: str, partitions: int = 2) -> str:
    topic = cluster.create_topic(f"{prefix}-{uuid.uuid4().hex[:6]}", partitions)
    cluster.wait_full_isr(topic)
    return topic


def wait_isr(cluster: Cluster, topic: str, isr: tuple[int, ...]) -> None:
    wait_until(
        lambda: all(v.isr == isr for v in cluster.partitions(topic).values()),
        30,
        f"the ISR of every partition of {topic} to be {list(isr)}",
        interval=0.2,
    )


def bring_back(cluster: Cluster, topic: str) -> None:
    for broker in cluster.brokers.values():
        if not broker.running:
            broker.start()
    cluster.wait_full_isr(topic)


class NeverCalled:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1


def reasons_for(error: RollBlocked, topic: str) -> dict[int, str]:
    """The roller's reason for each partition of ``topic``, by partition."""
    found = {}
    for reason in error.reasons:
        name, _, why = reason.partition(": ")
        if name.rpartition("-")[0] == topic:
            found[int(name.rpartition("-")[2])] = why
    return found


async def test_refuses_to_restart_the_last_in_sync_replica(cluster: Cluster) -> None:
    topic = new_topic(cluster, "last")
    try:
        cluster.brokers[1].stop()
        cluster.brokers[2].stop()
        wait_isr(cluster, topic, (0,))
        pid = cluster.brokers[0].process.pid  # type: ignore[union-attr]
        restart = NeverCalled()
        roller = Roller(ClusterAdmin(cluster.bootstrap), safe_timeout_s=1, poll_s=0.2)

        started = time.monotonic()
        with pytest.raises(RollBlocked) as raised:
            await roller.restart_safely(0, restart)

        assert time.monotonic() - started < 10
        assert restart.calls == 0
        assert cluster.brokers[0].running
        assert cluster.brokers[0].process.pid == pid  # type: ignore[union-attr]
        assert raised.value.node_id == 0
        reasons = reasons_for(raised.value, topic)
        assert sorted(reasons) == [0, 1]
        for why in reasons.values():
            assert why.startswith("broker 0 is its last in-sync replica")
            assert "ISR [0])" in why
    finally:
        bring_back(cluster, topic)


async def test_refuses_a_restart_below_min_isr_but_restarts_the_broker_outside_the_isr(
    cluster: Cluster,
) -> None:
    topic = new_topic(cluster, "below")
    try:
        cluster.brokers[2].stop()
        wait_isr(cluster, topic, (0, 1))
        roller = Roller(ClusterAdmin(cluster.bootstrap), safe_timeout_s=1, poll_s=0.2)

        for node in (0, 1):
            restart = NeverCalled()
            with pytest.raises(RollBlocked) as raised:
                await roller.restart_safely(node, restart)
            assert restart.calls == 0
            assert reasons_for(raised.value, topic) == {
                p: f"ISR [0, 1] without broker {node} has 1 member(s), below min.insync.replicas=2"
                for p in (0, 1)
            }

        # Broker 2 is in no ISR: restarting it cannot hurt, and is what repairs the topic.
        # Its process comes back after the callback returns, as a deleted pod does.
        starting: list[asyncio.Task[BrokerProcess]] = []

        async def restart() -> None:
            starting.append(asyncio.create_task(asyncio.to_thread(cluster.brokers[2].start)))

        await roller.restart_safely(2, restart)

        # The roller returned only once broker 2 was back in every ISR.
        assert all(v.isr == (0, 1, 2) for v in cluster.partitions(topic).values())
        await starting[0]
    finally:
        bring_back(cluster, topic)


async def test_a_broker_that_does_not_come_back_stalls_the_roll(cluster: Cluster) -> None:
    topic = new_topic(cluster, "stall")
    try:
        roller = Roller(ClusterAdmin(cluster.bootstrap), rejoin_timeout_s=2, poll_s=0.2)

        async def stop_only() -> None:
            await asyncio.to_thread(cluster.brokers[2].stop)

        with pytest.raises(RollStalled) as raised:
            await roller.restart_safely(2, stop_only)

        assert raised.value.node_id == 2
        assert raised.value.reasons == ["broker 2 is not registered"]
    finally:
        bring_back(cluster, topic)


async def test_rolls_every_broker_one_at_a_time_without_losing_acknowledged_records(
    cluster: Cluster,
) -> None:
    topic = new_topic(cluster, "roll", partitions=3)
    admin = ClusterAdmin(cluster.bootstrap)
    roller = Roller(admin, poll_s=0.2)
    controller = cluster.admin().list_topics(timeout=10).controller_id
    order = await roller.order([0, 1, 2])
    assert order[-1] == controller and sorted(order) == [0, 1, 2]

    pids_before = {n: b.process.pid for n, b in cluster.brokers.items()}  # type: ignore[union-attr]
    restarted: list[int] = []
    others_up: list[bool] = []
    # While each broker was down: were exactly the two others registered?
    isr_full_before: list[bool] = []

    async def restart(node: int) -> None:
        isr_full_before.append(all(len(v.isr) == 3 for v in cluster.partitions(topic).values()))
        await asyncio.to_thread(cluster.brokers[node].stop)
        restarted.append(node)
        registered = await asyncio.to_thread(lambda: cluster.admin().list_topics(timeout=10))
        others_up.append(sorted(registered.brokers) == sorted(set(cluster.brokers) - {node}))
        # The new process starts after the callback returns, as a deleted pod's successor does.
        starting.append(asyncio.create_task(asyncio.to_thread(cluster.brokers[node].start)))

    starting: list[asyncio.Task[BrokerProcess]] = []
    producer = SteadyProducer(cluster.bootstrap, topic, rate=200).start()
    try:
        await roller.roll(order, restart)
        # The roller returned only once the last broker was back in every ISR.
        isr_after = [v.isr for v in cluster.partitions(topic).values()]
    finally:
        producer.stop()
        await asyncio.gather(*starting)

    assert restarted == order
    assert others_up == [True, True, True]
    assert isr_full_before == [True, True, True]
    pids_after = {n: b.process.pid for n, b in cluster.brokers.items()}  # type: ignore[union-attr]
    assert all(pids_after[n] != pids_before[n] for n in order)
    assert isr_after == [(0, 1, 2)] * 3

    assert producer.errors == []
    assert producer.acked, "nothing acknowledged during the roll"
    ends: dict[int, int] = {}
    for _, partition, offset, _ in producer.acked:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    stored = {
        (r.partition, r.offset): r.value for r in confluent_consume(cluster.bootstrap, topic, ends)
    }
    lost = [
        seq
        for seq, partition, offset, _ in producer.acked
        if stored.get((partition, offset)) != b"seq-%d" % seq
    ]
    assert lost == []
