"""Mutual TLS at the gateway: a client certificate signs in as a tenant's key.

The gateway's SSL listener (``--mtls-listen``) trusts client certificates
signed by the platform's client CA (``--tls-client-ca``); the key whose
certificate subject is the certificate's (set with the key, by the Tenant
resource or ``shoal key create --certificate-subject``) is who the client is.
What a user checks:

* confluent-kafka and kafka-python connect with a certificate, produce and
  consume under the tenant's own names (the Java client: test_java_clients.py);
* the certificate's key keeps its ACLs (a read-only key cannot write) and its
  tenant's connection limit;
* a certificate from an unknown CA, an expired one, and one whose subject
  names no key are refused (the TLS handshake fails with its alert, as on
  Kafka's SSL listener; a subject naming no key is disconnected after it), each
  counted in ``shoal_gateway_authentication_failures_total``; a revoked key's
  certificate stops working, open connections included;
* SASL requests on a certificate session get ILLEGAL_SASL_STATE, as Kafka's SSL
  listener answers them;
* one subject signs in as one key: a second key claiming it is refused.
"""

from __future__ import annotations

import datetime
import re
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from gateway_env import (
    ClientCertificate,
    GatewayProcess,
    TenantKey,
    client_certificate,
    tenancy,
)
from harness import wait_until
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, request_class
from shoal.tenancy.acl import read_only_bindings
from shoal.tenancy.model import Quotas, TenancyError
from test_gateway_scram import auth_failures

pytestmark = pytest.mark.slow

TIMEOUT_S = 30


# -- helpers ---------------------------------------------------------------------------------


def with_certificate(key: TenantKey, certificate: ClientCertificate) -> None:
    tenancy(
        key.gateway.etcd_url,
        lambda store: store.set_certificate_subject(key.key_id, certificate.subject),
    )


def certificate_for(
    gateway_cluster: Any, tmp_path: Path, tenant: str, **kwargs: Any
) -> tuple[TenantKey, ClientCertificate]:
    """A new key of ``tenant`` and a certificate from the client CA that signs in as it."""
    key: TenantKey = gateway_cluster.tenant(tenant, **kwargs)
    gateway: GatewayProcess = gateway_cluster.gateway
    assert gateway.tls is not None
    certificate = client_certificate(
        tmp_path, gateway.tls.client_authority, f"{tenant}-{uuid.uuid4().hex[:6]}"
    )
    with_certificate(key, certificate)
    return key, certificate


def tls_connection(gateway: GatewayProcess, certificate: ClientCertificate) -> RawConnection:
    assert gateway.tls is not None
    context = ssl.create_default_context(cafile=str(gateway.tls.ca))
    context.load_cert_chain(str(certificate.cert), str(certificate.key))
    return RawConnection(gateway.mtls_bootstrap, tls=context)


def api_versions() -> Any:
    return request_class(18, 3)(client_software_name="t", client_software_version="1")


def refused_by_handshake(gateway: GatewayProcess, certificate: ClientCertificate) -> str:
    """What a TLS client sees when the gateway refuses its certificate: the alert."""
    try:
        connection = tls_connection(gateway, certificate)
    except (ssl.SSLError, ConnectionError) as exc:
        return str(exc)
    # TLS 1.3: the client finishes before the server has checked its certificate;
    # the alert arrives on the first read.
    with connection:
        try:
            connection.call(api_versions())
        except (ssl.SSLError, ConnectionError) as exc:
            return str(exc)
    raise AssertionError("the gateway accepted the certificate")


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(gateway_cluster: Any) -> GatewayProcess:
    return gateway_cluster.gateway  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def signed_in(
    gateway_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TenantKey, ClientCertificate]]:
    key, certificate = certificate_for(gateway_cluster, tmp_path_factory.mktemp("mtls"), "certs")
    admin = AdminClient(key.librdkafka())
    admin.create_topics([NewTopic("orders", 3)])["orders"].result(TIMEOUT_S)
    yield key, certificate


