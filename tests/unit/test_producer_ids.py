"""Producer id blocks: fetched ahead, so ids keep coming while the store is away."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from shoal.broker.cluster.store import MetadataStore, StoreError
from shoal.broker.producer_ids import ProducerIdManager


class Blocks:
    """allocate_producer_ids of a store that can be taken away."""

    def __init__(self) -> None:
        self.next = 0
        self.calls = 0
        self.up = True

    async def allocate_producer_ids(self, count: int) -> int:
        self.calls += 1
        await asyncio.sleep(0)
        if not self.up:
            raise StoreError("etcd is unreachable")
        start, self.next = self.next, self.next + count
        return start


def manager(blocks: Blocks, size: int = 10) -> ProducerIdManager:
    return ProducerIdManager(cast(MetadataStore, cast(Any, blocks)), block_size=size)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_ids_are_unique_and_in_order_across_blocks() -> None:
    async def go() -> list[int]:
        ids = manager(Blocks())
        ids.start()
        got = [await ids.generate() for _ in range(35)]
        await ids.close()
        return got

    assert asyncio.run(go()) == list(range(35))


def test_a_started_manager_serves_its_first_block_and_a_spare_while_the_store_is_away() -> None:
    async def go() -> None:
        blocks = Blocks()
        ids = manager(blocks)
        ids.start()
        await settle()  # the first block came while the store was up
        blocks.up = False
        got = [await ids.generate() for _ in range(9)]
        blocks.up = True
        got.append(await ids.generate())  # the tenth reaches the prefetch threshold
        await settle()
        blocks.up = False
        got += [await ids.generate() for _ in range(10)]  # the spare
        assert got == list(range(20))
        with pytest.raises(StoreError):
            await ids.generate()
        blocks.up = True
        assert await ids.generate() == 20
        await ids.close()

    asyncio.run(go())


def test_concurrent_callers_share_one_fetch() -> None:
    async def go() -> None:
        blocks = Blocks()
        ids = manager(blocks, size=100)
        got = await asyncio.gather(*(ids.generate() for _ in range(50)))
        assert sorted(got) == list(range(50))
        assert blocks.calls == 1
        await ids.close()

    asyncio.run(go())
