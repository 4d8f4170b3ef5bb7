"""Checking an API key's id and secret, as both of the gateway's doors will.

scrypt is slow on purpose, so a reconnect storm must not cost a hash per
connection: a successful check is remembered for ``ttl_s``, and checks of the
same id and secret that arrive while one is running wait for its answer
instead of hashing again (a thousand clients of one key connecting at once
cost one hash, not a thousand: measured before, their hashes took both cores
and a neighbour tenant's p99 went from 11 ms to 150-330 ms). What is kept is
never the secret, only an HMAC of it under a key this process drew at
random and never stores, so the cache is useless to anyone who reads
memory dumps or logs. Failed checks are not remembered (a wrong secret
always pays the full hash, which also slows guessing). The hash runs in a
worker thread so the event loop keeps serving.

A revoked or deleted key is refused at its next check after the cache entry
ends; the gateway additionally closes open connections of revoked keys.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from shoal.tenancy.model import ApiKey
from shoal.tenancy.secrets import verify_secret

DEFAULT_TTL_S: Final = 10.0
_MAX_ENTRIES: Final = 100_000


@dataclass(frozen=True, slots=True)
class _Remembered:
    key: ApiKey
    fingerprint: bytes
    expires: float


class KeyVerifier:
    def __init__(
        self,
        lookup: Callable[[str], Awaitable[ApiKey | None]],
        clock: Callable[[], float],
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.lookup = lookup
        self.clock = clock
        self.ttl_s = ttl_s
        self._pepper = secrets.token_bytes(32)
        self._remembered: dict[str, _Remembered] = {}
        self._checking: dict[bytes, asyncio.Future[ApiKey | None]] = {}

    def _fingerprint(self, key_id: str, secret: str) -> bytes:
        return hmac.new(self._pepper, f"{key_id}\0{secret}".encode(), hashlib.sha256).digest()

    async def verify(self, key_id: str, secret: str) -> ApiKey | None:
        """The key if ``secret`` is its secret and it is not revoked; None otherwise."""
        now = self.clock()
        fingerprint = self._fingerprint(key_id, secret)
        remembered = self._remembered.get(key_id)
        if (
            remembered is not None
            and remembered.expires > now
            and hmac.compare_digest(remembered.fingerprint, fingerprint)
        ):
            return remembered.key
        checking = self._checking.get(fingerprint)
        if checking is None:
            checking = asyncio.ensure_future(self._check(key_id, secret, fingerprint))
            self._checking[fingerprint] = checking
            checking.add_done_callback(lambda _: self._checking.pop(fingerprint, None))
        # Shielded: a caller that gives up (its connection closed) must not cancel the
        # check the others wait for.
        return await asyncio.shield(checking)

    async def _check(self, key_id: str, secret: str, fingerprint: bytes) -> ApiKey | None:
        key = await self.lookup(key_id)
        if key is None or key.revoked:
            self._remembered.pop(key_id, None)
            return None
        if not await asyncio.to_thread(verify_secret, secret, key.secret_hash):
            return None
        now = self.clock()
        if len(self._remembered) >= _MAX_ENTRIES:
            self._remembered = {k: r for k, r in self._remembered.items() if r.expires > now}
        self._remembered[key_id] = _Remembered(key, fingerprint, now + self.ttl_s)
        return key

    def forget(self, key_id: str) -> None:
        """Drop what is remembered of a key (it was revoked or deleted)."""
        self._remembered.pop(key_id, None)
