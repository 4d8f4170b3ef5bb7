"""kopf handlers for Cluster, Topic and Tenant: thin, they call the modules that do the work.

:func:`build_registry` registers every handler on a fresh
:class:`kopf.OperatorRegistry`, so ``shoal operator`` and the tests run the
same handlers, each with its own :class:`~shoal.operator.context.OperatorContext`
in kopf's memo. Each resource follows one pattern:

* create / update / resume reconcile, then write the status (conditions
  Ready, Reconciling, Degraded; observedGeneration) through the status
  subresource, also when they fail, so ``kubectl get`` tells what is wrong;
* what waiting may fix raises :class:`kopf.TemporaryError` (kopf retries);
  what only the user can fix raises :class:`kopf.PermanentError`, and the
  next change of the spec tries again;
* a timer repeats the reconcile (Topic, Tenant: drift on the cluster) or
  observes health (Cluster); handlers and timers of one object take turns
  (:meth:`~shoal.operator.context.OperatorContext.lock`), and the Cluster's
  timer skips a turn while a reconcile runs;
* deletion goes through a finalizer (kopf's on.delete) so the topic, or the
  tenant's keys and topics, are removed from the cluster before the
  resource disappears.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import kopf
from shoal.operator import conditions
from shoal.operator.cluster_reconcile import (
    apply_children,
    cluster_status,
    delete_unowned_children,
    drain,
    observe,
    roll_brokers,
    spread,
)
from shoal.operator.cluster_spec import ClusterSpec
from shoal.operator.context import Intervals, OperatorContext, context_of
from shoal.operator.endpoints import ClusterEndpoints
from shoal.operator.kafka_admin import ClusterAdmin, KafkaAdminError
from shoal.operator.kube import GROUP, VERSION, KubeClient, KubeError
from shoal.operator.pods import PodNotBack
from shoal.operator.rebalance import ReassignmentImpossible, ReassignmentTimeoutError
from shoal.operator.roller import RollBlocked, RollStalled
from shoal.operator.tenants import (
    TENANT_LABEL,
    CertificateSubjectTakenError,
    KeySecret,
    TenantSpec,
    read_key_secret,
    reconcile_tenant,
    remove_tenant,
)
from shoal.operator.topics import TopicError, TopicSpec, reconcile_topic, remove_topic
from shoal.tenancy.model import ConcurrentChangeError
from shoal.tenancy.store import TenancyStore, TenancyStoreError

log = logging.getLogger(__name__)

API_VERSION: Final = f"{GROUP}/{VERSION}"
TIMER_EXIT_POLL_S: Final = 2.0
"""How often kopf looks whether a deleted object's timer has finished (its default: 60 s)."""


class ClusterMissing(Exception):  # noqa: N818 (reads as the state it reports)
    """The Cluster a Topic or Tenant names does not exist (yet)."""


def _namespaced(namespace: str | None) -> str:
    """Our kinds are namespaced; kopf types the namespace for cluster-scoped kinds too."""
    if namespace is None:
        raise kopf.PermanentError("a Shoal resource must live in a namespace")
    return namespace


def _generation(meta: Mapping[str, Any]) -> int:
    return int(meta.get("generation") or 1)


def _conditions(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(c) for c in status.get("conditions") or []]


async def _write_status(
    kube: KubeClient, kind: str, namespace: str, name: str, status: Mapping[str, Any]
) -> None:
    try:
        await kube.patch_status(API_VERSION, kind, namespace, name, status)
    except KubeError as exc:
        if exc.status != 404:  # deleted meanwhile: nothing left to report on
            raise


@dataclass(frozen=True, slots=True)
class _StatusReport:
    """How a Topic or Tenant reconcile ends in its status: Ready with its fields,
    or not Ready with the reason (then kopf retries, or gives up if only the spec
    can fix it)."""

    ctx: OperatorContext
    kind: str
    namespace: str
    name: str
    found: list[dict[str, Any]]
    generation: int

    async def _write(self, status: Mapping[str, Any]) -> None:
        await _write_status(self.ctx.client(), self.kind, self.namespace, self.name, status)

    async def ready(self, message: str, fields: Mapping[str, Any]) -> None:
        await self._write(
            {
                **fields,
                "observedGeneration": self.generation,
                "conditions": conditions.ready(self.found, self.generation, message),
                "lastError": None,
            }
        )

    async def fail(self, reason: str, message: str, retry: bool) -> NoReturn:
        failed = conditions.not_ready(self.found, self.generation, reason, message)
        await self._write(
            {"observedGeneration": self.generation, "conditions": failed, "lastError": message}
        )
        if retry:
            raise kopf.TemporaryError(message, delay=self.ctx.intervals.retry_s)
        raise kopf.PermanentError(message)


