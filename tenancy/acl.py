"""Kafka's ACL decision, applied to one tenant's bindings: pure, no I/O.

The gateway asks one question per resource a request touches: may this key do
this operation on this resource of its tenant? The answer follows Kafka's
``AclAuthorizer`` (and KRaft's ``StandardAuthorizer``) so that a Kafka operator
reading a tenant's bindings predicts every decision:

* A binding counts only if it belongs to the asking tenant. Bindings name
  resources as the tenant sees them (``orders``, not ``acme.orders``), so a
  binding of another tenant that happens to use the same name must not apply.
* A binding's principal is a key id, or ``*`` for every key of the tenant.
* A LITERAL pattern matches its exact name, and ``*`` matches every name; a
  PREFIXED pattern matches every name that starts with it. CLUSTER is a single
  resource that Kafka names ``kafka-cluster``, so a literal ``kafka-cluster``
  matches it whatever name the caller uses for it.
* A binding for ALL matches every operation. An ALLOW for READ, WRITE, DELETE
  or ALTER also allows DESCRIBE, and one for ALTER_CONFIGS also allows
  DESCRIBE_CONFIGS: a client that may use a resource must be able to see it.
  DENY bindings imply nothing: denying READ leaves DESCRIBE alone, as in Kafka.
* Deny wins: one matching DENY refuses, whatever ALLOWs match. Nothing
  matching refuses too (Kafka with ``allow.everyone.if.no.acl.found=false``;
  a tenant starts from :func:`default_bindings`, not from an open door).

Kafka's super users have no counterpart: no tenant's key is above its bindings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

from shoal.tenancy.model import (
    WILDCARD,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

CLUSTER_NAME: Final = "kafka-cluster"
"""Kafka's name for the one CLUSTER resource (``Resource.CLUSTER_NAME``)."""

_IMPLIED_BY: Final[Mapping[Operation, frozenset[Operation]]] = MappingProxyType(
    {
        Operation.DESCRIBE: frozenset(
            {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
        ),
        Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
    }
)

# Computed once: the hot path asks for every resource of every request.
_ALLOWED_BY: Final[Mapping[Operation, frozenset[Operation]]] = MappingProxyType(
    {op: frozenset({op, Operation.ALL}) | _IMPLIED_BY.get(op, frozenset()) for op in Operation}
)
_DENIED_BY: Final[Mapping[Operation, frozenset[Operation]]] = MappingProxyType(
    {op: frozenset({op, Operation.ALL}) for op in Operation}
)


def allows(binding_operation: Operation, operation: Operation) -> bool:
    """Whether an ALLOW binding for ``binding_operation`` allows ``operation``."""
    return binding_operation in _ALLOWED_BY[operation]


def authorize(
    bindings: Iterable[AclBinding],
    tenant: str,
    principal: str,
    resource_type: ResourceType,
    resource_name: str,
    operation: Operation,
) -> bool:
    """Whether ``principal`` of ``tenant`` may do ``operation`` on the named resource.

    ``bindings`` is read once, so a generator will do; it may hold every
    tenant's bindings, since those of other tenants are skipped.
    """
    allowing = _ALLOWED_BY[operation]
    denying = _DENIED_BY[operation]
    allowed = False
    for binding in bindings:
        if not _applies(binding, tenant, principal, resource_type, resource_name):
            continue
        if binding.permission == Permission.DENY:
            if binding.operation in denying:
                return False
        elif binding.operation in allowing:
            allowed = True
    return allowed


def _applies(
    binding: AclBinding,
    tenant: str,
    principal: str,
    resource_type: ResourceType,
    resource_name: str,
) -> bool:
    return (
        binding.tenant == tenant
        and binding.principal in (principal, WILDCARD)
        and binding.resource_type == resource_type
        and _matches_name(binding, resource_type, resource_name)
    )


def _matches_name(binding: AclBinding, resource_type: ResourceType, resource_name: str) -> bool:
    pattern = binding.resource_name
    if binding.pattern_type == PatternType.PREFIXED:
        return resource_name.startswith(pattern)
    return pattern in (WILDCARD, resource_name) or (
        resource_type == ResourceType.CLUSTER and pattern == CLUSTER_NAME
    )


def default_bindings(tenant: str, principal: str) -> list[AclBinding]:
    """What a new key of ``tenant`` may do: everything inside its tenant.

    Everything on its topics, groups and transactional ids; on the cluster,
    only what clients need to create topics and to produce idempotently.
    ALTER and CLUSTER_ACTION stay out, because the cluster is shared by every
    tenant and is the platform's to change.
    """
    own = [
        AclBinding(tenant, principal, resource_type, PatternType.LITERAL, WILDCARD, Operation.ALL)
        for resource_type in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)
    ]
    cluster = [
        AclBinding(
            tenant, principal, ResourceType.CLUSTER, PatternType.LITERAL, CLUSTER_NAME, operation
        )
        for operation in (
            Operation.CREATE,
            Operation.DESCRIBE,
            Operation.DESCRIBE_CONFIGS,
            Operation.IDEMPOTENT_WRITE,
        )
    ]
    return own + cluster


def read_only_bindings(tenant: str, principal: str) -> list[AclBinding]:
    """What a read-only key of ``tenant`` may do: consume and look, never change.

    Consumers join groups and commit offsets, both of which Kafka checks as
    READ on the group, so a read-only key needs that much of the group.
    """
    wanted = (
        (ResourceType.TOPIC, WILDCARD, Operation.READ),
        (ResourceType.TOPIC, WILDCARD, Operation.DESCRIBE),
        (ResourceType.TOPIC, WILDCARD, Operation.DESCRIBE_CONFIGS),
        (ResourceType.GROUP, WILDCARD, Operation.READ),
        (ResourceType.GROUP, WILDCARD, Operation.DESCRIBE),
        (ResourceType.CLUSTER, CLUSTER_NAME, Operation.DESCRIBE),
    )
    return [
        AclBinding(tenant, principal, resource_type, PatternType.LITERAL, name, operation)
        for resource_type, name, operation in wanted
    ]
