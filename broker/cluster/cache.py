"""The broker's current view of the cluster, and waiting for it to catch up.

The store's image stream feeds :meth:`MetadataCache.publish`; listeners (the
replica manager) react to each new image before any waiter resumes, so when
a handler's ``wait_for(revision)`` returns, the partitions it created exist
locally too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from shoal.broker.cluster.model import ClusterImage


class MetadataCache:
    def __init__(self, image: ClusterImage) -> None:
        self.image = image
        self._listeners: list[Callable[[ClusterImage], None]] = []
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._changed: asyncio.Event | None = None

    def add_listener(self, listener: Callable[[ClusterImage], None]) -> None:
        self._listeners.append(listener)

    def publish(self, image: ClusterImage) -> None:
        self.image = image
        for listener in self._listeners:
            listener(image)
        pending = []
        for revision, waiter in self._waiters:
            if revision <= image.revision:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                pending.append((revision, waiter))
        self._waiters = pending
        if self._changed is not None:
            self._changed.set()

    async def wait_for(self, revision: int, timeout_s: float) -> bool:
        """Wait until the image reaches ``revision``; False if it did not in time."""
        if self.image.revision >= revision:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((revision, waiter))
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            return False
        return True

    async def wait_until(self, condition: Callable[[ClusterImage], bool], timeout_s: float) -> bool:
        """Wait until an image satisfies ``condition``; False if none did in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self._changed is None:
            self._changed = asyncio.Event()
        while not condition(self.image):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return condition(self.image)
        return True
