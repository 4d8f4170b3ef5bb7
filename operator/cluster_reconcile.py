"""A Cluster made real: its children applied, its brokers rolled, its health observed.

The handlers (:mod:`shoal.operator.handlers`) call these in order on every
create, update and resume: :func:`drain` when the broker count goes down
(partitions move off the leaving brokers before their pods go),
:func:`apply_children` (the builders' manifests, server-side applied), :func:`spread`
when it went up (partitions move onto the new brokers once they have joined),
:func:`roll_brokers` (each broker pod whose template hash is out of date, one
at a time, each only when the cluster says it is safe), and :func:`observe`
with :func:`cluster_status` for the status. The timer calls only the last two.

Whether the count went up or down is judged against ``status.brokers.desired``,
the count of the last finished reconcile, so a drain or spread that had to be
retried is taken up again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from shoal.operator import conditions
from shoal.operator.builders import broker_template_hash, build_children, outdated_brokers
from shoal.operator.builders.common import MANAGED_BY
from shoal.operator.cluster_spec import ClusterSpec
from shoal.operator.context import OperatorContext
from shoal.operator.endpoints import (
    ClusterEndpoints,
    broker_name,
    broker_pod,
    node_reader_binding_name,
)
from shoal.operator.kafka_admin import ClusterAdmin, KafkaAdminError
from shoal.operator.kube import KubeClient
from shoal.operator.pods import pod_ready, restart_pod, template_seen
from shoal.operator.rebalance import drain_brokers, spread_onto
from shoal.operator.roller import Roller

log = logging.getLogger(__name__)

RBAC_API_VERSION: Final = "rbac.authorization.k8s.io/v1"

Progress = Callable[[str, str], Awaitable[None]]
"""(reason, message) -> report work in progress in the Cluster's status."""


def broker_selector(cluster: str) -> str:
    return f"app.kubernetes.io/instance={cluster},app.kubernetes.io/component=broker"


OWNED_KINDS: Final = (
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)
"""Every namespaced kind the builders make: where :func:`prune_children` looks."""


async def apply_children(
    kube: KubeClient, name: str, namespace: str, uid: str, spec: ClusterSpec, image: str
) -> list[dict[str, Any]]:
    """Apply every child the builders make, then delete those they no longer make.

    Returns the manifests. Server-side apply removes the fields of an object
    the builders stopped setting; a whole object they stopped making (the
    brokers' ServiceAccount and node-reader binding once ``rackLabel`` is
    gone) is :func:`prune_children`'s to delete.
    """
    children = build_children(name, namespace, uid, spec, image)
    for child in children:
        await kube.apply(child)
    await prune_children(kube, name, namespace, uid, children)
    return children


def _instance_selector(cluster: str) -> str:
    return f"app.kubernetes.io/instance={cluster},app.kubernetes.io/managed-by={MANAGED_BY}"


