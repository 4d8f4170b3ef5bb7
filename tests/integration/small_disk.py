"""A broker's log directory on a filesystem of its own, which a fault can fill.

A tmpfs mounted over the directory (root needed, as for the network
namespaces): :meth:`SmallDisk.fill` takes every free byte with one
preallocated ballast file, so the next write there fails with ENOSPC as on
a full disk, and :meth:`SmallDisk.free` deletes it again.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

BALLAST = ".ballast"


class SmallDisk:
    def __init__(self, where: Path, size: str) -> None:
        self.where = where
        self.size = size
        self.mounted = False

    def mount(self) -> SmallDisk:
        self.where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise OSError(f"mounting a tmpfs on {self.where} failed: {done.stderr.strip()}")
        self.mounted = True
        return self

    def fill(self) -> int:
        """Take every free byte (written, not reserved: a failed reservation on tmpfs
        takes nothing); returns how many were taken."""
        taken = 0
        with open(self.where / BALLAST, "ab", buffering=0) as ballast:
            for chunk in (b"\0" * 2**20, b"\0" * 4096):
                with contextlib.suppress(OSError):  # ENOSPC: this chunk size no longer fits
                    while True:
                        taken += ballast.write(chunk) or 0
        return taken

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.where / BALLAST).unlink()

    def unmount(self) -> None:
        if self.mounted:
            done = subprocess.run(
                ["umount", "--lazy", str(self.where)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                log.warning("unmounting %s failed: %s", self.where, done.stderr.strip())
            self.mounted = False
