"""Fault injection for the crash tests of the cleaner: off unless asked for.

Each step of a clean that changes files calls :meth:`Faults.hit` with its
name (:data:`STEPS`). In production nothing is configured and ``hit`` is a
dictionary lookup. A test names one step, and how many hits to let pass
first, either in the constructor or with the environment variable
``SHOAL_CLEANER_FAULT=<step>[:<skip>]`` (read once, when the broker builds
its cleaner); at that hit the process ends at once with ``os._exit`` (as a
SIGKILL would, nothing flushed, no handler run) or, with ``raise_=True``,
:class:`InjectedFaultError` is raised (for tests of the abort paths).
"""

from __future__ import annotations

import os
from typing import Final

ENV_VAR: Final = "SHOAL_CLEANER_FAULT"
EXIT_CODE: Final = 86

STEPS: Final = (
    "map_built",
    "cleaned_partly_written",
    "cleaned_written",
    "index_swapped",
    "swap_renamed",
    "old_deleted_partly",
    "old_deleted",
    "index_live",
    "swap_live",
    "group_done",
    "checkpoint_written",
)
"""In the order a clean reaches them; the group steps repeat for every group."""


class InjectedFaultError(Exception):
    pass


class Faults:
    def __init__(self, step: str | None = None, skip: int = 0, raise_: bool = False) -> None:
        if step is not None and step not in STEPS:
            raise ValueError(f"unknown cleaner step {step!r}; one of {', '.join(STEPS)}")
        self.step = step
        self.remaining = skip
        self.raise_ = raise_

    @classmethod
    def from_env(cls) -> Faults:
        spec = os.environ.get(ENV_VAR, "")
        if not spec:
            return cls()
        step, _, skip = spec.partition(":")
        return cls(step, int(skip or 0))

    def hit(self, step: str) -> None:
        if step != self.step:
            return
        if self.remaining > 0:
            self.remaining -= 1
            return
        if self.raise_:
            raise InjectedFaultError(step)
        os._exit(EXIT_CODE)
