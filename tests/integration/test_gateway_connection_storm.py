"""A tenant opening a thousand connections at once gets its limit's worth, and its
neighbours do not notice.

The crowded tenant's ``maxConnections`` is 100: a thousand logins arrive from 32
threads at once (in a process of their own at the lowest CPU priority, as
clients on machines of their own would be); a hundred are let in, the other 900 are refused with
SASL_AUTHENTICATION_FAILED and a message naming the limit, each counted in
``shoal_gateway_limit_refusals_total``. Meanwhile a neighbour tenant produces
200 records a second (``acks=all``, ``linger.ms=0``, confluent-kafka) through
the same gateway: every record is acknowledged, none fails. Its latency during
the storm is printed beside its latency just before: a figure for the machine
to judge (run alone), not asserted here.
"""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import GatewayCluster, module_gateway_cluster
from gateway_env import TenantKey, limit_refusals
from harness import EtcdServer
from login_storm import STORM, open_connections
from shoal.tenancy.model import Quotas
from test_gateway_connection_limits import ROUND_S, SASL_AUTHENTICATION_FAILED

# The neighbour's latency it prints is the machine's: by itself, after the rest.
pytestmark = pytest.mark.alone

LIMIT = 100
PROBE_RATE = 200
"""The neighbour's records a second: a modest, steady load."""
PHASE_S = 5.0


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    """One broker behind one gateway: the limit is the gateway's."""
    yield from module_gateway_cluster(
        etcd, tmp_path_factory, request, "connection-storm", brokers=1
    )


class LatencyProbe(threading.Thread):
    """A neighbour's producer at :data:`PROBE_RATE`, each record's produce-to-acknowledgement
    time kept under the phase it was sent in."""

    def __init__(self, key: TenantKey, topic: str) -> None:
        super().__init__(daemon=True, name="probe")
        self.producer = Producer(key.librdkafka(**{"acks": "all", "linger.ms": 0}))
        self.topic = topic
        self.phase = "warm-up"
        self.latencies: dict[str, list[float]] = {}
        self.errors: list[str] = []
        self.sent = 0
        self._halt = threading.Event()

    def run(self) -> None:
        interval = 1 / PROBE_RATE
        next_at = time.monotonic()
        while not self._halt.is_set():
            phase, sent_at = self.phase, time.monotonic()

            def acknowledged(
                err: object, _msg: object, phase: str = phase, at: float = sent_at
            ) -> None:
                if err is not None:
                    self.errors.append(str(err))
                else:
                    self.latencies.setdefault(phase, []).append(time.monotonic() - at)

            self.producer.produce(self.topic, b"x" * 200, on_delivery=acknowledged)
            self.sent += 1
            next_at += interval
            # Polling all the while, not sleeping: an acknowledgement is timed when it
            # arrives, not at the next send (which hid everything under 5 ms).
            while (left := next_at - time.monotonic()) > 0 and not self._halt.is_set():
                self.producer.poll(left)
        self.producer.flush(30)

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def test_a_thousand_connections_at_once_get_the_limit_and_the_neighbours_keep_their_latency(
    cluster: GatewayCluster,
) -> None:
    crowd = cluster.tenant("crowd", quotas=Quotas(max_connections=LIMIT))
    neighbour = cluster.tenant("neighbour")
    time.sleep(ROUND_S)
    admin = AdminClient(neighbour.librdkafka())
    admin.create_topics([NewTopic("probe", 1)])["probe"].result(30)
    probe = LatencyProbe(neighbour, "probe")
    probe.start()
    # The storm's clients in a process of their own, as another tenant's would be: in
    # this one, 32 threads logging in would hold the GIL from the probe's callbacks.
    spawn = multiprocessing.get_context("spawn")
    answered: multiprocessing.Queue[tuple[float, list[tuple[int, str | None]]]] = spawn.Queue()
    go, release = spawn.Event(), spawn.Event()
    clients = spawn.Process(
        target=open_connections,
        args=(crowd.bootstrap(), crowd.key_id, crowd.secret, answered, go, release),
    )
    clients.start()
    try:
        time.sleep(2.0)
        probe.phase = "before"
        time.sleep(PHASE_S)
        probe.phase = "storm"
        go.set()
        storm_s, answers = answered.get(timeout=120)
        time.sleep(max(0.0, PHASE_S - storm_s))
        probe.phase = "after"
        time.sleep(1.0)
    finally:
        probe.stop()
        go.set()
        release.set()
        clients.join(30)

    refused = [(code, message) for code, message in answers if code != 0]
    assert len(answers) - len(refused) == LIMIT
    assert len(refused) == STORM - LIMIT
    assert {code for code, _ in refused} == {SASL_AUTHENTICATION_FAILED}
    assert all(
        message is not None and "maxConnections" in message and f"{LIMIT} connections" in message
        for _, message in refused
    ), refused[:3]
    assert limit_refusals(crowd, "connections") == STORM - LIMIT

    assert probe.errors == []
    acknowledged = sum(len(v) for v in probe.latencies.values())
    assert acknowledged == probe.sent
    before, during = p99(probe.latencies["before"]), p99(probe.latencies["storm"])
    print(
        f"\n{STORM} logins in {storm_s:.2f} s; the neighbour's p99 before"
        f" {before * 1000:.1f} ms, during the storm {during * 1000:.1f} ms"
    )