async def _resolve_cluster(
    ctx: OperatorContext, kube: KubeClient, namespace: str, cluster: str
) -> tuple[ClusterSpec, ClusterEndpoints]:
    found = await kube.get(API_VERSION, "Cluster", namespace, cluster)
    if found is None:
        raise ClusterMissing(f"Cluster {cluster} does not exist in namespace {namespace}")
    spec = ClusterSpec.from_spec(found.get("spec") or {})
    return spec, ctx.resolver(namespace, cluster, spec.brokers)


async def _counted(ctx: OperatorContext, kind: str, work: Awaitable[None]) -> None:
    """Run a reconcile, counting its result for /metrics."""
    try:
        await work
    except kopf.TemporaryError:
        ctx.metrics.reconciles.labels(kind, "retry").inc()
        raise
    except KubeError as exc:
        ctx.metrics.reconciles.labels(kind, "retry" if exc.transient else "failed").inc()
        raise
    except Exception:
        ctx.metrics.reconciles.labels(kind, "failed").inc()
        raise
    ctx.metrics.reconciles.labels(kind, "ok").inc()


# --- Cluster ---------------------------------------------------------------------------------


class _ClusterReport:
    """The Cluster's conditions as a reconcile goes, written as they change."""

    def __init__(
        self, kube: KubeClient, namespace: str, name: str, generation: int, found: list[Any]
    ) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.generation = generation
        self.found: conditions.Conditions = found

    async def _write(self) -> None:
        await _write_status(
            self.kube, "Cluster", self.namespace, self.name, {"conditions": self.found}
        )

    async def progress(self, reason: str, message: str) -> None:
        self.found = conditions.reconciling(self.found, self.generation, reason, message)
        await self._write()

    async def degraded(self, reason: str, message: str) -> None:
        self.found = conditions.degraded(self.found, self.generation, reason, message)
        await self._write()


async def _drain_first(
    ctx: OperatorContext,
    report: _ClusterReport,
    endpoints: ClusterEndpoints,
    previous: int,
    wanted: int,
) -> None:
    """Before fewer brokers: move partitions off the leaving ones, or refuse."""
    leaving = set(range(wanted, previous))
    await report.progress("ScalingDown", f"moving partitions off brokers {sorted(leaving)}")
    try:
        await drain(endpoints, leaving, ctx.intervals.reassignment_timeout_s)
    except ReassignmentImpossible as exc:
        message = f"cannot remove brokers {sorted(leaving)}, so keeping {previous}: {exc}"
        await report.degraded("ScaleDownImpossible", message)
        raise kopf.PermanentError(message) from exc
    except (ReassignmentTimeoutError, KafkaAdminError) as exc:
        await report.progress("ScalingDown", str(exc))
        raise kopf.TemporaryError(str(exc), delay=ctx.intervals.retry_s) from exc


async def _spread_after(
    ctx: OperatorContext,
    report: _ClusterReport,
    endpoints: ClusterEndpoints,
    previous: int,
    wanted: int,
) -> None:
    """After more brokers: once they have joined, give them their share of partitions."""
    joining = list(range(previous, wanted))
    await report.progress("ScalingUp", f"spreading partitions onto new brokers {joining}")
    try:
        await spread(endpoints, wanted, ctx.intervals.reassignment_timeout_s)
    except (ReassignmentTimeoutError, KafkaAdminError) as exc:
        await report.progress("ScalingUp", str(exc))
        raise kopf.TemporaryError(str(exc), delay=ctx.intervals.retry_s) from exc