async def prune_children(
    kube: KubeClient, name: str, namespace: str, uid: str, built: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Delete the Cluster's children that are not in ``built``; returns ``Kind/name`` of each.

    A child is the Cluster's when it carries the Cluster's instance label and
    its owner reference (uid ``uid``): objects of another Cluster of the same
    name (deleted and made again) or of someone else are left alone. The
    node-reader ClusterRoleBinding cannot have an owner; it goes by its name,
    which holds the namespace and the Cluster's name.
    """
    wanted = {(child["kind"], child["metadata"]["name"]) for child in built}
    deleted = []
    for api_version, kind in OWNED_KINDS:
        for found in await kube.list(api_version, kind, namespace, _instance_selector(name)):
            meta = found["metadata"]
            owned = any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or [])
            if owned and (kind, meta["name"]) not in wanted:
                await kube.delete(api_version, kind, namespace, meta["name"])
                deleted.append(f"{kind}/{meta['name']}")
    binding = node_reader_binding_name(namespace, name)
    if ("ClusterRoleBinding", binding) not in wanted and await kube.get(
        RBAC_API_VERSION, "ClusterRoleBinding", None, binding
    ):
        await kube.delete(RBAC_API_VERSION, "ClusterRoleBinding", None, binding)
        deleted.append(f"ClusterRoleBinding/{binding}")
    for child in deleted:
        log.info("event=child_pruned namespace=%s cluster=%s child=%s", namespace, name, child)
    return deleted


async def delete_unowned_children(
    kube: KubeClient, name: str, namespace: str, uid: str, spec: ClusterSpec, image: str
) -> None:
    """Delete the children the garbage collector will not: those without an owner
    reference (cluster-scoped ones cannot have a namespaced owner)."""
    for child in build_children(name, namespace, uid, spec, image):
        meta = child["metadata"]
        if not meta.get("ownerReferences"):
            await kube.delete(
                child["apiVersion"], child["kind"], meta.get("namespace"), meta["name"]
            )


async def drain(endpoints: ClusterEndpoints, leaving: set[int], timeout_s: float) -> None:
    """Move every partition off ``leaving``; ReassignmentImpossible if the rest cannot hold them."""
    async with ClusterAdmin(endpoints.brokers_bootstrap) as admin:
        await drain_brokers(admin, leaving, timeout_s)


async def spread(endpoints: ClusterEndpoints, brokers: int, timeout_s: float) -> None:
    """Spread partitions over brokers 0..brokers-1; KafkaAdminError until all have joined."""
    async with ClusterAdmin(endpoints.brokers_bootstrap) as admin:
        await spread_onto(admin, list(range(brokers)), timeout_s)


async def broker_pods(kube: KubeClient, namespace: str, cluster: str) -> list[dict[str, Any]]:
    return await kube.list("v1", "Pod", namespace, broker_selector(cluster))


async def roll_brokers(
    ctx: OperatorContext,
    kube: KubeClient,
    namespace: str,
    cluster: str,
    spec: ClusterSpec,
    endpoints: ClusterEndpoints,
    progress: Progress,
) -> list[int]:
    """Restart every broker whose pod runs an outdated template; returns their ids.

    Raises the roller's RollBlocked or RollStalled, or PodNotBack (and its
    TemplateNotSeen), when a broker cannot restart safely or does not come back
    in time; the brokers
    restarted before stay restarted, so the next attempt continues.
    """
    wanted = broker_template_hash(spec, ctx.default_image)
    pods = [p for p in await broker_pods(kube, namespace, cluster) if _index(p) < spec.brokers]
    outdated = outdated_brokers(pods, wanted)
    if not outdated:
        return []
    intervals = ctx.intervals
    await template_seen(
        kube,
        namespace,
        broker_name(cluster),
        intervals.pod_ready_timeout_s,
        intervals.pod_poll_s,
    )
    restart = partial(
        _restart_broker,
        kube,
        namespace,
        cluster,
        wanted,
        intervals.pod_ready_timeout_s,
        intervals.pod_poll_s,
    )
    async with ClusterAdmin(endpoints.brokers_bootstrap) as admin:
        roller = Roller(
            admin,
            safe_timeout_s=intervals.roll_safe_timeout_s,
            rejoin_timeout_s=intervals.roll_rejoin_timeout_s,
            poll_s=intervals.roll_poll_s,
        )
        order = await roller.order(outdated)
        for step, node_id in enumerate(order, start=1):
            await progress(
                "RollingBrokers",
                f"restarting broker {node_id} ({step} of {len(order)}: {order})",
            )
            await roller.restart_safely(node_id, partial(restart, node_id))
            ctx.metrics.broker_restarts.inc()
    return order


async def _restart_broker(
    kube: KubeClient,
    namespace: str,
    cluster: str,
    template_hash: str,
    timeout_s: float,
    poll_s: float,
    node_id: int,
) -> None:
    await restart_pod(
        kube, namespace, broker_pod(cluster, node_id), template_hash, timeout_s, poll_s
    )


def _index(pod: Mapping[str, Any]) -> int:
    """A broker pod's node id (its StatefulSet ordinal)."""
    return int(pod["metadata"]["name"].rsplit("-", 1)[1])


