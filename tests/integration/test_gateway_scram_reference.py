"""SCRAM refusals side by side: Apache Kafka 4.3.1 and the gateway answer alike.

Kafka runs with a SASL_PLAINTEXT listener beside its plain one, SCRAM-SHA-256
and -512 enabled, and a user made with AlterUserScramCredentials; the gateway
with a tenant's key. Each scenario is played on the wire against both, and
what a client can observe must be the same: at which message the exchange
ends (client-first or client-final), the SaslAuthenticate error code, and
that the connection is then closed. The messages differ on purpose (Kafka's
is one generic sentence, the gateway's says which rule was broken), so they
are not compared.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import scramp
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from gateway_env import TenantKey
from harness import wait_until
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection
from shoal.benchmarks.apache_kafka import (
    SHORT_RUN_JVM_OPTS,
    ApacheKafka,
    KafkaNode,
    default_kafka_home,
    free_port_block,
)
from test_gateway_auth import authenticate, closed_by_peer, handshake, known_to_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
KAFKA_USER, KAFKA_PASSWORD = "alice", "alice-secret"


class ScramKafka(ApacheKafka):
    """The benchmarks' KRaft cluster, each broker with a SCRAM listener of its own
    (brokers and tools keep using the plain one, so nothing else changes)."""

    def __init__(self, data_dir: Path, kafka_home: Path) -> None:
        super().__init__(
            data_dir,
            kafka_home,
            broker_heap=("-Xmx512m", "-Xms128m"),
            jvm_opts=SHORT_RUN_JVM_OPTS,
        )
        base = free_port_block(len(self.brokers))
        self.sasl_ports = {b.node_id: base + i for i, b in enumerate(self.brokers)}

    def _settings(self, node: KafkaNode) -> dict[str, str]:
        settings = super()._settings(node)
        if node.role == "controller":
            return settings
        sasl = f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_ports[node.node_id]}"
        return {
            **settings,
            "listeners": f"{settings['listeners']},{sasl}",
            "advertised.listeners": f"{settings['advertised.listeners']},{sasl}",
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
            ),
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": SCRAM_LOGIN,
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_LOGIN,
        }

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_ports[self.brokers[0].node_id]}"


@dataclass(frozen=True)
class Peer:
    name: str
    bootstrap: str
    username: str
    password: str


@dataclass(frozen=True)
class Outcome:
    """What a client sees: the message the exchange ended at, its code, the close."""

    ended_at: str
    error_code: int
    closed: bool


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=840)
    cluster = ScramKafka(tmp_path_factory.mktemp("scram-kafka"), home)
    with cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        # One request per mechanism: Kafka refuses a user twice in one request.
        for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
            upsert = UserScramCredentialUpsertion(
                KAFKA_USER, ScramCredentialInfo(mechanism, 4096), KAFKA_PASSWORD.encode()
            )
            for future in admin.alter_user_scram_credentials([upsert]).values():
                future.result(60)
        peer = Peer("kafka", cluster.sasl_bootstrap, KAFKA_USER, KAFKA_PASSWORD)
        # The credential reaches the brokers through the metadata log.
        wait_until(lambda: play(peer, "SCRAM-SHA-512", good).error_code == 0, 60, "alice")
        yield peer


@pytest.fixture(scope="module")
def gateway(gateway_cluster: Any) -> Peer:
    key: TenantKey = known_to_gateway(gateway_cluster.tenant("scram-reference"))
    return Peer("gateway", key.bootstrap(), key.key_id, key.secret)


# -- the scenarios: each plays one exchange on a fresh connection ----------------------------


Scenario = Callable[[RawConnection, str, Peer], Outcome]


def _client(mechanism: str, peer: Peer, password: str | None = None) -> scramp.ScramClient:
    return scramp.ScramClient([mechanism], peer.username, password or peer.password)


def _first(conn: RawConnection, mechanism: str, message: bytes) -> Any:
    assert handshake(conn, mechanism).error_code == ErrorCode.none
    return authenticate(conn, message)


def _ended(conn: RawConnection, at: str, response: Any) -> Outcome:
    closed = closed_by_peer(conn) if response.error_code else False
    return Outcome(at, int(response.error_code), closed)


def _exchange(
    conn: RawConnection, mechanism: str, client: scramp.ScramClient, final: bytes | None = None
) -> Outcome:
    first = _first(conn, mechanism, client.get_client_first().encode())
    if first.error_code:
        return _ended(conn, "client-first", first)
    client.set_server_first(first.auth_bytes.decode())
    return _ended(
        conn, "client-final", authenticate(conn, final or client.get_client_final().encode())
    )


def good(conn: RawConnection, mechanism: str, peer: Peer) -> Outcome:
    return _exchange(conn, mechanism, _client(mechanism, peer))


def wrong_password(conn: RawConnection, mechanism: str, peer: Peer) -> Outcome:
    return _exchange(conn, mechanism, _client(mechanism, peer, password="wrong"))


def unknown_user(conn: RawConnection, mechanism: str, peer: Peer) -> Outcome:
    stranger = Peer(peer.name, peer.bootstrap, "nobody-" + uuid.uuid4().hex, "x")
    return _exchange(conn, mechanism, _client(mechanism, stranger))


def replayed_final(conn: RawConnection, mechanism: str, peer: Peer) -> Outcome:
    with RawConnection(peer.bootstrap) as earlier:
        recorder = _client(mechanism, peer)
        first = _first(earlier, mechanism, recorder.get_client_first().encode())
        recorder.set_server_first(first.auth_bytes.decode())
        recorded = recorder.get_client_final().encode()
        assert authenticate(earlier, recorded).error_code == ErrorCode.none
    return _exchange(conn, mechanism, _client(mechanism, peer, "unknown"), final=recorded)


def _first_message(text: str) -> Scenario:
    def scenario(conn: RawConnection, mechanism: str, peer: Peer) -> Outcome:
        message = text.format(user=peer.username).encode()
        return _ended(conn, "client-first", _first(conn, mechanism, message))

    return scenario


def malformed_final(conn: RawConnection, mechanism: str, peer: Peer) -> Outcome:
    return _exchange(conn, mechanism, _client(mechanism, peer), final=b"c=biws,r=abc")


SCENARIOS: dict[str, Scenario] = {
    "good": good,
    "wrong-password": wrong_password,
    "unknown-user": unknown_user,
    "replayed-client-final": replayed_final,
    "channel-binding-p": _first_message("p=tls-unique,,n={user},r=abcdef"),
    "gs2-flag-y": _first_message("y,,n={user},r=abcdef"),
    "authzid-of-another": _first_message("n,a=someone-else,n={user},r=abcdef"),
    "delegation-token": _first_message("n,,n={user},r=abcdef,tokenauth=true"),
    "no-nonce": _first_message("n,,n={user}"),
    "malformed-client-final": malformed_final,
}


def play(peer: Peer, mechanism: str, scenario: Scenario) -> Outcome:
    with RawConnection(peer.bootstrap) as conn:
        return scenario(conn, mechanism, peer)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_the_gateway_answers_as_apache_kafka_does(
    kafka: Peer, gateway: Peer, mechanism: str, scenario: Scenario
) -> None:
    theirs = play(kafka, mechanism, scenario)
    ours = play(gateway, mechanism, scenario)
    assert ours == theirs, f"kafka: {theirs}, gateway: {ours}"
