"""Running an asyncio program until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine
from typing import Any


def run_until_signalled(program: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
    """Run ``program(stop)``; the first SIGINT or SIGTERM sets ``stop``."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await program(stop)

    asyncio.run(main())
