"""The signing key ring in etcd, and each replica's fresh copy of it.

Key layout, beside the tenancy records (same chroot)::

    <root>/oauth/signing-keys    KeyRing JSON (private keys included)

One value for the whole ring, so every change is one compare-and-swap:
the first gateway to start creates it with create-if-absent (version == 0),
and two gateways starting at once both read back the one that won; a
rotation replaces it only if its mod revision is the one read, so two
replicas that find the active key due at the same moment rotate once (the
loser reads the winner's ring and finds nothing due).

Why private keys may sit in etcd: etcd is already the root of trust of
every tenant (whoever can write it can make tenants, keys and ACLs), so it
must be reachable only by Shoal's own components (NetworkPolicy, client TLS
in production); a signing key adds nothing an etcd writer could not do by
other means. Reading it does let one mint tokens, so etcd backups must be
guarded like the cluster's secrets. Keys never leave the gateway otherwise:
the JWKS publishes only public halves, and logs name only key ids.

:class:`KeyRingKeeper` re-reads the ring every ``refresh_s`` (rotations by
another replica or ``shoal oauth rotate-keys`` arrive then, or at once when a
token names a key id this replica lacks) and rotates it when due.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

import aetcd
import aetcd.exceptions
from joserfc.jwk import KeySet
from shoal.gateway.oauth.keys import KeyRing, new_signing_key

from shoal.etcd_address import EtcdAddress
from shoal.etcd_client import EtcdClient

log = logging.getLogger(__name__)

DEFAULT_REFRESH_S: Final = 10.0
_RELOAD_MIN_INTERVAL_S: Final = 1.0


class KeyStoreError(Exception):
    """etcd could not be reached or refused the request."""


class SigningKeyStore:
    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.address = EtcdAddress.parse(url)
        self._key = self.address.root.encode() + b"/oauth/signing-keys"
        self._client = EtcdClient(self.address, timeout_s)

    async def __aenter__(self) -> SigningKeyStore:
        await self._call(self._client.connect())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.close()

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except aetcd.exceptions.ClientError as exc:
            raise KeyStoreError(f"etcd at {self.address} is unreachable: {exc}") from exc

    async def read(self) -> tuple[KeyRing, int] | None:
        """The ring and its mod revision, or None if none was made yet."""
        found = await self._call(self._client.get(self._key))
        if found is None:
            return None
        return KeyRing.from_json(bytes(found.value)), int(found.mod_revision)

    async def _swap(self, ring: KeyRing, mod_revision: int | None) -> bool:
        t = self._client.transactions
        compare = (
            t.version(self._key) == 0 if mod_revision is None else t.mod(self._key) == mod_revision
        )
        ok, _ = await self._call(
            self._client.transaction(
                compare=[compare], success=[t.put(self._key, ring.to_json())], failure=[]
            )
        )
        return bool(ok)

    async def load_or_create(self, now_ms: int) -> KeyRing:
        found = await self.read()
        if found is not None:
            return found[0]
        first = KeyRing((await asyncio.to_thread(new_signing_key, now_ms),))
        if await self._swap(first, None):
            log.info("event=oauth_key_created kid=%s", first.active.kid)
            return first
        found = await self.read()
        if found is None:
            raise KeyStoreError("the signing key ring vanished while it was being created")
        return found[0]

    async def rotate(self, now_ms: int, retain_ms: int, period_ms: int | None = None) -> KeyRing:
        """Rotate the ring (if due, given ``period_ms``); returns the ring now stored."""
        while True:
            found = await self.read()
            if found is None:
                return await self.load_or_create(now_ms)
            ring, revision = found
            if period_ms is not None and not ring.due(now_ms, period_ms):
                return ring
            new_key = await asyncio.to_thread(new_signing_key, now_ms)
            rotated = ring.rotated(new_key, now_ms, retain_ms)
            if await self._swap(rotated, revision):
                log.info(
                    "event=oauth_key_rotated kid=%s retired=%s kept=%d",
                    new_key.kid,
                    ring.active.kid,
                    len(rotated.keys),
                )
                return rotated


class KeyRingKeeper:
    """This replica's copy of the ring: what it signs with and trusts."""

    def __init__(
        self,
        store: SigningKeyStore,
        clock: Callable[[], float],
        period_s: float,
        retain_s: float,
        refresh_s: float = DEFAULT_REFRESH_S,
    ) -> None:
        self._store = store
        self._clock = clock
        self._period_ms = int(period_s * 1000)
        self._retain_ms = int(retain_s * 1000)
        self.refresh_s = refresh_s
        self._ring: KeyRing | None = None
        self._verification: KeySet = KeySet([])
        self._reloaded_at = float("-inf")

    @property
    def ring(self) -> KeyRing:
        assert self._ring is not None, "start() first"
        return self._ring

    @property
    def verification_keys(self) -> KeySet:
        return self._verification

    def _set(self, ring: KeyRing) -> None:
        if ring != self._ring:
            self._ring = ring
            self._verification = ring.verification_keys()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def start(self) -> None:
        self._set(await self._store.load_or_create(self._now_ms()))
        await self._rotate_if_due()

    async def _rotate_if_due(self) -> None:
        if self.ring.due(self._now_ms(), self._period_ms):
            self._set(await self._store.rotate(self._now_ms(), self._retain_ms, self._period_ms))

    async def refresh(self) -> None:
        found = await self._store.read()
        if found is not None:
            self._set(found[0])
        await self._rotate_if_due()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except KeyStoreError as exc:
                # Keep signing with the ring we have: etcd being away must not stop logins.
                log.warning("event=oauth_key_refresh_failed error=%s", exc)

    async def reload_for(self, kid: str) -> bool:
        """Re-read the ring for a key id we lack (at most once a second); True if found."""
        if self._clock() - self._reloaded_at < _RELOAD_MIN_INTERVAL_S:
            return False
        self._reloaded_at = self._clock()
        try:
            found = await self._store.read()
        except KeyStoreError as exc:
            log.warning("event=oauth_key_refresh_failed error=%s", exc)
            return False
        if found is not None:
            self._set(found[0])
        return self.ring.find(kid) is not None
