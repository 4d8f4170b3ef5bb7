"""The no-escalation rule for keys made and revoked by keys (pure: no store, no HTTP)."""

from __future__ import annotations

import pytest
from shoal.gateway.access import TenantAccess
from shoal.gateway.keys import KeyForbiddenError, new_key_bindings, uncovered
from shoal.tenancy.acl import CLUSTER_NAME, default_bindings, read_only_bindings
from shoal.tenancy.model import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    Quotas,
    ResourceType,
)

TENANT = "acme"


def access(key_id: str, bindings: list[AclBinding]) -> TenantAccess:
    return TenantAccess(TENANT, key_id, tuple(bindings), Quotas())


FULL = access("KFULL", default_bindings(TENANT, "KFULL"))
READER = access("KREAD", read_only_bindings(TENANT, "KREAD"))


def test_a_full_key_may_make_full_and_read_only_keys() -> None:
    assert new_key_bindings(FULL, "KNEW", read_only=False) == default_bindings(TENANT, "KNEW")
    assert new_key_bindings(FULL, "KNEW", read_only=True) == read_only_bindings(TENANT, "KNEW")


def test_a_read_only_key_may_make_only_read_only_keys() -> None:
    assert new_key_bindings(READER, "KNEW", read_only=True) == read_only_bindings(TENANT, "KNEW")
    with pytest.raises(KeyForbiddenError, match="CREATE on CLUSTER"):
        new_key_bindings(READER, "KNEW", read_only=False)


def test_a_key_with_rights_on_some_topics_only_cannot_make_a_key_for_all() -> None:
    narrow = [
        AclBinding(TENANT, "KNARROW", ResourceType.TOPIC, PatternType.PREFIXED, "team-", op)
        for op in (Operation.ALL,)
    ] + [b for b in default_bindings(TENANT, "KNARROW") if b.resource_type != ResourceType.TOPIC]
    with pytest.raises(KeyForbiddenError, match="on TOPIC"):
        new_key_bindings(access("KNARROW", narrow), "KNEW", read_only=False)


def test_the_creators_own_denials_pass_to_the_new_key() -> None:
    deny = AclBinding(
        TENANT,
        "KFULL",
        ResourceType.TOPIC,
        PatternType.LITERAL,
        "payroll",
        Operation.READ,
        Permission.DENY,
    )
    creator = access("KFULL", [*default_bindings(TENANT, "KFULL"), deny])
    made = new_key_bindings(creator, "KNEW", read_only=True)
    assert (
        AclBinding(
            TENANT,
            "KNEW",
            ResourceType.TOPIC,
            PatternType.LITERAL,
            "payroll",
            Operation.READ,
            Permission.DENY,
        )
        in made
    )
    assert not access("KNEW", made).may_topic("payroll", Operation.READ)


def test_a_prefixed_grant_is_covered_only_by_rights_on_every_name() -> None:
    prefixed = AclBinding(
        TENANT, "KX", ResourceType.TOPIC, PatternType.PREFIXED, "team-", Operation.WRITE
    )
    exact = access(
        "KY",
        [
            AclBinding(
                TENANT, "KY", ResourceType.TOPIC, PatternType.LITERAL, "team-", Operation.WRITE
            )
        ],
    )
    assert uncovered(exact, [prefixed]) == [prefixed]
    assert uncovered(FULL, [prefixed]) == []


def test_cluster_all_needs_every_cluster_operation() -> None:
    cluster_all = AclBinding(
        TENANT, "KX", ResourceType.CLUSTER, PatternType.LITERAL, CLUSTER_NAME, Operation.ALL
    )
    assert uncovered(FULL, [cluster_all]) == [cluster_all]
