"""A Topic resource made real on its cluster, through the Kafka admin protocol.

:func:`reconcile_topic` is idempotent and converges one step per call: it
creates the topic if the brokers lack it (so it also repairs drift, when
someone deleted the topic behind the operator's back), grows its partitions,
and makes its dynamic configs equal the spec's. "Equal" includes removal: a
config set on the topic that the spec no longer names is reset to the
cluster's default. Every topic config the brokers report as set on the topic
(DYNAMIC_TOPIC_CONFIG) is the spec's to own, since the Topic resource is the
topic's source of truth.

What the user must fix arrives as :class:`TopicError`: a tenant that does not
exist (yet: retryable, the Tenant may be on its way), the tenant's partition
limit, a shrink, a replication factor that differs from the topic's. The
partition limit counts every topic of the tenant, as the gateway does when a
tenant creates topics itself.

Names: the spec's ``topicName`` is what the tenant's clients see; on the
brokers it lives as ``<tenant>.<topicName>``
(:class:`shoal.gateway.namespace.Namespace`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from shoal.gateway.namespace import Namespace
from shoal.operator.cluster_state import TopicState
from shoal.operator.kafka_admin import ClusterAdmin, KafkaAdminError
from shoal.tenancy.model import validate_tenant_name
from shoal.tenancy.store import TenancyStore, TenancyStoreError

DEFAULT_REPLICAS: Final = 3
"""The CRD's default for spec.replicas."""
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,200}$")
_SETTLE_TRIES: Final = 50
_SETTLE_INTERVAL_S: Final = 0.1


class TopicError(Exception):
    """Why the topic cannot be made as the spec says; the message is for the user.

    ``retryable``: whether trying again later may succeed with the same spec
    (the tenant may yet appear, the brokers may yet answer).
    """

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class TopicSpec:
    cluster: str
    tenant: str
    topic_name: str
    """The tenant's name for the topic."""
    partitions: int
    replicas: int
    config: Mapping[str, str]

    @property
    def broker_name(self) -> str:
        return Namespace(self.tenant).inward(self.topic_name)

    @classmethod
    def from_resource(cls, name: str, spec: Mapping[str, Any]) -> TopicSpec:
        """Read a Topic's spec, re-applying the CRD's defaults and checks (a fake API
        server applies neither); raises ValueError saying what is wrong."""
        cluster = spec.get("cluster")
        if not isinstance(cluster, str) or not cluster:
            raise ValueError("spec.cluster: name the Cluster the topic lives on")
        tenant = validate_tenant_name(str(spec.get("tenant", "")))
        topic_name = spec.get("topicName") or name
        if not isinstance(topic_name, str) or not _TOPIC_NAME.match(topic_name):
            raise ValueError(
                f"topic name {topic_name!r}: use 1-200 letters, digits, dots, dashes, underscores"
            )
        config = spec.get("config") or {}
        if not isinstance(config, Mapping) or not all(isinstance(v, str) for v in config.values()):
            raise ValueError("spec.config: a map of config names to string values")
        return cls(
            cluster=cluster,
            tenant=tenant,
            topic_name=topic_name,
            partitions=_bounded(spec, "partitions", None, 1, 10_000),
            replicas=_bounded(spec, "replicas", DEFAULT_REPLICAS, 1, 16),
            config=MappingProxyType(dict(config)),
        )


def _bounded(spec: Mapping[str, Any], field: str, default: int | None, low: int, high: int) -> int:
    value = spec.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"spec.{field}: a whole number from {low} to {high}, not {value!r}")
    return value


def config_changes(
    wanted: Mapping[str, str], overrides: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """(configs to set, configs to reset) to make the topic's overrides equal ``wanted``."""
    to_set = {k: v for k, v in wanted.items() if overrides.get(k) != v}
    to_reset = sorted(k for k in overrides if k not in wanted)
    return to_set, to_reset


async def reconcile_topic(
    admin: ClusterAdmin, tenancy: TenancyStore, spec: TopicSpec
) -> dict[str, Any]:
    """Make the topic on the brokers match ``spec``; returns the Topic's status fields."""
    try:
        tenant = await tenancy.get_tenant(spec.tenant)
    except TenancyStoreError as exc:
        raise TopicError(str(exc), retryable=True) from exc
    if tenant is None:
        raise TopicError(
            f"tenant {spec.tenant} does not exist on cluster {spec.cluster}", retryable=True
        )
    limit = tenant.quotas.max_partitions
    try:
        state = await admin.describe_topic(spec.broker_name)
        if state is None:
            await _check_limit(admin, spec, limit, spec.partitions)
            await admin.create_topic(spec.broker_name, spec.partitions, spec.replicas, spec.config)
            state = await _settled(admin, spec.broker_name, spec.partitions)
        else:
            state = await _update(admin, spec, state, limit)
    except KafkaAdminError as exc:
        raise TopicError(f"topic {spec.topic_name}: {exc}", retryable=exc.retriable) from exc
    if state.replicas != spec.replicas:
        raise TopicError(
            f"topic {spec.topic_name} has {state.replicas} replicas per partition on the"
            f" brokers but spec.replicas is {spec.replicas}; the replication factor of an"
            " existing topic cannot be changed",
            retryable=False,
        )
    return {
        "topicName": spec.topic_name,
        "topicId": state.topic_id,
        "partitions": len(state.partitions),
        "replicas": state.replicas,
        "underReplicated": state.under_replicated,
    }


async def _update(
    admin: ClusterAdmin, spec: TopicSpec, state: TopicState, limit: int | None
) -> TopicState:
    actual = len(state.partitions)
    if spec.partitions < actual:
        raise TopicError(
            f"topic {spec.topic_name} has {actual} partitions; spec.partitions"
            f" {spec.partitions} would shrink it, and partitions can only be added",
            retryable=False,
        )
    to_set, to_reset = config_changes(spec.config, await admin.topic_overrides(spec.broker_name))
    await admin.alter_topic_config(spec.broker_name, to_set, to_reset)
    if spec.partitions > actual:
        await _check_limit(admin, spec, limit, spec.partitions - actual)
        await admin.create_partitions(spec.broker_name, spec.partitions)
        return await _settled(admin, spec.broker_name, spec.partitions)
    return state


async def _check_limit(
    admin: ClusterAdmin, spec: TopicSpec, limit: int | None, adding: int
) -> None:
    if limit is None:
        return
    namespace = Namespace(spec.tenant)
    held = sum(1 for p in await admin.partitions() if namespace.owns(p.topic))
    if held + adding > limit:
        raise TopicError(
            f"tenant {spec.tenant} may hold at most {limit} partitions (its maxPartitions);"
            f" it holds {held} and topic {spec.topic_name} would add {adding}",
            retryable=False,
        )


async def _settled(admin: ClusterAdmin, topic: str, partitions: int) -> TopicState:
    """The topic once the broker we ask shows all its partitions: the controller
    answers before every broker's metadata has caught up."""
    for _ in range(_SETTLE_TRIES):
        state = await admin.describe_topic(topic)
        if state is not None and len(state.partitions) >= partitions:
            return state
        await asyncio.sleep(_SETTLE_INTERVAL_S)
    raise TopicError(
        f"topic {topic} was changed but the brokers do not show it yet", retryable=True
    )


async def remove_topic(admin: ClusterAdmin, spec: TopicSpec) -> None:
    """Delete the topic on the brokers; a topic already gone is no error."""
    try:
        await admin.delete_topics([spec.broker_name])
    except KafkaAdminError as exc:
        raise TopicError(f"topic {spec.topic_name}: {exc}", retryable=exc.retriable) from exc
