"""Every way into the gateway but the right one ends in a clean refusal, and it keeps serving.

Wrong secrets, unknown, revoked and orphaned keys, malformed SASL/PLAIN
messages, requests out of order, internal APIs, garbage and oversized frames,
and clients that connect and say nothing: each gets the Kafka error code a
client can act on (SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM)
where the protocol has one, and then a closed connection.

Around every test, a connection that logged in before the bad one must still
be answered, the gateway process must still run, nothing may have failed
inside it, and a new client must still produce and consume.
"""

from __future__ import annotations

import ssl
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from gateway_env import GatewayProcess, TenantKey, TlsFiles, sasl_login, tenancy
from harness import wait_until
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, frame, request_class

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE, ALTER_PARTITION = 18, 17, 36, 56
CANARY = "canary"
CLOSE_WITHIN_S = 5.0
INTERNAL_FAILURE = "event=gateway_session_failed"
TLS_IDS = ["SASL_PLAINTEXT", "SASL_SSL"]


# -- raw protocol helpers --------------------------------------------------------------------


def connect(gateway: GatewayProcess, tls: bool = False) -> RawConnection:
    """A bare connection to the gateway's bootstrap port, through TLS if asked."""
    if not tls:
        return RawConnection(gateway.bootstrap)
    assert gateway.tls is not None
    conn = RawConnection(gateway.tls_bootstrap)
    context = ssl.create_default_context(cafile=str(gateway.tls.ca))
    conn.sock = context.wrap_socket(conn.sock, server_hostname="127.0.0.1")
    return conn


def closed_by_peer(conn: RawConnection, timeout: float = CLOSE_WITHIN_S) -> bool:
    """True if the gateway closed the connection, without sending anything more, in time."""
    conn.sock.settimeout(timeout)
    try:
        return conn.sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return True
    except TimeoutError:
        return False


def api_versions(conn: RawConnection) -> Any:
    request = request_class(API_VERSIONS, 3)
    return conn.call(request(client_software_name="shoal-tests", client_software_version="1"))


def handshake(conn: RawConnection, mechanism: str = "PLAIN", version: int = 1) -> Any:
    return conn.call(request_class(SASL_HANDSHAKE, version)(mechanism=mechanism))


def authenticate(conn: RawConnection, auth_bytes: bytes) -> Any:
    return conn.call(request_class(SASL_AUTHENTICATE, 2)(auth_bytes=auth_bytes))


def plain(username: str, password: str, authzid: str = "") -> bytes:
    return f"{authzid}\0{username}\0{password}".encode()


