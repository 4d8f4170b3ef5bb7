"""DescribeAcls, CreateAcls, DeleteAcls through the gateway, without sockets or etcd.

Each test runs the rewriter with an in-memory store and reads the answer as a
client would decode it: a tenant sees and changes only its own bindings,
under its own names and Kafka's ``User:`` principals, and never grants more
than the calling key may do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from acl_store_stub import StubAclStore
from shoal.gateway.access import TenantAccess
from shoal.gateway.apis.acls import create_acls, delete_acls, describe_acls
from shoal.gateway.apis.base import Answer, RequestContext, Step
from shoal.tenancy.acl import CLUSTER_NAME, default_bindings, read_only_bindings
from shoal.tenancy.model import (
    AclBinding,
    BindingSource,
    Operation,
    PatternType,
    Quotas,
    ResourceType,
)

from shoal.wire import ErrorCode as E
from shoal.wire import schema

TENANT = "acme"
KEY = "K1"
ANY = 1
MATCH = 2
LITERAL = 3
PREFIXED = 4
TOPIC = 2
CLUSTER = 4
USER_RESOURCE = 7
READ, WRITE, ALTER = 3, 4, 7
ALLOW, DENY = 3, 2
VERSIONS = [1, 3]

ALTER_CLUSTER = AclBinding(
    TENANT, KEY, ResourceType.CLUSTER, PatternType.LITERAL, CLUSTER_NAME, Operation.ALTER
)
ADMIN = [*default_bindings(TENANT, KEY), ALTER_CLUSTER]


def made(binding: AclBinding) -> AclBinding:
    return replace(binding, source=BindingSource.KAFKA_API)


def topic_binding(
    name: str,
    principal: str = "K2",
    operation: Operation = Operation.READ,
    pattern: PatternType = PatternType.LITERAL,
    tenant: str = TENANT,
) -> AclBinding:
    return AclBinding(tenant, principal, ResourceType.TOPIC, pattern, name, operation)


def context(
    api_key: int, version: int, store: StubAclStore, bindings: Sequence[AclBinding] = ADMIN
) -> RequestContext:
    access = TenantAccess(TENANT, KEY, bindings, Quotas())
    return RequestContext(access, schema(api_key, version), None, None, acl_store=store)  # type: ignore[arg-type]


def received(ctx: RequestContext, step: Step) -> Any:
    """The answer as the client decodes it."""
    assert isinstance(step, Answer)
    body, _ = ctx.api.read_response(memoryview(ctx.api.encode_body(step.response)), 0)
    return body


def describe_request(ctx: RequestContext, **changes: Any) -> Any:
    fields: dict[str, Any] = {
        "resource_type_filter": ANY,
        "resource_name_filter": None,
        "pattern_type_filter": ANY,
        "principal_filter": None,
        "host_filter": None,
        "operation": ANY,
        "permission_type": ANY,
    }
    return ctx.api.request(**{**fields, **changes})


async def describe(store: StubAclStore, version: int = 3, **changes: Any) -> Any:
    ctx = context(29, version, store)
    return received(ctx, await describe_acls(ctx, describe_request(ctx, **changes)))


def listed(response: Any) -> set[tuple[str, int, str, int, int]]:
    return {
        (r.resource_name, r.pattern_type, acl.principal, acl.operation, acl.permission_type)
        for r in response.resources
        for acl in r.acls
    }


@pytest.mark.parametrize("version", VERSIONS)
async def test_describe_shows_only_the_tenants_bindings_under_its_names(version: int) -> None:
    store = StubAclStore(
        [
            topic_binding("orders"),
            made(topic_binding("pay", "*", pattern=PatternType.PREFIXED)),
            topic_binding("orders", tenant="globex"),
        ]
    )
    response = await describe(store, version)
    assert response.error_code == E.none
    assert listed(response) == {
        ("orders", LITERAL, "User:K2", READ, ALLOW),
        ("pay", PREFIXED, "User:*", READ, ALLOW),
    }
    assert all(acl.host == "*" for r in response.resources for acl in r.acls)


async def test_a_binding_made_both_ways_is_listed_once() -> None:
    store = StubAclStore([topic_binding("orders"), made(topic_binding("orders"))])
    response = await describe(store)
    assert [len(r.acls) for r in response.resources] == [1]


async def test_describe_filters_as_kafka_match_does() -> None:
    store = StubAclStore(
        [
            topic_binding("orders"),
            topic_binding("*"),
            topic_binding("ord", pattern=PatternType.PREFIXED),
            topic_binding("payments"),
        ]
    )
    response = await describe(
        store, resource_type_filter=TOPIC, resource_name_filter="orders", pattern_type_filter=MATCH
    )
    assert {name for name, *_ in listed(response)} == {"orders", "*", "ord"}


@pytest.mark.parametrize(
    "changes",
    [{"principal_filter": "Group:ops"}, {"host_filter": "10.0.0.1"}, {"resource_type_filter": 7}],
)
async def test_a_filter_no_tenant_binding_can_match_selects_nothing(changes: Any) -> None:
    response = await describe(StubAclStore([topic_binding("orders")]), **changes)
    assert (response.error_code, response.resources) == (E.none, ())


async def test_a_principal_filter_takes_kafkas_user_form() -> None:
    store = StubAclStore([topic_binding("orders"), topic_binding("orders", "K3")])
    response = await describe(store, principal_filter="User:K3")
    assert listed(response) == {("orders", LITERAL, "User:K3", READ, ALLOW)}


async def test_an_unknown_filter_is_an_invalid_request() -> None:
    response = await describe(StubAclStore(), pattern_type_filter=0)
    assert response.error_code == E.invalid_request


async def test_describe_needs_describe_on_the_cluster() -> None:
    no_cluster = [b for b in default_bindings(TENANT, KEY) if b.resource_type != 4]
    ctx = context(29, 3, StubAclStore([topic_binding("orders")]), no_cluster)
    response = received(ctx, await describe_acls(ctx, describe_request(ctx)))
    assert response.error_code == E.cluster_authorization_failed
    assert response.resources == ()


def creation(ctx: RequestContext, **changes: Any) -> Any:
    fields: dict[str, Any] = {
        "resource_type": TOPIC,
        "resource_name": "orders",
        "resource_pattern_type": LITERAL,
        "principal": "User:K2",
        "host": "*",
        "operation": READ,
        "permission_type": ALLOW,
    }
    return ctx.api.make_request("AclCreation", **{**fields, **changes})


async def create(
    store: StubAclStore,
    *creations: dict[str, Any],
    bindings: Sequence[AclBinding] = ADMIN,
    version: int = 3,
) -> list[tuple[E, str | None]]:
    ctx = context(30, version, store, bindings)
    request = ctx.api.request(creations=tuple(creation(ctx, **c) for c in creations))
    response = received(ctx, await create_acls(ctx, request))
    return [(r.error_code, r.error_message) for r in response.results]


@pytest.mark.parametrize("version", VERSIONS)
async def test_create_stores_the_tenants_binding_marked_as_made_through_kafka(
    version: int,
) -> None:
    store = StubAclStore()
    results = await create(
        store,
        {},
        {"principal": "User:*", "resource_pattern_type": PREFIXED, "resource_name": "b."},
        version=version,
    )
    assert results == [(E.none, None), (E.none, None)]
    assert store.held == [
        made(topic_binding("orders")),
        made(topic_binding("b.", "*", pattern=PatternType.PREFIXED)),
    ]


async def test_create_needs_alter_on_the_cluster() -> None:
    store = StubAclStore()
    results = await create(store, {}, {}, bindings=default_bindings(TENANT, KEY))
    assert [code for code, _ in results] == [E.cluster_authorization_failed] * 2
    assert store.held == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"resource_type": CLUSTER, "resource_name": "acme-cluster"},
            "The only valid name for the CLUSTER resource is kafka-cluster",
        ),
        ({"resource_type": USER_RESOURCE}, "resourceType 7: a tenant's bindings hold TOPIC"),
        ({"resource_type": 1}, "Invalid resourceType ANY"),
        ({"resource_pattern_type": MATCH}, "Invalid patternType MATCH"),
        ({"operation": 1}, "Invalid operation ANY"),
        ({"operation": 13}, "operation 13: a tenant's bindings hold ALL, READ"),
        ({"permission_type": 0}, "Invalid permissionType UNKNOWN"),
        ({"resource_name": ""}, "Invalid empty resource name"),
        ({"host": "10.0.0.1"}, "host '10.0.0.1'"),
        ({"principal": "Group:ops"}, "a tenant's principals are User:<name>"),
        ({"principal": "K2"}, "use User:<key id> or User:*"),
        ({"principal": "User:"}, "a tenant's principals are User:<name>"),
    ],
)
async def test_creations_kafka_or_a_tenant_cannot_hold_are_invalid(
    changes: Any, message: str
) -> None:
    store = StubAclStore()
    [(code, answered)] = await create(store, changes)
    assert code == E.invalid_request
    assert answered is not None and message in answered, answered
    assert store.held == []


async def test_an_allow_beyond_the_callers_rights_is_refused_alone() -> None:
    store = StubAclStore()
    reader = [*read_only_bindings(TENANT, KEY), ALTER_CLUSTER]
    results = await create(
        store,
        {"operation": WRITE},
        {"operation": READ},
        {"operation": WRITE, "permission_type": DENY},
        {"resource_type": CLUSTER, "resource_name": CLUSTER_NAME, "operation": 2},
        bindings=reader,
    )
    codes = [code for code, _ in results]
    assert codes == [
        E.cluster_authorization_failed,
        E.none,
        E.none,
        E.cluster_authorization_failed,
    ]
    assert "WRITE" in (results[0][1] or "")
    assert len(store.held) == 2


async def test_a_store_failure_fails_the_creations_it_would_have_made() -> None:
    results = await create(StubAclStore(unreachable=True), {}, {"host": "h"})
    assert [code for code, _ in results] == [E.unknown_server_error, E.invalid_request]


def delete_filter(ctx: RequestContext, **changes: Any) -> Any:
    fields: dict[str, Any] = {
        "resource_type_filter": ANY,
        "resource_name_filter": None,
        "pattern_type_filter": ANY,
        "principal_filter": None,
        "host_filter": None,
        "operation": ANY,
        "permission_type": ANY,
    }
    return ctx.api.make_request("DeleteAclsFilter", **{**fields, **changes})


async def delete(
    store: StubAclStore,
    *filters: dict[str, Any],
    bindings: Sequence[AclBinding] = ADMIN,
    version: int = 3,
) -> Any:
    ctx = context(31, version, store, bindings)
    request = ctx.api.request(filters=tuple(delete_filter(ctx, **f) for f in filters))
    return received(ctx, await delete_acls(ctx, request))


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_broad_delete_removes_only_what_the_tenant_made(version: int) -> None:
    declared = topic_binding("orders")
    others = made(topic_binding("orders", tenant="globex"))
    store = StubAclStore(
        [declared, others, made(topic_binding("orders")), made(topic_binding("*", "*"))]
    )
    response = await delete(store, {}, version=version)
    [result] = response.filter_results
    assert result.error_code == E.none
    assert {(m.resource_name, m.principal) for m in result.matching_acls} == {
        ("orders", "User:K2"),
        ("*", "User:*"),
    }
    assert store.held == [declared, others]


async def test_each_filter_lists_its_own_matches() -> None:
    store = StubAclStore([made(topic_binding("orders")), made(topic_binding("pay"))])
    response = await delete(
        store,
        {"resource_name_filter": "orders", "pattern_type_filter": LITERAL},
        {"resource_name_filter": "payroll", "pattern_type_filter": LITERAL},
        {"pattern_type_filter": 0},
    )
    first, second, bad = response.filter_results
    assert [m.resource_name for m in first.matching_acls] == ["orders"]
    assert second.matching_acls == ()
    assert bad.error_code == E.invalid_request
    assert store.held == [made(topic_binding("pay"))]


async def test_delete_needs_alter_on_the_cluster() -> None:
    store = StubAclStore([made(topic_binding("orders"))])
    response = await delete(store, {}, {}, bindings=default_bindings(TENANT, KEY))
    assert [r.error_code for r in response.filter_results] == [E.cluster_authorization_failed] * 2
    assert len(store.held) == 1
