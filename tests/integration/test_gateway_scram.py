"""SASL/SCRAM-SHA-256 and SCRAM-SHA-512 at the gateway, with a tenant's API key.

The key id is the SCRAM username and its secret the password, as with PLAIN;
the gateway checks the proof against the SCRAM credentials the key was minted
with (never the secret). What a user checks:

* confluent-kafka (librdkafka), kafka-python and aiokafka sign in with each
  mechanism, produce and consume (KafkaJS and the Java client: their own
  modules, test_kafkajs.py and test_java_clients.py);
* the exchange over SaslAuthenticate, and over SaslHandshake v0's bare
  frames, ends with a server signature the client can verify;
* a wrong secret, an unknown key, a revoked key, a key minted before SCRAM
  existed, a replayed client-final message, channel binding, and malformed
  messages each get SASL_AUTHENTICATION_FAILED with a message saying why
  (as Apache Kafka answers them) and a closed connection, are counted in
  ``shoal_gateway_authentication_failures_total``, and the gateway keeps
  serving everyone else;
* confluent-kafka's AdminClient describes the SCRAM users of its own tenant
  (DescribeUserScramCredentials) and no other tenant's, and altering them
  (AlterUserScramCredentials) is refused with the advice to rotate the key.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import scramp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from gateway_env import GatewayProcess, TenantKey, tenancy
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.errors import KafkaTimeoutError
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, frame
from shoal.tenancy.model import ApiKey
from shoal.tenancy.secrets import hash_secret, new_key_id, new_secret
from test_gateway_auth import (
    INTERNAL_FAILURE,
    assert_serves_any_tenant,
    authenticate,
    closed_by_peer,
    connect,
    handshake,
    known_to_gateway,
    now_ms,
    plain,
)

pytestmark = pytest.mark.slow

MECHANISMS = ["SCRAM-SHA-256", "SCRAM-SHA-512"]
TOPIC = "scrambled"
TIMEOUT_S = 30


# -- helpers ---------------------------------------------------------------------------------


class Scram:
    """A raw SCRAM client exchange on one connection, over SaslAuthenticate v2."""

    def __init__(self, conn: RawConnection, mechanism: str, username: str, password: str) -> None:
        self.conn = conn
        self.client = scramp.ScramClient([mechanism], username, password)
        assert handshake(conn, mechanism).error_code == ErrorCode.none

    def first(self, message: bytes | None = None) -> Any:
        return authenticate(self.conn, message or self.client.get_client_first().encode())

    def final(self, server_first: bytes, message: bytes | None = None) -> Any:
        self.client.set_server_first(server_first.decode())
        return authenticate(self.conn, message or self.client.get_client_final().encode())


def assert_refused(response: Any, conn: RawConnection, reason: str) -> None:
    assert response.error_code == ErrorCode.sasl_authentication_failed, response
    assert re.search(reason, response.error_message or ""), response.error_message
    assert response.auth_bytes == b""
    assert closed_by_peer(conn)


def auth_failures(gateway: GatewayProcess) -> float:
    text = httpx.get(gateway.metrics_url, timeout=10).text
    found = re.search(
        r'^shoal_gateway_authentication_failures_total\{door="kafka"\} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def legacy_key(gateway_cluster: Any, tenant: str) -> TenantKey:
    """A key as stored before SCRAM existed: a scrypt hash and nothing else."""
    key_id, secret = new_key_id(), new_secret()
    record = ApiKey(key_id, tenant, hash_secret(secret), now_ms())
    tenancy(gateway_cluster.etcd_url, lambda store: store.add_key(record, []))
    return TenantKey(tenant, key_id, secret, gateway_cluster.gateway)


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(gateway_cluster: Any) -> GatewayProcess:
    return gateway_cluster.gateway  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def key(gateway_cluster: Any) -> TenantKey:
    key = known_to_gateway(gateway_cluster.tenant("scram"))
    admin = AdminClient(key.librdkafka())  # kept alive until the topic is made
    admin.create_topics([NewTopic(TOPIC, 1)])[TOPIC].result(30)
    return key


@pytest.fixture(autouse=True)
def gateway_keeps_serving(key: TenantKey, gateway: GatewayProcess) -> Iterator[None]:
    failures_before = gateway.log_text().count(INTERNAL_FAILURE)
    with key.raw() as bystander:
        yield
        assert gateway.running, gateway.log_tail()
        assert_serves_any_tenant(bystander)
    assert gateway.log_text().count(INTERNAL_FAILURE) == failures_before, gateway.log_tail()


# -- real clients ----------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_signs_in_with_scram_produces_and_consumes(
    key: TenantKey, gateway: GatewayProcess, mechanism: str
) -> None:
    log_start = len(gateway.log_text())
    value = uuid.uuid4().bytes
    producer = Producer(key.librdkafka(mechanism=mechanism, acks="all"))
    delivered: list[Any] = []
    producer.produce(TOPIC, value=value, on_delivery=lambda err, msg: delivered.append((err, msg)))
    assert producer.flush(TIMEOUT_S) == 0
    [(err, msg)] = delivered
    assert err is None, err
    consumer = Consumer(
        key.librdkafka(
            mechanism=mechanism,
            **{"group.id": f"scram-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False},
        )
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, msg.offset())])
        message = None
        deadline = time.monotonic() + TIMEOUT_S
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        assert message is not None and message.error() is None
        assert message.value() == value
    finally:
        consumer.close()
    logins = re.findall(
        rf"event=gateway_authenticated .*key={key.key_id} mechanism=(\S+)",
        gateway.log_text()[log_start:],
    )
    assert logins and set(logins) == {mechanism}, logins


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_signs_in_with_scram_produces_and_consumes(
    key: TenantKey, mechanism: str
) -> None:
    value = uuid.uuid4().bytes
    producer = KafkaProducer(**key.python_client(mechanism=mechanism), acks="all")
    try:
        sent = producer.send(TOPIC, value=value).get(timeout=TIMEOUT_S)
    finally:
        producer.close()
    consumer = KafkaConsumer(**key.python_client(mechanism=mechanism), enable_auto_commit=False)
    try:
        partition = KpTopicPartition(TOPIC, 0)
        consumer.assign([partition])
        consumer.seek(partition, sent.offset)
        records: list[Any] = []
        deadline = time.monotonic() + TIMEOUT_S
        while not records and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        assert [r.value for r in records[:1]] == [value]
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aiokafka_signs_in_with_scram_produces_and_consumes(key: TenantKey, mechanism: str) -> None:
    async def go() -> None:
        value = uuid.uuid4().bytes
        producer = AIOKafkaProducer(**key.python_client(mechanism=mechanism), acks="all")
        await producer.start()
        try:
            sent = await producer.send_and_wait(TOPIC, value=value)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            **key.python_client(mechanism=mechanism), enable_auto_commit=False
        )
        await consumer.start()
        try:
            partition = AioTopicPartition(TOPIC, 0)
            consumer.assign([partition])
            consumer.seek(partition, sent.offset)
            record = await asyncio.wait_for(consumer.getone(), TIMEOUT_S)
            assert record.value == value
        finally:
            await consumer.stop()

    asyncio.run(go())


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_with_a_wrong_scram_password_gets_an_authentication_error(
    key: TenantKey, mechanism: str
) -> None:
    errors: list[KafkaError] = []
    admin = AdminClient(
        key.librdkafka(
            mechanism=mechanism, **{"sasl.password": key.secret + "x", "error_cb": errors.append}
        )
    )
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    admin.poll(0)
    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}, [e.str() for e in errors]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_with_a_wrong_scram_password_gets_sasl_authentication_failed(
    key: TenantKey, mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    # kafka-python 3 retries a failed bootstrap until bootstrap_timeout_ms (30 s
    # unless told), then gives up with a timeout; what it met on each attempt is
    # Kafka's error 58 and our reason.
    settings = {**key.python_client(mechanism=mechanism), "sasl_plain_password": "wrong"}
    with pytest.raises(KafkaTimeoutError):
        KafkaProducer(**settings, bootstrap_timeout_ms=3000).close()
    assert re.search(
        r"\[Error 58\] SaslAuthenticationFailedError.*invalid API key or secret", caplog.text
    ), caplog.text[-3000:]


# -- the exchange on the wire ----------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_exchange_ends_with_a_server_signature_the_client_verifies(
    key: TenantKey, gateway: GatewayProcess, mechanism: str
) -> None:
    with connect(gateway) as conn:
        scram = Scram(conn, mechanism, key.key_id, key.secret)
        first = scram.first()
        assert first.error_code == ErrorCode.none
        assert first.session_lifetime.total_seconds() == 0
        final = scram.final(first.auth_bytes)
        assert final.error_code == ErrorCode.none, final.error_message
        scram.client.set_server_final(final.auth_bytes.decode())  # raises if forged
        assert_serves_any_tenant(conn)


def test_scram_over_tls_with_librdkafka(key: TenantKey) -> None:
    admin = AdminClient(key.librdkafka(True, mechanism="SCRAM-SHA-512"))
    assert TOPIC in admin.list_topics(timeout=TIMEOUT_S).topics


def test_a_scram_session_may_reauthenticate_on_its_connection(
    key: TenantKey, gateway: GatewayProcess
) -> None:
    # KIP-368: same mechanism, same principal, a whole new exchange (two rounds).
    with connect(gateway) as conn:
        for _ in range(2):
            scram = Scram(conn, "SCRAM-SHA-256", key.key_id, key.secret)
            final = scram.final(scram.first().auth_bytes)
            assert final.error_code == ErrorCode.none, final.error_message
            scram.client.set_server_final(final.auth_bytes.decode())
            assert_serves_any_tenant(conn)


def test_legacy_v0_handshake_carries_scram_in_bare_frames(
    key: TenantKey, gateway: GatewayProcess
) -> None:
    with connect(gateway) as conn:
        assert handshake(conn, "SCRAM-SHA-512", version=0).error_code == ErrorCode.none
        client = scramp.ScramClient(["SCRAM-SHA-512"], key.key_id, key.secret)
        conn.send_raw(frame(client.get_client_first().encode()))
        client.set_server_first(conn.read_frame().decode())
        conn.send_raw(frame(client.get_client_final().encode()))
        client.set_server_final(conn.read_frame().decode())
        assert_serves_any_tenant(conn)


def test_wrong_password_is_refused_after_the_proof_and_counted(
    key: TenantKey, gateway: GatewayProcess
) -> None:
    before = auth_failures(gateway)
    with connect(gateway) as conn:
        scram = Scram(conn, "SCRAM-SHA-512", key.key_id, key.secret + "x")
        first = scram.first()
        assert first.error_code == ErrorCode.none
        assert_refused(scram.final(first.auth_bytes), conn, "invalid API key or secret")
    assert auth_failures(gateway) == before + 1
    assert key.secret not in gateway.log_text()


def test_unknown_key_is_refused_at_the_first_message(gateway: GatewayProcess) -> None:
    with connect(gateway) as conn:
        scram = Scram(conn, "SCRAM-SHA-256", "K" + uuid.uuid4().hex.upper(), "whatever")
        assert_refused(scram.first(), conn, "invalid API key or secret")


def test_revoked_key_loses_its_scram_connections_and_cannot_sign_in(
    gateway_cluster: Any, gateway: GatewayProcess
) -> None:
    doomed = known_to_gateway(gateway_cluster.tenant("scram-revoking"))
    with connect(gateway) as open_conn:
        scram = Scram(open_conn, "SCRAM-SHA-512", doomed.key_id, doomed.secret)
        assert scram.final(scram.first().auth_bytes).error_code == ErrorCode.none
        assert_serves_any_tenant(open_conn)
        tenancy(gateway_cluster.etcd_url, lambda store: store.revoke_key(doomed.key_id, now_ms()))
        assert closed_by_peer(open_conn)
    with connect(gateway) as conn:
        scram = Scram(conn, "SCRAM-SHA-512", doomed.key_id, doomed.secret)
        assert_refused(scram.first(), conn, "invalid API key or secret")


def test_a_key_minted_before_scram_is_told_to_rotate_and_still_signs_in_with_plain(
    gateway_cluster: Any, gateway: GatewayProcess
) -> None:
    old = legacy_key(gateway_cluster, gateway_cluster.tenant("scram-legacy").tenant)
    with connect(gateway) as conn:
        scram = Scram(conn, "SCRAM-SHA-256", old.key_id, old.secret)
        assert_refused(scram.first(), conn, "predates SCRAM.*rotate it")
    with connect(gateway) as conn:
        assert handshake(conn).error_code == ErrorCode.none
        assert authenticate(conn, plain(old.key_id, old.secret)).error_code == ErrorCode.none


def test_a_replayed_client_final_message_is_refused(
    key: TenantKey, gateway: GatewayProcess
) -> None:
    with connect(gateway) as conn:
        scram = Scram(conn, "SCRAM-SHA-512", key.key_id, key.secret)
        first = scram.first()
        scram.client.set_server_first(first.auth_bytes.decode())
        recorded = scram.client.get_client_final().encode()
        assert authenticate(conn, recorded).error_code == ErrorCode.none
    # An eavesdropper replays the recorded proof on a new exchange of its own.
    with connect(gateway) as conn:
        replay = Scram(conn, "SCRAM-SHA-512", key.key_id, "not-known")
        assert replay.first().error_code == ErrorCode.none
        assert_refused(authenticate(conn, recorded), conn, "replayed")


@pytest.mark.parametrize("gs2", ["p=tls-unique,,", "y,,"])
def test_channel_binding_is_refused(key: TenantKey, gateway: GatewayProcess, gs2: str) -> None:
    with connect(gateway) as conn:
        scram = Scram(conn, "SCRAM-SHA-256", key.key_id, key.secret)
        bare = scram.client.get_client_first().encode().removeprefix(b"n,,")
        assert_refused(scram.first(gs2.encode() + bare), conn, "channel binding")


MALFORMED_FIRST = {
    "empty": b"",
    "plain-message": b"\0user\0secret",
    "no-nonce": b"n,,n=KABC",
    "delegation-token": b"n,,n=KABC,r=abc,tokenauth=true",
    "not-utf8": b"n,,n=\xff\xfe,r=abc",
    "oversized": b"n,,n=KABC,r=" + b"a" * 8192,
}


@pytest.mark.parametrize("message", MALFORMED_FIRST.values(), ids=MALFORMED_FIRST.keys())
def test_malformed_client_first_is_refused(gateway: GatewayProcess, message: bytes) -> None:
    with connect(gateway) as conn:
        assert handshake(conn, "SCRAM-SHA-512").error_code == ErrorCode.none
        assert_refused(authenticate(conn, message), conn, "SCRAM|delegation")


MALFORMED_FINAL = {
    "empty": b"",
    "no-proof": b"c=biws,r=abc",
    "garbage": b"\xde\xad\xbe\xef" * 8,
    "client-first-again": b"n,,n=KABC,r=abc",
}


@pytest.mark.parametrize("message", MALFORMED_FINAL.values(), ids=MALFORMED_FINAL.keys())
def test_malformed_client_final_is_refused(
    key: TenantKey, gateway: GatewayProcess, message: bytes
) -> None:
    with connect(gateway) as conn:
        scram = Scram(conn, "SCRAM-SHA-256", key.key_id, key.secret)
        assert scram.first().error_code == ErrorCode.none
        assert_refused(authenticate(conn, message), conn, "SCRAM")


def test_a_client_that_stops_mid_exchange_is_disconnected(
    key: TenantKey, gateway: GatewayProcess
) -> None:
    with connect(gateway) as conn:
        scram = Scram(conn, "SCRAM-SHA-256", key.key_id, key.secret)
        assert scram.first().error_code == ErrorCode.none
        # No client-final: the authentication timeout (Kafka's default 10 s here) ends it.
        assert closed_by_peer(conn, timeout=20)


def test_a_key_made_with_the_http_api_signs_in_with_scram_at_once(
    key: TenantKey, gateway: GatewayProcess
) -> None:
    answer = httpx.post(
        f"{gateway.http_url}/v3/api-keys",
        json={"description": "scram"},
        auth=(key.key_id, key.secret),
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    created = answer.json()
    assert sorted(created["scram_mechanisms"]) == MECHANISMS
    with connect(gateway) as conn:
        scram = Scram(conn, "SCRAM-SHA-512", created["id"], created["secret"])
        assert scram.final(scram.first().auth_bytes).error_code == ErrorCode.none
        assert_serves_any_tenant(conn)


# -- DescribeUserScramCredentials / AlterUserScramCredentials --------------------------------


def test_admin_client_describes_its_tenants_scram_users_and_nobody_elses(
    gateway_cluster: Any, key: TenantKey
) -> None:
    sibling = known_to_gateway(gateway_cluster.tenant("scram"))
    stranger = known_to_gateway(gateway_cluster.tenant("scram-stranger"))
    admin = AdminClient(key.librdkafka(mechanism="SCRAM-SHA-512"))

    everyone = admin.describe_user_scram_credentials().result(TIMEOUT_S)
    assert {key.key_id, sibling.key_id} <= set(everyone)
    assert stranger.key_id not in everyone
    infos = everyone[key.key_id].scram_credential_infos
    assert sorted((i.mechanism, i.iterations) for i in infos) == [
        (ScramMechanism.SCRAM_SHA_256, 4096),
        (ScramMechanism.SCRAM_SHA_512, 4096),
    ]

    named = admin.describe_user_scram_credentials([sibling.key_id, stranger.key_id])
    assert named[sibling.key_id].result(TIMEOUT_S).user == sibling.key_id
    with pytest.raises(KafkaException) as refused:
        named[stranger.key_id].result(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND


def test_admin_client_cannot_alter_scram_credentials_and_is_told_to_rotate(
    key: TenantKey,
) -> None:
    admin = AdminClient(key.librdkafka())
    upsert = UserScramCredentialUpsertion(
        key.key_id, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"new-password"
    )
    [future] = admin.alter_user_scram_credentials([upsert]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert "rotate the key" in refused.value.args[0].str()
    # Nothing changed: the key still signs in with SCRAM and its own secret.
    with connect(key.gateway) as conn:
        scram = Scram(conn, "SCRAM-SHA-512", key.key_id, key.secret)
        assert scram.final(scram.first().auth_bytes).error_code == ErrorCode.none
