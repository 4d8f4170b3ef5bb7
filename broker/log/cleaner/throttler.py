"""``log.cleaner.io.max.bytes.per.second``: one budget for all cleaner threads.

As Kafka's Throttler: the workers report the bytes they read and write; when
the rate since the last check exceeds the limit, the reporting worker sleeps
until the average is back at it. Sleeping happens in the worker thread, never
on the event loop. Thread-safe.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Final

UNLIMITED: Final = sys.float_info.max
"""Kafka's default, Double.MAX_VALUE: no throttling at all."""
_CHECK_INTERVAL_S: Final = 0.1


class Throttler:
    def __init__(
        self,
        bytes_per_second: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.bytes_per_second = bytes_per_second
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._period_start = clock()
        self._observed = 0.0

    @property
    def limited(self) -> bool:
        return 0 < self.bytes_per_second < UNLIMITED

    def maybe_throttle(self, nbytes: int) -> None:
        if not self.limited:
            return
        with self._lock:
            self._observed += nbytes
            elapsed = self._clock() - self._period_start
            if elapsed < _CHECK_INTERVAL_S and self._observed < self.bytes_per_second:
                return
            wait = self._observed / self.bytes_per_second - elapsed
            if wait > 0:
                self._sleep(wait)
            self._period_start = self._clock()
            self._observed = 0.0