# -- clients sign in with a certificate ------------------------------------------------------


def test_librdkafka_produces_and_consumes_with_a_certificate(
    signed_in: tuple[TenantKey, ClientCertificate], gateway: GatewayProcess
) -> None:
    key, certificate = signed_in
    log_start = len(gateway.log_text())
    admin = AdminClient(certificate.librdkafka(gateway))
    topics = admin.list_topics(timeout=TIMEOUT_S).topics
    assert "orders" in topics
    assert not [t for t in topics if "." in t], "a broker-side name leaked"

    producer = Producer(certificate.librdkafka(gateway, acks="all"))
    for i in range(30):
        producer.produce("orders", f"signed-{i}".encode(), partition=i % 3)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer(
        certificate.librdkafka(
            gateway, **{"group.id": "cert-readers", "auto.offset.reset": "earliest"}
        )
    )
    consumer.subscribe(["orders"])
    seen: list[str] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(seen) < 30 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append((message.value() or b"").decode())
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"signed-{i}" for i in range(30))
    logins = re.findall(
        rf"event=gateway_authenticated .*key={key.key_id} mechanism=(\S+)",
        gateway.log_text()[log_start:],
    )
    assert logins and set(logins) == {"SSL"}, logins


def test_kafka_python_produces_and_consumes_with_a_certificate(
    signed_in: tuple[TenantKey, ClientCertificate], gateway: GatewayProcess
) -> None:
    _, certificate = signed_in
    assert gateway.tls is not None
    settings: dict[str, Any] = {
        "bootstrap_servers": gateway.mtls_bootstrap,
        "security_protocol": "SSL",
        "ssl_cafile": str(gateway.tls.ca),
        "ssl_certfile": str(certificate.cert),
        "ssl_keyfile": str(certificate.key),
    }
    producer = KafkaProducer(**settings, acks="all")
    try:
        sent = producer.send("orders", b"from-kafka-python", partition=1).get(TIMEOUT_S)
    finally:
        producer.close()
    consumer = KafkaConsumer(**settings, consumer_timeout_ms=10_000)
    try:
        partition = KpTopicPartition("orders", 1)
        consumer.assign([partition])
        consumer.seek(partition, sent.offset)
        record = next(iter(consumer))
    finally:
        consumer.close()
    assert record.value == b"from-kafka-python"


# -- the key's ACLs and its tenant's limits hold -----------------------------------------------


def test_a_read_only_keys_certificate_cannot_write(
    gateway_cluster: Any, gateway: GatewayProcess, tmp_path: Path
) -> None:
    writer = gateway_cluster.tenant("certs-ro")
    admin = AdminClient(writer.librdkafka())
    admin.create_topics([NewTopic("ledger", 1)])["ledger"].result(TIMEOUT_S)
    _, certificate = certificate_for(
        gateway_cluster, tmp_path, "certs-ro", bindings=read_only_bindings("certs-ro", "KEY")
    )
    producer = Producer(certificate.librdkafka(gateway, acks="all", retries=0))
    failures: list[KafkaError] = []
    producer.produce("ledger", b"no", on_delivery=lambda err, _: failures.append(err))
    producer.flush(TIMEOUT_S)
    assert [e.code() for e in failures] == [KafkaError.TOPIC_AUTHORIZATION_FAILED], failures
    assert (
        "ledger"
        in AdminClient(certificate.librdkafka(gateway)).list_topics(timeout=TIMEOUT_S).topics
    )


def test_certificate_connections_count_against_the_tenants_limit(
    gateway_cluster: Any, gateway: GatewayProcess, tmp_path: Path
) -> None:
    _, certificate = certificate_for(
        gateway_cluster, tmp_path, "certs-few", quotas=Quotas(max_connections=1)
    )
    with tls_connection(gateway, certificate) as first:
        assert first.call(api_versions()).error_code == 0
        with tls_connection(gateway, certificate) as second, pytest.raises(ConnectionError):
            second.call(api_versions())
        assert first.call(api_versions()).error_code == 0
    assert "(maxConnections)" in gateway.log_text()


