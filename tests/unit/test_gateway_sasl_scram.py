"""SASL/SCRAM without sockets: what a key stores, and the gateway's side of the exchange.

The client here is written out from RFC 5802 with hashlib and hmac, not taken
from scramp (which the gateway uses), so the two sides cannot share a
mistake; RFC 7677's own example exchange pins the SHA-256 arithmetic to the
byte. Every refusal the gateway can meet (wrong secret, replayed nonce,
channel binding, an authorization id for someone else, delegation tokens,
malformed messages) must be a :class:`SaslError`, whose message the client
is shown, and never any other exception.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoal.gateway.sasl import SaslError
from shoal.gateway.scram import ClientFirst, ScramExchange, parse_client_first
from shoal.tenancy.keys import key_record, mint_key
from shoal.tenancy.model import ApiKey
from shoal.tenancy.scram import ITERATIONS, ScramCredential, ScramMechanism, derive, derive_all

SHA256 = ScramMechanism.SCRAM_SHA_256
SHA512 = ScramMechanism.SCRAM_SHA_512
_HASH = {SHA256: "sha256", SHA512: "sha512"}


class Client:
    """RFC 5802's client, by hand: client-first, then client-final from server-first."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        username: str,
        password: str,
        nonce: str = "fyko+d2lbbFgONRv9qkxdawL",
        gs2: str = "n,,",
    ) -> None:
        self.hash = _HASH[mechanism]
        self.password = password
        self.nonce = nonce
        self.gs2 = gs2
        self.first_bare = f"n={username.replace('=', '=3D').replace(',', '=2C')},r={nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return (self.gs2 + self.first_bare).encode()

    def final(self, server_first: bytes, password: str | None = None) -> bytes:
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        assert attrs["r"].startswith(self.nonce)
        salted = hashlib.pbkdf2_hmac(
            self.hash,
            (password or self.password).encode(),
            base64.b64decode(attrs["s"]),
            int(attrs["i"]),
        )
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self.hash, client_key).digest()
        without_proof = f"c={base64.b64encode(self.gs2.encode()).decode()},r={attrs['r']}"
        auth = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        proof = bytes(a ^ b for a, b in zip(client_key, self._hmac(stored_key, auth), strict=True))
        self.server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self.hash).digest()

    def verify(self, server_final: bytes) -> None:
        assert server_final == b"v=" + base64.b64encode(self.server_signature)


def exchange(
    mechanism: ScramMechanism, credential: ScramCredential, client: Client
) -> tuple[ScramExchange, bytes]:
    server = ScramExchange(parse_client_first(mechanism, client.first()), credential)
    return server, server.server_first


# What a key stores


