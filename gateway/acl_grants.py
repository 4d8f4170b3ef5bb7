"""What a tenant's key may grant through CreateAcls: never more than it may do itself.

Kafka lets whoever holds ALTER on the cluster create any binding. In Shoal
the cluster a tenant sees is its own slice of a shared one, and ALTER on it
is something a Tenant resource grants to chosen keys; such a key must not be
able to hand any key (itself included) rights beyond its own. The rule:

* A DENY may always be created: it only takes rights away.
* An ALLOW is created only if every operation it would allow (ALL stands for
  every operation of the resource type; READ, WRITE, DELETE and ALTER also
  allow DESCRIBE, as in :mod:`shoal.tenancy.acl`) is allowed to the caller on
  every name the new pattern covers, by one ALLOW of the caller's (its key or
  ``*``) whose pattern covers the new one, and no DENY of the caller's for
  that operation touches any name the new pattern covers. So a key denied
  READ on ``payroll`` cannot grant READ on ``*`` or on prefix ``pay``.

Names are the tenant's, and bindings are kept per tenant, so no pattern can
reach another tenant's resources whatever it spells (``b.orders`` is this
tenant's topic ``b.orders``).
"""

from __future__ import annotations

from shoal.gateway.access import SUPPORTED_OPERATIONS, TenantAccess
from shoal.tenancy.acl import allows
from shoal.tenancy.model import WILDCARD, AclBinding, Operation, PatternType, Permission


def ungranted(access: TenantAccess, wanted: AclBinding) -> list[Operation]:
    """The operations ``wanted`` would allow somewhere the caller may not do them."""
    if wanted.permission == Permission.DENY:
        return []
    own = [
        b
        for b in access.bindings
        if b.tenant == access.tenant
        and b.principal in (access.key_id, WILDCARD)
        and b.resource_type == wanted.resource_type
    ]
    missing = []
    for operation in _granted(wanted):
        covered = any(
            b.permission == Permission.ALLOW
            and allows(b.operation, operation)
            and _covers(b, wanted)
            for b in own
        )
        denied = any(
            b.permission == Permission.DENY
            and b.operation in (operation, Operation.ALL)
            and _overlaps(b, wanted)
            for b in own
        )
        if denied or not covered:
            missing.append(operation)
    return missing


def _granted(wanted: AclBinding) -> list[Operation]:
    """Every operation an ALLOW for ``wanted.operation`` allows on its resource type."""
    supported = SUPPORTED_OPERATIONS[wanted.resource_type]
    if wanted.operation == Operation.ALL:
        return list(supported)
    implied = [op for op in supported if op != wanted.operation and allows(wanted.operation, op)]
    return [wanted.operation, *implied]


def _everything(binding: AclBinding) -> bool:
    return binding.pattern_type == PatternType.LITERAL and binding.resource_name == WILDCARD


def _covers(outer: AclBinding, inner: AclBinding) -> bool:
    """Whether every name ``inner`` matches is matched by ``outer``."""
    if _everything(outer):
        return True
    if _everything(inner):
        return False
    if outer.pattern_type == PatternType.PREFIXED:
        return inner.resource_name.startswith(outer.resource_name)
    return inner.pattern_type == PatternType.LITERAL and inner.resource_name == outer.resource_name


def _overlaps(one: AclBinding, other: AclBinding) -> bool:
    """Whether some name is matched by both."""
    if _everything(one) or _everything(other):
        return True
    a, b = one.resource_name, other.resource_name
    if one.pattern_type == PatternType.LITERAL and other.pattern_type == PatternType.LITERAL:
        return a == b
    if one.pattern_type == PatternType.PREFIXED and other.pattern_type == PatternType.PREFIXED:
        return a.startswith(b) or b.startswith(a)
    literal, prefix = (a, b) if one.pattern_type == PatternType.LITERAL else (b, a)
    return literal.startswith(prefix)
