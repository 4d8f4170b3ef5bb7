"""How long the broker's event loop stalls.

Everything a broker does runs on one asyncio loop: a stall (a large request
decoded, a segment rolled, the GIL held by another thread, the process
descheduled on a crowded host) delays every client and follower at once.
Lease renewals no longer run on it (:mod:`shoal.broker.cluster.heartbeat`
renews from a thread of its own, because under heavy produce load on two
cores this loop stalled for up to 1.9 s, more than half the session
timeout), but a loop stalled past ``SHOAL_BROKER_LOOP_STALL_TIMEOUT_MS``
stops them. A ticker that wakes every :data:`TICK_S` measures how late it
woke; stalls past :data:`REPORT_S` are logged (``event=event_loop_stalled``)
and the longest is kept for ``shoal_broker_event_loop_stall_max_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

log = logging.getLogger(__name__)

TICK_S: Final = 0.1
REPORT_S: Final = 0.5


class LoopWatch:
    def __init__(self) -> None:
        self.longest_s = 0.0
        """The longest stall since the broker started."""
        self.stalls = 0
        """Stalls longer than :data:`REPORT_S`."""

    async def run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(TICK_S)
            late = time.monotonic() - before - TICK_S
            self.longest_s = max(self.longest_s, late)
            if late >= REPORT_S:
                self.stalls += 1
                log.warning("event=event_loop_stalled stalled_ms=%d", late * 1000)