# -- refusals --------------------------------------------------------------------------------


def test_a_certificate_from_an_unknown_authority_is_refused_and_counted(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    stranger = client_certificate(tmp_path, trustme.CA(), "stranger")
    before = auth_failures(gateway)
    alert = refused_by_handshake(gateway, stranger)
    assert "unknown ca" in alert.lower() or "certificate" in alert.lower(), alert
    errors: list[KafkaError] = []
    admin = AdminClient(stranger.librdkafka(gateway, error_cb=errors.append, log_level=2))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    admin.poll(0)
    # What librdkafka reports from Kafka's SSL listener too: OpenSSL's name for the alert.
    assert any("alert unknown ca" in e.str() for e in errors), [e.str() for e in errors]
    wait_until(lambda: auth_failures(gateway) >= before + 2, 10, "the refusals to be counted")


def test_an_expired_certificate_is_refused_and_counted(
    gateway: GatewayProcess, gateway_cluster: Any, tmp_path: Path
) -> None:
    assert gateway.tls is not None
    key: TenantKey = gateway_cluster.tenant("certs-old")
    expired = client_certificate(
        tmp_path,
        gateway.tls.client_authority,
        "expired",
        not_after=datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1),
    )
    with_certificate(key, expired)
    before = auth_failures(gateway)
    alert = refused_by_handshake(gateway, expired)
    assert "expired" in alert.lower(), alert
    wait_until(lambda: auth_failures(gateway) >= before + 1, 10, "the refusal to be counted")
    assert "certificate_has_expired" in gateway.log_text()


def test_a_certificate_naming_no_key_is_disconnected_and_counted(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    assert gateway.tls is not None
    nobody = client_certificate(tmp_path, gateway.tls.client_authority, "nobody")
    before = auth_failures(gateway)
    with tls_connection(gateway, nobody) as connection, pytest.raises(ConnectionError):
        connection.call(api_versions())
    wait_until(lambda: auth_failures(gateway) >= before + 1, 10, "the refusal to be counted")
    assert re.search(
        r"mechanism=SSL subject=CN=nobody,OU=apps,O=acme reason=no_key", gateway.log_text()
    )


def test_a_revoked_keys_certificate_stops_working(
    gateway_cluster: Any, gateway: GatewayProcess, tmp_path: Path
) -> None:
    key, certificate = certificate_for(gateway_cluster, tmp_path, "certs-revoked")
    with tls_connection(gateway, certificate) as connection:
        assert connection.call(api_versions()).error_code == 0
        revoked_ms = int(time.time() * 1000)
        tenancy(gateway.etcd_url, lambda store: store.revoke_key(key.key_id, revoked_ms))
        assert connection.is_closed_by_peer(timeout=10), "the open connection stays"
    with tls_connection(gateway, certificate) as again, pytest.raises(ConnectionError):
        again.call(api_versions())


def test_sasl_on_a_certificate_session_gets_illegal_sasl_state(
    signed_in: tuple[TenantKey, ClientCertificate], gateway: GatewayProcess
) -> None:
    _, certificate = signed_in
    with tls_connection(gateway, certificate) as connection:
        handshake = connection.call(request_class(17, 1)(mechanism="PLAIN"))
        assert handshake.error_code == ErrorCode.illegal_sasl_state
        authenticate = connection.call(request_class(36, 2)(auth_bytes=b"\0a\0b"))
        assert authenticate.error_code == ErrorCode.illegal_sasl_state
        assert connection.call(api_versions()).error_code == 0, "the session goes on"


def test_one_subject_signs_in_as_one_key(
    signed_in: tuple[TenantKey, ClientCertificate], gateway_cluster: Any
) -> None:
    _, certificate = signed_in
    other: TenantKey = gateway_cluster.tenant("certs-thief")
    with pytest.raises(TenancyError, match="already signs in as a key"):
        with_certificate(other, certificate)
