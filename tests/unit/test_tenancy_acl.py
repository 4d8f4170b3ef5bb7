"""The ACL authorizer: Kafka's AclAuthorizer decisions, confined to one tenant.

Hand-picked cases pin each rule (patterns, principals, implications, deny wins);
hypothesis properties check what must hold for any set of bindings: other
tenants never matter, order never matters, a DENY never grants and an ALLOW
never refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoal.tenancy.acl import CLUSTER_NAME, authorize, default_bindings, read_only_bindings
from shoal.tenancy.model import (
    WILDCARD,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

TENANT = "acme"
OTHER_TENANT = "globex"
KEY = "key-1"
OTHER_KEY = "key-2"

TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
CLUSTER = ResourceType.CLUSTER
TXN = ResourceType.TRANSACTIONAL_ID
LITERAL = PatternType.LITERAL
PREFIXED = PatternType.PREFIXED
ALLOW = Permission.ALLOW
DENY = Permission.DENY

# Operations that imply nothing and are implied by nothing but ALL.
PLAIN_OPERATIONS = (
    Operation.READ,
    Operation.WRITE,
    Operation.CREATE,
    Operation.DELETE,
    Operation.ALTER,
    Operation.CLUSTER_ACTION,
    Operation.ALTER_CONFIGS,
    Operation.IDEMPOTENT_WRITE,
)
REAL_OPERATIONS = tuple(op for op in Operation if op != Operation.ALL)


def binding(
    operation: Operation,
    permission: Permission = ALLOW,
    *,
    resource_type: ResourceType = TOPIC,
    pattern_type: PatternType = LITERAL,
    name: str = "orders",
    principal: str = KEY,
    tenant: str = TENANT,
) -> AclBinding:
    return AclBinding(tenant, principal, resource_type, pattern_type, name, operation, permission)


def allowed(
    bindings: list[AclBinding],
    operation: Operation,
    name: str = "orders",
    *,
    resource_type: ResourceType = TOPIC,
    principal: str = KEY,
    tenant: str = TENANT,
) -> bool:
    return authorize(bindings, tenant, principal, resource_type, name, operation)


# -- no match -------------------------------------------------------------------


def test_no_bindings_denies() -> None:
    assert not allowed([], Operation.READ)
    assert not allowed([], Operation.DESCRIBE, CLUSTER_NAME, resource_type=CLUSTER)


def test_bindings_for_something_else_deny() -> None:
    bindings = [
        binding(Operation.READ, name="payments"),
        binding(Operation.WRITE),
        binding(Operation.READ, resource_type=GROUP),
        binding(Operation.READ, principal=OTHER_KEY),
    ]
    assert not allowed(bindings, Operation.READ)


# -- resource patterns ------------------------------------------------------------


def test_literal_matches_only_its_exact_name() -> None:
    bindings = [binding(Operation.READ, name="orders")]
    assert allowed(bindings, Operation.READ, "orders")
    for other in ("order", "orders2", "Orders", "xorders", "", "*"):
        assert not allowed(bindings, Operation.READ, other), other


@pytest.mark.parametrize("name", ["orders", "payments", "a.b-c_d", "*", ""])
def test_literal_wildcard_matches_every_name(name: str) -> None:
    assert allowed([binding(Operation.READ, name=WILDCARD)], Operation.READ, name)


def test_prefixed_matches_names_starting_with_the_prefix() -> None:
    bindings = [binding(Operation.READ, pattern_type=PREFIXED, name="orders.")]
    assert allowed(bindings, Operation.READ, "orders.")
    assert allowed(bindings, Operation.READ, "orders.eu")
    assert allowed(bindings, Operation.READ, "orders.eu.v2")
    for other in ("orders", "order.eu", "x.orders.eu", "ORDERS.eu"):
        assert not allowed(bindings, Operation.READ, other), other


def test_prefixed_star_is_a_plain_prefix_not_a_wildcard() -> None:
    bindings = [binding(Operation.READ, pattern_type=PREFIXED, name=WILDCARD)]
    assert not allowed(bindings, Operation.READ, "orders")
    assert allowed(bindings, Operation.READ, "*orders")


def test_pattern_matches_only_its_resource_type() -> None:
    bindings = [binding(Operation.READ, resource_type=GROUP, name=WILDCARD)]
    assert allowed(bindings, Operation.READ, "orders", resource_type=GROUP)
    for other in (TOPIC, TXN, CLUSTER):
        assert not allowed(bindings, Operation.READ, "orders", resource_type=other), other


@pytest.mark.parametrize("pattern", [CLUSTER_NAME, WILDCARD])
@pytest.mark.parametrize("asked", [CLUSTER_NAME, "", "shoal"])
def test_cluster_literal_matches_the_cluster_by_any_name(pattern: str, asked: str) -> None:
    bindings = [binding(Operation.DESCRIBE, resource_type=CLUSTER, name=pattern)]
    assert allowed(bindings, Operation.DESCRIBE, asked, resource_type=CLUSTER)


def test_kafka_cluster_name_is_only_special_for_the_cluster() -> None:
    bindings = [binding(Operation.READ, name=CLUSTER_NAME)]
    assert allowed(bindings, Operation.READ, CLUSTER_NAME)
    assert not allowed(bindings, Operation.READ, "orders")


# -- principals -----------------------------------------------------------------


def test_binding_applies_only_to_its_principal() -> None:
    bindings = [binding(Operation.READ, principal=KEY)]
    assert allowed(bindings, Operation.READ, principal=KEY)
    assert not allowed(bindings, Operation.READ, principal=OTHER_KEY)


def test_wildcard_principal_applies_to_every_key_of_the_tenant() -> None:
    bindings = [binding(Operation.READ, principal=WILDCARD)]
    assert allowed(bindings, Operation.READ, principal=KEY)
    assert allowed(bindings, Operation.READ, principal=OTHER_KEY)


def test_principal_must_match_exactly() -> None:
    bindings = [binding(Operation.READ, principal="key")]
    for other in ("key-1", "KEY", "User:key", ""):
        assert not allowed(bindings, Operation.READ, principal=other), other


# -- operations and implications ------------------------------------------------------


@pytest.mark.parametrize("operation", REAL_OPERATIONS)
def test_allow_all_allows_every_operation(operation: Operation) -> None:
    assert allowed([binding(Operation.ALL)], operation)


@pytest.mark.parametrize("granted", PLAIN_OPERATIONS)
def test_allow_grants_its_operation_and_no_other_plain_one(granted: Operation) -> None:
    bindings = [binding(granted)]
    assert allowed(bindings, granted)
    for other in PLAIN_OPERATIONS:
        if other != granted:
            assert not allowed(bindings, other), other
    assert not allowed(bindings, Operation.ALL)


@pytest.mark.parametrize(
    "granted", [Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER]
)
def test_allow_to_use_a_resource_implies_describe(granted: Operation) -> None:
    assert allowed([binding(granted)], Operation.DESCRIBE)


def test_allow_alter_configs_implies_describe_configs() -> None:
    assert allowed([binding(Operation.ALTER_CONFIGS)], Operation.DESCRIBE_CONFIGS)


@pytest.mark.parametrize(
    ("granted", "not_implied"),
    [
        (Operation.DESCRIBE, Operation.READ),
        (Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
        (Operation.ALTER_CONFIGS, Operation.DESCRIBE),
        (Operation.ALTER, Operation.DESCRIBE_CONFIGS),
        (Operation.CREATE, Operation.DESCRIBE),
        (Operation.IDEMPOTENT_WRITE, Operation.DESCRIBE),
        (Operation.CLUSTER_ACTION, Operation.DESCRIBE),
        (Operation.READ, Operation.DESCRIBE_CONFIGS),
    ],
)
def test_implications_go_only_the_documented_way(
    granted: Operation, not_implied: Operation
) -> None:
    assert not allowed([binding(granted)], not_implied)


def test_deny_read_does_not_deny_describe() -> None:
    bindings = [binding(Operation.DESCRIBE), binding(Operation.READ, DENY)]
    assert allowed(bindings, Operation.DESCRIBE)
    assert not allowed(bindings, Operation.READ)


def test_deny_alter_configs_does_not_deny_describe_configs() -> None:
    bindings = [binding(Operation.DESCRIBE_CONFIGS), binding(Operation.ALTER_CONFIGS, DENY)]
    assert allowed(bindings, Operation.DESCRIBE_CONFIGS)


def test_implied_describe_stands_when_the_implying_operation_is_denied() -> None:
    # Kafka checks the DENY against the operation asked (DESCRIBE), not against
    # the ALLOW that implies it: WRITE allowed and denied still lets one describe.
    bindings = [binding(Operation.WRITE), binding(Operation.WRITE, DENY)]
    assert allowed(bindings, Operation.DESCRIBE)
    assert not allowed(bindings, Operation.WRITE)


def test_deny_describe_overrides_the_implied_describe() -> None:
    bindings = [binding(Operation.READ), binding(Operation.DESCRIBE, DENY)]
    assert not allowed(bindings, Operation.DESCRIBE)
    assert allowed(bindings, Operation.READ)


# -- deny wins ---------------------------------------------------------------------


def test_deny_wins_over_allow_of_the_same_operation() -> None:
    bindings = [binding(Operation.READ), binding(Operation.READ, DENY)]
    assert not allowed(bindings, Operation.READ)


def test_deny_wins_whatever_the_order() -> None:
    bindings = [binding(Operation.READ, DENY), binding(Operation.READ)]
    assert not allowed(bindings, Operation.READ)


@pytest.mark.parametrize("operation", REAL_OPERATIONS)
def test_deny_all_denies_every_operation_over_allow_all(operation: Operation) -> None:
    bindings = [binding(Operation.ALL), binding(Operation.ALL, DENY)]
    assert not allowed(bindings, operation)


def test_deny_all_denies_a_specific_allow() -> None:
    bindings = [binding(Operation.WRITE), binding(Operation.ALL, DENY)]
    assert not allowed(bindings, Operation.WRITE)


def test_deny_of_one_operation_leaves_the_others_allowed() -> None:
    bindings = [binding(Operation.ALL), binding(Operation.WRITE, DENY)]
    assert not allowed(bindings, Operation.WRITE)
    assert allowed(bindings, Operation.READ)
    assert allowed(bindings, Operation.DESCRIBE)


def test_deny_for_wildcard_principal_wins_over_allow_for_the_key() -> None:
    bindings = [binding(Operation.READ), binding(Operation.READ, DENY, principal=WILDCARD)]
    assert not allowed(bindings, Operation.READ, principal=KEY)
    assert not allowed(bindings, Operation.READ, principal=OTHER_KEY)


def test_deny_for_the_key_wins_over_allow_for_everyone() -> None:
    bindings = [binding(Operation.READ, principal=WILDCARD), binding(Operation.READ, DENY)]
    assert not allowed(bindings, Operation.READ, principal=KEY)
    assert allowed(bindings, Operation.READ, principal=OTHER_KEY)


def test_prefixed_deny_wins_over_literal_allow() -> None:
    bindings = [
        binding(Operation.WRITE, name="orders.eu"),
        binding(Operation.WRITE, DENY, pattern_type=PREFIXED, name="orders."),
    ]
    assert not allowed(bindings, Operation.WRITE, "orders.eu")


def test_literal_deny_carves_a_name_out_of_a_wildcard_allow() -> None:
    bindings = [
        binding(Operation.ALL, name=WILDCARD),
        binding(Operation.ALL, DENY, name="audit"),
    ]
    assert not allowed(bindings, Operation.READ, "audit")
    assert allowed(bindings, Operation.READ, "orders")


def test_wildcard_deny_wins_over_literal_allow() -> None:
    bindings = [binding(Operation.READ), binding(Operation.READ, DENY, name=WILDCARD)]
    assert not allowed(bindings, Operation.READ)


def test_deny_for_another_key_does_not_apply() -> None:
    bindings = [binding(Operation.READ), binding(Operation.READ, DENY, principal=OTHER_KEY)]
    assert allowed(bindings, Operation.READ)


# -- tenants ---------------------------------------------------------------------


def test_another_tenants_allow_never_applies() -> None:
    bindings = [binding(Operation.ALL, name=WILDCARD, principal=WILDCARD, tenant=OTHER_TENANT)]
    assert not allowed(bindings, Operation.READ, tenant=TENANT)
    assert allowed(bindings, Operation.READ, tenant=OTHER_TENANT)


def test_same_key_id_in_another_tenant_gets_nothing() -> None:
    bindings = [binding(Operation.ALL)]
    assert not allowed(bindings, Operation.READ, tenant=OTHER_TENANT)


def test_another_tenants_deny_never_applies() -> None:
    bindings = [
        binding(Operation.READ),
        binding(Operation.ALL, DENY, name=WILDCARD, principal=WILDCARD, tenant=OTHER_TENANT),
    ]
    assert allowed(bindings, Operation.READ)


# -- inputs ------------------------------------------------------------------------


def test_bindings_may_be_a_one_shot_iterator() -> None:
    def stream() -> Iterator[AclBinding]:
        yield binding(Operation.READ, principal=OTHER_KEY)
        yield binding(Operation.READ)

    assert authorize(stream(), TENANT, KEY, TOPIC, "orders", Operation.READ)


# -- default and read-only keys ------------------------------------------------------


@pytest.mark.parametrize("resource_type", [TOPIC, GROUP, TXN])
@pytest.mark.parametrize("operation", REAL_OPERATIONS)
def test_default_key_may_do_anything_to_its_tenants_resources(
    resource_type: ResourceType, operation: Operation
) -> None:
    bindings = default_bindings(TENANT, KEY)
    assert allowed(bindings, operation, "orders", resource_type=resource_type)
    assert allowed(bindings, operation, "any.name-at_all", resource_type=resource_type)


@pytest.mark.parametrize(
    "operation",
    [
        Operation.CREATE,
        Operation.DESCRIBE,
        Operation.DESCRIBE_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
    ],
)
def test_default_key_may_create_topics_and_produce_idempotently(operation: Operation) -> None:
    assert allowed(default_bindings(TENANT, KEY), operation, CLUSTER_NAME, resource_type=CLUSTER)


@pytest.mark.parametrize(
    "operation",
    [
        Operation.ALTER,
        Operation.ALTER_CONFIGS,
        Operation.CLUSTER_ACTION,
        Operation.READ,
        Operation.WRITE,
        Operation.DELETE,
        Operation.ALL,
    ],
)
def test_default_key_may_not_change_the_cluster(operation: Operation) -> None:
    assert not allowed(
        default_bindings(TENANT, KEY), operation, CLUSTER_NAME, resource_type=CLUSTER
    )


def test_default_bindings_belong_to_the_key_and_its_tenant() -> None:
    bindings = default_bindings(TENANT, KEY)
    assert {(b.tenant, b.principal, b.permission) for b in bindings} == {(TENANT, KEY, ALLOW)}
    assert not allowed(bindings, Operation.READ, principal=OTHER_KEY)
    assert not allowed(bindings, Operation.READ, tenant=OTHER_TENANT)


@pytest.mark.parametrize(
    ("resource_type", "name", "operation"),
    [
        (TOPIC, "orders", Operation.READ),
        (TOPIC, "orders", Operation.DESCRIBE),
        (TOPIC, "orders", Operation.DESCRIBE_CONFIGS),
        (GROUP, "billing", Operation.READ),
        (GROUP, "billing", Operation.DESCRIBE),
        (CLUSTER, CLUSTER_NAME, Operation.DESCRIBE),
    ],
)
def test_read_only_key_may_consume_and_look(
    resource_type: ResourceType, name: str, operation: Operation
) -> None:
    assert allowed(read_only_bindings(TENANT, KEY), operation, name, resource_type=resource_type)


@pytest.mark.parametrize(
    ("resource_type", "name", "operation"),
    [
        (TOPIC, "orders", Operation.WRITE),
        (TOPIC, "orders", Operation.CREATE),
        (TOPIC, "orders", Operation.DELETE),
        (TOPIC, "orders", Operation.ALTER),
        (TOPIC, "orders", Operation.ALTER_CONFIGS),
        (GROUP, "billing", Operation.DELETE),
        (TXN, "tx-1", Operation.WRITE),
        (TXN, "tx-1", Operation.DESCRIBE),
        (CLUSTER, CLUSTER_NAME, Operation.CREATE),
        (CLUSTER, CLUSTER_NAME, Operation.IDEMPOTENT_WRITE),
        (CLUSTER, CLUSTER_NAME, Operation.ALTER),
        (CLUSTER, CLUSTER_NAME, Operation.DESCRIBE_CONFIGS),
    ],
)
def test_read_only_key_may_not_change_anything(
    resource_type: ResourceType, name: str, operation: Operation
) -> None:
    assert not allowed(
        read_only_bindings(TENANT, KEY), operation, name, resource_type=resource_type
    )


def test_read_only_bindings_belong_to_the_key_and_its_tenant() -> None:
    bindings = read_only_bindings(TENANT, KEY)
    assert {(b.tenant, b.principal, b.permission) for b in bindings} == {(TENANT, KEY, ALLOW)}
    assert not allowed(bindings, Operation.READ, principal=OTHER_KEY)
    assert not allowed(bindings, Operation.READ, tenant=OTHER_TENANT)


def test_a_deny_narrows_a_default_key() -> None:
    bindings = [*default_bindings(TENANT, KEY), binding(Operation.WRITE, DENY, name="audit")]
    assert not allowed(bindings, Operation.WRITE, "audit")
    assert allowed(bindings, Operation.READ, "audit")
    assert allowed(bindings, Operation.WRITE, "orders")


# -- properties over arbitrary bindings ----------------------------------------------

# Few tenants, keys and short names over a two-letter alphabet, so that
# patterns, principals and tenants collide often enough to matter.
names = st.one_of(st.just(WILDCARD), st.just(CLUSTER_NAME), st.text("ab", min_size=1, max_size=3))
bindings_st = st.builds(
    AclBinding,
    tenant=st.sampled_from([TENANT, OTHER_TENANT]),
    principal=st.sampled_from([KEY, OTHER_KEY, WILDCARD]),
    resource_type=st.sampled_from(ResourceType),
    pattern_type=st.sampled_from(PatternType),
    resource_name=names,
    operation=st.sampled_from(Operation),
    permission=st.sampled_from(Permission),
)
binding_lists = st.lists(bindings_st, max_size=8)
requests = st.tuples(
    st.sampled_from([KEY, OTHER_KEY]),
    st.sampled_from(ResourceType),
    st.one_of(st.just(CLUSTER_NAME), st.text("ab", min_size=1, max_size=3)),
    st.sampled_from(REAL_OPERATIONS),
)
Request = tuple[str, ResourceType, str, Operation]


def decide(bindings: list[AclBinding], request: Request) -> bool:
    principal, resource_type, name, operation = request
    return authorize(bindings, TENANT, principal, resource_type, name, operation)


@given(binding_lists, binding_lists, requests)
def test_other_tenants_bindings_never_change_a_decision(
    own: list[AclBinding], mixed: list[AclBinding], request: Request
) -> None:
    foreign = [b for b in mixed if b.tenant != TENANT]
    assert decide(own + foreign, request) == decide(own, request)
    assert decide(foreign + own, request) == decide(own, request)


@given(binding_lists, requests, st.data())
def test_order_of_bindings_never_changes_a_decision(
    bindings: list[AclBinding], request: Request, data: st.DataObject
) -> None:
    shuffled = data.draw(st.permutations(bindings))
    assert decide(shuffled, request) == decide(bindings, request)


@given(binding_lists, bindings_st, requests)
def test_adding_a_deny_never_grants(
    bindings: list[AclBinding], extra: AclBinding, request: Request
) -> None:
    deny = replace(extra, permission=DENY)
    if not decide(bindings, request):
        assert not decide([*bindings, deny], request)


@given(binding_lists, bindings_st, requests)
def test_adding_an_allow_never_refuses(
    bindings: list[AclBinding], extra: AclBinding, request: Request
) -> None:
    allow = replace(extra, permission=ALLOW)
    if decide(bindings, request):
        assert decide([*bindings, allow], request)


@given(binding_lists, requests)
def test_a_matching_deny_all_refuses_whatever_else_there_is(
    bindings: list[AclBinding], request: Request
) -> None:
    principal, resource_type, name, _ = request
    deny = binding(Operation.ALL, DENY, resource_type=resource_type, name=name, principal=principal)
    assert not decide([*bindings, deny], request)


@given(binding_lists, requests)
def test_only_allows_grant(bindings: list[AclBinding], request: Request) -> None:
    denies = [b for b in bindings if b.permission == DENY]
    assert not decide(denies, request)
