"""OAuth 2.0 end to end: librdkafka's OIDC client-credentials login against the
gateway's own token endpoint, token refresh by KIP-368 re-authentication,
refusals over both doors, key rotation, and an external issuer's tokens.

One gateway (one broker behind it) serves the module, with tokens that live
8 s so that a client's session outlives its token several times within a
test: a producer and a consumer keep working across the refreshes, and the
gateway's log shows that their connections re-authenticated rather than
reconnected. An external identity provider is a JWKS file served over HTTP
by the test; its tokens name the tenant in a ``shoal_tenant`` claim.

Refused tokens (expired, foreign-signed, revoked key, unknown tenant) are
checked where a user meets them: the SaslAuthenticate error a Kafka client
reports, the 401 of an HTTP call, and RFC 6749 errors at the token endpoint.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import GatewayCluster, start_gateway_cluster
from gateway_env import TenantKey, tenancy
from harness import EtcdServer, free_port, wait_until
from joserfc import jwt
from joserfc.jwk import RSAKey
from raw_kafka import RawConnection, request_class
from shoal.gateway.oauth.keys import SigningKey
from shoal.gateway.oauth.keystore import SigningKeyStore
from shoal.gateway.oauth.tokens import TokenPolicy, issue_token
from shoal.tenancy.acl import default_bindings

pytestmark = pytest.mark.slow

LIFETIME_S = 8
IDP_ISSUER = "https://idp.example.com"
IDP_KID = "idp-1"
TENANT_CLAIM = "shoal_tenant"
SASL_AUTHENTICATION_FAILED = 58


class JwksServer:
    """The external identity provider's JWKS endpoint."""

    def __init__(self) -> None:
        self.key = RSAKey.generate_key(2048, parameters={"kid": IDP_KID, "use": "sig"})
        document = json.dumps({"keys": [self.key.as_dict(private=False)]}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(document)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, tenant: str, principal: str, lifetime_s: int = 300) -> str:
        now = int(time.time())
        claims = {
            "iss": IDP_ISSUER,
            "aud": "shoal",
            "sub": principal,
            TENANT_CLAIM: tenant,
            "iat": now,
            "exp": now + lifetime_s,
        }
        return jwt.encode({"alg": "RS256", "kid": IDP_KID}, claims, self.key)


@pytest.fixture(scope="module")
def idp() -> Iterator[JwksServer]:
    server = JwksServer()
    yield server
    server.server.shutdown()


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, idp: JwksServer
) -> Iterator[GatewayCluster]:
    root = tmp_path_factory.mktemp("oauth-cluster")
    env = {
        "SHOAL_OAUTH_TOKEN_LIFETIME_S": str(LIFETIME_S),
        "SHOAL_OAUTH_LEEWAY_S": "1",
        "SHOAL_OAUTH_EXTERNAL_ISSUER": IDP_ISSUER,
        "SHOAL_OAUTH_EXTERNAL_JWKS_URL": idp.url,
        "SHOAL_OAUTH_EXTERNAL_TENANT_CLAIM": TENANT_CLAIM,
    }
    cluster, started = start_gateway_cluster(etcd, root, brokers=1, gateway_env=env)
    yield cluster
    if cluster.gateway.running:
        cluster.gateway.stop()
    for broker in started:
        broker.stop()


# -- helpers ---------------------------------------------------------------------------------


def oidc(key: TenantKey, **extra: Any) -> dict[str, Any]:
    """librdkafka's settings for OIDC client credentials against the gateway."""
    return {
        "bootstrap.servers": key.bootstrap(),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": key.key_id,
        "sasl.oauthbearer.client.secret": key.secret,
        "sasl.oauthbearer.token.endpoint.url": key.gateway.http_url + "/oauth2/token",
        **extra,
    }