@dataclass(frozen=True)
class ClusterHealth:
    desired: int
    ready: int
    partitions: int = 0
    under_replicated: int = 0
    offline: int = 0
    unreachable: str | None = None
    """Why the brokers could not be asked, when they could not."""


async def observe(
    kube: KubeClient, namespace: str, cluster: str, spec: ClusterSpec, endpoints: ClusterEndpoints
) -> ClusterHealth:
    """Ready broker pods (from Kubernetes) and partition health (from the brokers)."""
    pods = await broker_pods(kube, namespace, cluster)
    ready = sum(1 for p in pods if pod_ready(p) and _index(p) < spec.brokers)
    try:
        async with ClusterAdmin(endpoints.brokers_bootstrap) as admin:
            partitions = await admin.partitions()
    except KafkaAdminError as exc:
        return ClusterHealth(spec.brokers, ready, unreachable=str(exc))
    return ClusterHealth(
        desired=spec.brokers,
        ready=ready,
        partitions=len(partitions),
        under_replicated=sum(1 for p in partitions if p.under_replicated),
        offline=sum(1 for p in partitions if p.offline),
    )


STARTING = "WaitingForBrokers"
"""The Reconciling reason while brokers start: not Degraded yet, they are on their way."""
_PASSING = frozenset({"BrokersUnreachable", "BrokersNotReady", "UnderReplicated"})


def health_conditions(
    health: ClusterHealth,
    generation: int,
    previous: Sequence[Mapping[str, Any]],
    settling: bool,
) -> conditions.Conditions:
    """Ready when every broker is ready and every partition fully replicated; else Degraded.

    ``settling``: a reconcile has just applied a change, so brokers that are
    not ready yet are starting (Reconciling), not failing. That stays so,
    timer after timer, until they are ready; only a problem found outside
    such a start is Degraded.
    """
    reconciling = conditions.find(previous, conditions.RECONCILING) or {}
    starting = settling or (
        reconciling.get("status") == "True" and reconciling.get("reason") == STARTING
    )
    if health.unreachable is not None:
        problem = ("BrokersUnreachable", health.unreachable)
    elif health.ready < health.desired:
        problem = ("BrokersNotReady", f"{health.ready} of {health.desired} brokers are ready")
    elif health.offline:
        problem = ("PartitionsOffline", f"{health.offline} partition(s) have no leader")
    elif health.under_replicated:
        problem = (
            "UnderReplicated",
            f"{health.under_replicated} partition(s) have fewer in-sync replicas than replicas",
        )
    else:
        message = f"{health.ready} brokers ready, every partition fully replicated"
        return conditions.ready(previous, generation, message)
    reason, message = problem
    if starting and reason in _PASSING:
        return conditions.reconciling(previous, generation, STARTING, message)
    return conditions.degraded(previous, generation, reason, message)


def cluster_status(
    health: ClusterHealth,
    generation: int,
    previous: Sequence[Mapping[str, Any]],
    endpoints: ClusterEndpoints,
    image: str | None,
    settling: bool,
    mtls: bool = False,
) -> dict[str, Any]:
    """The Cluster's status for what :func:`observe` saw (see :func:`health_conditions`).

    ``image`` is the image every broker runs (None leaves the previous value:
    the timer does not know whether a roll is under way). ``mtls``: whether the
    gateway runs its mutual-TLS listener (the spec has a client CA); its
    bootstrap is ``mtlsBootstrap``, removed (None) when it does not.
    """
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": health_conditions(health, generation, previous, settling),
        "brokers": {"desired": health.desired, "ready": health.ready},
        "bootstrap": endpoints.gateway_bootstrap,
        "mtlsBootstrap": endpoints.gateway_mtls_bootstrap if mtls else None,
    }
    if health.unreachable is None:
        status["partitions"] = {
            "total": health.partitions,
            "underReplicated": health.under_replicated,
            "offline": health.offline,
        }
    if image is not None:
        status["image"] = image
    return status
