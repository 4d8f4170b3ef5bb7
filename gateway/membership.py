"""How many gateways run: each registers under an etcd lease and counts the others.

A tenant's quota is split evenly over the running gateways (a client's
connections spread over them through the Service), so each enforces
``quota / replicas``. A gateway that dies drops out when its lease ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aetcd
import aetcd.exceptions

from shoal.etcd_address import EtcdAddress

log = logging.getLogger(__name__)


class GatewayMembership:
    def __init__(self, etcd_url: str, gateway_id: str, ttl_s: int) -> None:
        address = EtcdAddress.parse(etcd_url)
        self._prefix = address.root.encode() + b"/gateways/"
        self._key = self._prefix + gateway_id.encode()
        self._client = aetcd.Client(host=address.host, port=address.port, timeout=5.0)
        self._ttl_s = ttl_s
        self._lease: aetcd.Lease | None = None
        self.count = 1

    async def register(self) -> None:
        self._lease = await self._client.lease(self._ttl_s)
        await self._client.put(self._key, b"", lease=self._lease)
        await self.recount()

    async def recount(self) -> None:
        found = await self._client.get_prefix(self._prefix, keys_only=True)
        self.count = max(1, len(found))

    async def keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            try:
                reply = None if self._lease is None else await self._lease.refresh()
                if reply is None or reply.TTL <= 0:
                    await self.register()
                else:
                    await self.recount()
            except aetcd.exceptions.ClientError as exc:
                # Keep the last count: quotas stay split as they were until etcd is back.
                log.warning("event=gateway_membership_failed error=%s", exc)

    async def close(self) -> None:
        with contextlib.suppress(aetcd.exceptions.ClientError):
            if self._lease is not None:
                await self._lease.revoke()
        await self._client.close()
