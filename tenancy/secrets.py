"""API key ids and secrets: made with a CSPRNG, kept only as a slow salted hash.

The secret is shown once, when the key is created. What the store keeps is
``scrypt$<n>$<r>$<p>$<salt>$<digest>`` (hashlib's scrypt, memory-hard, so a
leaked store does not give the secrets away cheaply); verification compares
in constant time. The parameters travel with each hash, so they can be raised
later without invalidating existing keys.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Final

SCRYPT_N: Final = 2**14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
_SALT_BYTES: Final = 16
_DIGEST_BYTES: Final = 32
_KEY_ID_BYTES: Final = 10
_SECRET_BYTES: Final = 32


def new_key_id() -> str:
    """A key id (the SASL username): ``K`` and 16 base32 characters, safe in any config file."""
    return "K" + base64.b32encode(secrets.token_bytes(_KEY_ID_BYTES)).decode().rstrip("=")


def new_secret() -> str:
    return secrets.token_urlsafe(_SECRET_BYTES)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_secret(secret: str) -> str:
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = hashlib.scrypt(
        secret.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=_DIGEST_BYTES
    )
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def verify_secret(secret: str, stored: str) -> bool:
    """Whether ``secret`` matches ``stored``; False for anything malformed."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = _unb64(digest)
        actual = hashlib.scrypt(
            secret.encode(), salt=_unb64(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected)
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)
