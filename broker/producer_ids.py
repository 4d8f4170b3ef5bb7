"""Producer ids for idempotent producers, unique across the cluster and across restarts.

Like Kafka's ProducerIdManager, a broker takes a block of ids at a time from
the cluster's store (one compare-and-swap per block) and hands them out
from memory; ids of a block cut short by a restart are skipped, never reused.
"""

from __future__ import annotations

import asyncio
from typing import Final

from shoal.broker.cluster.store import MetadataStore

BLOCK_SIZE: Final = 1000


class ProducerIdManager:
    def __init__(self, store: MetadataStore, block_size: int = BLOCK_SIZE) -> None:
        self.store = store
        self.block_size = block_size
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def generate(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                start = await self.store.allocate_producer_ids(self.block_size)
                self._next, self._end = start, start + self.block_size
            producer_id = self._next
            self._next += 1
            return producer_id
