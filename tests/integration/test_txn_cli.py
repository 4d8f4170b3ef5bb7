"""``shoal txn`` against three brokers and through the gateway: finding a hanging
transaction and aborting it, as an operator (or a tenant) does with kafka-transactions.sh.

A transaction left open holds back every read_committed consumer of its
partitions. ``shoal txn list`` and ``describe`` show it Ongoing with its
partitions, ``describe-producers`` shows the offset it started at, and
``shoal txn abort`` fences its producer so the coordinator aborts it: the
records written after it become readable. Through the gateway a tenant sees
its own ids under its own names, and another tenant sees none of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from conftest import GatewayCluster, module_gateway_cluster
from harness import EtcdServer
from test_transactions import ROUTES, TXN_ENV, Route, tenant

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TIMEOUT_S = 60
SHOAL_TXN = (sys.executable, "-m", "shoal", "txn")
OPEN_FOR_MS = 300_000
"""The hanging transaction's timeout: longer than the test, so only ``abort`` ends it."""


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "txn-cli", TXN_ENV)


@pytest.fixture(params=list(ROUTES))
def route(request: pytest.FixtureRequest, cluster: GatewayCluster) -> Route:
    return ROUTES[request.param](cluster)


def properties(route: Route, directory: Path) -> Path:
    """The route's settings as a client.properties, for ``-F``."""
    path = directory / f"{route.name}-{uuid.uuid4().hex[:6]}.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in route.settings.items()))
    return path


def shoal_txn(config: Path, *args: str, output: str = "json") -> Any:
    """``shoal txn ARGS -o json -F config``'s parsed output (the text for
    ``output="table"``); the command must succeed."""
    result = subprocess.run(
        [*SHOAL_TXN, *args, "-o", output, "-F", str(config)],
        capture_output=True,
        timeout=TIMEOUT_S + 30,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout) if output == "json" else result.stdout.decode()


def read_committed(route: Route, topic: str, seconds: float) -> list[bytes]:
    consumer = route.consumer("read_committed")
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while not got and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    return got


def test_a_hanging_transaction_is_found_and_aborted(route: Route, tmp_path: Path) -> None:
    config = properties(route, tmp_path)
    topic = route.create_topic(partitions=1)
    transactional_id = f"hanging-{uuid.uuid4().hex[:6]}"
    hanging = route.producer(transactional_id, **{"transaction.timeout.ms": OPEN_FOR_MS})
    hanging.init_transactions(TIMEOUT_S)
    hanging.begin_transaction()
    hanging.produce(topic, value=b"never", partition=0)
    hanging.flush(TIMEOUT_S)
    plain = Producer(route.settings)
    plain.produce(topic, value=b"after", partition=0)
    assert plain.flush(TIMEOUT_S) == 0

    listed = shoal_txn(config, "list")
    (row,) = [r for r in listed if r["transactional_id"] == transactional_id]
    assert row["state"] == "Ongoing"
    described = shoal_txn(config, "describe", transactional_id)
    assert (described["state"], described["partitions"]) == ("Ongoing", [f"{topic}-0"])
    assert described["producer_id"] == row["producer_id"]
    assert described["start_time"] is not None
    table = shoal_txn(config, "describe", transactional_id, output="table")
    assert "Ongoing" in table and f"{topic}-0" in table
    producers = shoal_txn(config, "describe-producers", topic, "--partition", "0")
    (mine,) = [p for p in producers if p["producer_id"] == described["producer_id"]]
    assert (mine["partition"], mine["current_txn_start_offset"]) == (0, 0)
    # The open transaction holds back the record after it.
    assert read_committed(route, topic, 2.0) == []

    aborted = shoal_txn(config, "abort", transactional_id)

    assert aborted["state_before"] == "Ongoing"
    assert aborted["producer_epoch"] > described["producer_epoch"]
    assert read_committed(route, topic, TIMEOUT_S) == [b"after"]
    after = shoal_txn(config, "describe-producers", topic, "--partition", "0")
    assert [
        p["current_txn_start_offset"] for p in after if p["producer_id"] == mine["producer_id"]
    ] == [-1]
    with pytest.raises(KafkaException):
        hanging.commit_transaction(TIMEOUT_S)


def test_a_tenant_never_sees_another_tenants_transactions(
    cluster: GatewayCluster, tmp_path: Path
) -> None:
    acme, globex = tenant(cluster), tenant(cluster)
    acme_config, globex_config = properties(acme, tmp_path), properties(globex, tmp_path)
    topic = acme.create_topic(partitions=1)
    transactional_id = f"private-{uuid.uuid4().hex[:6]}"
    producer = acme.producer(transactional_id, **{"transaction.timeout.ms": OPEN_FOR_MS})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, value=b"acme", partition=0)
    producer.flush(TIMEOUT_S)
    try:
        assert transactional_id in {r["transactional_id"] for r in shoal_txn(acme_config, "list")}
        theirs = shoal_txn(globex_config, "list")
        assert not [r for r in theirs if transactional_id in r["transactional_id"]]
        # Naming it lands in globex's own namespace, where there is no such id.
        result = subprocess.run(
            [*SHOAL_TXN, "describe", transactional_id, "-F", str(globex_config)],
            capture_output=True,
            timeout=TIMEOUT_S + 30,
        )
        assert result.returncode == 1
        assert "TRANSACTIONAL_ID_NOT_FOUND" in result.stderr.decode().upper()
    finally:
        producer.abort_transaction(TIMEOUT_S)