def with_token(bootstrap: str, token: str, principal: str, **extra: Any) -> dict[str, Any]:
    """librdkafka's settings for a token the application brings (oauth_cb)."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": lambda _config: (token, time.time() + 300, principal),
        **extra,
    }


def create_topic(config: dict[str, Any], name: str, partitions: int = 1) -> None:
    admin = AdminClient(config)
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)


def sasl_oauthbearer(connection: RawConnection, token: str) -> Any:
    """SaslHandshake v1 + SaslAuthenticate v2 with OAUTHBEARER; the SaslAuthenticate answer."""
    handshake = request_class(17, 1)
    assert connection.call(handshake(mechanism="OAUTHBEARER")).error_code == 0
    authenticate = request_class(36, 2)
    message = f"n,,\x01auth=Bearer {token}\x01\x01".encode()
    return connection.call(authenticate(auth_bytes=message))


def kafka_login(bootstrap: str, token: str) -> Any:
    with RawConnection(bootstrap) as connection:
        return sasl_oauthbearer(connection, token)


def api_versions(connection: RawConnection) -> Any:
    request = request_class(18, 3)
    return connection.call(request(client_software_name="t", client_software_version="1"))


def token_request(cluster: GatewayCluster, **kwargs: Any) -> httpx.Response:
    return httpx.post(cluster.gateway.http_url + "/oauth2/token", timeout=10, **kwargs)


def get_token(cluster: GatewayCluster, key: TenantKey) -> str:
    response = token_request(
        cluster, data={"grant_type": "client_credentials"}, auth=(key.key_id, key.secret)
    )
    assert response.status_code == 200, response.text
    return str(response.json()["access_token"])


def whoami(cluster: GatewayCluster, token: str) -> httpx.Response:
    return httpx.get(
        cluster.gateway.http_url + "/oauth2/userinfo",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def signing_key(cluster: GatewayCluster) -> SigningKey:
    async def read() -> SigningKey:
        async with SigningKeyStore(cluster.etcd_url) as store:
            found = await store.read()
            assert found is not None
            return found[0].active

    return asyncio.run(read())


def own_token(cluster: GatewayCluster, key: TenantKey, signer: SigningKey, now: float) -> str:
    policy = TokenPolicy(cluster.gateway.http_url, "shoal", LIFETIME_S, 1)
    return issue_token(signer, policy, subject=key.key_id, tenant=key.tenant, now=now).access_token


# -- tests -----------------------------------------------------------------------------------


def test_oidc_client_credentials_produce_and_consume_across_token_refreshes(
    cluster: GatewayCluster,
) -> None:
    key = cluster.tenant("oidc")
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    create_topic(oidc(key), topic)
    producer = Producer(oidc(key, **{"linger.ms": 0}))
    consumer = Consumer(oidc(key, **{"group.id": "g1", "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    sent: list[bytes] = []
    received: list[bytes] = []
    # Two and a half token lifetimes: every connection's session ends twice on its way.
    deadline = time.monotonic() + 2.5 * LIFETIME_S
    while time.monotonic() < deadline:
        value = f"record-{len(sent)}".encode()
        producer.produce(topic, value)
        sent.append(value)
        producer.poll(0)
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            received.append(message.value())
    assert producer.flush(30) == 0
    end = time.monotonic() + 20
    while len(received) < len(sent) and time.monotonic() < end:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            received.append(message.value())
    consumer.close()
    assert received == sent
    # The client fetched new tokens and logged in again on the connections it had.
    log = cluster.gateway.log_text()
    assert log.count(f"event=oauth_token_issued tenant=oidc key={key.key_id}") >= 3
    peers = re.findall(rf"event=gateway_reauthenticated peer=(\S+) key={key.key_id} ", log)
    assert peers, "librdkafka did not re-authenticate"
    assert max(peers.count(peer) for peer in peers) >= 2
    assert f"key={key.key_id} reason=the_session_expired" not in log


def test_a_session_lasts_as_long_as_its_token_unless_renewed_on_the_connection(
    cluster: GatewayCluster,
) -> None:
    key = cluster.tenant("sessions")
    other = cluster.tenant("sessions")
    signer = signing_key(cluster)
    # A token that ends 3 s from now, on two connections; only one renews its session.
    short = own_token(cluster, key, signer, now=time.time() - LIFETIME_S + 3)
    with RawConnection(key.bootstrap()) as renewing, RawConnection(key.bootstrap()) as lapsing:
        for connection in (renewing, lapsing):
            answer = sasl_oauthbearer(connection, short)
            assert answer.error_code == 0
            assert 1 <= answer.session_lifetime.total_seconds() <= 3
        renewed = sasl_oauthbearer(renewing, own_token(cluster, key, signer, time.time()))
        assert renewed.error_code == 0
        assert renewed.session_lifetime.total_seconds() > 5
        time.sleep(3.5)
        assert api_versions(renewing).error_code == 0
        lapsing.send(request_class(18, 3)(client_software_name="t", client_software_version="1"))
        assert lapsing.is_closed_by_peer()
    # Re-authentication cannot switch to another key's token.
    with RawConnection(key.bootstrap()) as connection:
        fresh = own_token(cluster, key, signer, time.time())
        assert sasl_oauthbearer(connection, fresh).error_code == 0
        switched = sasl_oauthbearer(connection, own_token(cluster, other, signer, time.time()))
        assert switched.error_code == SASL_AUTHENTICATION_FAILED
        assert "principal" in switched.error_message
        assert connection.is_closed_by_peer()
    assert f"key={key.key_id} reason=the_session_expired" in cluster.gateway.log_text()


def test_expired_and_foreign_tokens_are_refused_over_kafka_and_http(
    cluster: GatewayCluster,
) -> None:
    key = cluster.tenant("refusals")
    ours = signing_key(cluster)
    expired = own_token(cluster, key, ours, now=time.time() - LIFETIME_S - 60)
    stranger = SigningKey(ours.kid, RSAKey.generate_key(2048).as_pem(private=True).decode(), 0)
    foreign = own_token(cluster, key, stranger, now=time.time())
    valid = own_token(cluster, key, ours, now=time.time())
    for token, why in [(expired, "expired"), (foreign, "signature does not verify")]:
        answer = kafka_login(key.bootstrap(), token)
        assert answer.error_code == SASL_AUTHENTICATION_FAILED
        assert why in answer.error_message
        response = whoami(cluster, token)
        assert response.status_code == 401
        assert why in response.json()["message"]
    assert kafka_login(key.bootstrap(), valid).error_code == 0
    assert whoami(cluster, valid).json() == {"sub": key.key_id, "tenant": "refusals"}
    # librdkafka reports the gateway's reason to the application.
    errors: list[KafkaError] = []
    producer = Producer(with_token(key.bootstrap(), foreign, key.key_id, error_cb=errors.append))
    wait_until(lambda: producer.poll(0.2) is not None and bool(errors), 15, "an auth error")
    assert errors[0].code() == KafkaError._AUTHENTICATION
    assert "signature does not verify" in errors[0].str()


def test_a_revoked_key_gets_no_tokens_and_its_tokens_stop_working(
    cluster: GatewayCluster,
) -> None:
    key = cluster.tenant("revoked")
    posted = token_request(
        cluster,
        data={
            "grant_type": "client_credentials",
            "client_id": key.key_id,
            "client_secret": key.secret,
        },
    )
    assert posted.status_code == 200
    body = posted.json()
    assert (body["token_type"], body["expires_in"]) == ("Bearer", LIFETIME_S)
    assert posted.headers["cache-control"] == "no-store"
    token = body["access_token"]
    assert whoami(cluster, token).status_code == 200

    tenancy(cluster.etcd_url, lambda store: store.revoke_key(key.key_id, int(time.time() * 1000)))

    def refused() -> bool:
        response = token_request(
            cluster, data={"grant_type": "client_credentials"}, auth=(key.key_id, key.secret)
        )
        return response.status_code == 401

    wait_until(refused, 10, "the revoked key to be refused tokens")
    response = token_request(
        cluster, data={"grant_type": "client_credentials"}, auth=(key.key_id, key.secret)
    )
    assert response.json()["error"] == "invalid_client"
    assert response.headers["www-authenticate"].startswith("Basic")
    assert "revoked" in whoami(cluster, token).json()["message"]
    answer = kafka_login(key.bootstrap(), token)
    assert answer.error_code == SASL_AUTHENTICATION_FAILED
    assert "revoked" in answer.error_message


def test_the_token_endpoint_answers_rfc_6749_errors(cluster: GatewayCluster) -> None:
    key = cluster.tenant("errors")
    cases = [
        ({"data": {"grant_type": "password"}, "auth": (key.key_id, key.secret)}, 400,
         "unsupported_grant_type"),
        ({"data": {"scope": "x"}, "auth": (key.key_id, key.secret)}, 400, "invalid_request"),
        ({"json": {"grant_type": "client_credentials"}}, 400, "invalid_request"),
        ({"data": {"grant_type": "client_credentials"}}, 401, "invalid_client"),
        ({"data": {"grant_type": "client_credentials"}, "auth": (key.key_id, "wrong")}, 401,
         "invalid_client"),
        ({"data": {"grant_type": "client_credentials", "client_id": key.key_id,
                   "client_secret": key.secret}, "auth": (key.key_id, key.secret)}, 400,
         "invalid_request"),
    ]  # fmt: skip
    for request, status, error in cases:
        response = token_request(cluster, **request)
        assert (response.status_code, response.json()["error"]) == (status, error), request
        assert response.json()["error_description"]


def test_discovery_and_jwks_publish_the_key_tokens_are_signed_with(
    cluster: GatewayCluster,
) -> None:
    base = cluster.gateway.http_url
    discovery = httpx.get(base + "/.well-known/openid-configuration", timeout=10).json()
    assert discovery["issuer"] == base
    assert discovery["token_endpoint"] == base + "/oauth2/token"
    assert discovery["grant_types_supported"] == ["client_credentials"]
    assert set(discovery["token_endpoint_auth_methods_supported"]) == {
        "client_secret_basic",
        "client_secret_post",
    }
    token = get_token(cluster, cluster.tenant("discovery"))
    jwks = httpx.get(discovery["jwks_uri"], timeout=10).json()
    kid = jwt.decode(token, RSAKey.import_key(jwks["keys"][-1])).header["kid"]
    assert kid in [k["kid"] for k in jwks["keys"]]
    assert all("d" not in k for k in jwks["keys"])


def test_rotation_keeps_issued_tokens_valid_and_replicas_trust_the_new_key(
    cluster: GatewayCluster, tmp_path: Path
) -> None:
    key = cluster.tenant("rotation")
    before = get_token(cluster, key)
    old = signing_key(cluster)
    rotated = subprocess.run(
        [sys.executable, "-m", "shoal", "oauth", "rotate-keys", "-o", "json",
         f"--etcd={cluster.etcd_url}", f"--token-lifetime-s={LIFETIME_S}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    ring = json.loads(rotated.stdout)
    assert ring["retired"][-1] == old.kid
    new = signing_key(cluster)
    assert new.kid == ring["active"] != old.kid
    # The old key's token still works; one signed by the new key (as another replica
    # would sign it) is trusted at once, before this gateway's next refresh.
    assert whoami(cluster, before).status_code == 200
    assert whoami(cluster, own_token(cluster, key, new, now=time.time())).status_code == 200


def test_external_issuer_tokens_reach_only_the_tenant_they_name(
    cluster: GatewayCluster, idp: JwksServer
) -> None:
    for tenant in ("ext-a", "ext-b"):
        cluster.tenant(tenant, bindings=default_bindings(tenant, "alice"))
    bootstrap = cluster.gateway.bootstrap
    token_a = idp.token("ext-a", "alice")
    token_b = idp.token("ext-b", "alice")
    assert whoami(cluster, token_a).json() == {"sub": "alice", "tenant": "ext-a"}
    create_topic(with_token(bootstrap, token_a, "alice"), "only-in-a")
    create_topic(with_token(bootstrap, token_b, "alice"), "only-in-b")
    seen_by_b = AdminClient(with_token(bootstrap, token_b, "alice")).list_topics(timeout=10)
    assert "only-in-b" in seen_by_b.topics
    assert "only-in-a" not in seen_by_b.topics
    assert not any(name.startswith("ext-a") for name in seen_by_b.topics)
    # A principal without bindings in the tenant it names gets nothing of it.
    create_denied = AdminClient(with_token(bootstrap, idp.token("ext-a", "mallory"), "mallory"))
    with pytest.raises(Exception, match=r"AUTHORIZATION|authorized"):
        for future in create_denied.create_topics([NewTopic("nope", 1, 1)]).values():
            future.result(10)
    answer = kafka_login(bootstrap, idp.token("no-such-tenant", "alice"))
    assert answer.error_code == SASL_AUTHENTICATION_FAILED
    assert "does not exist" in answer.error_message
    expired = idp.token("ext-a", "alice", lifetime_s=-60)
    assert "expired" in kafka_login(bootstrap, expired).error_message


def test_replicas_starting_or_rotating_together_agree_on_one_key_ring(etcd: EtcdServer) -> None:
    """Against a real etcd: create-if-absent and compare-and-swap, raced."""
    url = etcd.chroot_url()

    async def race() -> None:
        async with SigningKeyStore(url) as first, SigningKeyStore(url) as second:
            rings = await asyncio.gather(first.load_or_create(0), second.load_or_create(0))
            assert rings[0] == rings[1]
            now_ms = 120_000
            rotated = await asyncio.gather(
                first.rotate(now_ms, retain_ms=60_000, period_ms=60_000),
                second.rotate(now_ms, retain_ms=60_000, period_ms=60_000),
            )
            assert rotated[0] == rotated[1]
            assert [k.kid for k in rotated[0].keys[:-1]] == [rings[0].active.kid]

    asyncio.run(race())
