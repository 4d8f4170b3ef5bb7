"""Keeping the garbage collector's full collections away from what a server loads at start.

CPython's cycle collector walks every tracked object in a full (oldest generation)
collection. A gateway that has loaded its message schemas (kio's classes for every
API version it serves, and the writers compiled from them) tracks about 175,000
objects, and a full collection of them takes 100 ms on a quiet machine. Caught in
the gateway's stack during the noisy-neighbour benchmark, such collections stopped
its event loop for 185-260 ms, every tenant's requests waiting, at whatever
allocation happened to trigger them. A broker's schemas are as many.

Those objects live as long as the process, so after one collection
:func:`gc.freeze` moves everything alive into the permanent generation, which no
later collection walks: full collections then cover only what was made since
(sessions, requests). An object frozen and later unreachable is still freed by
its reference count; only a reference cycle among such objects would stay, which
the schemas, built once, do not make.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect the start's garbage, then exempt every object alive from later
    collections; returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
