"""Where etcd is: ``http://host:port[,host:port...][/chroot]``, as every Shoal component takes it.

Several comma-separated endpoints name the members of one etcd cluster, as
etcdctl's ``--endpoints`` does; the chroot after the last of them keeps one
cluster's keys under a prefix (``/shoal`` by default), as ZooKeeper's chroot
did for Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

DEFAULT_ROOT: Final = "/shoal"
DEFAULT_PORT: Final = 2379


@dataclass(frozen=True, slots=True)
class EtcdAddress:
    endpoints: tuple[tuple[str, int], ...]
    """Every member named, ``(host, port)``, in the order given."""
    root: str

    @property
    def host(self) -> str:
        return self.endpoints[0][0]

    @property
    def port(self) -> int:
        return self.endpoints[0][1]

    def __str__(self) -> str:
        """The members as messages name them: ``host:port,host:port``."""
        return ",".join(f"{host}:{port}" for host, port in self.endpoints)

    @classmethod
    def parse(cls, url: str) -> EtcdAddress:
        """``http://a:2379,http://b:2379/chroot`` or ``http://a:2379,b:2379/chroot``."""
        endpoints: list[tuple[str, int]] = []
        root = ""
        for part in url.split(","):
            text = part.strip()
            if not text:
                continue
            if "://" not in text:
                text = "http://" + text
            parts = urlsplit(text)
            if parts.scheme != "http":
                raise ValueError(f"etcd URL {url!r}: only http:// is supported")
            if not parts.hostname:
                raise ValueError(f"etcd URL {url!r} has no host in {part.strip()!r}")
            path = parts.path.rstrip("/")
            if path and root and path != root:
                raise ValueError(f"etcd URL {url!r} names two chroots: {root!r} and {path!r}")
            root = root or path
            endpoints.append((parts.hostname, parts.port or DEFAULT_PORT))
        if not endpoints:
            raise ValueError(f"etcd URL {url!r} names no endpoint")
        return cls(tuple(endpoints), root or DEFAULT_ROOT)
