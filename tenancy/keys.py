"""Making an API key: a fresh id and secret, what the store keeps of the secret,
and the bindings its role starts with. One recipe for every writer of keys
(the CLI, the operator, the HTTP API, ``shoal dev``), so a key means the same
whoever made it.

The store keeps two things of a secret, never the secret: its scrypt hash
(PLAIN and HTTP Basic check it) and its SCRAM credentials for both SCRAM
mechanisms (:mod:`shoal.tenancy.scram`). Both can only be made now, while the
secret exists. Hashing is scrypt and slow on purpose: callers on an event
loop run :func:`mint_key` and :func:`key_record` in a worker thread.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shoal.tenancy.acl import default_bindings, read_only_bindings
from shoal.tenancy.model import AclBinding, ApiKey
from shoal.tenancy.scram import derive_all
from shoal.tenancy.secrets import hash_secret, new_key_id, new_secret


class KeyRole(enum.Enum):
    """The bindings a new key starts with."""

    DEFAULT = "default"
    """Everything inside its tenant (:func:`~shoal.tenancy.acl.default_bindings`)."""
    READ_ONLY = "read-only"
    """Consume and look (:func:`~shoal.tenancy.acl.read_only_bindings`)."""
    NONE = "none"
    """Nothing until bindings are added for it."""


def role_bindings(role: KeyRole, tenant: str, key_id: str) -> list[AclBinding]:
    if role is KeyRole.DEFAULT:
        return default_bindings(tenant, key_id)
    if role is KeyRole.READ_ONLY:
        return read_only_bindings(tenant, key_id)
    return []


@dataclass(frozen=True, slots=True)
class MintedKey:
    """A new key and its secret, which exists only here: the store keeps the hash."""

    key: ApiKey
    secret: str


def key_record(
    key_id: str,
    tenant: str,
    secret: str,
    now_ms: int,
    description: str = "",
    platform_admin: bool = False,
) -> ApiKey:
    """The record of a key whose secret is ``secret``: its hash and SCRAM credentials."""
    return ApiKey(
        key_id,
        tenant,
        hash_secret(secret),
        now_ms,
        description,
        platform_admin=platform_admin,
        scram=derive_all(secret),
    )


def mint_key(tenant: str, description: str, now_ms: int, platform_admin: bool = False) -> MintedKey:
    key_id, secret = new_key_id(), new_secret()
    return MintedKey(
        key_record(key_id, tenant, secret, now_ms, description, platform_admin), secret
    )
