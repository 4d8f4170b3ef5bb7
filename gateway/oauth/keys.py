"""The signing key ring every gateway replica signs and verifies with.

A ring is a list of RSA keys, oldest first; the last one is *active* and
signs every new token, the others are *retired*: they sign nothing but stay
published (JWKS) and trusted until every token they signed has expired.
Rotation appends a fresh key, retires the previous active one, and drops
keys retired longer ago than ``retain_ms``, the longest a token they signed
can still be valid (token lifetime, plus how stale a replica's copy of the
ring may be, plus clock leeway).

Invariant: a ring is never empty, keys are ordered by ``created_ms``, and
exactly the last key has ``retired_ms is None``.

The ring is one JSON document (one etcd value), so replicas agree on it by
compare-and-swap of the whole; ``kid`` is the RFC 7638 thumbprint of the
public key, the same on every replica that reads it.

RS256 because it is what every JWT library and identity-provider tool
verifies (it is OpenID Connect's mandatory algorithm).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from typing import Any, Final

from joserfc.jwk import KeyParameters, KeySet, RSAKey

ALGORITHM: Final = "RS256"
KEY_SIZE: Final = 2048


@dataclass(frozen=True, slots=True)
class SigningKey:
    kid: str
    private_pem: str
    created_ms: int
    retired_ms: int | None = None

    def __repr__(self) -> str:
        return f"SigningKey(kid={self.kid!r}, created_ms={self.created_ms}, private=<hidden>)"

    def jwk(self) -> RSAKey:
        """The private key, for signing."""
        return _imported(self.private_pem, self.kid)

    def public_jwk(self) -> dict[str, Any]:
        """The public half as a JWK, as published at the JWKS endpoint."""
        return dict(_public(self.private_pem, self.kid))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kid": self.kid,
            "private_pem": self.private_pem,
            "created_ms": self.created_ms,
            "retired_ms": self.retired_ms,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SigningKey:
        return cls(
            kid=str(data["kid"]),
            private_pem=str(data["private_pem"]),
            created_ms=int(data["created_ms"]),
            retired_ms=None if data.get("retired_ms") is None else int(data["retired_ms"]),
        )


# Importing an RSA private key checks it, which takes tens of milliseconds of the
# event loop; the JWKS endpoint (anyone may call it) and every token signed or
# verified would pay that each time. A ring holds a handful of keys that never
# change, so each is imported once per process.
@functools.lru_cache(maxsize=32)
def _imported(private_pem: str, kid: str) -> RSAKey:
    parameters: KeyParameters = {"kid": kid, "alg": ALGORITHM, "use": "sig"}
    return RSAKey.import_key(private_pem, parameters)


@functools.lru_cache(maxsize=32)
def _public(private_pem: str, kid: str) -> dict[str, Any]:
    return dict(_imported(private_pem, kid).as_dict(private=False))


@functools.lru_cache(maxsize=8)
def _key_set(keys: tuple[SigningKey, ...]) -> KeySet:
    return KeySet([RSAKey.import_key(k.public_jwk()) for k in keys])


def new_signing_key(now_ms: int) -> SigningKey:
    key = RSAKey.generate_key(KEY_SIZE, private=True)
    return SigningKey(
        kid=key.thumbprint(),
        private_pem=key.as_pem(private=True).decode(),
        created_ms=now_ms,
    )


@dataclass(frozen=True, slots=True)
class KeyRing:
    keys: tuple[SigningKey, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a key ring has at least one key")
        if any(k.retired_ms is None for k in self.keys[:-1]) or self.keys[-1].retired_ms:
            raise ValueError("exactly the newest key of a ring is active")

    @classmethod
    def first(cls, now_ms: int) -> KeyRing:
        return cls((new_signing_key(now_ms),))

    @property
    def active(self) -> SigningKey:
        return self.keys[-1]

    def find(self, kid: str) -> SigningKey | None:
        return next((k for k in self.keys if k.kid == kid), None)

    def jwks(self) -> dict[str, Any]:
        """The JWKS document: every key a valid token may have been signed with."""
        return {"keys": [k.public_jwk() for k in self.keys]}

    def verification_keys(self) -> KeySet:
        return _key_set(self.keys)

    def due(self, now_ms: int, period_ms: int) -> bool:
        """Whether the active key has signed for its whole period."""
        return now_ms >= self.active.created_ms + period_ms

    def rotated(self, new_key: SigningKey, now_ms: int, retain_ms: int) -> KeyRing:
        """``new_key`` active, the previous one retired, long-retired keys dropped."""
        kept = tuple(
            k
            for k in self.keys[:-1]
            if k.retired_ms is not None and k.retired_ms + retain_ms > now_ms
        )
        return KeyRing((*kept, replace(self.active, retired_ms=now_ms), new_key))

    def to_json(self) -> bytes:
        return json.dumps({"keys": [k.to_dict() for k in self.keys]}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> KeyRing:
        return cls(tuple(SigningKey.from_dict(k) for k in json.loads(data)["keys"]))