async def _cluster_reconcile(
    ctx: OperatorContext,
    name: str,
    namespace: str,
    uid: str,
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
) -> None:
    kube = ctx.client()
    generation = _generation(meta)
    report = _ClusterReport(kube, namespace, name, generation, _conditions(status))
    try:
        cluster = ClusterSpec.from_spec(spec)
    except ValueError as exc:
        await report.degraded("InvalidSpec", str(exc))
        raise kopf.PermanentError(str(exc)) from exc
    endpoints = ctx.resolver(namespace, name, cluster.brokers)
    # The broker count of the last finished reconcile (none yet: a new Cluster).
    desired = (status.get("brokers") or {}).get("desired")
    previous = desired if isinstance(desired, int) else cluster.brokers
    if cluster.brokers < previous:
        await _drain_first(ctx, report, endpoints, previous, cluster.brokers)
    await report.progress("Applying", "applying the cluster's StatefulSets, Services and policies")
    await apply_children(kube, name, namespace, uid, cluster, ctx.default_image)
    if cluster.brokers > previous:
        await _spread_after(ctx, report, endpoints, previous, cluster.brokers)
    try:
        await roll_brokers(ctx, kube, namespace, name, cluster, endpoints, report.progress)
    except (RollBlocked, RollStalled, PodNotBack) as exc:
        # Retried: the broker in the way may recover (or be fixed) meanwhile.
        await report.degraded(type(exc).__name__, str(exc))
        raise kopf.TemporaryError(str(exc), delay=ctx.intervals.retry_s) from exc
    health = await observe(kube, namespace, name, cluster, endpoints)
    image = cluster.image or ctx.default_image
    mtls = cluster.gateway_client_ca_secret is not None
    fresh = cluster_status(
        health, generation, report.found, endpoints, image, settling=True, mtls=mtls
    )
    await _write_status(kube, "Cluster", namespace, name, fresh)


async def _cluster_observe(
    ctx: OperatorContext,
    name: str,
    namespace: str,
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
) -> None:
    # Read once, before any wait: these are kopf's live views of the object.
    found = _conditions(status)
    generation = _generation(meta)
    if status.get("observedGeneration") != generation:
        return  # a change not reconciled yet: its handler will report
    try:
        cluster = ClusterSpec.from_spec(spec)
    except ValueError:
        return  # reported as Degraded by the reconcile
    kube = ctx.client()
    endpoints = ctx.resolver(namespace, name, cluster.brokers)
    health = await observe(kube, namespace, name, cluster, endpoints)
    mtls = cluster.gateway_client_ca_secret is not None
    fresh = cluster_status(health, generation, found, endpoints, None, settling=False, mtls=mtls)
    await _write_status(kube, "Cluster", namespace, name, fresh)


async def _cluster_delete(
    ctx: OperatorContext, name: str, namespace: str, uid: str, spec: Mapping[str, Any]
) -> None:
    try:
        cluster = ClusterSpec.from_spec(spec)
    except ValueError:
        return  # never applied, nothing of ours to remove
    await delete_unowned_children(ctx.client(), name, namespace, uid, cluster, ctx.default_image)


# --- Topic -----------------------------------------------------------------------------------


async def _topic_reconcile(
    ctx: OperatorContext,
    name: str,
    namespace: str,
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
) -> None:
    kube = ctx.client()
    report = _StatusReport(ctx, "Topic", namespace, name, _conditions(status), _generation(meta))
    fail = report.fail

    try:
        topic = TopicSpec.from_resource(name, spec)
        _, endpoints = await _resolve_cluster(ctx, kube, namespace, topic.cluster)
        async with (
            ClusterAdmin(endpoints.brokers_bootstrap) as admin,
            TenancyStore(endpoints.etcd_url) as tenancy,
        ):
            result = await reconcile_topic(admin, tenancy, topic)
    except ClusterMissing as exc:
        await fail("ClusterNotFound", str(exc), retry=True)
    except TopicError as exc:
        await fail("TopicError", str(exc), retry=exc.retryable)
    except (KafkaAdminError, TenancyStoreError) as exc:
        await fail("ClusterUnreachable", str(exc), retry=True)
    except ValueError as exc:
        await fail("InvalidSpec", str(exc), retry=False)
    else:
        message = (
            f"{result.get('underReplicated')} partition(s) under-replicated"
            if result.get("underReplicated")
            else f"topic {result.get('topicName')} exists on cluster {topic.cluster}"
        )
        await report.ready(message, result)


