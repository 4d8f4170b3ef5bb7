"""KafkaJS, the Node.js client, against Shoal: on three brokers, and through the gateway as a
tenant (SASL/PLAIN with the tenant's API key, no TLS).

What a KafkaJS user checks:

* the transactional producer (``producer({transactionalId, idempotent: true,
  maxInFlightRequests: 1})``, ``producer.transaction()``, ``transaction.send``,
  ``commit``/``abort``) writes a committed, an aborted and a committed transaction; a
  KafkaJS consumer with ``readUncommitted: false`` gets the committed records once and the
  aborted ones never, with ``readUncommitted: true`` both, and neither gets a marker; and
  confluent-kafka's read_committed consumer agrees;
* consume-transform-produce with ``transaction.sendOffsets``: the output and the group's
  offsets (read back with ``admin.fetchOffsets``) commit together, and an aborted round
  moves neither;
* the admin client, as a tenant, creates a topic, reads its metadata and offsets under the
  tenant's own name, and another tenant does not list it;
* a tenant's key signs in with SASL/SCRAM-SHA-256 and -512, produces and consumes; a
  wrong password gets KafkaJS's SASL authentication error with the gateway's reason.

``make kafkajs`` installs KafkaJS at the version tests/integration/kafkajs/package.json
pins, into ~/.cache/shoal (the fixture runs it, so this test never skips). The client code
is tests/integration/kafkajs/steps.js, run by ``node`` with ``NODE_PATH`` at the cache: it
takes its steps as JSON and prints one JSON line a step.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from conftest import GatewayCluster, module_gateway_cluster
from gateway_env import TenantKey
from harness import EtcdServer
from test_transactions import PARTITIONS, TIMEOUT_S, TXN_ENV, Route, read_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
STEPS_JS = Path(__file__).resolve().parent / "kafkajs" / "steps.js"
PACKAGE_JSON = STEPS_JS.with_name("package.json")
SETTLE_MS = 2000


def pinned_version() -> str:
    version: str = json.loads(PACKAGE_JSON.read_text())["dependencies"]["kafkajs"]
    return version


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """KafkaJS at the pinned version, installed by ``make kafkajs`` (a no-op when warm)."""
    home = Path.home() / ".cache" / "shoal" / f"kafkajs-{pinned_version()}"
    subprocess.run(["make", "kafkajs", f"KAFKAJS_HOME={home}"], cwd=REPO, check=True, timeout=600)
    installed = json.loads((home / "node_modules" / "kafkajs" / "package.json").read_text())
    assert installed["version"] == pinned_version()
    return home / "node_modules"


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "kafkajs", TXN_ENV)


@dataclass
class KafkaJs:
    """One way to the cluster for KafkaJS (straight to the brokers, or as a tenant through
    the gateway), and confluent-kafka's settings for the same way, to set up and cross-check."""

    name: str
    node_modules: Path
    bootstrap: str
    key: TenantKey | None
    mechanism: str = "plain"
    """KafkaJS's name of the SASL mechanism: plain, scram-sha-256 or scram-sha-512."""

    @property
    def route(self) -> Route:
        settings = self.key.librdkafka() if self.key else {"bootstrap.servers": self.bootstrap}
        return Route(self.name, settings)

    def connection(self) -> dict[str, Any]:
        connection: dict[str, Any] = {"brokers": self.bootstrap.split(",")}
        if self.key is not None:
            connection.update(
                username=self.key.key_id, password=self.key.secret, mechanism=self.mechanism
            )
        return connection

    def run(self, *steps: dict[str, Any]) -> list[dict[str, Any]]:
        """Run the steps in one node process; each step's JSON line, in order."""
        done = subprocess.run(
            ["node", str(STEPS_JS), json.dumps({"connection": self.connection(), "steps": steps})],
            # KafkaJS 2 warns, at every producer, that its default partitioner changed in 2.0.
            env={
                **os.environ,
                "NODE_PATH": str(self.node_modules),
                "KAFKAJS_NO_PARTITIONER_WARNING": "1",
            },
            capture_output=True,
            text=True,
            timeout=4 * TIMEOUT_S,
        )
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert done.returncode == 0, f"{lines}\n{done.stderr}"
        assert [line["step"] for line in lines] == [step["kind"] for step in steps], done.stderr
        return lines


