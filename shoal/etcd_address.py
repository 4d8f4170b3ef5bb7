"""Where etcd is: ``http://host:port[/chroot]``, as every Shoal component takes it.

The chroot keeps one cluster's keys under a prefix (``/shoal`` by default),
as ZooKeeper's chroot did for Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

DEFAULT_ROOT: Final = "/shoal"


@dataclass(frozen=True, slots=True)
class EtcdAddress:
    host: str
    port: int
    root: str

    @classmethod
    def parse(cls, url: str) -> EtcdAddress:
        """``http://host:port[/chroot]``; only the first of comma-separated endpoints is used."""
        first = url.split(",", maxsplit=1)[0].strip()
        if "://" not in first:
            first = "http://" + first
        parts = urlsplit(first)
        if parts.scheme != "http":
            raise ValueError(f"etcd URL {url!r}: only http:// is supported")
        if not parts.hostname:
            raise ValueError(f"etcd URL {url!r} has no host")
        root = parts.path.rstrip("/") or DEFAULT_ROOT
        return cls(parts.hostname, parts.port or 2379, root)
