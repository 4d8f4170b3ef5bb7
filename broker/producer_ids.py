"""Producer ids for idempotent producers, unique across the cluster and across restarts.

Like Kafka's ProducerIdManager, a broker takes a block of ids at a time from
the cluster's store (one compare-and-swap per block) and hands them out
from memory; ids of a block cut short by a restart are skipped, never reused.

A broker holds its next block before it needs it: the first is fetched when
the broker starts, and the one after in the background once 90% of the
current block is handed out (Kafka's prefetch threshold). So a new
idempotent or transactional producer gets its id at once, also while etcd is
away, until a block and a spare are used up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from shoal.broker.cluster.store import MetadataStore, StoreError

log = logging.getLogger(__name__)

BLOCK_SIZE: Final = 1000
PREFETCH_AT: Final = 0.9
"""The share of a block handed out before the next one is fetched."""


class ProducerIdManager:
    def __init__(self, store: MetadataStore, block_size: int = BLOCK_SIZE) -> None:
        self.store = store
        self.block_size = block_size
        self._next = 0
        self._end = 0
        self._spare: int | None = None
        """The start of the next block, fetched ahead."""
        self._fetching: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def start(self) -> None:
        """Fetch a block in the background, so the first producer does not wait for it."""
        self._prefetch()

    async def close(self) -> None:
        if self._fetching is not None:
            self._fetching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._fetching

    async def generate(self) -> int:
        """The next id; raises :class:`StoreError` when no block is held and the store
        cannot give one."""
        async with self._lock:
            if self._next >= self._end:
                if self._fetching is not None:
                    # A fetch under way: its block, or its failure, is the answer.
                    await asyncio.wait([self._fetching])
                if self._spare is None:
                    self._spare = await self.store.allocate_producer_ids(self.block_size)
                self._next, self._end, self._spare = (
                    self._spare,
                    self._spare + self.block_size,
                    None,
                )
            producer_id = self._next
            self._next += 1
            if self._end - self._next <= self.block_size * (1 - PREFETCH_AT):
                self._prefetch()
            return producer_id

    def _prefetch(self) -> None:
        if self._spare is None and (self._fetching is None or self._fetching.done()):
            self._fetching = asyncio.create_task(self._fetch(), name="producer-id-prefetch")

    async def _fetch(self) -> None:
        try:
            self._spare = await self.store.allocate_producer_ids(self.block_size)
        except StoreError as exc:
            # generate() asks again when it needs the block.
            log.info("event=producer_id_prefetch_failed error=%s", str(exc).replace(" ", "_"))