@pytest.fixture(params=["direct", "gateway"])
def kafkajs(request: pytest.FixtureRequest, cluster: GatewayCluster, node_modules: Path) -> KafkaJs:
    if request.param == "direct":
        return KafkaJs("direct", node_modules, cluster.internal_bootstrap, None)
    key = cluster.tenant(f"t{uuid.uuid4().hex[:6]}")
    return KafkaJs("gateway", node_modules, key.bootstrap(), key)


def consume(topic: str, read_uncommitted: bool, expected: int) -> dict[str, Any]:
    return {
        "kind": "consume",
        "topic": topic,
        "readUncommitted": read_uncommitted,
        "expected": expected,
        "settleMs": SETTLE_MS,
        "timeoutMs": TIMEOUT_S * 1000,
    }


def test_kafkajs_commits_and_aborts_and_its_consumer_honours_isolation(kafkajs: KafkaJs) -> None:
    topic = kafkajs.route.create_topic()
    first = [f"kafkajs-first-{i}" for i in range(12)]
    aborted = [f"kafkajs-aborted-{i}" for i in range(7)]
    last = [f"kafkajs-last-{i}" for i in range(5)]
    committed_values = sorted(first + last)
    every_value = sorted(first + aborted + last)

    produced, ends, committed, everything = kafkajs.run(
        {
            "kind": "transactions",
            "transactionalId": f"kafkajs-{uuid.uuid4().hex[:6]}",
            "topic": topic,
            "partitions": PARTITIONS,
            "transactions": [
                {"values": first, "commit": True},
                {"values": aborted, "commit": False},
                {"values": last, "commit": True},
            ],
        },
        {"kind": "endOffsets", "topic": topic},
        consume(topic, read_uncommitted=False, expected=len(committed_values)),
        consume(topic, read_uncommitted=True, expected=len(every_value)),
    )
    assert produced["outcomes"] == ["committed", "aborted", "committed"]
    read_committed = sorted(r["value"] for r in committed["records"])
    # Where each record was read from tells a duplicate in the log (two offsets) from
    # one delivered twice (one offset), and which partition it came from.
    where = sorted((r["value"], r["partition"], int(r["offset"])) for r in everything["records"])
    assert read_committed == committed_values, (committed["records"], where)
    assert sorted(r["value"] for r in everything["records"]) == every_value, where
    # The markers (one per partition and transaction) take offsets; no consumer hands one
    # to the application, so the records and the markers fill each partition exactly.
    high = {o["partition"]: o["high"] for o in ends["offsets"]}
    assert sum(high.values()) == len(every_value) + 3 * PARTITIONS
    for partition, end in high.items():
        offsets = {int(r["offset"]) for r in everything["records"] if r["partition"] == partition}
        assert len(offsets) + 3 == end, (partition, sorted(offsets), end)
        assert max(offsets) < end
    # What KafkaJS wrote, another client reads the same way.
    other = read_all(kafkajs.route.consumer("read_committed"), topic, len(committed_values))
    assert sorted(other) == committed_values


