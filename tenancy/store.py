"""Tenancy records in etcd, next to the cluster's own keys (same chroot).

Key layout::

    <root>/tenancy/tenants/<tenant>             Tenant JSON (quotas included)
    <root>/tenancy/keys/<key id>                ApiKey JSON (hash only)
    <root>/tenancy/acls/<tenant>/<binding id>   AclBinding JSON
    <root>/tenancy/subjects/<subject hash>      id of the key a certificate subject names

A binding's id is a hash of its contents, so adding the same binding twice
stores it once. A binding a tenant made with Kafka's CreateAcls carries
``"source": "kafka-api"`` (declared ones carry no source), so it is stored
beside a declared twin rather than over it (docs/acls.md). Creating a tenant
is create-if-absent; deleting one removes its keys and bindings in the same
transaction.

A certificate subject (mutual TLS) signs in as one key only, whatever the
tenant: claiming one writes its ``subjects/`` entry in the same transaction as
the key, on condition that the entry is unchanged since it was read, and an
entry may be taken over only when the key it names is gone, revoked or no
longer holds the subject. Entries are never cleaned up otherwise: a stale one
grants nothing, since the gateway maps subjects from the keys themselves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import aetcd
import aetcd.exceptions
from shoal.tenancy.model import (
    AclBinding,
    ApiKey,
    ConcurrentChangeError,
    Quotas,
    TenancyError,
    Tenant,
)

from shoal.etcd_address import EtcdAddress
from shoal.etcd_client import EtcdClient


@dataclass(frozen=True, slots=True)
class TenancySnapshot:
    """Every tenancy record at one etcd revision: what the gateway serves from."""

    revision: int
    tenants: Mapping[str, Tenant]
    keys: Mapping[str, ApiKey]
    bindings: Mapping[str, tuple[AclBinding, ...]]


class TenancyStoreError(Exception):
    """etcd could not be reached or refused the request."""


def binding_id(binding: AclBinding) -> str:
    return hashlib.sha256(json.dumps(binding.to_dict(), sort_keys=True).encode()).hexdigest()[:24]


MAX_TXN_OPS: Final = 128
"""etcd's default ``--max-txn-ops``: it refuses a transaction with more operations."""


