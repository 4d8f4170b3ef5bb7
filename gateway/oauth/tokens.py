"""Issuing and verifying JWT access tokens: pure, the clock passed in.

Tokens we issue (RFC 9068's JWT access-token profile, trimmed)::

    header  {"alg": "RS256", "typ": "JWT", "kid": <thumbprint of the signing key>}
    claims  {"iss": <the gateway's public HTTP URL>, "sub": <API key id>,
             "aud": <audience>, "client_id": <API key id>, "tenant": <tenant>,
             "iat", "nbf", "exp", "jti", ["scope"]}

Verification checks, in this order, so that the message names the first
thing wrong: the token is a compact JWS, its key id is known, the signature
verifies, then iss, aud, exp and nbf (with ``leeway_s`` either way, for
clocks that disagree), and that the claims a caller needs are present. Every
failure is a :class:`~shoal.gateway.http.auth.TokenError` whose message is
safe to show the client (it says what is wrong, never which keys we have).

Only asymmetric algorithms are accepted: a JWKS publishes public keys, and
an HMAC "signed" with a public key would verify for anyone.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from joserfc import errors, jwt
from joserfc.jwk import KeySet
from joserfc.jws import extract_compact
from shoal.gateway.http.auth import TokenError
from shoal.gateway.oauth.keys import ALGORITHM, SigningKey

TENANT_CLAIM: Final = "tenant"
ASYMMETRIC: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384")
MAX_TOKEN_BYTES: Final = 65536
"""Identity providers' tokens can carry many groups; beyond this is not a token."""


class UnknownKeyError(TokenError):
    """The token names a key id the key set lacks (a fresh key, or a stranger's)."""


@dataclass(frozen=True, slots=True)
class TokenPolicy:
    """How the gateway issues and checks its own tokens."""

    issuer: str
    audience: str
    lifetime_s: int
    leeway_s: int


@dataclass(frozen=True, slots=True)
class IssuedToken:
    access_token: str
    expires_in: int
    scope: str | None = None


def issue_token(
    key: SigningKey,
    policy: TokenPolicy,
    *,
    subject: str,
    tenant: str,
    now: float,
    scope: str | None = None,
) -> IssuedToken:
    issued_at = int(now)
    claims: dict[str, Any] = {
        "iss": policy.issuer,
        "sub": subject,
        "aud": policy.audience,
        "client_id": subject,
        TENANT_CLAIM: tenant,
        "iat": issued_at,
        "nbf": issued_at,
        "exp": issued_at + policy.lifetime_s,
        "jti": uuid.uuid4().hex,
    }
    if scope:
        claims["scope"] = scope
    header = {"alg": ALGORITHM, "typ": "JWT", "kid": key.kid}
    token = jwt.encode(header, claims, key.jwk(), algorithms=[ALGORITHM])
    return IssuedToken(token, policy.lifetime_s, scope or None)


@dataclass(frozen=True, slots=True)
class Unverified:
    """What a token says about itself before any check: only for choosing a verifier."""

    kid: str | None
    issuer: str | None


def peek(token: str) -> Unverified:
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenError("the token is too long")
    try:
        compact = extract_compact(token.encode("ascii"))
        claims = json.loads(compact.payload)
    except (errors.JoseError, UnicodeError, ValueError):
        raise TokenError("the token is not a JWT") from None
    if not isinstance(claims, dict):
        raise TokenError("the token's payload is not a JSON object")
    kid = compact.headers().get("kid")
    issuer = claims.get("iss")
    return Unverified(
        kid if isinstance(kid, str) else None, issuer if isinstance(issuer, str) else None
    )


def verify_token(
    token: str,
    keys: KeySet,
    *,
    issuer: str,
    audience: str,
    now: int,
    leeway_s: int,
    algorithms: Iterable[str] = (ALGORITHM,),
    required: Iterable[str] = ("sub",),
) -> Mapping[str, Any]:
    """The token's claims if it is valid at ``now``; :class:`TokenError` says why not."""
    unverified = peek(token)
    if unverified.kid is not None and not any(k.kid == unverified.kid for k in keys.keys):
        raise UnknownKeyError(f"the token's signing key {unverified.kid!r} is not known")
    try:
        decoded = jwt.decode(token, keys, algorithms=list(algorithms))
    except errors.BadSignatureError:
        raise TokenError("the token's signature does not verify") from None
    except errors.InvalidKeyIdError:
        raise UnknownKeyError("the token's signing key is not known") from None
    except (errors.UnsupportedAlgorithmError, errors.MissingAlgorithmError):
        raise TokenError("the token's signing algorithm is not accepted") from None
    except errors.JoseError as exc:
        raise TokenError(f"the token is malformed ({exc.error})") from None
    claims = decoded.claims
    registry = jwt.JWTClaimsRegistry(
        now=now,
        leeway=leeway_s,
        iss={"essential": True, "value": issuer},
        aud={"essential": True, "value": audience},
        exp={"essential": True},
    )
    try:
        registry.validate(claims)
    except errors.ExpiredTokenError:
        raise TokenError(f"the token expired at {_when(claims.get('exp'))}") from None
    except errors.MissingClaimError as exc:
        raise TokenError(f"the token lacks the claim {exc.claim}") from None
    except errors.InvalidClaimError as exc:
        raise TokenError(_invalid_claim(exc, claims)) from None
    missing = sorted(name for name in required if not _present(claims.get(name)))
    if missing:
        raise TokenError(f"the token lacks the claim {', '.join(missing)}")
    return claims


def expires_at(claims: Mapping[str, Any]) -> float:
    """The token's ``exp`` as Unix seconds (verified tokens always have one)."""
    return float(claims["exp"])


def _present(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _when(exp: object) -> str:
    if isinstance(exp, int | float):
        return datetime.fromtimestamp(exp, UTC).isoformat(timespec="seconds")
    return "?"


def _invalid_claim(exc: errors.InvalidClaimError, claims: Mapping[str, Any]) -> str:
    claim = exc.claim
    if claim == "iss":
        return "the token's issuer is not the one expected"
    if claim == "aud":
        return "the token is meant for another audience"
    if claim == "nbf":
        return f"the token is not valid before {_when(claims.get('nbf'))}"
    if claim == "iat":
        return "the token is not valid yet: it was issued in the future"
    return f"the token's {claim} claim is invalid"