def test_rfc7677_example_exchange_byte_for_byte() -> None:
    credential = derive(SHA256, "pencil", 4096, base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    client = Client(SHA256, "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    server = ScramExchange(
        parse_client_first(SHA256, client.first()),
        credential,
        server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
    )
    assert server.server_first == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    final = client.final(server.server_first)
    assert final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert server.finish(final) == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_a_new_key_has_both_mechanisms_with_their_own_salts_at_kafkas_minimum() -> None:
    minted = mint_key("acme", "test", 0)
    credentials = {c.mechanism: c for c in minted.key.scram}
    assert set(credentials) == {SHA256, SHA512}
    assert credentials[SHA256].salt != credentials[SHA512].salt
    assert {c.iterations for c in credentials.values()} == {ITERATIONS} == {4096}
    assert len(credentials[SHA512].stored_key) == 64
    assert len(credentials[SHA256].server_key) == 32


def test_the_same_secret_minted_twice_gets_different_salts_and_keys() -> None:
    first = key_record("K1", "acme", "s3cret", 0).scram_credential(SHA512)
    second = key_record("K1", "acme", "s3cret", 0).scram_credential(SHA512)
    assert first is not None and second is not None
    assert first.salt != second.salt and first.stored_key != second.stored_key


def test_the_record_keeps_no_secret_and_its_repr_shows_no_keys() -> None:
    minted = mint_key("acme", "test", 0)
    stored = minted.key.to_json().decode()
    assert minted.secret not in stored
    for credential in minted.key.scram:
        assert base64.b64encode(credential.stored_key).decode() not in repr(credential)


def test_credentials_survive_the_store_json() -> None:
    key = mint_key("acme", "test", 0).key
    again = ApiKey.from_json(key.to_json())
    assert again == key
    assert again.scram_credential(SHA256) == key.scram_credential(SHA256)


def test_a_key_stored_before_scram_reads_back_with_no_credentials() -> None:
    legacy = json.dumps(
        {"key_id": "KOLD", "tenant": "acme", "secret_hash": "scrypt$1", "created_ms": 0}
    ).encode()
    key = ApiKey.from_json(legacy)
    assert key.scram == ()
    assert key.scram_credential(SHA512) is None


@pytest.mark.parametrize("iterations", [1, 4095, 16385])
def test_iterations_outside_kafkas_bounds_are_refused(iterations: int) -> None:
    with pytest.raises(ValueError, match="4096"):
        derive(SHA256, "secret", iterations)


# The exchange


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_the_right_secret_signs_in_and_the_server_proves_itself(
    mechanism: ScramMechanism,
) -> None:
    secret = "k3y-s3cret_with-url.safe~chars"
    credential = derive(mechanism, secret)
    client = Client(mechanism, "KABCDEF", secret)
    server, server_first = exchange(mechanism, credential, client)
    assert server.username == "KABCDEF"
    client.verify(server.finish(client.final(server_first)))


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_a_wrong_secret_is_refused_as_invalid_credentials(mechanism: ScramMechanism) -> None:
    credential = derive(mechanism, "right")
    client = Client(mechanism, "KABCDEF", "right")
    server, server_first = exchange(mechanism, credential, client)
    with pytest.raises(SaslError, match="invalid API key or secret"):
        server.finish(client.final(server_first, password="wrong"))


def test_a_replayed_client_final_is_refused_by_its_nonce() -> None:
    credential = derive(SHA512, "right")
    client = Client(SHA512, "KABCDEF", "right")
    first_server, server_first = exchange(SHA512, credential, client)
    recorded = client.final(server_first)
    first_server.finish(recorded)
    second_server, _ = exchange(SHA512, credential, client)
    with pytest.raises(SaslError, match="replayed"):
        second_server.finish(recorded)


def test_a_client_final_with_an_altered_nonce_is_refused() -> None:
    credential = derive(SHA256, "right")
    client = Client(SHA256, "KABCDEF", "right")
    server, server_first = exchange(SHA256, credential, client)
    final = client.final(server_first).replace(b",p=", b"x,p=")
    with pytest.raises(SaslError, match="nonce"):
        server.finish(final)


def test_a_client_final_with_a_tampered_proof_is_refused() -> None:
    credential = derive(SHA256, "right")
    client = Client(SHA256, "KABCDEF", "right")
    server, server_first = exchange(SHA256, credential, client)
    good = client.final(server_first)
    head, _, proof = good.rpartition(b",p=")
    flipped = base64.b64decode(proof)
    tampered = head + b",p=" + base64.b64encode(bytes([flipped[0] ^ 1]) + flipped[1:])
    with pytest.raises(SaslError, match="invalid API key or secret"):
        server.finish(tampered)


def test_a_client_final_whose_channel_binding_is_not_biws_is_refused() -> None:
    credential = derive(SHA256, "right")
    client = Client(SHA256, "KABCDEF", "right")
    server, server_first = exchange(SHA256, credential, client)
    final = client.final(server_first).replace(b"c=biws", b"c=eSws")
    with pytest.raises(SaslError):
        server.finish(final)


@pytest.mark.parametrize("gs2", ["p=tls-unique,,", "p=tls-server-end-point,,", "y,,"])
def test_channel_binding_is_refused_with_that_reason(gs2: str) -> None:
    client = Client(SHA512, "KABCDEF", "x", gs2=gs2)
    with pytest.raises(SaslError, match="channel binding"):
        parse_client_first(SHA512, client.first())


def test_an_authorization_id_must_be_empty_or_the_username() -> None:
    assert parse_client_first(SHA256, b"n,a=KABC,n=KABC,r=abc").username == "KABC"
    with pytest.raises(SaslError, match="authorization id"):
        parse_client_first(SHA256, b"n,a=KOTHER,n=KABC,r=abc")


def test_the_username_is_unescaped_as_rfc5802_says() -> None:
    assert parse_client_first(SHA256, b"n,,n=a=2Cb=3Dc,r=abc").username == "a,b=c"
    with pytest.raises(SaslError, match="escape"):
        parse_client_first(SHA256, b"n,,n=a=b,r=abc")


def test_kafkas_delegation_token_extension_is_refused_with_that_reason() -> None:
    with pytest.raises(SaslError, match="delegation tokens"):
        parse_client_first(SHA512, b"n,,n=KABC,r=abc,tokenauth=true")


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"n,,",
        b"n,,r=abc,n=KABC",
        b"n,,n=,r=abc",
        b"n,,n=KABC,r=",
        b"n,,n=KABC",
        b"x,,n=KABC,r=abc",
        b"n,b=KABC,n=KABC,r=abc",
        b"n,,n=\xff,r=abc",
        b"n,,n=KABC,r=" + b"a" * 5000,
    ],
    ids=[
        "empty",
        "header-only",
        "nonce-first",
        "empty-user",
        "empty-nonce",
        "no-nonce",
        "unknown-gs2-flag",
        "not-an-authzid",
        "not-utf8",
        "too-long",
    ],
)
def test_malformed_client_first_messages_are_refused(message: bytes) -> None:
    with pytest.raises(SaslError):
        parse_client_first(SHA256, message)


def test_a_credential_of_the_other_mechanism_is_a_programming_error() -> None:
    first = ClientFirst(SHA256, "KABC", "n,,n=KABC,r=abc")
    with pytest.raises(ValueError, match="mechanism"):
        ScramExchange(first, derive(SHA512, "x"))


@given(st.binary(max_size=300))
def test_any_client_first_bytes_are_accepted_or_refused_never_crash(message: bytes) -> None:
    try:
        first = parse_client_first(SHA256, message)
    except SaslError:
        return
    with contextlib.suppress(SaslError):
        ScramExchange(first, _SHARED_CREDENTIAL)


@given(st.binary(max_size=300))
def test_any_client_final_bytes_are_refused_never_crash(message: bytes) -> None:
    server = ScramExchange(parse_client_first(SHA256, b"n,,n=KABC,r=abc"), _SHARED_CREDENTIAL)
    with pytest.raises(SaslError):
        server.finish(message)


_SHARED_CREDENTIAL = derive(SHA256, "shared")


def test_derive_all_covers_every_mechanism() -> None:
    assert {c.mechanism for c in derive_all("x")} == set(ScramMechanism)
