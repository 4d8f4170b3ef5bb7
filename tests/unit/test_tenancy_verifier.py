"""Verifying API keys: right and wrong secrets, revocation, and the brief cache."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from shoal.tenancy.model import ApiKey
from shoal.tenancy.secrets import hash_secret, new_key_id, new_secret
from shoal.tenancy.verifier import KeyVerifier


class Keys:
    """A key store that counts lookups, standing in for etcd."""

    def __init__(self) -> None:
        self.keys: dict[str, ApiKey] = {}
        self.lookups = 0

    def add(self, tenant: str = "acme") -> tuple[ApiKey, str]:
        secret = new_secret()
        key = ApiKey(new_key_id(), tenant, hash_secret(secret), 0)
        self.keys[key.key_id] = key
        return key, secret

    async def lookup(self, key_id: str) -> ApiKey | None:
        self.lookups += 1
        return self.keys.get(key_id)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def keys() -> Keys:
    return Keys()


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def test_the_right_secret_verifies_and_a_wrong_one_does_not(keys: Keys, clock: Clock) -> None:
    key, secret = keys.add()
    verifier = KeyVerifier(keys.lookup, clock)
    assert await verifier.verify(key.key_id, secret) == key
    assert await verifier.verify(key.key_id, secret + "x") is None
    assert await verifier.verify(key.key_id, "") is None
    assert await verifier.verify("K-UNKNOWN", secret) is None


async def test_one_key_s_secret_does_not_open_another_key(keys: Keys, clock: Clock) -> None:
    first, first_secret = keys.add()
    second, _ = keys.add("other")
    verifier = KeyVerifier(keys.lookup, clock)
    assert await verifier.verify(first.key_id, first_secret) == first
    assert await verifier.verify(second.key_id, first_secret) is None


async def test_a_success_is_remembered_briefly_and_only_for_the_same_secret(
    keys: Keys, clock: Clock
) -> None:
    key, secret = keys.add()
    verifier = KeyVerifier(keys.lookup, clock, ttl_s=10)
    await verifier.verify(key.key_id, secret)
    await verifier.verify(key.key_id, secret)
    assert keys.lookups == 1, "the second check came from the cache"
    assert await verifier.verify(key.key_id, "wrong") is None, (
        "the cache never admits another secret"
    )
    clock.now += 11
    await verifier.verify(key.key_id, secret)
    assert keys.lookups == 3, "after the ttl the store is asked again"


async def test_a_revoked_key_is_refused_once_its_cache_entry_ends(keys: Keys, clock: Clock) -> None:
    key, secret = keys.add()
    verifier = KeyVerifier(keys.lookup, clock, ttl_s=5)
    assert await verifier.verify(key.key_id, secret) == key
    keys.keys[key.key_id] = dataclasses.replace(key, revoked_ms=1)
    clock.now += 6
    assert await verifier.verify(key.key_id, secret) is None


async def test_forget_makes_revocation_immediate(keys: Keys, clock: Clock) -> None:
    key, secret = keys.add()
    verifier = KeyVerifier(keys.lookup, clock, ttl_s=60)
    await verifier.verify(key.key_id, secret)
    del keys.keys[key.key_id]
    verifier.forget(key.key_id)
    assert await verifier.verify(key.key_id, secret) is None


async def test_the_cache_holds_no_secret(keys: Keys, clock: Clock) -> None:
    key, secret = keys.add()
    verifier = KeyVerifier(keys.lookup, clock)
    await verifier.verify(key.key_id, secret)
    remembered = vars(verifier)["_remembered"][key.key_id]
    assert secret.encode() not in remembered.fingerprint
    assert secret not in repr(remembered)


async def test_logins_of_one_key_at_once_share_one_check(keys: Keys, clock: Clock) -> None:
    """A thousand clients of one key connecting together cost one lookup and one hash;
    a wrong secret among them is still checked on its own, and refused."""
    key, secret = keys.add()
    verifier = KeyVerifier(keys.lookup, clock)
    answers = await asyncio.gather(
        *(verifier.verify(key.key_id, secret) for _ in range(50)),
        verifier.verify(key.key_id, secret + "x"),
    )
    assert answers == [key] * 50 + [None]
    assert keys.lookups == 2


async def test_a_caller_giving_up_does_not_cancel_the_check_others_wait_for(
    keys: Keys, clock: Clock
) -> None:
    key, secret = keys.add()
    verifier = KeyVerifier(keys.lookup, clock)
    impatient = asyncio.ensure_future(verifier.verify(key.key_id, secret))
    patient = asyncio.ensure_future(verifier.verify(key.key_id, secret))
    await asyncio.sleep(0)
    impatient.cancel()
    assert await patient == key
    assert keys.lookups == 1
