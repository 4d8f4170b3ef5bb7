"""One certificate subject signs in as one live key, across tenants (etcd, the CLI)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import pytest
from harness import EtcdServer
from shoal.tenancy.keys import mint_key
from shoal.tenancy.model import ConcurrentChangeError, TenancyError, Tenant
from shoal.tenancy.store import TenancyStore
from test_tenancy_cli import as_json, shoal

SUBJECT = "CN=orders,OU=apps,O=acme"


def now_ms() -> int:
    return int(time.time() * 1000)


async def new_key(store: TenancyStore, tenant: str, subject: str | None = None) -> str:
    if await store.get_tenant(tenant) is None:
        await store.create_tenant(Tenant(tenant, now_ms()))
    key = replace(mint_key(tenant, "", now_ms()).key, certificate_subject=subject)
    await store.add_key(key, [])
    return key.key_id


def test_a_subject_held_by_a_live_key_cannot_be_claimed_again(etcd: EtcdServer) -> None:
    async def go() -> None:
        async with TenancyStore(etcd.chroot_url()) as store:
            holder = await new_key(store, "acme", SUBJECT)
            with pytest.raises(TenancyError, match="already signs in as a key"):
                await new_key(store, "intruder", SUBJECT)
            other = await new_key(store, "intruder")
            with pytest.raises(TenancyError, match="already signs in as a key"):
                await store.set_certificate_subject(other, SUBJECT)
            # Setting it again on its holder is no change, and no error.
            assert (await store.set_certificate_subject(holder, SUBJECT)).key_id == holder

    asyncio.run(go())


@pytest.mark.parametrize("release", ["revoke", "clear", "delete tenant"])
def test_a_released_subject_may_be_claimed_by_another_key(etcd: EtcdServer, release: str) -> None:
    async def go() -> None:
        async with TenancyStore(etcd.chroot_url()) as store:
            holder = await new_key(store, "acme", SUBJECT)
            if release == "revoke":
                await store.revoke_key(holder, now_ms())
            elif release == "clear":
                assert (
                    await store.set_certificate_subject(holder, None)
                ).certificate_subject is None
            else:
                await store.delete_tenant("acme")
            successor = await new_key(store, "globex")
            changed = await store.set_certificate_subject(successor, SUBJECT)
            assert changed.certificate_subject == SUBJECT
            stored = await store.get_key(successor)
            assert stored is not None
            assert stored.certificate_subject == SUBJECT

    asyncio.run(go())


def test_of_two_keys_claiming_a_subject_at_once_one_gets_it(etcd: EtcdServer) -> None:
    async def go() -> None:
        async with TenancyStore(etcd.chroot_url()) as store:
            first, second = await new_key(store, "acme"), await new_key(store, "globex")
            results = await asyncio.gather(
                store.set_certificate_subject(first, SUBJECT),
                store.set_certificate_subject(second, SUBJECT),
                return_exceptions=True,
            )
            refused = [r for r in results if isinstance(r, TenancyError)]
            assert len(refused) == 1, results
            holders = [k for k in await store.list_keys() if k.certificate_subject == SUBJECT]
            assert len(holders) == 1

    asyncio.run(go())


def test_one_key_changed_by_two_writers_at_once_keeps_one_and_tells_the_other_to_retry(
    etcd: EtcdServer,
) -> None:
    """The loser gets ConcurrentChangeError (the operator retries it), not a refusal of its
    request: made again, it succeeds."""

    async def go() -> None:
        async with TenancyStore(etcd.chroot_url()) as store:
            key = await new_key(store, "acme")
            subjects = ["CN=first,O=acme", "CN=second,O=acme"]
            results = await asyncio.gather(
                *(store.set_certificate_subject(key, s) for s in subjects),
                return_exceptions=True,
            )
            lost = [
                (s, r) for s, r in zip(subjects, results, strict=True) if isinstance(r, Exception)
            ]
            assert len(lost) == 1, results
            subject, error = lost[0]
            assert isinstance(error, ConcurrentChangeError), error
            assert (
                await store.set_certificate_subject(key, subject)
            ).certificate_subject == subject

    asyncio.run(go())


def test_the_cli_gives_a_key_a_certificate_subject(etcd: EtcdServer) -> None:
    url = etcd.chroot_url()
    shoal("tenant", "create", "acme", "--etcd", url)
    created = as_json(
        "key", "create", "acme", "--etcd", url, "--certificate-subject", "CN=orders, O=acme"
    )
    assert created["certificate_subject"] == "CN=orders,O=acme"
    other = as_json("key", "create", "acme", "--etcd", url)
    taken = shoal(
        "key", "certificate", other["key_id"], "CN=orders,O=acme", "--etcd", url, check=False
    )
    assert taken.returncode == 1
    assert "already signs in as a key" in taken.stderr
    bad = shoal("key", "certificate", other["key_id"], "O=acme", "--etcd", url, check=False)
    assert bad.returncode == 1
    assert "no CN" in bad.stderr

    cleared = as_json("key", "certificate", created["key_id"], "--etcd", url)
    assert cleared["certificate_subject"] is None
    moved = as_json("key", "certificate", other["key_id"], "CN=orders,O=acme", "--etcd", url)
    assert moved["certificate_subject"] == "CN=orders,O=acme"
    listed = {k["key_id"]: k for k in as_json("key", "list", "acme", "--etcd", url)}
    assert listed[other["key_id"]]["certificate_subject"] == "CN=orders,O=acme"
    assert "CN=orders,O=acme" in shoal("key", "list", "acme", "--etcd", url).stdout
    assert json.dumps(listed)  # nothing unserialisable
