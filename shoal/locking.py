"""One process per data directory: an exclusive flock on ``<dir>/.lock``.

The broker locks its log directory and ``shoal dev`` locks its whole data
directory, so a second broker or a second ``shoal dev`` on the same files
stops with a message instead of corrupting them. The lock file holds the
owner's pid for that message; the kernel drops the lock when the owner dies,
even by SIGKILL, so a stale file never blocks a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Final

LOCK_FILE: Final = ".lock"


class DirectoryLockedError(Exception):
    pass


class DirectoryLock:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / LOCK_FILE
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            raise DirectoryLockedError(
                f"{directory} is in use by another process (pid {holder}); stop it first"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
