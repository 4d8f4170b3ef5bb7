"""Loads of the gateway's tenancy view: the newest records stay, whatever the order.

The poll and a login that asks for a key made since the last poll may both
load at once; the one that read etcd first must not finish last with older
records. Loads go one at a time, and the records of an etcd restored from a
snapshot (its revision lower than before) are still taken.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from shoal.gateway.tenancy_view import TenancyView
from shoal.tenancy.model import ApiKey, Tenant
from shoal.tenancy.store import TenancySnapshot


class Etcd:
    """Tenancy records at a revision; a read can be held until ``release`` is set."""

    def __init__(self) -> None:
        self.revision = 10
        self.hold = False
        self.release = asyncio.Event()

    async def stamp(self) -> tuple[int, int]:
        return (self.revision, 1)

    async def snapshot(self) -> TenancySnapshot:
        revision = self.revision
        if self.hold:
            self.hold = False
            await self.release.wait()
        name = f"t{revision}"
        return TenancySnapshot(revision, {name: Tenant(name, created_ms=0)}, {}, {})


async def test_a_load_that_read_older_records_does_not_put_them_back() -> None:
    etcd = Etcd()
    view = TenancyView(etcd, poll_interval_s=1.0)  # type: ignore[arg-type]
    etcd.hold = True
    first = asyncio.create_task(view.load())
    await asyncio.sleep(0)
    etcd.revision = 11  # a tenant made while the first read is on its way back
    second = asyncio.create_task(view.load())
    await asyncio.sleep(0)
    etcd.release.set()
    await asyncio.gather(first, second)
    assert view.snapshot.revision == 11
    assert set(view.snapshot.tenants) == {"t11"}


async def test_the_records_of_a_restored_etcd_are_taken() -> None:
    etcd = Etcd()
    view = TenancyView(etcd, poll_interval_s=1.0)  # type: ignore[arg-type]
    await view.load()
    etcd.revision = 3  # restored from a snapshot taken earlier
    await view.load()
    assert set(view.snapshot.tenants) == {"t3"}


async def test_a_keys_rights_are_kept_until_the_records_change() -> None:
    view = TenancyView(Etcd(), poll_interval_s=1.0)  # type: ignore[arg-type]
    key = ApiKey("k1", "acme", "hash", created_ms=0)
    view.snapshot = TenancySnapshot(5, {"acme": Tenant("acme", created_ms=0)}, {"k1": key}, {})
    first = view.access("k1")
    assert first is not None and first.tenant == "acme"
    assert view.access("k1") is first
    assert view.access("nobody") is None

    revoked = replace(key, revoked_ms=1)
    view.snapshot = TenancySnapshot(6, {"acme": Tenant("acme", created_ms=0)}, {"k1": revoked}, {})
    assert view.access("k1") is None
    view.snapshot = TenancySnapshot(7, {}, {"k1": key}, {})
    assert view.access("k1") is None  # the tenant is gone
