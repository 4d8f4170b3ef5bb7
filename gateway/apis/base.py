"""What an API rewriter is given and what it decides.

A rewriter is ``async def rewrite(ctx, request) -> Forward | Answer``. It reads
kio's request entity for the client's version, checks each resource against
``ctx.access``, maps names into the tenant's namespace, and either forwards a
rewritten request (with ``finish`` to map the broker's response back and put
the refused slots in) or answers on its own. It never touches a socket: the
few things it must look up (a topic id's name, the tenant's partition count)
come through ``ctx.lookups``, so rewriters are unit-tested with a stub.

A request that cannot be served at all (another broker's internal API, say)
raises :class:`RefusedRequestError`, and the session closes the connection, as
Kafka closes it for requests it will not serve.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final, Protocol

from shoal.gateway.access import TenantAccess
from shoal.gateway.fetch_session import ClientFetchSession
from shoal.gateway.mutation_quota import UNLIMITED, MutationVerdict
from shoal.gateway.namespace import Namespace
from shoal.tenancy.model import AclBinding, ApiKey, Quotas

from shoal.wire import ApiSchema, ErrorCode

E = ErrorCode
NO_THROTTLE: Final = timedelta(0)
ZERO_UUID: Final = uuid.UUID(int=0)
"""Kafka's "no topic id"."""
NOT_REQUESTED: Final = -(2**31)
"""Kafka's "authorized operations were not asked for" value."""


class RefusedRequestError(Exception):
    """The request is not one a tenant may send; the connection is closed."""


class Lookups(Protocol):
    """What rewriters ask of the gateway beyond the request itself."""

    async def topic_name(self, topic_id: uuid.UUID) -> str | None:
        """The brokers' name of a topic id, asking the brokers once if it is new."""
        ...

    async def topic_partitions(self) -> Mapping[str, int]:
        """Partition counts of every topic on the brokers (brokers' names), fresh."""
        ...

    async def created_partitions(self, request: Any, version: int) -> Mapping[str, int]:
        """How many partitions a CreateTopics request would create per topic
        (brokers' names), asked of the brokers with validate_only."""
        ...

    def remember_topic_ids(self, ids: Mapping[uuid.UUID, str]) -> None: ...

    def gateway_address(self, node_id: int) -> tuple[str, int] | None:
        """Where a client reaches broker ``node_id`` through this gateway listener."""
        ...


class ClientQuotaStore(Protocol):
    """The platform admin's view of every tenant's quotas (DescribeClientQuotas)."""

    async def all_quotas(self) -> Mapping[str, Quotas]: ...

    async def set_quotas(self, tenant: str, quotas: Quotas) -> None: ...


class AclStore(Protocol):
    """Every tenant's ACL bindings, as the ACL APIs read and change them.

    Reads are fresh (not the gateway's last poll), so a DeleteAcls sees a
    binding made through another gateway a moment ago; a change applies on
    this gateway before the call returns. Failures raise
    :class:`~shoal.tenancy.store.TenancyStoreError`.
    """

    async def bindings(self, tenant: str) -> Sequence[AclBinding]: ...

    async def add(self, tenant: str, bindings: Sequence[AclBinding]) -> None: ...

    async def remove(self, tenant: str, bindings: Sequence[AclBinding]) -> None: ...


def _no_mutation_quota(costs: Sequence[int], strict: bool) -> MutationVerdict:
    del costs, strict
    return UNLIMITED


def _no_storage_limit() -> str | None:
    return None


MutationCharger = Callable[[Sequence[int], bool], MutationVerdict]
"""Charges a request's topics (partitions each, in order) to the tenant's controller
mutation quota, strictly or permissively (:mod:`shoal.gateway.mutation_quota`)."""


