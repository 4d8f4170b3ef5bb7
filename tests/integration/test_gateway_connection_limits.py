"""A tenant's connection limit (maxConnections) holds over every gateway replica.

A tenant at its limit is refused at login with SASL_AUTHENTICATION_FAILED and
a message naming the limit, the refusal is counted in
``shoal_gateway_limit_refusals``, other tenants log in as before, and a
closed connection frees its place. Replicas learn each other's counts every
second (the quota rounds), so the test waits a round before it crosses over.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Producer
from conftest import GatewayCluster, module_gateway_cluster
from gateway_env import GatewayProcess, TenantKey, limit_refusals, sasl_login
from harness import EtcdServer, wait_until
from raw_kafka import RawConnection
from shoal.tenancy.model import Quotas

LIMIT = 5
ROUND_S = 1.5
"""Longer than the replicas' one-second round of reports."""
SASL_AUTHENTICATION_FAILED = 58


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    """One broker behind one gateway: the limits are the gateway's."""
    yield from module_gateway_cluster(
        etcd, tmp_path_factory, request, "connection-limits", brokers=1
    )


def login(key: TenantKey) -> tuple[RawConnection, int, str | None]:
    connection = RawConnection(key.bootstrap())
    answer = sasl_login(connection, key.key_id, key.secret)
    return connection, answer.error_code, answer.error_message


def refusals(key: TenantKey) -> float:
    return limit_refusals(key, "connections")


def test_a_tenant_at_its_connection_limit_is_refused_at_login_and_others_are_not(
    cluster: GatewayCluster,
) -> None:
    limited = cluster.tenant("crowded", quotas=Quotas(max_connections=LIMIT))
    other = cluster.tenant("roomy")
    time.sleep(ROUND_S)
    held = []
    try:
        for _ in range(LIMIT):
            connection, code, _ = login(limited)
            assert code == 0
            held.append(connection)
        connection, code, message = login(limited)
        connection.close()
        assert code == SASL_AUTHENTICATION_FAILED
        assert message is not None and "maxConnections" in message and str(LIMIT) in message
        assert refusals(limited) == 1

        # Another tenant's connections are not counted against this one's.
        others = [login(other) for _ in range(LIMIT + 2)]
        assert [code for _, code, _ in others] == [0] * (LIMIT + 2)
        for connection, _, _ in others:
            connection.close()

        # A real client is told the same, and a closed connection frees a place.
        errors: list[KafkaError] = []
        producer = Producer(limited.librdkafka(error_cb=errors.append))
        wait_until(lambda: producer.poll(0.2) >= 0 and errors, 30, "the client's error")
        assert errors[0].code() == KafkaError._AUTHENTICATION, errors
        assert "maxConnections" in errors[0].str()
        held.pop().close()
        wait_until(lambda: login_succeeds(limited), 10, "a freed place")
    finally:
        for connection in held:
            connection.close()


def login_succeeds(key: TenantKey) -> bool:
    connection, code, _ = login(key)
    connection.close()
    return code == 0


def login_refused(key: TenantKey) -> bool:
    """Whether a login is refused for the connection limit (a success is closed again)."""
    connection, code, message = login(key)
    connection.close()
    return code == SASL_AUTHENTICATION_FAILED and "maxConnections" in (message or "")


def test_the_limit_counts_connections_on_every_replica(cluster: GatewayCluster) -> None:
    first = cluster.gateway
    second = GatewayProcess(
        first.etcd_url, first.upstream, cluster.root / "second-gateway", brokers=1
    ).start()
    key = cluster.tenant("spread", quotas=Quotas(max_connections=4))
    on_second = dataclasses.replace(key, gateway=second)
    held = []
    try:
        time.sleep(ROUND_S)
        for _ in range(3):
            connection, code, _ = login(key)
            assert code == 0
            held.append(connection)
        connection, code, _ = login(on_second)
        assert code == 0
        held.append(connection)
        # Each replica hears of the other's connections within a round or two of etcd
        # reports (ROUND_S; a busy machine may take longer), then refuses a fifth.
        wait_until(lambda: login_refused(on_second), 10, "the second replica to refuse a fifth")
        wait_until(lambda: login_refused(key), 10, "the first replica to refuse a fifth")
        connection, code, message = login(on_second)
        connection.close()
        assert code == SASL_AUTHENTICATION_FAILED, message
    finally:
        for connection in held:
            connection.close()
        second.stop()
