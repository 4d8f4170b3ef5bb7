"""An external issuer's signing keys (its JWKS), fetched over HTTP and cached.

The keys are fetched when the first token needs them, and again when a token
names a key id the cached set lacks: identity providers rotate keys and
publish the new one before signing with it. Refetches are rate-limited to one
per ``min_refetch_s``, so tokens with made-up key ids cannot make the gateway
hammer the provider; concurrent needs share one fetch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
from joserfc import errors
from joserfc.jwk import KeySet
from shoal.gateway.http.auth import TokenError

log = logging.getLogger(__name__)

DEFAULT_MIN_REFETCH_S: Final = 10.0
_FETCH_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class ExternalIssuer:
    """A trusted identity provider, and the claims that name tenant and principal."""

    issuer: str
    jwks_url: str
    audience: str
    tenant_claim: str
    principal_claim: str


class JwksUnavailableError(TokenError):
    """The issuer's keys could not be fetched or read."""


async def fetch_jwks(url: str) -> Mapping[str, Any]:
    try:
        async with httpx.AsyncClient(timeout=_FETCH_TIMEOUT_S) as client:
            response = await client.get(url, headers={"Accept": "application/json"})
            response.raise_for_status()
            document = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("event=oauth_jwks_fetch_failed url=%s error=%s", url, exc)
        raise JwksUnavailableError("the token issuer's keys could not be fetched") from None
    if not isinstance(document, dict):
        raise JwksUnavailableError("the token issuer's key set is not a JSON object")
    return document


def parse_jwks(document: Mapping[str, Any]) -> KeySet:
    """The signing keys of a JWKS document; encryption keys are left out."""
    keys = document.get("keys")
    if not isinstance(keys, list):
        raise JwksUnavailableError("the token issuer's key set has no keys")
    signing = [k for k in keys if isinstance(k, dict) and k.get("use", "sig") == "sig"]
    try:
        return KeySet.import_key_set({"keys": signing})
    except (errors.JoseError, ValueError, TypeError):
        raise JwksUnavailableError("the token issuer's key set cannot be read") from None


class JwksCache:
    def __init__(
        self,
        fetch: Callable[[], Awaitable[Mapping[str, Any]]],
        clock: Callable[[], float],
        min_refetch_s: float = DEFAULT_MIN_REFETCH_S,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._min_refetch_s = min_refetch_s
        self._keys: KeySet | None = None
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def keys(self, kid: str | None) -> KeySet:
        """The cached keys, refetched first if ``kid`` is new to them (rate-limited)."""
        if self._keys is not None and _has(self._keys, kid):
            return self._keys
        async with self._lock:
            if self._keys is not None and _has(self._keys, kid):
                return self._keys
            fetched_at = self._fetched_at
            if fetched_at is None or self._clock() - fetched_at >= self._min_refetch_s:
                self._fetched_at = self._clock()
                self._keys = parse_jwks(await self._fetch())
        if self._keys is None:
            raise JwksUnavailableError("the token issuer's keys could not be fetched")
        return self._keys


def _has(keys: KeySet, kid: str | None) -> bool:
    return kid is None or any(k.kid == kid for k in keys.keys)