def test_kafkajs_sends_offsets_with_its_transaction(kafkajs: KafkaJs) -> None:
    """Consume-transform-produce with ``transaction.sendOffsets``."""
    route = kafkajs.route
    source, sink = route.create_topic(), route.create_topic()
    plain = Producer(route.settings)
    inputs = [f"in-{i}" for i in range(30)]
    for i, value in enumerate(inputs):
        plain.produce(source, value=value.encode(), partition=i % PARTITIONS)
    assert plain.flush(TIMEOUT_S) == 0
    group = f"kafkajs-transform-{uuid.uuid4().hex[:6]}"

    def transform(expected: int, commit: bool) -> dict[str, Any]:
        (done,) = kafkajs.run(
            {
                "kind": "transform",
                "source": source,
                "sink": sink,
                "groupId": group,
                "transactionalId": f"kafkajs-transform-{uuid.uuid4().hex[:6]}",
                "expected": expected,
                "commit": commit,
                "timeoutMs": TIMEOUT_S * 1000,
            }
        )
        return done

    done = transform(len(inputs), commit=True)
    assert done["transformed"] == len(inputs)
    per_partition = {str(p): len(inputs[p::PARTITIONS]) for p in range(PARTITIONS)}
    assert done["committed"] == per_partition

    # An aborted round moves neither the output nor the offsets.
    extra = [f"in-extra-{i}" for i in range(6)]
    for i, value in enumerate(extra):
        plain.produce(source, value=value.encode(), partition=i % PARTITIONS)
    assert plain.flush(TIMEOUT_S) == 0
    aborted = transform(len(extra), commit=False)
    assert aborted["transformed"] == len(extra)
    assert aborted["committed"] == per_partition

    outputs = read_all(route.consumer("read_committed"), sink, len(inputs))
    assert sorted(outputs) == sorted(v.replace("in-", "out-") for v in inputs)


def test_kafkajs_admin_sees_the_tenants_own_topics(
    cluster: GatewayCluster, node_modules: Path
) -> None:
    ours, theirs = (cluster.tenant(f"t{uuid.uuid4().hex[:6]}") for _ in range(2))
    mine = KafkaJs("gateway", node_modules, ours.bootstrap(), ours)
    other = KafkaJs("gateway", node_modules, theirs.bootstrap(), theirs)
    topic, their_topic = f"kafkajs-{uuid.uuid4().hex[:6]}", f"kafkajs-{uuid.uuid4().hex[:6]}"

    (created,) = mine.run({"kind": "admin", "topic": topic, "partitions": PARTITIONS})
    assert created["created"] is True
    # The tenant's own name everywhere, and nothing of anyone else's (nor the internal topics).
    assert [t["name"] for t in created["metadata"]] == [topic]
    partitions = created["metadata"][0]["partitions"]
    assert sorted(p["partition"] for p in partitions) == list(range(PARTITIONS))
    assert created["listed"] == [topic]
    assert sorted(o["partition"] for o in created["offsets"]) == list(range(PARTITIONS))

    (seen,) = other.run({"kind": "admin", "topic": their_topic, "partitions": 1})
    assert seen["listed"] == [their_topic]


@pytest.mark.parametrize("mechanism", ["scram-sha-256", "scram-sha-512"])
def test_kafkajs_signs_in_with_scram_produces_and_consumes(
    cluster: GatewayCluster, node_modules: Path, mechanism: str
) -> None:
    key = cluster.tenant(f"s{uuid.uuid4().hex[:6]}")
    kafkajs = KafkaJs("gateway", node_modules, key.bootstrap(), key, mechanism)
    topic = kafkajs.route.create_topic(partitions=1)
    values = [f"scram-{i}" for i in range(10)]
    log_start = len(cluster.gateway.log_text())
    produced, consumed = kafkajs.run(
        {"kind": "produce", "topic": topic, "values": values},
        {**consume(topic, True, len(values)), "settleMs": 0},
    )
    assert [s["partition"] for s in produced["sent"]] == [0]
    assert sorted(r["value"] for r in consumed["records"]) == sorted(values)
    log = cluster.gateway.log_text()[log_start:]
    logins = re.findall(rf"event=gateway_authenticated .*key={key.key_id} mechanism=(\S+)", log)
    assert logins and set(logins) == {mechanism.upper()}, logins


def test_kafkajs_with_a_wrong_scram_password_gets_a_sasl_authentication_error(
    cluster: GatewayCluster, node_modules: Path
) -> None:
    key = cluster.tenant(f"s{uuid.uuid4().hex[:6]}")
    wrong = replace(key, secret=key.secret + "x")
    kafkajs = KafkaJs("gateway", node_modules, key.bootstrap(), wrong, "scram-sha-512")
    with pytest.raises(AssertionError) as failed:
        kafkajs.run({"kind": "produce", "topic": "anything", "values": ["x"]})
    assert "KafkaJSSASLAuthenticationError" in str(failed.value)
    assert "invalid API key or secret" in str(failed.value)