@dataclass(frozen=True, slots=True)
class RequestContext:
    access: TenantAccess
    api: ApiSchema
    lookups: Lookups
    quota_store: ClientQuotaStore
    fetch_cap: int | None = None
    """Largest fetch response the tenant's consume quota allows, or None."""
    acl_store: AclStore = field(kw_only=True)
    tenant_keys: Callable[[str], Sequence[ApiKey]] = field(default=lambda _tenant: (), kw_only=True)
    """A tenant's API keys as the gateway last read them (the SCRAM credential APIs)."""
    charge_mutations: MutationCharger = field(default=_no_mutation_quota, kw_only=True)
    """The tenant's ``controller_mutation_rate`` budget (CreateTopics, CreatePartitions,
    DeleteTopics); the default is unlimited."""
    storage_refusal: Callable[[], str | None] = field(default=_no_storage_limit, kw_only=True)
    """Why the tenant may not produce now (its ``max_storage_bytes`` is reached,
    :mod:`shoal.gateway.storage_limit`), or None; the default is unlimited."""
    fetch_session: ClientFetchSession | None = field(default=None, kw_only=True)
    """The client connection's fetch session (KIP-227); None where there is no
    connection to keep one on (the HTTP door), which fetches in full."""

    @property
    def version(self) -> int:
        return self.api.version

    @property
    def ns(self) -> Namespace:
        return self.access.namespace


def _identity(response: Any) -> Any:
    return response


@dataclass(frozen=True, slots=True)
class Forward:
    """Send ``request`` to the broker; map its response with ``finish``."""

    request: Any
    finish: Callable[[Any], Any] = field(default=_identity)
    expects_response: bool = True
    throttle_ms: int = 0
    """The gateway's own throttle for this request (a controller mutation quota): the
    answer carries at least this ``throttle_time_ms`` and the connection is muted."""


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the client without the broker."""

    response: Any
    throttle_ms: int = 0
    """As :attr:`Forward.throttle_ms`."""


Step = Forward | Answer
Rewriter = Callable[[RequestContext, Any], Awaitable[Step]]


def replace(entity: Any, **changes: Any) -> Any:
    return dataclasses.replace(entity, **changes)


def has_field(entity: Any, name: str) -> bool:
    names = _FIELD_NAMES.get(type(entity))
    if names is None:
        names = _FIELD_NAMES[type(entity)] = frozenset(f.name for f in dataclasses.fields(entity))
    return name in names


_FIELD_NAMES: dict[type[Any], frozenset[str]] = {}
"""Each message class's field names: asked for every topic of every answer relayed."""


def topic_field(entity: Any) -> str:
    """Kafka names the topic field ``name`` in most APIs and ``topic`` in some."""
    return "topic" if has_field(entity, "topic") else "name"


def rename_topics(entities: Any, ns: Namespace) -> tuple[Any, ...]:
    """Map the topic names of a response's entries outward.

    Requests only ever name the tenant's topics, so every entry should be the
    tenant's; one that is not is dropped rather than shown.
    """
    out = []
    for entity in entities:
        key = topic_field(entity)
        broker_name = getattr(entity, key)
        name = ns.outward(broker_name)
        if name is None:
            continue
        out.append(scrubbed(replace(entity, **{key: name}), broker_name, name))
    return tuple(out)


def scrubbed(entity: Any, broker_name: str, name: str) -> Any:
    """The entity with the brokers' name replaced by the tenant's in its error messages.

    "Topic 'acme.orders' already exists": the tenant knows it as 'orders'.
    Produce keeps messages on its partitions, so one level of nesting is searched.
    """
    changes: dict[str, Any] = {}
    message = getattr(entity, "error_message", None)
    if message and broker_name in message:
        changes["error_message"] = message.replace(broker_name, name)
    for nested in ("partition_responses", "partitions"):
        children = getattr(entity, nested, None)
        if children and has_field(children[0], "error_message"):
            kept = tuple(scrubbed(c, broker_name, name) for c in children)
            if any(new is not old for new, old in zip(kept, children, strict=True)):
                changes[nested] = kept
    return replace(entity, **changes) if changes else entity
