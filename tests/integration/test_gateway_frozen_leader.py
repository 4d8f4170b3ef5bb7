"""A partition leader frozen (SIGSTOP) under a producer that writes through the gateway.

Kafka clients wait on a frozen broker for their ``request.timeout.ms``; the
gateway knows sooner: once the broker's etcd session expires and the
brokers stop counting it, the gateway disconnects the clients it relayed to
it, and they retry where the partition is led now. So acknowledgements
resume while the old leader is still frozen, nothing acknowledged is lost,
and when it wakes it rejoins as a follower.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import EtcdServer, GatewayCluster, module_gateway_cluster
from faults import FaultInjector
from harness import wait_until

from shoal.history.checker import check
from shoal.history.events import Event, Kind
from shoal.history.workload import Run, Workload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FROZEN_S = 30.0


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "frozen-leader")


def acks_between(events: list[Event], start: float, end: float) -> list[Event]:
    return [e for e in events if e.kind is Kind.ACK and not e.error and start < e.time < end]


def test_acknowledgements_resume_while_the_old_leader_is_still_frozen(
    cluster: GatewayCluster,
) -> None:
    key = cluster.tenant("frozen")
    settings = key.librdkafka()
    admin = AdminClient(settings)  # alive until its future resolves
    topic = NewTopic("orders", 1, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic])["orders"].result(30)
    injector = FaultInjector(cluster, "frozen.orders", time.monotonic)
    wait_until(lambda: injector.leader_of(0) >= 0, 30, "a leader for frozen.orders")

    run = Run(Workload(settings, "orders", producers=1, consumers=0, rate=200)).start()
    time.sleep(3)
    leader = injector.broker(injector.leader_of(0))
    frozen_at = run.history.now()
    leader.pause()
    try:
        time.sleep(FROZEN_S)
        events = list(run.history.events)
        resumed = acks_between(events, frozen_at + 1.0, frozen_at + FROZEN_S)
    finally:
        leader.resume()
    events = run.finish()

    report = check(events)
    print(report.summary())
    assert report.ok, report.summary()
    assert resumed, (
        f"no acknowledgement in the {FROZEN_S:.0f} s the leader was frozen:\n"
        f"{cluster.gateway.log_tail()}"
    )
    first = min(e.time for e in resumed) - frozen_at
    print(f"acknowledgements resumed {first:.1f} s after the leader froze")
    assert "event=gateway_broker_gone" in cluster.gateway.log_text()
