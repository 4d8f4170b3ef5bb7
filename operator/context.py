"""What every handler needs, kept in kopf's memo: settings, and the Kubernetes client.

``shoal operator`` builds one :class:`OperatorContext` from its flags; tests
build their own, pointing the :data:`~shoal.operator.endpoints.EndpointResolver`
at local processes and giving a fixed :class:`kopf.ConnectionInfo` for the
fake API server. The login handler fills in :attr:`OperatorContext.kube`.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Final

import kopf
from prometheus_client import CollectorRegistry, Counter
from shoal.operator.endpoints import EndpointResolver, in_cluster_endpoints
from shoal.operator.kube import KubeClient

MEMO_KEY: Final = "shoal"
ENV_PREFIX: Final = "SHOAL_OPERATOR_"


@dataclass(frozen=True)
class Intervals:
    """How often the timers look again, and how long the roller and pods may take."""

    cluster_status_s: float = 30
    """The Cluster timer: brokers and partitions health into its status."""
    topic_drift_s: float = 60
    """The Topic timer: recreate a topic someone deleted on the brokers, undo config drift."""
    tenant_drift_s: float = 60
    retry_s: float = 15
    """Delay before kopf retries a handler that could not finish (cluster unreachable, ...)."""
    roll_safe_timeout_s: float = 300
    roll_rejoin_timeout_s: float = 600
    roll_poll_s: float = 2
    pod_ready_timeout_s: float = 600
    """How long a restarted broker pod may take to come back Ready."""
    pod_poll_s: float = 1
    reassignment_timeout_s: float = 600
    """How long a scale-up or scale-down waits for partitions to move (then retries)."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Intervals:
        """The defaults, each replaced by ``SHOAL_OPERATOR_<FIELD>`` when set.

        E.g. ``SHOAL_OPERATOR_CLUSTER_STATUS_S=2``: tests and development
        clusters want answers in seconds, not in the minutes that suit
        production.
        """
        given = {}
        for item in fields(cls):
            value = environ.get(f"{ENV_PREFIX}{item.name.upper()}")
            if value is not None:
                try:
                    given[item.name] = float(value)
                except ValueError:
                    raise ValueError(
                        f"{ENV_PREFIX}{item.name.upper()} must be a number of seconds: {value!r}"
                    ) from None
        return cls(**given)


class OperatorMetrics:
    """The operator's Prometheus series, in a registry of its own (``--metrics-listen``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "shoal_operator_reconciles",
            "Handler runs by resource kind and result (ok, retry, failed).",
            ["kind", "result"],
            registry=self.registry,
        )
        self.broker_restarts = Counter(
            "shoal_operator_broker_restarts",
            "Broker pods the roller restarted.",
            registry=self.registry,
        )


@dataclass
class OperatorContext:
    default_image: str
    """The image a Cluster's pods run unless its spec names one (the operator's own)."""
    resolver: EndpointResolver = in_cluster_endpoints
    connection: kopf.ConnectionInfo | None = None
    """Fixed credentials (tests); None logs in with the pod's service account or kubeconfig."""
    intervals: Intervals = field(default_factory=Intervals)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    kube: KubeClient | None = None
    _locks: weakref.WeakValueDictionary[tuple[str, str, str], asyncio.Lock] = field(
        default_factory=weakref.WeakValueDictionary
    )

    def lock(self, kind: str, namespace: str, name: str) -> asyncio.Lock:
        """One handler or timer at a time per object.

        kopf runs an object's timer beside its change and delete handlers, and
        hands both the same live body, replaced in place as events arrive. A
        timer that started on the old spec could otherwise finish after a
        change handler and write its stale view over the status, or repair
        "drift" back to the old spec, or recreate a topic being deleted. A
        lock nobody holds or waits for is dropped with its last reference.
        """
        key = (kind, namespace, name)
        found = self._locks.get(key)
        if found is None:
            found = self._locks[key] = asyncio.Lock()
        return found

    def client(self) -> KubeClient:
        if self.kube is None:
            raise kopf.TemporaryError("not logged in to the Kubernetes API yet", delay=5)
        return self.kube


def context_of(memo: kopf.Memo) -> OperatorContext:
    ctx = memo[MEMO_KEY]
    assert isinstance(ctx, OperatorContext)
    return ctx
