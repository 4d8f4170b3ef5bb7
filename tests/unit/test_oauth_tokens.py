"""The gateway's tokens: what it signs, what it accepts, and what it refuses and why.

Every refusal a client can meet has its own case and its message is
checked, because the message is what an operator reads in librdkafka's log
(expired, not yet valid, wrong audience or issuer, foreign signature,
unknown key). Rotation is checked as a user sees it: a token signed before a
rotation keeps working until it expires, and a key is dropped only once no
token it signed can still be valid. Time is passed in, never read.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, OctKey, RSAKey
from shoal.gateway.http.auth import TokenError
from shoal.gateway.oauth.external import JwksCache, JwksUnavailableError
from shoal.gateway.oauth.keys import KeyRing, SigningKey, new_signing_key
from shoal.gateway.oauth.tokens import (
    ASYMMETRIC,
    TokenPolicy,
    UnknownKeyError,
    issue_token,
    peek,
    verify_token,
)

NOW = 1_800_000_000
POLICY = TokenPolicy(issuer="http://gw:8080", audience="shoal", lifetime_s=900, leeway_s=30)


@pytest.fixture(scope="module")
def ring() -> KeyRing:
    return KeyRing((new_signing_key(NOW * 1000),))


@pytest.fixture(scope="module")
def stranger() -> SigningKey:
    return new_signing_key(NOW * 1000)


def issue(key: SigningKey, now: int = NOW, policy: TokenPolicy = POLICY) -> str:
    return issue_token(key, policy, subject="Kabc", tenant="acme", now=now).access_token


def check(token: str, ring: KeyRing, now: int = NOW, **kwargs: Any) -> Mapping[str, Any]:
    options: dict[str, Any] = {
        "issuer": POLICY.issuer,
        "audience": POLICY.audience,
        "now": now,
        "leeway_s": POLICY.leeway_s,
        **kwargs,
    }
    return verify_token(token, ring.verification_keys(), **options)


def refused(token: str, ring: KeyRing, now: int = NOW, **kwargs: Any) -> str:
    with pytest.raises(TokenError) as caught:
        check(token, ring, now, **kwargs)
    return str(caught.value)


# Issuing


def test_an_issued_token_carries_the_claims_and_the_signing_key_id(ring: KeyRing) -> None:
    issued = issue_token(ring.active, POLICY, subject="Kabc", tenant="acme", now=NOW, scope="a b")
    claims = check(issued.access_token, ring)
    assert issued.expires_in == 900
    assert issued.scope == "a b"
    assert {k: claims[k] for k in ("iss", "sub", "aud", "tenant", "client_id", "scope")} == {
        "iss": "http://gw:8080",
        "sub": "Kabc",
        "aud": "shoal",
        "tenant": "acme",
        "client_id": "Kabc",
        "scope": "a b",
    }
    assert (claims["iat"], claims["nbf"], claims["exp"]) == (NOW, NOW, NOW + 900)
    assert len(claims["jti"]) == 32
    assert peek(issued.access_token).kid == ring.active.kid


def test_each_token_has_its_own_id(ring: KeyRing) -> None:
    first, second = (check(issue(ring.active), ring)["jti"] for _ in range(2))
    assert first != second


def test_a_key_id_is_the_public_keys_thumbprint_and_no_secret_is_in_its_repr(
    ring: KeyRing,
) -> None:
    key = ring.active
    assert RSAKey.import_key(key.public_jwk()).thumbprint() == key.kid
    assert "PRIVATE" not in repr(key)
    assert all("d" not in jwk for jwk in ring.jwks()["keys"])


# Refusals, each with the message a client sees


def test_an_expired_token_is_refused_once_past_the_leeway(ring: KeyRing) -> None:
    token = issue(ring.active)
    assert check(token, ring, now=NOW + 900 + 29)["sub"] == "Kabc"
    assert "expired" in refused(token, ring, now=NOW + 900 + 30)


def test_a_token_from_the_future_is_not_valid_yet(ring: KeyRing) -> None:
    token = issue(ring.active, now=NOW + 60)
    assert "not valid" in refused(token, ring, now=NOW)
    assert check(token, ring, now=NOW + 31)["sub"] == "Kabc"


def test_a_token_for_another_audience_is_refused(ring: KeyRing) -> None:
    assert "another audience" in refused(issue(ring.active), ring, audience="billing")


def test_a_token_of_another_issuer_is_refused(ring: KeyRing) -> None:
    other = TokenPolicy("http://evil:8080", "shoal", 900, 30)
    assert "issuer" in refused(issue(ring.active, policy=other), ring)


def test_a_token_signed_by_a_foreign_key_under_our_key_id_is_refused(
    ring: KeyRing, stranger: SigningKey
) -> None:
    forged = SigningKey(ring.active.kid, stranger.private_pem, NOW)
    assert "signature does not verify" in refused(issue(forged), ring)


def test_a_token_tampered_with_after_signing_is_refused(ring: KeyRing) -> None:
    token = issue(ring.active)
    header, _, signature = token.split(".")
    claims = {**check(token, ring), "tenant": "other"}
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    assert "signature does not verify" in refused(f"{header}.{payload}.{signature}", ring)


def test_a_token_naming_an_unknown_key_is_refused_as_such(
    ring: KeyRing, stranger: SigningKey
) -> None:
    with pytest.raises(UnknownKeyError, match="not known"):
        check(issue(stranger), ring)


@pytest.mark.parametrize(
    "key,alg",
    [(OctKey.generate_key(256), "HS256"), (ECKey.generate_key("P-256"), "ES256")],
    ids=["hmac", "unlisted-algorithm"],
)
def test_tokens_in_algorithms_we_do_not_accept_are_refused(
    ring: KeyRing, key: Any, alg: str
) -> None:
    claims = check(issue(ring.active), ring)
    token = jwt.encode({"alg": alg, "kid": ring.active.kid}, dict(claims), key, algorithms=[alg])
    assert "algorithm" in refused(token, ring)


def test_an_unsigned_token_is_refused(ring: KeyRing) -> None:
    _, payload, _ = issue(ring.active).split(".")
    # {"alg":"none"}: the oldest JWT attack.
    assert "algorithm" in refused(f"eyJhbGciOiJub25lIn0.{payload}.", ring)


@pytest.mark.parametrize(
    "token", ["", "abc", "a.b.c", "x" * 70000, "eyJhbGciOiJSUzI1NiJ9.WzFd.c2ln"]
)
def test_what_is_not_a_jwt_is_refused_as_such(ring: KeyRing, token: str) -> None:
    assert "token" in refused(token, ring)


def test_a_token_without_a_claim_the_caller_needs_is_refused(ring: KeyRing) -> None:
    assert "lacks the claim groups" in refused(issue(ring.active), ring, required=("groups",))


# Rotation


def test_rotation_keeps_tokens_of_the_retired_key_valid_until_they_expire() -> None:
    first = KeyRing.first(NOW * 1000)
    old_token = issue(first.active)
    retain_ms = (900 + 10 + 30) * 1000
    second = first.rotated(new_signing_key(NOW * 1000 + 60_000), NOW * 1000 + 60_000, retain_ms)
    assert second.active.kid != first.active.kid
    assert second.keys[0].retired_ms == NOW * 1000 + 60_000
    assert [k["kid"] for k in second.jwks()["keys"]] == [first.active.kid, second.active.kid]
    assert check(old_token, second, now=NOW + 120)["sub"] == "Kabc"
    assert check(issue(second.active, now=NOW + 60), second, now=NOW + 120)["sub"] == "Kabc"
    # Rotated again after every token of the first key has expired: it is dropped.
    later_ms = NOW * 1000 + 60_000 + retain_ms
    third = second.rotated(new_signing_key(later_ms), later_ms, retain_ms)
    assert [k.kid for k in third.keys] == [second.active.kid, third.active.kid]
    with pytest.raises(UnknownKeyError):
        check(old_token, third, now=NOW + 120)


def test_a_ring_is_due_for_rotation_after_its_period() -> None:
    ring = KeyRing((SigningKey("k", "pem", created_ms=1000),))
    assert not ring.due(now_ms=1000 + 59_999, period_ms=60_000)
    assert ring.due(now_ms=1000 + 60_000, period_ms=60_000)


def test_a_ring_survives_its_json_form(ring: KeyRing) -> None:
    assert KeyRing.from_json(ring.to_json()) == ring


def test_a_ring_has_exactly_one_active_key_its_newest() -> None:
    with pytest.raises(ValueError):
        KeyRing(())
    with pytest.raises(ValueError):
        KeyRing((SigningKey("a", "p", 1), SigningKey("b", "p", 2)))


# External issuers' keys


class FakeIdp:
    def __init__(self, *keys: RSAKey) -> None:
        self.keys = list(keys)
        self.fetches = 0
        self.down = False

    async def fetch(self) -> Mapping[str, Any]:
        self.fetches += 1
        if self.down:
            raise JwksUnavailableError("the token issuer's keys could not be fetched")
        return {"keys": [k.as_dict(private=False) for k in self.keys]}


def rsa(kid: str) -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig"})


async def test_external_keys_are_fetched_once_and_again_for_a_new_key_id() -> None:
    clock = [0.0]
    idp = FakeIdp(rsa("one"))
    cache = JwksCache(idp.fetch, lambda: clock[0], min_refetch_s=10)
    assert [k.kid for k in (await cache.keys("one")).keys] == ["one"]
    await cache.keys("one")
    assert idp.fetches == 1
    idp.keys.append(rsa("two"))
    clock[0] = 10
    assert {k.kid for k in (await cache.keys("two")).keys} == {"one", "two"}
    assert idp.fetches == 2


async def test_made_up_key_ids_cannot_make_the_gateway_hammer_the_issuer() -> None:
    clock = [0.0]
    idp = FakeIdp(rsa("one"))
    cache = JwksCache(idp.fetch, lambda: clock[0], min_refetch_s=10)
    for guess in range(20):
        keys = await cache.keys(f"guess-{guess}")
        assert [k.kid for k in keys.keys] == ["one"]
        clock[0] += 0.1
    assert idp.fetches == 1


async def test_an_unreachable_issuer_is_a_refusal_not_a_crash() -> None:
    idp = FakeIdp(rsa("one"))
    idp.down = True
    cache = JwksCache(idp.fetch, lambda: 0.0)
    with pytest.raises(JwksUnavailableError, match="could not be fetched"):
        await cache.keys("one")


async def test_external_tokens_in_any_listed_asymmetric_algorithm_verify() -> None:
    key = ECKey.generate_key("P-256", parameters={"kid": "ec", "use": "sig"})
    cache = JwksCache(lambda: _jwks(key), lambda: 0.0)
    claims = {"iss": "https://idp", "aud": "shoal", "exp": NOW + 60, "sub": "alice"}
    token = jwt.encode({"alg": "ES256", "kid": "ec"}, claims, key, algorithms=["ES256"])
    verified = verify_token(
        token,
        await cache.keys("ec"),
        issuer="https://idp",
        audience="shoal",
        now=NOW,
        leeway_s=0,
        algorithms=ASYMMETRIC,
    )
    assert verified["sub"] == "alice"


async def _jwks(key: Any) -> Mapping[str, Any]:
    return {"keys": [key.as_dict(private=False)]}
