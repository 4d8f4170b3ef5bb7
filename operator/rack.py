"""A broker's rack: the value of one label of the Node its pod runs on.

The downward API gives a pod its node's name but not the node's labels, so
the brokers' init container (``shoal rack-of-node``) reads the Node from the
Kubernetes API with the pod's service account token and writes the label's
value to a file the broker reads as ``SHOAL_RACK``. The request goes through
lightkube, the client the operator uses (:mod:`shoal.operator.kube`). The brokers' service
account may ``get nodes`` through the Helm chart's ClusterRole
``shoal-broker-node-reader``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.resources.core_v1 import Node

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


async def read_node(api: InClusterApi, name: str) -> dict[str, Any]:
    """The Node ``name``, read with lightkube (the operator's client) as the pod's account."""
    config = KubeConfig.from_one(
        cluster=Cluster(
            server=api.server, certificate_auth=str(api.ca_file) if api.ca_file else None
        ),
        user=User(token=api.token),
    )
    client = AsyncClient(config, timeout=httpx2.Timeout(REQUEST_TIMEOUT_S), trust_env=False)
    try:
        node = await client.get(Node, name)
    except httpx2.HTTPStatusError as exc:
        response = exc.response
        raise RackError(
            f"GET node {name!r}: HTTP {response.status_code}: {response.text[:200]}"
        ) from exc
    except httpx2.TransportError as exc:
        raise RackError(f"GET node {name!r} from {api.server}: {exc!r}") from exc
    finally:
        await client.close()
    return node.to_dict()


async def rack_of_node(api: InClusterApi, node: str, label: str) -> str:
    return rack_of(await read_node(api, node), label)
