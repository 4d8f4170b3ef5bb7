"""Pure builders: a Cluster's spec in, the manifests of its children out.

No I/O here: the handlers apply what :func:`build_children` returns (and
delete what it no longer returns). One module per component; names and
ports come from :mod:`shoal.operator.endpoints`.
"""

from __future__ import annotations

from typing import Any

from shoal.operator.builders.brokers import (
    NODE_READER_ROLE,
    TEMPLATE_HASH,
    broker_template_hash,
    build_brokers,
    outdated_brokers,
)
from shoal.operator.builders.common import Owner
from shoal.operator.builders.etcd import build_etcd
from shoal.operator.builders.gateway import build_gateway
from shoal.operator.builders.network import build_network_policies
from shoal.operator.cluster_spec import ClusterSpec

__all__ = [
    "NODE_READER_ROLE",
    "TEMPLATE_HASH",
    "broker_template_hash",
    "build_children",
    "outdated_brokers",
]


def build_children(
    name: str, namespace: str, uid: str, spec: ClusterSpec, default_image: str
) -> list[dict[str, Any]]:
    """Every child of the Cluster ``namespace/name``, each owned by it (uid ``uid``).

    The one exception is the brokers' node-reader ClusterRoleBinding (only
    with ``spec.brokers.rackLabel``): cluster-scoped objects cannot have a
    namespaced owner, so the operator deletes it with the Cluster
    (:func:`shoal.operator.endpoints.node_reader_binding_name`).
    """
    owner = Owner(name, namespace, uid)
    return [
        *build_etcd(owner, spec),
        *build_brokers(owner, spec, default_image),
        *build_gateway(owner, spec, default_image),
        *build_network_policies(owner, spec),
    ]
