"""The tenancy records as the gateway serves from them: re-read every second.

Every poll reads all of ``<root>/tenancy/`` in one etcd range read (one
revision, so keys, tenants and bindings agree). Changes apply to the next
request of every open connection: ACLs and quotas at once, and a key that is
revoked or deleted, or whose tenant is deleted, has its connections closed
by the server within a poll interval. A poll that fails keeps the last good
snapshot: etcd being briefly away must not lock every tenant out.

Polling was chosen over an etcd watch for its failure mode: a watch that
silently stalls would keep a revoked key working, a poll that fails is seen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from shoal.gateway.access import TenantAccess
from shoal.tenancy.model import AclBinding, ApiKey, Quotas
from shoal.tenancy.store import TenancySnapshot, TenancyStore, TenancyStoreError
from shoal.tenancy.verifier import KeyVerifier

log = logging.getLogger(__name__)

_EMPTY = TenancySnapshot(0, {}, {}, {})


class TenancyView:
    def __init__(self, store: TenancyStore, poll_interval_s: float) -> None:
        self.store = store
        self.poll_interval_s = poll_interval_s
        self.snapshot = _EMPTY
        self.verifier = KeyVerifier(self._lookup, time.monotonic)
        self.on_change: list[Callable[[TenancySnapshot], None]] = []
        self._subjects: dict[str, str] = {}
        """Certificate subject -> id of the live key it signs in as."""
        self._loading = asyncio.Lock()
        self._accesses: dict[str, TenantAccess | None] = {}
        self._accesses_of = self.snapshot
        """The snapshot ``_accesses`` were computed from."""
        self._stamp: tuple[int, int] | None = None
        """The tenancy records' stamp when the snapshot was last read: a poll that finds it
        unchanged reads nothing more (with a thousand tenants, reading and decoding every
        record each second cost the gateway a tenth of a core)."""

    async def _lookup(self, key_id: str) -> ApiKey | None:
        known = self.snapshot.keys.get(key_id)
        if known is not None:
            return known
        # A key made since the last poll: ask etcd rather than fail its first login.
        return await self.store.get_key(key_id)

    async def find_key(self, key_id: str) -> ApiKey | None:
        """The key's record, revoked or not, from the snapshot or, if newer, from etcd."""
        return await self._lookup(key_id)

    async def load(self) -> None:
        # One at a time: the poll and a login asking for a key made since may both
        # load, and one that read earlier but finished later would put older records
        # back. (Not "only a higher revision": after an etcd restore the revision
        # goes back, and the restored records must still be taken.)
        async with self._loading:
            await self._load()

    async def _load(self) -> None:
        # The stamp is read first: a change between it and the snapshot is in the
        # snapshot, and moves the stamp the next poll reads, which reads again.
        stamp = await self.store.stamp()
        if stamp == self._stamp:
            return
        snapshot = await self.store.snapshot()
        self._stamp = stamp
        if snapshot.revision != self.snapshot.revision:
            old = self.snapshot
            self.snapshot = snapshot
            self._subjects = _subjects(snapshot)
            for key_id in old.keys:
                now = snapshot.keys.get(key_id)
                if now is None or now.revoked or now.tenant not in snapshot.tenants:
                    self.verifier.forget(key_id)
            for callback in self.on_change:
                callback(snapshot)

    async def poll(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                await self.load()
                if failing:
                    log.info("event=tenancy_poll_recovered")
                failing = False
            except TenancyStoreError as exc:
                if not failing:
                    log.warning("event=tenancy_poll_failed error=%s", exc)
                failing = True

    def access(self, key_id: str) -> TenantAccess | None:
        """The key's current rights, or None if it may no longer connect.

        Every request of a session asks, so the answer is kept until the snapshot
        is replaced (records are only ever swapped whole, never changed in place).
        """
        snapshot = self.snapshot
        if self._accesses_of is not snapshot:
            self._accesses.clear()
            self._accesses_of = snapshot
        try:
            return self._accesses[key_id]
        except KeyError:
            access = self._accesses[key_id] = _access(snapshot, key_id)
            return access

    def key_for_subject(self, subject: str) -> str | None:
        """The id of the live key a client certificate of ``subject`` signs in as."""
        return self._subjects.get(subject)

    def access_for(self, tenant: str, principal: str) -> TenantAccess | None:
        """The rights of a principal named by a trusted token issuer, not by one
        of our keys: the tenant's bindings for that principal (or ``*``)."""
        snapshot = self.snapshot
        record = snapshot.tenants.get(tenant)
        if record is None:
            return None
        return TenantAccess(
            tenant=tenant,
            key_id=principal,
            bindings=snapshot.bindings.get(tenant, ()),
            quotas=record.quotas,
        )

    def tenant_keys(self, tenant: str) -> list[ApiKey]:
        """The tenant's keys in the snapshot, revoked ones included."""
        return [k for k in self.snapshot.keys.values() if k.tenant == tenant]

    def still_valid(self, key_id: str) -> bool:
        return self.access(key_id) is not None


def _access(snapshot: TenancySnapshot, key_id: str) -> TenantAccess | None:
    key = snapshot.keys.get(key_id)
    if key is None or key.revoked:
        return None
    tenant = snapshot.tenants.get(key.tenant)
    if tenant is None:
        return None
    return TenantAccess(
        tenant=key.tenant,
        key_id=key_id,
        bindings=snapshot.bindings.get(key.tenant, ()),
        quotas=tenant.quotas,
        platform_admin=key.platform_admin,
    )


def _subjects(snapshot: TenancySnapshot) -> dict[str, str]:
    holders: dict[str, list[str]] = {}
    for key in snapshot.keys.values():
        if key.certificate_subject is not None and not key.revoked:
            holders.setdefault(key.certificate_subject, []).append(key.key_id)
    for subject, keys in holders.items():
        if len(keys) > 1:
            # The store lets one live key hold a subject; records written around it
            # must not let a certificate pick its key: it signs in as none.
            log.warning(
                "event=certificate_subject_ambiguous subject=%s keys=%s",
                subject.replace(" ", "_"),
                ",".join(sorted(keys)),
            )
    return {subject: keys[0] for subject, keys in holders.items() if len(keys) == 1}


class StoreQuotas:
    """The client-quota APIs' view, read from and written to etcd directly."""

    def __init__(self, view: TenancyView) -> None:
        self._view = view

    async def all_quotas(self) -> Mapping[str, Quotas]:
        return {t.name: t.quotas for t in await self._view.store.list_tenants()}

    async def set_quotas(self, tenant: str, quotas: Quotas) -> None:
        await self._view.store.set_quotas(tenant, quotas)
        await self._view.load()


class StoreAcls:
    """The ACL APIs' view: read from and written to etcd, then reloaded here."""

    def __init__(self, view: TenancyView) -> None:
        self._view = view

    async def bindings(self, tenant: str) -> Sequence[AclBinding]:
        return await self._view.store.list_bindings(tenant)

    async def add(self, tenant: str, bindings: Sequence[AclBinding]) -> None:
        await self._view.store.add_bindings(tenant, bindings)
        await self._view.load()

    async def remove(self, tenant: str, bindings: Sequence[AclBinding]) -> None:
        await self._view.store.remove_bindings(tenant, bindings)
        await self._view.load()