async def _topic_delete(
    ctx: OperatorContext, name: str, namespace: str, spec: Mapping[str, Any]
) -> None:
    kube = ctx.client()
    try:
        topic = TopicSpec.from_resource(name, spec)
        _, endpoints = await _resolve_cluster(ctx, kube, namespace, topic.cluster)
    except (ValueError, ClusterMissing) as exc:
        log.info("event=topic_release namespace=%s topic=%s reason=%r", namespace, name, str(exc))
        return  # never made, or its cluster is gone with it
    try:
        async with ClusterAdmin(endpoints.brokers_bootstrap) as admin:
            await remove_topic(admin, topic)
    except (TopicError, KafkaAdminError) as exc:
        raise kopf.TemporaryError(str(exc), delay=ctx.intervals.retry_s) from exc


# --- Tenant ----------------------------------------------------------------------------------


async def _known_keys(
    kube: KubeClient, namespace: str, tenant: str, owner_uid: str
) -> dict[str, KeySecret]:
    """What the tenant's existing key Secrets (the ones this Tenant owns) hold."""
    known = {}
    for secret in await kube.list("v1", "Secret", namespace, f"{TENANT_LABEL}={tenant}"):
        owners = secret["metadata"].get("ownerReferences") or []
        if not any(ref.get("uid") == owner_uid for ref in owners):
            continue
        held = read_key_secret(secret)
        if held is not None:
            known[held.key_name] = held
    return known


