"""Names and addresses of a Cluster's children: one place, so builders and actions agree.

A Cluster ``demo`` in namespace ``prod`` has the StatefulSets ``demo-etcd``
and ``demo-broker`` (each with a headless Service of the same name), the etcd
client Service ``demo-etcd-client``, and the gateway Deployment and Service
``demo-gateway``. Broker ``n`` is the pod ``demo-broker-n``, whose node id is
``n``; its internal listener is ``demo-broker-n.demo-broker.prod.svc:19092``.
The gateway's Kafka bootstrap port is 9092 and broker ``n`` is at 9093+n on
the same Service, as ``shoal gateway`` lays out its listeners; its
mutual-TLS listener (when the Cluster has a client CA) likewise at 9292 and
9293+n.

The operator reaches a Cluster through :class:`ClusterEndpoints`. In a pod
these are Service DNS names; tests and operators run outside the cluster give
their own resolver instead (see :data:`EndpointResolver`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

BROKER_PORT = 19092
"""Brokers' internal listener (no authentication: NetworkPolicies keep it private)."""
GATEWAY_KAFKA_PORT = 9092
"""Gateway bootstrap; broker n is at GATEWAY_KAFKA_PORT + 1 + n."""
GATEWAY_MTLS_PORT = 9292
"""Gateway's mutual-TLS bootstrap (security.protocol SSL); broker n at GATEWAY_MTLS_PORT + 1 + n.
200 above GATEWAY_KAFKA_PORT: both blocks stay clear of each other and of METRICS_PORT
for up to 111 brokers (the spec allows 64)."""
GATEWAY_HTTP_PORT = 8080
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
METRICS_PORT = 9404
ETCD_ROOT = "/shoal"
"""The chroot every component of a Cluster keeps its etcd keys under."""


def etcd_name(cluster: str) -> str:
    return f"{cluster}-etcd"


def etcd_client_name(cluster: str) -> str:
    """The etcd client Service (ClusterIP); ``etcd_name`` is the peers' headless one."""
    return f"{cluster}-etcd-client"


def broker_name(cluster: str) -> str:
    return f"{cluster}-broker"


def gateway_name(cluster: str) -> str:
    return f"{cluster}-gateway"


def config_name(cluster: str) -> str:
    """The ConfigMap with the brokers' settings (topic defaults, ``spec.brokers.config``)."""
    return f"{cluster}-config"


def node_reader_binding_name(namespace: str, cluster: str) -> str:
    """The brokers' ClusterRoleBinding to read Nodes (their rack label).

    Cluster-scoped, so it cannot be owned by the namespaced Cluster: the
    operator deletes it when the Cluster goes.
    """
    return f"shoal-{namespace}-{cluster}-broker-node-reader"


def broker_pod(cluster: str, node_id: int) -> str:
    return f"{broker_name(cluster)}-{node_id}"


def gateway_broker_port(node_id: int) -> int:
    return GATEWAY_KAFKA_PORT + 1 + node_id


def gateway_mtls_broker_port(node_id: int) -> int:
    return GATEWAY_MTLS_PORT + 1 + node_id


def key_secret_name(tenant: str, key: str) -> str:
    """The Secret holding one of a tenant's API keys (``shoal-<tenant>-<key>``)."""
    return f"shoal-{tenant}-{key}"


@dataclass(frozen=True, slots=True)
class ClusterEndpoints:
    """How the operator, and a tenant's clients, reach one Cluster."""

    etcd_url: str
    """etcd with the cluster's chroot, as ``shoal broker --etcd`` takes it."""
    brokers_bootstrap: str
    """Comma-separated internal listeners of the brokers, for the Kafka admin protocol."""
    gateway_bootstrap: str
    """What a tenant's Kafka client puts in bootstrap.servers."""
    gateway_http: str
    """Base URL of the gateway's HTTP API."""
    gateway_mtls_bootstrap: str | None = None
    """bootstrap.servers for a client signing in with a certificate (the gateway's
    mutual-TLS listener, when the Cluster has a client CA); None: not known."""


EndpointResolver = Callable[[str, str, int], ClusterEndpoints]
"""(namespace, cluster name, broker count) -> endpoints."""


def in_cluster_endpoints(namespace: str, cluster: str, brokers: int) -> ClusterEndpoints:
    """The Service DNS names, as seen from a pod in the same Kubernetes cluster."""
    domain = f"{namespace}.svc"
    brokers_service = f"{broker_name(cluster)}.{domain}"
    gateway_host = f"{gateway_name(cluster)}.{domain}"
    return ClusterEndpoints(
        # The headless Service: its name resolves to every member, which the components'
        # etcd client spreads its requests over and fails over between (shoal.etcd_client);
        # behind the ClusterIP one a connection sticks to one member, even one cut off.
        etcd_url=f"http://{etcd_name(cluster)}.{domain}:{ETCD_CLIENT_PORT}{ETCD_ROOT}",
        brokers_bootstrap=",".join(
            f"{broker_pod(cluster, n)}.{brokers_service}:{BROKER_PORT}" for n in range(brokers)
        ),
        gateway_bootstrap=f"{gateway_host}:{GATEWAY_KAFKA_PORT}",
        gateway_http=f"http://{gateway_host}:{GATEWAY_HTTP_PORT}",
        gateway_mtls_bootstrap=f"{gateway_host}:{GATEWAY_MTLS_PORT}",
    )


class EndpointsFileError(Exception):
    """The endpoints file (:func:`endpoints_file`) is missing or not JSON."""


ANY_CLUSTER: Final = "*"
"""The key of an endpoints file's entry for every Cluster it does not name."""


def endpoints_file(path: Path) -> EndpointResolver:
    """A resolver for an operator running outside the Kubernetes cluster (development, tests).

    Service DNS names do not resolve outside the cluster, so such an operator
    reads where each Cluster's brokers, etcd and gateway are from a JSON file::

        {"streaming/demo": {"etcd_url": "http://127.0.0.1:2379/shoal",
                            "brokers_bootstrap": "127.0.0.1:19092",
                            "gateway_bootstrap": "127.0.0.1:9092",
                            "gateway_http": "http://127.0.0.1:8080",
                            "gateway_mtls_bootstrap": "127.0.0.1:9292"},
         "*": {...}}

    keyed ``<namespace>/<cluster>``, with ``*`` for every Cluster not named
    (``gateway_mtls_bootstrap`` may be left out);
    a Cluster in neither gets :func:`in_cluster_endpoints`. The file is read
    at each resolution, so entries may be added while the operator runs.
    """

    def resolve(namespace: str, cluster: str, brokers: int) -> ClusterEndpoints:
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            # Not a ValueError: handlers read those as invalid specs. kopf retries this.
            raise EndpointsFileError(f"cannot read the endpoints file {path}: {exc}") from exc
        entry = entries.get(f"{namespace}/{cluster}") or entries.get(ANY_CLUSTER)
        if entry is None:
            return in_cluster_endpoints(namespace, cluster, brokers)
        return ClusterEndpoints(
            etcd_url=str(entry["etcd_url"]),
            brokers_bootstrap=str(entry["brokers_bootstrap"]),
            gateway_bootstrap=str(entry["gateway_bootstrap"]),
            gateway_http=str(entry["gateway_http"]),
            gateway_mtls_bootstrap=(
                None
                if entry.get("gateway_mtls_bootstrap") is None
                else str(entry["gateway_mtls_bootstrap"])
            ),
        )

    return resolve
