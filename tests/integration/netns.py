"""Each process in a network namespace of its own, so tests can cut links between them.

A :class:`Network` makes a switch namespace holding a bridge, and for every
node a namespace joined to the bridge by a veth pair, with an address on a
private /24 that exists only inside these namespaces (the host's own
network is never touched). Faults:

- :meth:`Network.isolate` takes a node's link down: it reaches no one and
  no one reaches it (a pulled cable);
- :meth:`Network.cut` drops traffic between two groups of nodes with
  blackhole routes on both sides, leaving each group's other links up (a
  leader cut from etcd and its followers but not from its clients);
- :meth:`Network.heal` undoes both.

This machine has no ``tc`` actions or netfilter, so there is no delay or
loss, only cuts; a blackhole route makes new connections fail at once
(EINVAL) where a real partition would leave them hanging, and makes
established ones stall, as a real partition does.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN): :func:`namespaces_available`
says whether this process may make namespaces.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

SUBNET = "10.213.0"
"""The first three octets of the nodes' addresses; only inside our namespaces."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def namespaces_available() -> str | None:
    """None when namespaces can be made here, else why not (for a skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    probe = f"shoal-probe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"cannot create a network namespace here: {exc}"
    _ip("netns", "del", probe)
    return None


@dataclass
class Node:
    name: str
    namespace: str
    address: str
    switch_port: str
    """The veth end on the bridge: down means the node is isolated."""
    blackholed: set[str] = field(default_factory=set)

    def command(self, args: list[str]) -> list[str]:
        """``args`` run inside this node's namespace (``ip netns exec`` execs them, so
        signals sent to the process reach the program itself)."""
        return ["ip", "netns", "exec", self.namespace, *args]


class Network:
    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.switch = f"shoal-{self.tag}-sw"
        self.nodes: dict[str, Node] = {}
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add(self, name: str) -> Node:
        number = len(self.nodes) + 1
        namespace = f"shoal-{self.tag}-{name}"
        port = f"p{number}"
        address = f"{SUBNET}.{number}"
        _ip("netns", "add", namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip(
            "link",
            "add",
            "eth0",
            "netns",
            namespace,
            "type",
            "veth",
            "peer",
            port,
            "netns",
            self.switch,
        )
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        node = Node(name, namespace, address, port)
        self.nodes[name] = node
        return node

    def isolate(self, node: Node) -> None:
        _ip("-n", self.switch, "link", "set", node.switch_port, "down")

    def cut(self, group: Iterable[Node], others: Iterable[Node]) -> None:
        """No traffic between any node of ``group`` and any of ``others``."""
        others = list(others)
        for a in group:
            for b in others:
                for source, target in ((a, b), (b, a)):
                    if target.address not in source.blackholed:
                        _ip(
                            "-n",
                            source.namespace,
                            "route",
                            "add",
                            "blackhole",
                            f"{target.address}/32",
                        )
                        source.blackholed.add(target.address)

    def heal(self) -> None:
        for node in self.nodes.values():
            _ip("-n", self.switch, "link", "set", node.switch_port, "up")
            for address in node.blackholed:
                _ip("-n", node.namespace, "route", "del", "blackhole", f"{address}/32")
            node.blackholed.clear()

    def close(self) -> None:
        """Delete every namespace (their veths go with them)."""
        for namespace in [*(n.namespace for n in self.nodes.values()), self.switch]:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)
        self.nodes.clear()


CLONE_NEWNET = 0x40000000


def call_in(node: Node, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a thread of this process that has joined ``node``'s namespace.

    Threads a thread starts share its namespace, so librdkafka clients made
    inside ``function`` (their threads included) live in the node's network.
    The calling thread, and the rest of the test process, stay where they are.
    """
    outcome: list[Any] = []

    def enter_and_call() -> None:
        try:
            with open(f"/run/netns/{node.namespace}") as handle:
                if _libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {node.namespace} failed")
            outcome.append(function(*args))
        except BaseException as exc:  # re-raised in the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=enter_and_call, name=f"in-{node.name}")
    thread.start()
    thread.join()
    [result] = outcome
    if isinstance(result, BaseException):
        raise result
    return result  # type: ignore[no-any-return]


_libc = ctypes.CDLL(None, use_errno=True)