def _require_tenant_of(tenant: str, bindings: Sequence[AclBinding]) -> None:
    strangers = {b.tenant for b in bindings} - {tenant}
    if strangers:
        raise TenancyError(f"bindings of {sorted(strangers)} given as tenant {tenant!r}'s")


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class TenancyStore:
    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.address = EtcdAddress.parse(url)
        self._root = self.address.root.encode() + b"/tenancy"
        self._client = EtcdClient(self.address, timeout_s)

    async def __aenter__(self) -> TenancyStore:
        try:
            await self._client.connect()
        except aetcd.exceptions.ClientError as exc:
            raise TenancyStoreError(self._unreachable(exc)) from exc
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.close()

    def _unreachable(self, exc: Exception) -> str:
        return f"etcd at {self.address} is unreachable: {exc}"

    def _key(self, *parts: str) -> bytes:
        return b"/".join([self._root, *(p.encode() for p in parts)])

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except aetcd.exceptions.ClientError as exc:
            raise TenancyStoreError(self._unreachable(exc)) from exc

    async def _values(self, prefix: bytes) -> list[bytes]:
        found = await self._call(self._client.get_prefix(prefix + b"/"))
        return [bytes(kv.value) for kv in found]

    async def stamp(self) -> tuple[int, int]:
        """What changes whenever any tenancy record does (:meth:`EtcdClient.prefix_stamp`):
        one small read, where :meth:`snapshot` reads and decodes every record."""
        stamp: tuple[int, int] = await self._call(self._client.prefix_stamp(self._root + b"/"))
        return stamp

    async def snapshot(self) -> TenancySnapshot:
        """All records in one read (one revision), so they agree with each other."""
        prefix = self._root + b"/"
        found = await self._call(self._client.get_prefix(prefix))
        revision = int(found.header.revision)
        tenants: dict[str, Tenant] = {}
        keys: dict[str, ApiKey] = {}
        bindings: dict[str, list[AclBinding]] = {}
        for kv in found:
            kind, _, _ = bytes(kv.key)[len(prefix) :].partition(b"/")
            if kind == b"tenants":
                tenant = Tenant.from_json(kv.value)
                tenants[tenant.name] = tenant
            elif kind == b"keys":
                key = ApiKey.from_json(kv.value)
                keys[key.key_id] = key
            elif kind == b"acls":
                binding = AclBinding.from_dict(json.loads(kv.value))
                bindings.setdefault(binding.tenant, []).append(binding)
        return TenancySnapshot(revision, tenants, keys, {t: tuple(b) for t, b in bindings.items()})

    # -- tenants ---------------------------------------------------------------

    async def create_tenant(self, tenant: Tenant) -> None:
        key = self._key("tenants", tenant.name)
        t = self._client.transactions
        ok, _ = await self._call(
            self._client.transaction(
                compare=[t.version(key) == 0], success=[t.put(key, tenant.to_json())], failure=[]
            )
        )
        if not ok:
            raise TenancyError(f"tenant {tenant.name!r} already exists")

    async def get_tenant(self, name: str) -> Tenant | None:
        found = await self._call(self._client.get(self._key("tenants", name)))
        return None if found is None else Tenant.from_json(found.value)

    async def require_tenant(self, name: str) -> Tenant:
        tenant = await self.get_tenant(name)
        if tenant is None:
            raise TenancyError(f"tenant {name!r} does not exist")
        return tenant

    async def list_tenants(self) -> list[Tenant]:
        return sorted(
            (Tenant.from_json(v) for v in await self._values(self._key("tenants"))),
            key=lambda t: t.name,
        )

    async def set_quotas(self, name: str, quotas: Quotas) -> Tenant:
        tenant = replace(await self.require_tenant(name), quotas=quotas)
        await self._call(self._client.put(self._key("tenants", name), tenant.to_json()))
        return tenant

    async def delete_tenant(self, name: str) -> list[ApiKey]:
        """Delete the tenant, its keys and its bindings; returns the keys it had."""
        await self.require_tenant(name)
        keys = await self.list_keys(name)
        t = self._client.transactions
        acls = self._key("acls", name) + b"/"
        ops = [
            t.delete(self._key("tenants", name)),
            t.delete(acls, range_end=_prefix_end(acls)),
            *(t.delete(self._key("keys", k.key_id)) for k in keys),
        ]
        await self._call(self._client.transaction(compare=[], success=ops, failure=[]))
        return keys

    # -- keys ------------------------------------------------------------------

    async def add_key(self, key: ApiKey, bindings: Sequence[AclBinding]) -> None:
        """Store a new key and its bindings, if its tenant exists: whoever sees the key
        sees all its bindings. Bindings beyond one transaction's room go first (a
        binding for a key that does not exist yet grants nothing)."""
        room = MAX_TXN_OPS - 1 - (key.certificate_subject is not None)
        await self.add_bindings(key.tenant, bindings[room:])
        compares, puts = await self._claim_subject(key)
        t = self._client.transactions
        tenant_key = self._key("tenants", key.tenant)
        ops = [t.put(self._key("keys", key.key_id), key.to_json()), *puts]
        ops += [
            t.put(self._key("acls", b.tenant, binding_id(b)), json.dumps(b.to_dict()).encode())
            for b in bindings[:room]
        ]
        ok, _ = await self._call(
            self._client.transaction(
                compare=[t.version(tenant_key) > 0, *compares], success=ops, failure=[]
            )
        )
        if not ok:
            if await self.get_tenant(key.tenant) is None:
                raise TenancyError(f"tenant {key.tenant!r} does not exist")
            raise TenancyError(
                f"certificate subject {key.certificate_subject!r} was claimed meanwhile"
            )

    async def _claim_subject(self, key: ApiKey) -> tuple[list[Any], list[Any]]:
        """(compares, puts) for a transaction that stores ``key`` holding its
        certificate subject; raises :class:`TenancyError` if a live key of any
        tenant holds the subject already."""
        subject = key.certificate_subject
        if subject is None:
            return [], []
        t = self._client.transactions
        entry = self._key("subjects", hashlib.sha256(subject.encode()).hexdigest()[:32])
        found = await self._call(self._client.get(entry))
        if found is None:
            compare = t.version(entry) == 0
        else:
            holder = await self.get_key(bytes(found.value).decode())
            if (
                holder is not None
                and holder.key_id != key.key_id
                and not holder.revoked
                and holder.certificate_subject == subject
            ):
                # Not named: the holder may be another tenant's key.
                raise TenancyError(f"certificate subject {subject!r} already signs in as a key")
            compare = t.mod(entry) == found.mod_revision
        return [compare], [t.put(entry, key.key_id.encode())]

    async def set_certificate_subject(self, key_id: str, subject: str | None) -> ApiKey:
        """Let clients with a certificate of ``subject`` (canonical, see
        :func:`shoal.tenancy.certificates.canonical_subject`) sign in as the key,
        or nobody (None)."""
        key = await self.get_key(key_id)
        if key is None or key.revoked:
            raise TenancyError(f"key {key_id!r} does not exist or is revoked")
        if key.certificate_subject == subject:
            return key
        changed = replace(key, certificate_subject=subject)
        compares, puts = await self._claim_subject(changed)
        t = self._client.transactions
        record = self._key("keys", key_id)
        ok, _ = await self._call(
            self._client.transaction(
                compare=[*compares, t.value(record) == key.to_json()],
                success=[*puts, t.put(record, changed.to_json())],
                failure=[],
            )
        )
        if not ok:
            raise ConcurrentChangeError(f"key {key_id!r} changed meanwhile; try again")
        return changed

    async def get_key(self, key_id: str) -> ApiKey | None:
        found = await self._call(self._client.get(self._key("keys", key_id)))
        return None if found is None else ApiKey.from_json(found.value)

    async def list_keys(self, tenant: str | None = None) -> list[ApiKey]:
        keys = [ApiKey.from_json(v) for v in await self._values(self._key("keys"))]
        return sorted(
            (k for k in keys if tenant is None or k.tenant == tenant),
            key=lambda k: (k.tenant, k.created_ms, k.key_id),
        )

    async def revoke_key(self, key_id: str, now_ms: int) -> ApiKey:
        key = await self.get_key(key_id)
        if key is None:
            raise TenancyError(f"key {key_id!r} does not exist")
        if key.revoked:
            return key
        revoked = replace(key, revoked_ms=now_ms)
        await self._call(self._client.put(self._key("keys", key_id), revoked.to_json()))
        return revoked

    # -- ACL bindings ------------------------------------------------------------

    async def add_binding(self, binding: AclBinding) -> None:
        await self.require_tenant(binding.tenant)
        await self._call(
            self._client.put(
                self._key("acls", binding.tenant, binding_id(binding)),
                json.dumps(binding.to_dict()).encode(),
            )
        )

    async def add_bindings(self, tenant: str, bindings: Sequence[AclBinding]) -> None:
        """Store ``bindings``, all of ``tenant``, if the tenant exists.

        One transaction per :data:`MAX_TXN_OPS` bindings: a larger batch that
        fails midway may be stored in part (storing one again is harmless).
        """
        _require_tenant_of(tenant, bindings)
        t = self._client.transactions
        for start in range(0, len(bindings), MAX_TXN_OPS):
            ops = [
                t.put(self._key("acls", tenant, binding_id(b)), json.dumps(b.to_dict()).encode())
                for b in bindings[start : start + MAX_TXN_OPS]
            ]
            ok, _ = await self._call(
                self._client.transaction(
                    compare=[t.version(self._key("tenants", tenant)) > 0], success=ops, failure=[]
                )
            )
            if not ok:
                raise TenancyError(f"tenant {tenant!r} does not exist")

    async def remove_bindings(self, tenant: str, bindings: Sequence[AclBinding]) -> None:
        """Remove ``bindings``, all of ``tenant``; absent ones are no error. One
        transaction per :data:`MAX_TXN_OPS` bindings, as :meth:`add_bindings`."""
        _require_tenant_of(tenant, bindings)
        t = self._client.transactions
        for start in range(0, len(bindings), MAX_TXN_OPS):
            ops = [
                t.delete(self._key("acls", tenant, binding_id(b)))
                for b in bindings[start : start + MAX_TXN_OPS]
            ]
            await self._call(self._client.transaction(compare=[], success=ops, failure=[]))

    async def remove_binding(self, binding: AclBinding) -> bool:
        deleted = await self._call(
            self._client.delete(self._key("acls", binding.tenant, binding_id(binding)))
        )
        return bool(deleted)

    async def list_bindings(self, tenant: str) -> list[AclBinding]:
        return [
            AclBinding.from_dict(json.loads(v))
            for v in await self._values(self._key("acls", tenant))
        ]
