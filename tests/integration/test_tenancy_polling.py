"""The gateway's tenancy poll reads every record only when one changed (a real etcd)."""

from __future__ import annotations

import asyncio
import time

from harness import EtcdServer
from shoal.gateway.tenancy_view import TenancyView
from shoal.tenancy.keys import mint_key
from shoal.tenancy.model import Tenant
from shoal.tenancy.store import TenancyStore


def test_a_poll_reads_the_records_only_after_a_put_or_a_delete(etcd: EtcdServer) -> None:
    async def go() -> None:
        url = etcd.chroot_url()
        async with TenancyStore(url) as store, TenancyStore(url) as writer:
            view = TenancyView(store, poll_interval_s=1.0)
            reads = 0
            snapshot = store.snapshot

            async def counted() -> object:
                nonlocal reads
                reads += 1
                return await snapshot()

            store.snapshot = counted  # type: ignore[method-assign]
            await writer.create_tenant(Tenant("acme", int(time.time() * 1000)))
            await view.load()
            assert (reads, sorted(view.snapshot.tenants)) == (1, ["acme"])
            await view.load()
            assert reads == 1, "nothing changed: nothing read"

            minted = mint_key("acme", "", int(time.time() * 1000))
            await writer.add_key(minted.key, [])
            await view.load()
            assert reads == 2 and minted.key.key_id in view.snapshot.keys
            await writer.revoke_key(minted.key.key_id, int(time.time() * 1000))
            await view.load()
            assert reads == 3 and view.snapshot.keys[minted.key.key_id].revoked
            await writer.delete_tenant("acme")
            await view.load()
            assert reads == 4 and not view.snapshot.tenants and not view.snapshot.keys
            await view.load()
            assert reads == 4

    asyncio.run(go())
