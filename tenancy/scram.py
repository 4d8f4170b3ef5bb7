"""SCRAM credentials of an API key (RFC 5802, RFC 7677; Kafka's KIP-84).

A SCRAM server never needs the password, only, per hash function, what
RFC 5802 section 3 derives from it::

    SaltedPassword = PBKDF2-HMAC-H(password, salt, iterations)
    StoredKey      = H(HMAC(SaltedPassword, "Client Key"))
    ServerKey      = HMAC(SaltedPassword, "Server Key")

A key's credentials are made when the key is minted, the one moment its
secret exists on the server, for both of Kafka's mechanisms (SCRAM-SHA-256
and SCRAM-SHA-512) with a fresh salt each. A key minted before SCRAM
existed has none and can never get them (its secret is kept only as an
scrypt hash): it signs in with PLAIN until it is rotated.

Iterations are Kafka's minimum, 4096. The count is what slows a guess
against a leaked StoredKey, which matters for a password a person chose;
an API key's secret is 256 random bits, so no count makes guessing it
practical, and every client pays the count again on every connection.

The derivation is scramp's, the SCRAM library the gateway's exchange uses
(:mod:`shoal.gateway.scram`), so what is stored and what is checked come
from one implementation; its PBKDF2 is hashlib's.
"""

from __future__ import annotations

import base64
import enum
from dataclasses import dataclass
from typing import Any, Final

import scramp


class ScramMechanism(enum.Enum):
    """Kafka's SCRAM mechanisms (``ScramMechanism`` in Kafka), named as in SaslHandshake."""

    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"

    @property
    def kafka_type(self) -> int:
        """Kafka's numbering in DescribeUserScramCredentials (0 is UNKNOWN)."""
        return 1 if self is ScramMechanism.SCRAM_SHA_256 else 2


MIN_ITERATIONS: Final = 4096
"""Kafka's minimum for both mechanisms (``ScramMechanism.minIterations``)."""
MAX_ITERATIONS: Final = 16384
"""Kafka's maximum: a client refuses a server-first message asking for more."""
ITERATIONS: Final = MIN_ITERATIONS


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a SCRAM server keeps of one password for one mechanism (RFC 5802 section 2.2)."""

    mechanism: ScramMechanism
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def __repr__(self) -> str:
        return f"ScramCredential({self.mechanism.value}, i={self.iterations}, keys=<hidden>)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism.value,
            "salt": _b64(self.salt),
            "iterations": self.iterations,
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScramCredential:
        return cls(
            ScramMechanism(data["mechanism"]),
            base64.b64decode(data["salt"]),
            int(data["iterations"]),
            base64.b64decode(data["stored_key"]),
            base64.b64decode(data["server_key"]),
        )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def derive(
    mechanism: ScramMechanism, secret: str, iterations: int = ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    """The credential for ``secret``, with a fresh random salt unless one is given."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"SCRAM iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    salt_out, stored_key, server_key, count = scramp.ScramMechanism(mechanism.value).make_auth_info(
        secret, iteration_count=iterations, salt=salt
    )
    return ScramCredential(mechanism, salt_out, count, stored_key, server_key)


def derive_all(secret: str, iterations: int = ITERATIONS) -> tuple[ScramCredential, ...]:
    """One credential per mechanism, each with its own salt: what a new key stores."""
    return tuple(derive(mechanism, secret, iterations) for mechanism in ScramMechanism)
