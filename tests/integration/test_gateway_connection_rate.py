"""A tenant's connection creation rate (maxConnectionRate, Kafka's KIP-612) through the gateway.

Logins faster than the rate are held, not failed: twenty clients opening
their connections at once at 4 a second are all served, one after another,
over some four seconds, while a neighbour tenant logs in at once. A login
whose hold would pass 10 s is refused with SASL_AUTHENTICATION_FAILED and a
message naming the limit. Held and refused logins are both counted in
``shoal_gateway_limit_refusals_total{limit="connection_rate"}``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from conftest import GatewayCluster, module_gateway_cluster
from gateway_env import TenantKey, limit_refusals, sasl_login
from harness import EtcdServer
from raw_kafka import RawConnection
from shoal.tenancy.model import Quotas

SASL_AUTHENTICATION_FAILED = 58
CLIENTS = 20
RATE = 4.0


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    """One broker behind one gateway: the limits are the gateway's."""
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "connection-rate", brokers=1)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def login(key: TenantKey) -> tuple[int, str | None, float]:
    """One bare SASL/PLAIN login: its error code, message and how long its answer took."""
    started = time.monotonic()
    with RawConnection(key.bootstrap(), timeout=30) as connection:
        answer = sasl_login(connection, key.key_id, key.secret)
    return answer.error_code, answer.error_message, time.monotonic() - started


def refusals(key: TenantKey) -> float:
    return limit_refusals(key, "connection_rate")


def test_a_login_storm_is_paced_at_the_rate_and_every_client_is_served(
    cluster: GatewayCluster,
) -> None:
    stormy = cluster.tenant(unique("stormy"), quotas=Quotas(max_connection_rate=RATE))
    calm = cluster.tenant(unique("calm"), quotas=Quotas(max_connection_rate=RATE))
    served: list[float] = []
    failures: list[BaseException] = []
    started = time.monotonic()

    def connect() -> None:
        try:
            producer = Producer(stormy.librdkafka())
            producer.list_topics(timeout=30)
            served.append(time.monotonic() - started)
        except Exception as exc:  # reported by the test below
            failures.append(exc)

    clients = [threading.Thread(target=connect) for _ in range(CLIENTS)]
    for client in clients:
        client.start()
    # While the storm is held, the neighbour's logins are not.
    time.sleep(1.0)
    neighbour = [login(calm) for _ in range(3)]
    for client in clients:
        client.join(60)

    assert failures == []
    assert len(served) == CLIENTS
    # 4 at once, then one every quarter second: the twentieth about 4 s in.
    assert max(served) >= 0.85 * (CLIENTS - RATE) / RATE, sorted(served)
    assert min(served) < 2.0, "the first second's worth went at once"
    assert [code for code, _, _ in neighbour] == [0, 0, 0]
    assert max(took for _, _, took in neighbour) < 1.0, neighbour
    assert refusals(stormy) >= CLIENTS - RATE
    assert refusals(calm) == 0


def test_a_login_held_past_ten_seconds_is_refused_with_the_limit_named(
    cluster: GatewayCluster,
) -> None:
    # A quarter login a second: one at once, then 4 s, 8 s; the next would wait 12 s.
    slow = cluster.tenant(unique("slow"), quotas=Quotas(max_connection_rate=0.25))
    answers: list[tuple[int, str | None, float]] = []

    def connect() -> None:
        answers.append(login(slow))

    logins = [threading.Thread(target=connect) for _ in range(5)]
    for thread in logins:
        thread.start()
    for thread in logins:
        thread.join(60)

    accepted = sorted(took for code, _, took in answers if code == 0)
    refused = [message for code, message, _ in answers if code == SASL_AUTHENTICATION_FAILED]
    assert len(accepted) == 3 and len(refused) == 2, answers
    assert accepted[0] < 1.0 and accepted[2] > 7.0, "held 0, 4 and 8 seconds"
    for message in refused:
        assert message is not None
        assert f"tenant {slow.tenant} opens connections faster than its limit" in message
        assert "(maxConnectionRate) of 0.25/s; retry later" in message
    assert refusals(slow) == 4, "two held and two refused"
