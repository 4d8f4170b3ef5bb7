"""A tenant's own API keys, managed by one of its keys: the rules, apart from HTTP.

The HTTP routes (:mod:`shoal.gateway.http.keys`) parse and answer; this
module decides. Its rules:

* **A key sees only its own tenant's keys.** A key id of another tenant is
  answered exactly as an id that does not exist (:class:`KeyNotFoundError`, a 404
  over HTTP, never a 403), so key ids cannot be probed across tenants.
* **Looking needs Cluster DESCRIBE**, the right Kafka asks for DescribeAcls;
  default and read-only keys both have it.
* **No escalation.** A new key gets :func:`~shoal.tenancy.acl.default_bindings`
  or, with ``read_only``, :func:`~shoal.tenancy.acl.read_only_bindings`, and
  only if its creator is allowed every one of those operations on every
  resource (so a full key needs Cluster CREATE, Topic ALL, ...: what a default
  key has and a read-only key lacks; a read-only key can make read-only keys
  only). The creator's own DENY bindings are copied to the new key, so a key
  denied a topic cannot mint one that is not. A new key is never a platform
  admin.
* **Revoking** one's own key is always allowed; revoking another key needs
  the same coverage as creating it would (a read-only key may revoke
  read-only keys, never a full one). Revoking twice is not an error.
* **Changes are prompt.** After writing a new key or a revocation, the
  gateway reloads the tenancy records, so on this gateway a new key serves
  its first Kafka request and a revoked key is refused, its Kafka connections
  closed, at once; every other gateway follows within its tenancy poll.

Secrets are drawn with :mod:`shoal.tenancy.secrets` and turned into what the
store keeps (scrypt hash, SCRAM credentials) by
:func:`~shoal.tenancy.keys.key_record`; scrypt is slow on purpose, so that runs
in a worker thread. Only the new key's
creation returns its secret; nothing returns a hash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from shoal.gateway.access import TenantAccess
from shoal.gateway.tenancy_view import TenancyView
from shoal.tenancy.acl import default_bindings, read_only_bindings
from shoal.tenancy.keys import key_record
from shoal.tenancy.model import (
    AclBinding,
    ApiKey,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from shoal.tenancy.secrets import new_key_id, new_secret
from shoal.tenancy.store import TenancyStoreError

log = logging.getLogger(__name__)


class KeyNotFoundError(Exception):
    """No such key in the caller's tenant (whether or not it exists elsewhere)."""


class KeyForbiddenError(Exception):
    """The caller's rights do not allow this; the message says which are missing."""


@dataclass(frozen=True, slots=True)
class CreatedKey:
    key: ApiKey
    secret: str
    bindings: Sequence[AclBinding]


def uncovered(access: TenantAccess, wanted: Iterable[AclBinding]) -> list[AclBinding]:
    """The ALLOW bindings in ``wanted`` that grant something ``access`` may not do.

    A LITERAL binding is covered if the caller may do its operation on its
    name (``*`` included, which only a wildcard binding of the caller
    allows). A PREFIXED one is covered only by the right on every name, so
    the check never grants more than the caller has.
    """
    missing = []
    for binding in wanted:
        if binding.permission != Permission.ALLOW:
            continue
        name = "*" if binding.pattern_type == PatternType.PREFIXED else binding.resource_name
        operations = _operations(binding.resource_type, binding.operation)
        if not all(access.allowed(binding.resource_type, name, op) for op in operations):
            missing.append(binding)
    return missing


# ALL on a resource is covered only by every operation Kafka defines for it.
_ALL_OF = {
    ResourceType.TOPIC: (
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
    ResourceType.CLUSTER: (
        Operation.CREATE,
        Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
        Operation.ALTER,
        Operation.DESCRIBE,
    ),
}


def _operations(resource_type: ResourceType, operation: Operation) -> tuple[Operation, ...]:
    return _ALL_OF[resource_type] if operation == Operation.ALL else (operation,)


def new_key_bindings(creator: TenantAccess, key_id: str, read_only: bool) -> list[AclBinding]:
    """The bindings a key made by ``creator`` gets; raises :class:`KeyForbiddenError`
    if they would grant anything the creator may not do."""
    template = read_only_bindings if read_only else default_bindings
    allows = template(creator.tenant, key_id)
    missing = uncovered(creator, allows)
    if missing:
        raise KeyForbiddenError(
            f"this key may not create a {'read-only' if read_only else 'full'} key: it lacks "
            + ", ".join(_describe(b) for b in missing)
        )
    denies = [
        replace(b, principal=key_id)
        for b in creator.bindings
        if b.permission == Permission.DENY and b.principal == creator.key_id
    ]
    return allows + denies


def _describe(binding: AclBinding) -> str:
    return f"{binding.operation.name} on {binding.resource_type.name} {binding.resource_name}"


class KeyManager:
    """The caller's tenant's keys, read from and written to the tenancy store."""

    def __init__(self, tenancy: TenancyView) -> None:
        self._tenancy = tenancy

    @staticmethod
    def _require_describe(caller: TenantAccess) -> None:
        if not caller.may_cluster(Operation.DESCRIBE):
            raise KeyForbiddenError("listing keys needs DESCRIBE on the cluster")

    async def list(self, caller: TenantAccess) -> list[ApiKey]:
        self._require_describe(caller)
        return await self._tenancy.store.list_keys(caller.tenant)

    async def get(self, caller: TenantAccess, key_id: str) -> ApiKey:
        key = await self._tenancy.store.get_key(key_id)
        if key is None or key.tenant != caller.tenant:
            raise KeyNotFoundError(f"no API key {key_id!r}")
        self._require_describe(caller)
        return key

    async def create(self, caller: TenantAccess, description: str, read_only: bool) -> CreatedKey:
        key_id = new_key_id()
        bindings = new_key_bindings(caller, key_id, read_only)
        secret = new_secret()
        key = await asyncio.to_thread(
            key_record, key_id, caller.tenant, secret, _now_ms(), description
        )
        await self._tenancy.store.add_key(key, bindings)
        await self._reload(key_id)
        return CreatedKey(key, secret, bindings)

    async def revoke(self, caller: TenantAccess, key_id: str) -> ApiKey:
        await self.get(caller, key_id)
        if key_id != caller.key_id:
            own = [
                b
                for b in await self._tenancy.store.list_bindings(caller.tenant)
                if b.principal == key_id
            ]
            missing = uncovered(caller, own)
            if missing:
                raise KeyForbiddenError(
                    "this key may not revoke a key with more rights: it lacks "
                    + ", ".join(_describe(b) for b in missing)
                )
        revoked = await self._tenancy.store.revoke_key(key_id, _now_ms())
        await self._reload(key_id)
        return revoked

    async def _reload(self, key_id: str) -> None:
        """Apply a key's change on this gateway now rather than at the next poll."""
        try:
            await self._tenancy.load()
        except TenancyStoreError as exc:
            # The change is written, so the next successful poll applies it.
            log.warning("event=key_change_reload_failed key=%s error=%s", key_id, exc)


def _now_ms() -> int:
    return int(time.time() * 1000)
