"""Kafka's ACL binding filter over a tenant's bindings: the selections Kafka's
ResourcePatternFilter and AccessControlEntryFilter make."""

from __future__ import annotations

import pytest
from shoal.tenancy.acl_filter import AclFilter, PatternFilter
from shoal.tenancy.model import AclBinding, Operation, PatternType, Permission, ResourceType

T = ResourceType.TOPIC


def binding(
    name: str,
    pattern: PatternType = PatternType.LITERAL,
    principal: str = "K1",
    operation: Operation = Operation.READ,
    permission: Permission = Permission.ALLOW,
    resource_type: ResourceType = T,
) -> AclBinding:
    return AclBinding("acme", principal, resource_type, pattern, name, operation, permission)


ORDERS = binding("orders")
EVERY_TOPIC = binding("*")
ORD_PREFIX = binding("ord", PatternType.PREFIXED)
OTHER_PREFIX = binding("pay", PatternType.PREFIXED)
ALL = [ORDERS, EVERY_TOPIC, ORD_PREFIX, OTHER_PREFIX]


def selected(selection: AclFilter) -> list[AclBinding]:
    return [b for b in ALL if selection.matches(b)]


def test_an_open_filter_selects_every_binding() -> None:
    assert selected(AclFilter()) == ALL


def test_match_selects_what_would_apply_to_the_name() -> None:
    assert selected(AclFilter(T, "orders", PatternFilter.MATCH)) == [
        ORDERS,
        EVERY_TOPIC,
        ORD_PREFIX,
    ]


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        (PatternFilter.LITERAL, "orders", [ORDERS]),
        (PatternFilter.LITERAL, "*", [EVERY_TOPIC]),
        (PatternFilter.PREFIXED, "ord", [ORD_PREFIX]),
        (PatternFilter.PREFIXED, "orders", []),
        (PatternFilter.ANY, "ord", [ORD_PREFIX]),
        (PatternFilter.LITERAL, None, [ORDERS, EVERY_TOPIC]),
    ],
)
def test_literal_prefixed_and_any_compare_names_exactly(
    pattern: PatternFilter, name: str | None, expected: list[AclBinding]
) -> None:
    assert selected(AclFilter(T, name, pattern)) == expected


def test_the_wildcard_principal_filter_selects_only_wildcard_bindings() -> None:
    everyone = binding("orders", principal="*")
    assert AclFilter(principal="*").matches(everyone)
    assert not AclFilter(principal="*").matches(ORDERS)
    assert not AclFilter(principal="K2").matches(ORDERS)


def test_operation_permission_and_resource_type_narrow_the_selection() -> None:
    deny = binding("orders", operation=Operation.WRITE, permission=Permission.DENY)
    assert AclFilter(operation=Operation.WRITE).matches(deny)
    assert not AclFilter(operation=Operation.WRITE).matches(ORDERS)
    assert AclFilter(permission=Permission.DENY).matches(deny)
    assert not AclFilter(permission=Permission.ALLOW).matches(deny)
    assert not AclFilter(resource_type=ResourceType.GROUP).matches(ORDERS)