def metadata_request(topics: tuple[str, ...] | None = (CANARY,)) -> Any:
    cls = request_class(3, 12)
    topic_cls = request_class(3, 12, "MetadataRequestTopic")
    return cls(
        topics=None if topics is None else tuple(topic_cls(topic_id=None, name=t) for t in topics),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def assert_serves(conn: RawConnection) -> None:
    """The connection is answered: the auth tenant's canary topic is there."""
    response = conn.call(metadata_request())
    assert response.brokers
    assert [(t.name, t.error_code) for t in response.topics] == [(CANARY, ErrorCode.none)]


def assert_serves_any_tenant(conn: RawConnection) -> None:
    assert conn.call(metadata_request(topics=None)).brokers


def known_to_gateway(key: TenantKey) -> TenantKey:
    """Wait until a just-made key is served, not only authenticated, by the gateway.

    A key made since the gateway's last tenancy poll logs in but has its
    connection closed at its first request (see
    test_key_made_since_the_last_poll_serves_its_first_request); tests about
    other things wait for the poll instead of tripping over that.
    """

    def served() -> bool:
        try:
            with key.raw() as conn:
                assert_serves_any_tenant(conn)
                return True
        except ConnectionError:
            return False

    wait_until(served, 10, f"the gateway to serve key {key.key_id}")
    return key


def fetch_request(replica_id: int) -> Any:
    cls = request_class(1, 12)
    topic_cls = request_class(1, 12, "FetchTopic")
    partition_cls = request_class(1, 12, "FetchPartition")
    return cls(
        replica_id=replica_id,
        max_wait=timedelta(milliseconds=10),
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            topic_cls(
                topic=CANARY,
                partitions=(
                    partition_cls(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=0,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )


def bare_header(api_key: int, version: int, correlation_id: int = 7) -> bytes:
    """Request header v1 (key, version, correlation id, client id) with no body."""
    client_id = b"raw-test"
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def assert_refused_and_closed(response: Any, conn: RawConnection) -> None:
    assert response.error_code == ErrorCode.sasl_authentication_failed, response
    assert response.auth_bytes == b""
    assert closed_by_peer(conn)


def now_ms() -> int:
    return int(time.time() * 1000)


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def key(gateway_cluster: Any) -> TenantKey:
    key = known_to_gateway(gateway_cluster.tenant("auth"))
    admin = AdminClient(key.librdkafka())
    admin.create_topics([NewTopic(CANARY, 1)])[CANARY].result(30)
    return key


@pytest.fixture(scope="module")
def gateway(gateway_cluster: Any) -> GatewayProcess:
    return gateway_cluster.gateway  # type: ignore[no-any-return]


def produce_and_consume(key: TenantKey, topic: str = CANARY) -> None:
    """A new client of a good key writes a record and reads it back."""
    value = uuid.uuid4().bytes
    producer = Producer(key.librdkafka(acks="all"))
    delivered: list[Any] = []
    producer.produce(topic, value=value, on_delivery=lambda err, msg: delivered.append((err, msg)))
    assert producer.flush(30) == 0
    [(err, msg)] = delivered
    assert err is None, err
    consumer = Consumer(
        key.librdkafka(
            **{"group.id": f"canary-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
        )
    )
    try:
        consumer.assign([TopicPartition(topic, 0, msg.offset())])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                assert message.value() == value
                return
        raise AssertionError("the record produced was not consumed back")
    finally:
        consumer.close()


@pytest.fixture(autouse=True)
def gateway_keeps_serving(key: TenantKey, gateway: GatewayProcess) -> Iterator[None]:
    """A logged-in connection from before the test still works after it, and so do new ones."""
    failures_before = gateway.log_text().count(INTERNAL_FAILURE)
    with key.raw() as bystander:
        assert_serves(bystander)
        yield
        assert gateway.running, gateway.log_tail()
        assert_serves(bystander)
    produce_and_consume(key)
    assert gateway.log_text().count(INTERNAL_FAILURE) == failures_before, gateway.log_tail()


# -- before authentication ------------------------------------------------------------------------


@pytest.mark.parametrize("tls", [False, True], ids=TLS_IDS)
def test_api_versions_before_login_offers_sasl_and_no_internal_api(
    gateway: GatewayProcess, tls: bool
) -> None:
    with connect(gateway, tls) as conn:
        response = api_versions(conn)
        assert response.error_code == ErrorCode.none
        offered = {v.api_key: (v.min_version, v.max_version) for v in response.api_keys}
        assert SASL_HANDSHAKE in offered
        assert SASL_AUTHENTICATE in offered
        assert ALTER_PARTITION not in offered
        # ApiVersions does not count as authentication: the exchange goes on.
        assert handshake(conn).error_code == ErrorCode.none


@pytest.mark.parametrize("tls", [False, True], ids=TLS_IDS)
def test_wrong_password_is_refused_then_closed(
    key: TenantKey, gateway: GatewayProcess, tls: bool
) -> None:
    wrong = key.secret + "x"
    with connect(gateway, tls) as conn:
        response = sasl_login(conn, key.key_id, wrong)
        assert_refused_and_closed(response, conn)
    # The refusal is logged, the secrets tried are not.
    assert key.secret not in gateway.log_text()


def test_unknown_key_id_is_refused_then_closed(key: TenantKey, gateway: GatewayProcess) -> None:
    with connect(gateway) as conn:
        response = sasl_login(conn, "k-" + uuid.uuid4().hex, key.secret)
        assert_refused_and_closed(response, conn)


@pytest.mark.parametrize("tls", [False, True], ids=TLS_IDS)
def test_librdkafka_with_a_wrong_password_gets_an_authentication_error(
    key: TenantKey, tls: bool
) -> None:
    errors: list[KafkaError] = []
    admin = AdminClient(
        key.librdkafka(tls, **{"sasl.password": key.secret + "x", "error_cb": errors.append})
    )
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    admin.poll(0)
    codes = {e.code() for e in errors}
    assert KafkaError._AUTHENTICATION in codes, [e.str() for e in errors]


def test_plain_message_with_authzid_equal_to_username_is_accepted(
    key: TenantKey, gateway: GatewayProcess
) -> None:
    with connect(gateway) as conn:
        assert handshake(conn).error_code == ErrorCode.none
        response = authenticate(conn, plain(key.key_id, key.secret, authzid=key.key_id))
        assert response.error_code == ErrorCode.none
        assert_serves(conn)


MALFORMED: dict[str, Callable[[TenantKey], bytes]] = {
    "no-nul": lambda k: f"{k.key_id}{k.secret}".encode(),
    "one-nul": lambda k: f"{k.key_id}\0{k.secret}".encode(),
    "too-many-nuls": lambda k: plain(k.key_id, k.secret) + b"\0extra",
    "authzid-is-another-principal": lambda k: plain(k.key_id, k.secret, authzid="k-someone-else"),
    "not-utf8": lambda k: b"\0" + k.key_id.encode() + b"\0" + k.secret.encode() + b"\xff\xfe",
    "empty": lambda k: b"",
    "empty-username": lambda k: plain("", k.secret),
    "empty-password": lambda k: plain(k.key_id, ""),
    "oversized": lambda k: plain(k.key_id, k.secret) + b"x" * 8192,
}


@pytest.mark.parametrize("message", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_plain_message_is_refused_then_closed(
    key: TenantKey, gateway: GatewayProcess, message: Callable[[TenantKey], bytes]
) -> None:
    with connect(gateway) as conn:
        assert handshake(conn).error_code == ErrorCode.none
        assert_refused_and_closed(authenticate(conn, message(key)), conn)


def test_authenticate_before_handshake_closes(key: TenantKey, gateway: GatewayProcess) -> None:
    with connect(gateway) as conn:
        conn.send(request_class(SASL_AUTHENTICATE, 2)(auth_bytes=plain(key.key_id, key.secret)))
        assert closed_by_peer(conn)


def test_unsupported_mechanism_is_refused_with_ours_offered(gateway: GatewayProcess) -> None:
    with connect(gateway) as conn:
        response = handshake(conn, "GSSAPI")
        assert response.error_code == ErrorCode.unsupported_sasl_mechanism
        assert list(response.mechanisms) == [
            "PLAIN",
            "SCRAM-SHA-256",
            "SCRAM-SHA-512",
            "OAUTHBEARER",
        ]
        assert closed_by_peer(conn)


@pytest.mark.parametrize("after_handshake", [False, True], ids=["first", "after-handshake"])
def test_other_request_before_login_closes(gateway: GatewayProcess, after_handshake: bool) -> None:
    with connect(gateway) as conn:
        if after_handshake:
            assert handshake(conn).error_code == ErrorCode.none
        conn.send(metadata_request())
        assert closed_by_peer(conn)


def test_legacy_v0_handshake_wrong_password_closes_right_one_serves(
    key: TenantKey, gateway: GatewayProcess
) -> None:
    # SaslHandshake v0: the PLAIN message follows as a bare frame, not a request.
    with connect(gateway) as conn:
        assert handshake(conn, version=0).error_code == ErrorCode.none
        conn.send_raw(frame(plain(key.key_id, key.secret + "x")))
        assert closed_by_peer(conn)
    with connect(gateway) as conn:
        assert handshake(conn, version=0).error_code == ErrorCode.none
        conn.send_raw(frame(plain(key.key_id, key.secret)))
        assert conn.read_frame() == b""
        assert_serves(conn)


BAD_FRAMES: dict[str, bytes] = {
    "garbage": frame(b"\xde\xad\xbe\xef" * 16),
    "truncated-metadata": frame(bare_header(3, 12) + b"\x07"),
    "negative-size": struct.pack(">i", -5),
    "two-gigabytes": struct.pack(">i", 2_000_000_000) + b"\0" * 64,
    "over-socket-request-max-bytes": struct.pack(">i", 104857600 + 1) + b"\0" * 64,
}


@pytest.mark.parametrize("logged_in", [False, True], ids=["before-login", "after-login"])
@pytest.mark.parametrize("data", BAD_FRAMES.values(), ids=BAD_FRAMES.keys())
def test_bad_frame_closes(
    key: TenantKey, gateway: GatewayProcess, data: bytes, logged_in: bool
) -> None:
    with key.raw() if logged_in else connect(gateway) as conn:
        conn.send_raw(data)
        assert closed_by_peer(conn)


def test_plaintext_on_the_tls_port_closes(gateway: GatewayProcess) -> None:
    with RawConnection(gateway.tls_bootstrap) as conn:
        conn.send(
            request_class(API_VERSIONS, 3)(client_software_name="x", client_software_version="1")
        )
        assert closed_by_peer(conn)


# -- keys that stop being good -----------------------------------------------------------------


def test_revoked_key_loses_its_connections_and_cannot_log_in(
    gateway_cluster: Any, gateway: GatewayProcess
) -> None:
    doomed = known_to_gateway(gateway_cluster.tenant("revoking"))
    sibling = known_to_gateway(gateway_cluster.tenant("revoking"))
    errors: list[KafkaError] = []
    producer = Producer(
        doomed.librdkafka(
            False,
            acks="all",
            error_cb=errors.append,
            **{"message.timeout.ms": 4000, "reconnect.backoff.max.ms": 500},
        )
    )
    admin = AdminClient(doomed.librdkafka())
    admin.create_topics([NewTopic("events", 1)])["events"].result(30)
    outcomes: list[KafkaError | None] = []
    producer.produce("events", value=b"before", on_delivery=lambda err, _msg: outcomes.append(err))
    assert producer.flush(30) == 0
    assert outcomes == [None]

    with doomed.raw() as plain_conn, connect(gateway, tls=True) as tls_conn, sibling.raw() as other:
        assert sasl_login(tls_conn, doomed.key_id, doomed.secret).error_code == ErrorCode.none
        assert_serves_any_tenant(plain_conn)
        assert_serves_any_tenant(tls_conn)

        tenancy(gateway_cluster.etcd_url, lambda store: store.revoke_key(doomed.key_id, now_ms()))

        assert closed_by_peer(plain_conn)
        assert closed_by_peer(tls_conn)
        # Another key of the same tenant is not touched.
        assert_serves_any_tenant(other)

    with connect(gateway) as conn:
        assert_refused_and_closed(sasl_login(conn, doomed.key_id, doomed.secret), conn)

    # librdkafka's own connection is closed too; it reconnects and is refused.
    producer.produce("events", value=b"after", on_delivery=lambda err, _msg: outcomes.append(err))
    producer.flush(15)
    assert len(outcomes) == 2
    assert outcomes[1] is not None, "a record was accepted from a revoked key"
    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}, [e.str() for e in errors]
    produce_and_consume(sibling, "events")


def test_key_of_a_deleted_tenant_loses_its_connections_and_cannot_log_in(
    gateway_cluster: Any, gateway: GatewayProcess
) -> None:
    doomed = known_to_gateway(gateway_cluster.tenant("deleting"))
    with doomed.raw() as conn:
        assert_serves_any_tenant(conn)
        tenancy(gateway_cluster.etcd_url, lambda store: store.delete_tenant("deleting"))
        assert closed_by_peer(conn)
    with connect(gateway) as conn:
        assert_refused_and_closed(sasl_login(conn, doomed.key_id, doomed.secret), conn)


# -- after authentication ------------------------------------------------------------------------


def test_api_versions_after_login_never_offers_internal_apis(key: TenantKey) -> None:
    with key.raw() as conn:
        offered = {v.api_key for v in api_versions(conn).api_keys}
        assert ALTER_PARTITION not in offered
        assert_serves(conn)


def test_consumer_fetch_is_served(key: TenantKey) -> None:
    """The control for the replica fetch below: the same request from a consumer is answered."""
    with key.raw() as conn:
        response = conn.call(fetch_request(replica_id=-1))
        assert response.error_code == ErrorCode.none
        assert [t.topic for t in response.responses] == [CANARY]
        assert_serves(conn)


AFTER_LOGIN: dict[str, Callable[[RawConnection], None]] = {
    "unknown-api-key": lambda c: c.send_raw(frame(bare_header(1000, 0))),
    "alter-partition": lambda c: c.send(
        request_class(ALTER_PARTITION, 2)(broker_id=0, broker_epoch=0, topics=())
    ),
    "replica-fetch": lambda c: c.send(fetch_request(replica_id=1)),
    # Re-authentication (KIP-368) needs SaslHandshake v1 or later.
    "sasl-handshake-v0-again": lambda c: c.send(
        request_class(SASL_HANDSHAKE, 0)(mechanism="PLAIN")
    ),
    "sasl-authenticate-again": lambda c: c.send(
        request_class(SASL_AUTHENTICATE, 2)(auth_bytes=b"\0a\0b")
    ),
}


@pytest.mark.parametrize("send", AFTER_LOGIN.values(), ids=AFTER_LOGIN.keys())
def test_refused_request_after_login_closes(
    key: TenantKey, send: Callable[[RawConnection], None]
) -> None:
    with key.raw() as conn:
        assert_serves(conn)
        send(conn)
        assert closed_by_peer(conn)


# -- a second gateway: short authentication timeout, slow tenancy polls ----------------------------

AUTH_TIMEOUT_S = 1.0
SLOW_POLL_MS = 30_000


@pytest.fixture(scope="module")
def impatient_gateway(
    gateway_cluster: Any, key: TenantKey, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A second gateway in front of the same brokers that closes silent clients after 1 s,
    and re-reads the tenancy records only every 30 s, so that what a key can do between
    two polls is seen every time, not by chance. It starts after ``key`` was made."""
    root: Path = tmp_path_factory.mktemp("impatient-gateway")
    process = GatewayProcess(
        gateway_cluster.etcd_url,
        gateway_cluster.internal_bootstrap,
        root,
        tls=TlsFiles.make(root / "tls"),
        env={
            "SHOAL_AUTHENTICATION_TIMEOUT_MS": str(int(AUTH_TIMEOUT_S * 1000)),
            "SHOAL_TENANCY_POLL_INTERVAL_MS": str(SLOW_POLL_MS),
        },
    ).start()
    yield process
    if process.running:
        process.stop()


def test_key_made_since_the_last_poll_serves_its_first_request(
    gateway_cluster: Any, impatient_gateway: GatewayProcess
) -> None:
    """The gateway accepts the login of a key it has not polled yet (it asks etcd);
    having accepted it, it must serve the connection, not close it at its first request."""
    fresh: TenantKey = gateway_cluster.tenant("newcomer")
    with connect(impatient_gateway) as conn:
        assert sasl_login(conn, fresh.key_id, fresh.secret).error_code == ErrorCode.none
        try:
            response = conn.call(metadata_request(topics=None))
        except ConnectionError:
            closes = [
                line for line in impatient_gateway.log_text().splitlines() if "closed" in line
            ]
            pytest.fail(f"the gateway closed a connection it had just authenticated: {closes[-1:]}")
        assert response.brokers


SILENT: dict[str, Callable[[GatewayProcess, TenantKey], RawConnection]] = {
    "says-nothing": lambda g, k: connect(g),
    "api-versions-only": lambda g, k: _after(connect(g), api_versions),
    "handshake-only": lambda g, k: _after(connect(g), handshake),
    "tls-says-nothing": lambda g, k: connect(g, tls=True),
    "tls-handshake-only": lambda g, k: _after(connect(g, tls=True), handshake),
    "tcp-on-tls-port-never-starts-tls": lambda g, k: RawConnection(g.tls_bootstrap),
}


def _after(conn: RawConnection, step: Callable[[RawConnection], Any]) -> RawConnection:
    assert step(conn).error_code == ErrorCode.none
    return conn


@pytest.mark.parametrize("opening", SILENT.values(), ids=SILENT.keys())
def test_client_that_never_logs_in_is_disconnected_after_the_timeout(
    impatient_gateway: GatewayProcess,
    key: TenantKey,
    opening: Callable[[GatewayProcess, TenantKey], RawConnection],
) -> None:
    started = time.monotonic()
    with opening(impatient_gateway, key) as conn:
        assert closed_by_peer(conn, timeout=AUTH_TIMEOUT_S + 4)
        elapsed = time.monotonic() - started
    assert AUTH_TIMEOUT_S * 0.8 <= elapsed <= AUTH_TIMEOUT_S + 4, elapsed
    assert impatient_gateway.running
    # Logging in in time still works on that gateway.
    with connect(impatient_gateway) as conn:
        assert sasl_login(conn, key.key_id, key.secret).error_code == ErrorCode.none
        time.sleep(AUTH_TIMEOUT_S * 1.5)
        assert_serves(conn)


def test_a_plain_login_may_be_renewed_on_its_connection_but_not_switched(key: TenantKey) -> None:
    """KIP-368 re-authentication: same mechanism and principal keep serving; PLAIN
    sessions never expire (lifetime 0); another mechanism closes the connection."""
    with key.raw() as conn:
        renewed = sasl_login(conn, key.key_id, key.secret)
        assert renewed.error_code == ErrorCode.none
        assert renewed.session_lifetime == timedelta(0)
        assert_serves(conn)
        response = handshake(conn, "OAUTHBEARER")
        assert response.error_code == ErrorCode.unsupported_sasl_mechanism
        assert closed_by_peer(conn)
    with key.raw() as conn:
        refused = sasl_login(conn, key.key_id, "not-the-secret")
        assert refused.error_code == ErrorCode.sasl_authentication_failed
        assert closed_by_peer(conn)
