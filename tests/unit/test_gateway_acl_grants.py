"""What a key may grant through CreateAcls: never more than it may do itself."""

from __future__ import annotations

import pytest
from shoal.gateway.access import TenantAccess
from shoal.gateway.acl_grants import ungranted
from shoal.tenancy.acl import CLUSTER_NAME, default_bindings, read_only_bindings
from shoal.tenancy.model import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    Quotas,
    ResourceType,
)

TOPIC = ResourceType.TOPIC
LIT = PatternType.LITERAL
PRE = PatternType.PREFIXED


def access(bindings: list[AclBinding], key: str = "K1") -> TenantAccess:
    return TenantAccess("acme", key, bindings, Quotas())


def grant(
    name: str,
    operation: Operation,
    pattern: PatternType = LIT,
    resource_type: ResourceType = TOPIC,
    permission: Permission = Permission.ALLOW,
) -> AclBinding:
    return AclBinding("acme", "K2", resource_type, pattern, name, operation, permission)


def test_a_default_key_may_grant_anything_on_its_topics() -> None:
    caller = access(default_bindings("acme", "K1"))
    assert ungranted(caller, grant("*", Operation.ALL)) == []
    assert ungranted(caller, grant("pay", Operation.WRITE, PRE)) == []


def test_a_read_only_key_may_grant_reading_but_not_writing() -> None:
    caller = access(read_only_bindings("acme", "K1"))
    assert ungranted(caller, grant("orders", Operation.READ)) == []
    assert ungranted(caller, grant("orders", Operation.WRITE)) == [Operation.WRITE]
    assert Operation.WRITE in ungranted(caller, grant("orders", Operation.ALL))


def test_no_key_of_a_default_role_may_grant_alter_on_the_cluster() -> None:
    caller = access(default_bindings("acme", "K1"))
    wanted = grant(CLUSTER_NAME, Operation.ALTER, resource_type=ResourceType.CLUSTER)
    assert ungranted(caller, wanted) == [Operation.ALTER]


def test_a_literal_right_covers_only_its_name() -> None:
    caller = access([AclBinding("acme", "K1", TOPIC, LIT, "orders", Operation.READ)])
    assert ungranted(caller, grant("orders", Operation.READ)) == []
    assert ungranted(caller, grant("orders", Operation.DESCRIBE)) == [], "READ implies DESCRIBE"
    reading = [Operation.READ, Operation.DESCRIBE]  # what an ALLOW for READ allows
    assert ungranted(caller, grant("*", Operation.READ)) == reading
    assert ungranted(caller, grant("ord", Operation.READ, PRE)) == reading


def test_a_prefixed_right_covers_longer_prefixes_and_names_under_it() -> None:
    caller = access([AclBinding("acme", "K1", TOPIC, PRE, "pay", Operation.READ)])
    assert ungranted(caller, grant("payroll", Operation.READ)) == []
    assert ungranted(caller, grant("pay.eu", Operation.READ, PRE)) == []
    assert ungranted(caller, grant("pa", Operation.READ, PRE)) == [
        Operation.READ,
        Operation.DESCRIBE,
    ]


@pytest.mark.parametrize(
    "wanted",
    [
        grant("*", Operation.READ),
        grant("pay", Operation.READ, PRE),
        grant("payroll", Operation.ALL),
    ],
)
def test_a_deny_of_the_caller_limits_every_pattern_that_touches_it(wanted: AclBinding) -> None:
    deny = AclBinding("acme", "K1", TOPIC, LIT, "payroll", Operation.READ, Permission.DENY)
    caller = access([*default_bindings("acme", "K1"), deny])
    assert Operation.READ in ungranted(caller, wanted)


def test_a_deny_on_another_name_does_not_limit() -> None:
    deny = AclBinding("acme", "K1", TOPIC, LIT, "payroll", Operation.READ, Permission.DENY)
    caller = access([*default_bindings("acme", "K1"), deny])
    assert ungranted(caller, grant("orders", Operation.READ)) == []
    assert ungranted(caller, grant("ord", Operation.READ, PRE)) == []


def test_a_deny_may_always_be_created() -> None:
    caller = access(read_only_bindings("acme", "K1"))
    assert ungranted(caller, grant("*", Operation.ALL, permission=Permission.DENY)) == []


def test_only_the_callers_own_and_tenant_wide_bindings_count() -> None:
    others = [
        *default_bindings("acme", "K9"),
        *default_bindings("globex", "K1"),
        AclBinding("acme", "*", TOPIC, LIT, "shared", Operation.WRITE),
    ]
    caller = access(others)
    assert ungranted(caller, grant("orders", Operation.READ)) == [
        Operation.READ,
        Operation.DESCRIBE,
    ]
    assert ungranted(caller, grant("shared", Operation.WRITE)) == []
