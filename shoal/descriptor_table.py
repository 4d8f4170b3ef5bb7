"""Growing a server's file descriptor table before it serves, not inside an accept.

Linux keeps a process's open files in a table it enlarges when a new descriptor
does not fit (64 entries, then 128, 256, ... to the limit), and a process with
more than one thread (asyncio's worker threads, gRPC's for etcd) waits for an
RCU grace period inside that enlargement (``expand_files`` calls
``synchronize_rcu``) before the call that needed the descriptor returns. The
call is an ``accept()`` on the event loop: caught in the gateway's stack during
a storm of a thousand logins, each growth stopped its loop for 4-20 ms while
using 0.2 ms of CPU, and every session already in waited as long. The table
never shrinks, so growing it once at start takes every growth up to that size
out of serving.
"""

from __future__ import annotations

import fcntl
import os
import resource
from typing import Final

DESCRIPTOR_TABLE: Final = 16384
"""Entries to reserve: a gateway holds two descriptors per client session (its own and
its broker connection's), so thousands of sessions fit; 128 KiB of table. Past it the
table grows as before, a few times at most (it doubles each time)."""


def reserve_descriptor_table(entries: int = DESCRIPTOR_TABLE) -> int:
    """Make the process's descriptor table hold ``entries`` descriptors (at most the
    open-files limit allows) by opening one at the top and closing it again. Returns
    the size reserved, 0 if the limit leaves nothing above what is open."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = min(entries, soft) - 1
    opened = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        # F_DUPFD takes the lowest free descriptor from ``top`` up, where dup2 would
        # close one that is in use.
        reserved = fcntl.fcntl(opened, fcntl.F_DUPFD_CLOEXEC, top)
    except OSError:
        return 0
    finally:
        os.close(opened)
    os.close(reserved)
    return reserved + 1
