"""A broker's rack: the value of one label of the Node its pod runs on.

The downward API gives a pod its node's name but not the node's labels, so
the brokers' init container (``shoal rack-of-node``) reads the Node from the
Kubernetes API with the pod's service account token and writes the label's
value to a file the broker reads as ``SHOAL_RACK``. The brokers' service
account may ``get nodes`` through the Helm chart's ClusterRole
``shoal-broker-node-reader``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import aiohttp

SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REQUEST_TIMEOUT_S: Final = 10.0


class RackError(Exception):
    """The rack cannot be known: the Node is unreadable or lacks the label."""


def rack_of(node: Mapping[str, Any], label: str) -> str:
    """The value of ``label`` on the Node object ``node``."""
    meta = node.get("metadata", {})
    value = meta.get("labels", {}).get(label)
    if not value:
        raise RackError(f"node {meta.get('name')!r} has no label {label!r}")
    return str(value)


@dataclass(frozen=True, slots=True)
class InClusterApi:
    """The Kubernetes API as a pod reaches it: server, bearer token, cluster CA."""

    server: str
    token: str
    ca_file: Path | None

    @classmethod
    def from_pod(
        cls, account_dir: Path = SERVICE_ACCOUNT_DIR, server: str | None = None
    ) -> InClusterApi:
        """From the mounted service account and the KUBERNETES_SERVICE_* variables."""
        if server is None:
            host = os.environ.get("KUBERNETES_SERVICE_HOST")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise RackError("not in a pod: KUBERNETES_SERVICE_HOST is not set")
            server = f"https://{f'[{host}]' if ':' in host else host}:{port}"
        try:
            token = (account_dir / "token").read_text().strip()
        except OSError as exc:
            raise RackError(f"no service account token in {account_dir}: {exc}") from exc
        ca_file = account_dir / "ca.crt"
        return cls(server.rstrip("/"), token, ca_file if ca_file.exists() else None)

    def ssl_context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None


async def read_node(api: InClusterApi, name: str) -> dict[str, Any]:
    url = f"{api.server}/api/v1/nodes/{quote(name, safe='')}"
    headers = {"Authorization": f"Bearer {api.token}", "Accept": "application/json"}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, headers=headers, ssl=api.ssl_context() or True) as response,
        ):
            if response.status != 200:
                raise RackError(
                    f"GET node {name!r}: HTTP {response.status}: {(await response.text())[:200]}"
                )
            node: dict[str, Any] = await response.json()
            return node
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise RackError(f"GET node {name!r} from {api.server}: {exc}") from exc


async def rack_of_node(api: InClusterApi, node: str, label: str) -> str:
    return rack_of(await read_node(api, node), label)
