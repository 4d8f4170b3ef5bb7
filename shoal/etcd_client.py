"""aetcd's client over every member of an etcd cluster, asking only members that have a leader.

aetcd opens one gRPC channel to one ``host:port`` and sends every request
there. A Shoal component given a three-member cluster must survive losing
any one member, including the worst case: a member cut off from the other
two but still reachable. That member answers nothing useful (a write or a
linearizable read waits for a quorum it no longer has, until the request's
timeout), so a broker talking only to it loses its session while a quorum
is healthy one hop away. This client fixes both halves the way etcd's own Go
client does:

- the channel spans every member named (gRPC's ``round_robin`` policy over
  all their addresses), so each request goes to the next member and a
  member that is down is skipped once its connection fails;
- every request carries etcd's ``hasleader`` metadata, so a member without
  a leader refuses at once (``UNAVAILABLE``, "etcdserver: no leader") instead
  of waiting, and closes watch streams it serves;
- requests that cannot change anything (reads, lease renewals, status) are
  retried by gRPC on ``UNAVAILABLE``, which sends the retry to the next
  member; writes are not: a write refused for want of a leader never ran,
  but one cut off mid-flight may have, so its caller decides.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from typing import Any, Final

import aetcd
import aetcd.exceptions

from shoal.etcd_address import EtcdAddress

REQUIRE_LEADER: Final = (("hasleader", "true"),)
"""etcd's ``rpctypes.MetadataRequireLeaderKey``: refuse at once when leaderless."""

_SAFE_TO_RETRY: Final = (
    ("etcdserverpb.KV", "Range"),
    ("etcdserverpb.Lease", "LeaseKeepAlive"),
    ("etcdserverpb.Lease", "LeaseTimeToLive"),
    ("etcdserverpb.Maintenance", "Status"),
)
_SERVICE_CONFIG: Final = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": service, "method": method} for service, method in _SAFE_TO_RETRY],
            "retryPolicy": {
                # One try per member of a three-member cluster, and one more.
                "maxAttempts": 4,
                "initialBackoff": "0.05s",
                "maxBackoff": "0.5s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ],
}
CHANNEL_OPTIONS: Final[dict[str, Any]] = {
    "grpc.service_config": json.dumps(_SERVICE_CONFIG),
    "grpc.enable_retries": 1,
    # A member whose link went silently dead is found by a ping unanswered: not more
    # often than etcd's --grpc-keepalive-min-time (5 s) allows, or it hangs up on us.
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 3_000,
    # Back to a member that came back soon, not after gRPC's default 120 s at most.
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 2_000,
}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def grpc_target(address: EtcdAddress) -> str:
    """The channel's target: one name is left to gRPC's DNS resolver (which finds every
    member behind a Kubernetes headless Service); several are resolved here into one
    ``ipv4:`` address list, since a gRPC target names at most one host name."""
    if len(address.endpoints) == 1:
        host, port = address.endpoints[0]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    loop = asyncio.get_running_loop()
    addresses: list[str] = []
    for host, port in address.endpoints:
        if ":" in host:
            raise aetcd.exceptions.ConnectionFailedError(
                f"etcd members {address}: several members must be IPv4 addresses or names;"
                " for IPv6 give one DNS name that resolves to every member"
            )
        if _is_ip(host):
            addresses.append(f"{host}:{port}")
            continue
        try:
            found = await loop.getaddrinfo(
                host, port, family=socket.AF_INET, type=socket.SOCK_STREAM
            )
        except socket.gaierror:
            continue  # a member not in DNS yet (a pod starting) is left out until it is
        addresses.extend(f"{info[4][0]}:{port}" for info in found)
    if not addresses:
        raise aetcd.exceptions.ConnectionFailedError(f"no etcd member of {address} resolves")
    return "ipv4:" + ",".join(dict.fromkeys(addresses))


class EtcdClient(aetcd.Client):  # type: ignore[misc]
    """An :class:`aetcd.Client` for every member of ``address``; see the module's docstring."""

    def __init__(self, address: EtcdAddress, timeout: float | None) -> None:
        super().__init__(timeout=timeout, options=CHANNEL_OPTIONS)
        self.address = address

    @aetcd.client._handle_errors  # type: ignore[untyped-decorator]
    @aetcd.client._ensure_connected  # type: ignore[untyped-decorator]
    async def prefix_stamp(self, prefix: bytes) -> tuple[int, int]:
        """The newest modification revision of a key under ``prefix`` and how many keys it
        holds, in one read that returns one key and no value.

        Any change under the prefix moves one of the two (a put raises the first, a
        delete lowers the second), so a poller that sees neither move may skip reading
        the prefix. A raw Range: aetcd's request builder leaves ``limit`` out."""
        request = aetcd.rpc.RangeRequest(
            key=prefix,
            range_end=aetcd.utils.prefix_range_end(prefix),
            limit=1,
            sort_order=aetcd.rpc.RangeRequest.DESCEND,
            sort_target=aetcd.rpc.RangeRequest.MOD,
            keys_only=True,
        )
        response = await self.kvstub.Range(request, timeout=self._timeout, metadata=self.metadata)
        newest = response.kvs[0].mod_revision if response.kvs else 0
        return int(newest), int(response.count)

    async def connect(self) -> None:
        if not self._connected.is_set() and not self._is_connecting:
            # aetcd builds its channel's target as f"{host}:{port}", hence the split.
            host, _, port = (await grpc_target(self.address)).rpartition(":")
            self._host, self._port = host, int(port)
        # Set before aetcd's connect, which hands it to the watcher it makes there.
        self.metadata = REQUIRE_LEADER
        await super().connect()