def _owned_by_tenant(manifest: Mapping[str, Any], name: str, uid: str) -> dict[str, Any]:
    owned = dict(manifest)
    owned["metadata"] = {
        **manifest["metadata"],
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": "Tenant",
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    return owned


async def _tenant_reconcile(
    ctx: OperatorContext,
    name: str,
    namespace: str,
    uid: str,
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
) -> None:
    kube = ctx.client()
    report = _StatusReport(ctx, "Tenant", namespace, name, _conditions(status), _generation(meta))
    fail = report.fail

    try:
        tenant = TenantSpec.from_resource(name, spec, namespace)
        cluster, endpoints = await _resolve_cluster(ctx, kube, namespace, tenant.cluster)
        known = await _known_keys(kube, namespace, tenant.tenant, uid)
        async with TenancyStore(endpoints.etcd_url) as store:
            outcome = await reconcile_tenant(
                store, tenant, known, endpoints, tls=cluster.gateway_tls_secret is not None
            )
    except ClusterMissing as exc:
        await fail("ClusterNotFound", str(exc), retry=True)
    except TenancyStoreError as exc:
        await fail("ClusterUnreachable", str(exc), retry=True)
    except CertificateSubjectTakenError as exc:
        await fail("CertificateSubjectTaken", str(exc), retry=False)
    except ConcurrentChangeError as exc:
        await fail("ConcurrentChange", str(exc), retry=True)
    except ValueError as exc:
        await fail("InvalidSpec", str(exc), retry=False)
    else:
        for secret in outcome.secrets:
            await kube.apply(_owned_by_tenant(secret, name, uid))
        for obsolete in outcome.obsolete_secrets:
            await kube.delete("v1", "Secret", namespace, obsolete)
        message = f"tenant {tenant.tenant} has {len(outcome.secrets)} key(s)"
        await report.ready(message, outcome.status)


async def _tenant_delete(
    ctx: OperatorContext, name: str, namespace: str, uid: str, spec: Mapping[str, Any]
) -> None:
    kube = ctx.client()
    try:
        tenant = TenantSpec.from_resource(name, spec, namespace)
        _, endpoints = await _resolve_cluster(ctx, kube, namespace, tenant.cluster)
    except (ValueError, ClusterMissing) as exc:
        log.info("event=tenant_release namespace=%s tenant=%s reason=%r", namespace, name, str(exc))
        return
    # The tenant's Topic resources go first: their drift timers would recreate
    # the topics remove_tenant deletes. Their own finalizers delete them on the
    # brokers too; remove_tenant catches any left.
    for topic in await kube.list(API_VERSION, "Topic", namespace):
        topic_spec = topic.get("spec") or {}
        if topic_spec.get("tenant") == tenant.tenant and topic_spec.get("cluster") == (
            tenant.cluster
        ):
            await kube.delete(API_VERSION, "Topic", namespace, topic["metadata"]["name"])
    try:
        async with (
            ClusterAdmin(endpoints.brokers_bootstrap) as admin,
            TenancyStore(endpoints.etcd_url) as store,
        ):
            await remove_tenant(store, admin, tenant)
    except (KafkaAdminError, TenancyStoreError) as exc:
        raise kopf.TemporaryError(str(exc), delay=ctx.intervals.retry_s) from exc
    # Owner references would let Kubernetes collect them; deleting now means no
    # revoked credentials linger in the namespace meanwhile.
    for secret in await kube.list("v1", "Secret", namespace, f"{TENANT_LABEL}={tenant.tenant}"):
        if any(r.get("uid") == uid for r in secret["metadata"].get("ownerReferences") or []):
            await kube.delete("v1", "Secret", namespace, secret["metadata"]["name"])


# --- Registration ----------------------------------------------------------------------------


@asynccontextmanager
async def _alone(
    memo: kopf.Memo, kind: str, namespace: str | None, name: str
) -> AsyncIterator[tuple[OperatorContext, str]]:
    """The context and namespace, holding the object's lock (see ``OperatorContext.lock``)."""
    ctx = context_of(memo)
    namespaced = _namespaced(namespace)
    async with ctx.lock(kind, namespaced, name):
        try:
            yield ctx, namespaced
        except KubeError as exc:
            if not exc.transient:
                raise
            # The API server restarting, a conflict: soon, not after kopf's
            # default minute for unexpected errors.
            raise kopf.TemporaryError(str(exc), delay=ctx.intervals.retry_s) from exc


def build_registry(intervals: Intervals) -> kopf.OperatorRegistry:
    """Every handler of the operator on a new registry.

    kopf fixes timer intervals at registration: pass the ``Intervals`` of the
    context the memo will hold. A timer first fires one interval after the
    resource appears, once its create handler has had its turn.
    """
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
        ctx = context_of(memo)
        info = (
            ctx.connection
            or kopf.login_with_service_account(**kwargs)
            or kopf.login_with_kubeconfig(**kwargs)
        )
        if info is not None:
            if ctx.kube is not None:
                await ctx.kube.close()
            ctx.kube = KubeClient(info)
        return info

    @kopf.on.cleanup(registry=registry)
    async def close_client(memo: kopf.Memo, **_: Any) -> None:
        ctx = context_of(memo)
        if ctx.kube is not None:
            await ctx.kube.close()
            ctx.kube = None

    @kopf.on.create(GROUP, VERSION, "clusters", registry=registry)
    @kopf.on.update(GROUP, VERSION, "clusters", field="spec", registry=registry)
    @kopf.on.resume(GROUP, VERSION, "clusters", registry=registry)
    async def cluster_changed(
        name: str,
        namespace: str | None,
        uid: str,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        async with _alone(memo, "Cluster", namespace, name) as (ctx, ns):
            await _counted(
                ctx, "Cluster", _cluster_reconcile(ctx, name, ns, uid, meta, spec, status)
            )

    @kopf.timer(
        GROUP,
        VERSION,
        "clusters",
        interval=intervals.cluster_status_s,
        initial_delay=intervals.cluster_status_s,
        registry=registry,
    )
    async def cluster_health(
        name: str,
        namespace: str | None,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        ctx = context_of(memo)
        namespace = _namespaced(namespace)
        lock = ctx.lock("Cluster", namespace, name)
        if lock.locked():
            return  # a reconcile is running: it owns the status until it finishes
        async with lock:
            await _cluster_observe(ctx, name, namespace, meta, spec, status)

    @kopf.on.delete(GROUP, VERSION, "clusters", registry=registry)
    async def cluster_deleted(
        name: str, namespace: str | None, uid: str, spec: kopf.Spec, memo: kopf.Memo, **_: Any
    ) -> None:
        async with _alone(memo, "Cluster", namespace, name) as (ctx, ns):
            await _cluster_delete(ctx, name, ns, uid, spec)

    @kopf.on.create(GROUP, VERSION, "topics", registry=registry)
    @kopf.on.update(GROUP, VERSION, "topics", field="spec", registry=registry)
    @kopf.on.resume(GROUP, VERSION, "topics", registry=registry)
    @kopf.timer(
        GROUP,
        VERSION,
        "topics",
        interval=intervals.topic_drift_s,
        initial_delay=intervals.topic_drift_s,
        registry=registry,
    )
    async def topic_changed(
        name: str,
        namespace: str | None,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        async with _alone(memo, "Topic", namespace, name) as (ctx, ns):
            await _counted(ctx, "Topic", _topic_reconcile(ctx, name, ns, meta, spec, status))

    @kopf.on.delete(GROUP, VERSION, "topics", registry=registry)
    async def topic_deleted(
        name: str, namespace: str | None, spec: kopf.Spec, memo: kopf.Memo, **_: Any
    ) -> None:
        async with _alone(memo, "Topic", namespace, name) as (ctx, ns):
            await _topic_delete(ctx, name, ns, spec)

    @kopf.on.create(GROUP, VERSION, "tenants", registry=registry)
    @kopf.on.update(GROUP, VERSION, "tenants", field="spec", registry=registry)
    @kopf.on.resume(GROUP, VERSION, "tenants", registry=registry)
    @kopf.timer(
        GROUP,
        VERSION,
        "tenants",
        interval=intervals.tenant_drift_s,
        initial_delay=intervals.tenant_drift_s,
        registry=registry,
    )
    async def tenant_changed(
        name: str,
        namespace: str | None,
        uid: str,
        meta: kopf.Meta,
        spec: kopf.Spec,
        status: kopf.Status,
        memo: kopf.Memo,
        **_: Any,
    ) -> None:
        async with _alone(memo, "Tenant", namespace, name) as (ctx, ns):
            await _counted(ctx, "Tenant", _tenant_reconcile(ctx, name, ns, uid, meta, spec, status))

    @kopf.on.delete(GROUP, VERSION, "tenants", registry=registry)
    async def tenant_deleted(
        name: str, namespace: str | None, uid: str, spec: kopf.Spec, memo: kopf.Memo, **_: Any
    ) -> None:
        async with _alone(memo, "Tenant", namespace, name) as (ctx, ns):
            await _tenant_delete(ctx, name, ns, uid, spec)

    return registry


@dataclass(frozen=True, slots=True)
class Peering:
    """Several operator replicas, one active: kopf's peering.

    Every replica writes itself (identity, priority, lifetime) into the
    peering object ``name`` (a ``ClusterKopfPeering`` when the operator
    watches every namespace, a ``KopfPeering`` in each watched namespace
    otherwise) and keeps it fresh. The replica with the highest priority
    handles events; the others watch and wait. When it stops writing (killed,
    its node gone), its record expires after ``lifetime_s`` and the next one
    takes over, resuming each object from the progress kept in its
    annotations. Priorities must differ: kopf pauses every replica while two
    share the highest one.
    """

    name: str
    priority: int
    lifetime_s: int = 60


def operator_settings(namespaced: bool, peering: Peering | None = None) -> kopf.OperatorSettings:
    """kopf's settings for Shoal: progress in annotations; one replica, or peering.

    kopf's default also keeps progress in ``status.kopf``, which our CRDs'
    structural schemas would prune; annotations are kept as written. Without
    ``peering`` the operator is standalone (one replica serves, and the
    Deployment has one); with it, see :class:`Peering`.
    ``namespaced``: the operator serves a given list of namespaces; it then has
    Roles there and no right to list namespaces, so kopf takes the list as it
    is instead of scanning the cluster for it.
    """
    settings = kopf.OperatorSettings()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    if peering is None:
        settings.peering.standalone = True
    else:
        settings.peering.standalone = False
        # Without its peering object a replica must not serve: it would not
        # know of the others.
        settings.peering.mandatory = True
        settings.peering.name = peering.name
        settings.peering.priority = peering.priority
        settings.peering.lifetime = peering.lifetime_s
    # A Cluster deleted while its health timer runs keeps kopf's finalizer
    # until kopf sees the timer finished; kopf looks every minute by default,
    # so `kubectl delete cluster` took a minute longer (make test-kube).
    settings.background.cancellation_polling = TIMER_EXIT_POLL_S
    settings.posting.level = logging.WARNING
    settings.scanning.disabled = namespaced
    return settings
