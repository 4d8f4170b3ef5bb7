"""Which gateways run, and what traffic each carries: a key per gateway under an etcd lease.

Every :data:`ROUND_S` a gateway writes its traffic report
(:class:`~shoal.gateway.quota_shares.TrafficLedger`) as the value of its own
key, ``<root>/gateways/<gateway id>``, and reads every replica's key; the
round goes to :class:`~shoal.gateway.quota_shares.QuotaShares`, which splits
each tenant's quotas where its traffic is. A gateway that dies drops out when
its lease ends. While etcd cannot be reached, the last round stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aetcd
import aetcd.exceptions
from shoal.gateway.quota_shares import ROUND_S, QuotaShares, TrafficLedger

from shoal.etcd_address import EtcdAddress
from shoal.etcd_client import EtcdClient

log = logging.getLogger(__name__)


class GatewayMembership:
    def __init__(
        self,
        etcd_url: str,
        gateway_id: str,
        ttl_s: int,
        traffic: TrafficLedger,
        shares: QuotaShares,
    ) -> None:
        address = EtcdAddress.parse(etcd_url)
        self._prefix = address.root.encode() + b"/gateways/"
        self._key = self._prefix + gateway_id.encode()
        self._client = EtcdClient(address, 5.0)
        self._ttl_s = ttl_s
        self._lease: aetcd.Lease | None = None
        self._traffic = traffic
        self._shares = shares
        self._reported_at = time.monotonic()

    async def register(self) -> None:
        self._lease = await self._client.lease(self._ttl_s)
        await self._exchange()

    async def _exchange(self) -> None:
        now = time.monotonic()
        report = self._traffic.report(max(now - self._reported_at, 1e-3))
        self._reported_at = now
        await self._client.put(self._key, report, lease=self._lease)
        found = await self._client.get_prefix(self._prefix)
        self._shares.update(
            {bytes(kv.key)[len(self._prefix) :].decode(): bytes(kv.value) for kv in found}
        )

    async def keep_alive(self) -> None:
        refreshed = time.monotonic()
        while True:
            await asyncio.sleep(ROUND_S)
            try:
                if time.monotonic() - refreshed >= self._ttl_s / 3:
                    reply = None if self._lease is None else await self._lease.refresh()
                    refreshed = time.monotonic()
                    if reply is None or reply.TTL <= 0:
                        await self.register()
                        continue
                await self._exchange()
            except aetcd.exceptions.ClientError as exc:
                log.warning("event=gateway_membership_failed error=%s", exc)

    async def close(self) -> None:
        with contextlib.suppress(aetcd.exceptions.ClientError):
            if self._lease is not None:
                await self._lease.revoke()
        await self._client.close()
