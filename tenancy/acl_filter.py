"""Kafka's ACL binding filter (DescribeAcls, DeleteAcls) over a tenant's bindings: pure.

The matching rules are Kafka's ``ResourcePatternFilter`` and
``AccessControlEntryFilter``, so a filter selects here what it would select
on a Kafka cluster holding the same bindings:

* A field left open (None) matches every value; ANY does the same for the
  resource type, the pattern type, the operation and the permission.
* Pattern type LITERAL or PREFIXED selects bindings of that type whose name
  is the filter's name, exactly. ANY selects bindings of every type with that
  exact name. MATCH selects the bindings that would apply to a resource of
  that name: the literal name, the literal ``*``, and every prefix of it.
* The principal is compared exactly: a filter for ``*`` selects the bindings
  for every key, not the bindings of every principal.

Names and principals are the tenant's (``orders``, a key id or ``*``); the
caller maps the wire's forms (``User:<key id>``) before filtering.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shoal.tenancy.model import (
    WILDCARD,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)


class PatternFilter(enum.IntEnum):
    """Kafka's PatternType numbering as a filter reads it (ANY and MATCH included)."""

    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings a DescribeAcls or DeleteAcls filter selects; None matches anything."""

    resource_type: ResourceType | None = None
    resource_name: str | None = None
    pattern: PatternFilter = PatternFilter.ANY
    principal: str | None = None
    operation: Operation | None = None
    permission: Permission | None = None

    def matches(self, binding: AclBinding) -> bool:
        return self._matches_pattern(binding) and self._matches_entry(binding)

    def _matches_pattern(self, binding: AclBinding) -> bool:
        if self.resource_type is not None and self.resource_type != binding.resource_type:
            return False
        exact = self.pattern in (PatternFilter.ANY, PatternFilter.MATCH)
        if not exact and self.pattern != PatternFilter(binding.pattern_type):
            return False
        name = self.resource_name
        if name is None:
            return True
        if self.pattern != PatternFilter.MATCH:
            return name == binding.resource_name
        if binding.pattern_type == PatternType.PREFIXED:
            return name.startswith(binding.resource_name)
        return binding.resource_name in (name, WILDCARD)

    def _matches_entry(self, binding: AclBinding) -> bool:
        return (
            (self.principal is None or self.principal == binding.principal)
            and (self.operation is None or self.operation == binding.operation)
            and (self.permission is None or self.permission == binding.permission)
        )
