"""DescribeUserScramCredentials and AlterUserScramCredentials through the gateway, without sockets.

A tenant describes its own keys' SCRAM credentials (mechanisms and
iterations, never salts or keys) and nobody else's: another tenant's key, a
revoked key and a key minted before SCRAM are all "does not exist", so key
ids cannot be probed. Alter never changes anything and says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from shoal.gateway.access import TenantAccess
from shoal.gateway.apis.base import Answer, RequestContext, Step
from shoal.gateway.apis.scram_credentials import alter, describe
from shoal.tenancy.acl import default_bindings, read_only_bindings
from shoal.tenancy.keys import key_record
from shoal.tenancy.model import AclBinding, ApiKey, Quotas

from shoal.wire import ErrorCode as E
from shoal.wire import schema

DESCRIBE, ALTER = 50, 51
TENANT = "acme"
CALLER = key_record("KCALLER", TENANT, "caller-secret", 0)
SIBLING = key_record("KSIBLING", TENANT, "sibling-secret", 1)
REVOKED = replace(key_record("KREVOKED", TENANT, "x", 2), revoked_ms=3)
LEGACY = ApiKey("KLEGACY", TENANT, "scrypt$...", 4)
STRANGER = key_record("KSTRANGER", "other", "y", 5)
KEYS = (CALLER, SIBLING, REVOKED, LEGACY, STRANGER)


def context(api_key: int, bindings: Sequence[AclBinding]) -> RequestContext:
    access = TenantAccess(TENANT, CALLER.key_id, bindings, Quotas())
    return RequestContext(
        access,
        schema(api_key, 0),
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        acl_store=None,  # type: ignore[arg-type]
        tenant_keys=lambda tenant: [k for k in KEYS if k.tenant == tenant],
    )


def received(ctx: RequestContext, step: Step) -> Any:
    """The answer as the client decodes it."""
    assert isinstance(step, Answer)
    body, _ = ctx.api.read_response(memoryview(ctx.api.encode_body(step.response)), 0)
    return body


async def describe_users(names: Sequence[str] | None, bindings: Sequence[AclBinding]) -> Any:
    ctx = context(DESCRIBE, bindings)
    users = (
        None if names is None else tuple(ctx.api.make_request("UserName", name=n) for n in names)
    )
    return received(ctx, await describe(ctx, ctx.api.request(users=users)))


def by_user(response: Any) -> dict[str, Any]:
    return {r.user: r for r in response.results}


async def test_describe_all_lists_the_tenants_live_keys_with_both_mechanisms() -> None:
    response = await describe_users(None, default_bindings(TENANT, CALLER.key_id))
    assert response.error_code == E.none
    results = by_user(response)
    assert sorted(results) == ["KCALLER", "KSIBLING"]
    for result in results.values():
        assert result.error_code == E.none
        assert [(c.mechanism, c.iterations) for c in result.credential_infos] == [
            (1, 4096),
            (2, 4096),
        ]


async def test_an_empty_list_means_every_user_as_in_kafka() -> None:
    response = await describe_users([], default_bindings(TENANT, CALLER.key_id))
    assert sorted(by_user(response)) == ["KCALLER", "KSIBLING"]


async def test_keys_that_are_not_the_tenants_or_not_scram_users_do_not_exist() -> None:
    names = ["KSIBLING", "KSTRANGER", "KREVOKED", "KLEGACY", "KNOBODY"]
    results = by_user(await describe_users(names, default_bindings(TENANT, CALLER.key_id)))
    assert results["KSIBLING"].error_code == E.none
    for name in names[1:]:
        assert results[name].error_code == E.resource_not_found
        assert results[name].error_message == (
            "Attempt to describe a user credential that does not exist"
        )
        assert results[name].credential_infos == ()


async def test_a_user_named_twice_is_a_duplicate() -> None:
    results = by_user(
        await describe_users(["KSIBLING", "KSIBLING"], default_bindings(TENANT, CALLER.key_id))
    )
    assert results["KSIBLING"].error_code == E.duplicate_resource


async def test_describe_needs_describe_on_the_cluster() -> None:
    response = await describe_users(None, [])
    assert response.error_code == E.cluster_authorization_failed
    assert response.results == ()
    # A read-only key has it (it may look, as with DescribeAcls).
    allowed = await describe_users(None, read_only_bindings(TENANT, CALLER.key_id))
    assert allowed.error_code == E.none


async def test_alter_changes_nothing_and_says_to_rotate_the_key() -> None:
    ctx = context(ALTER, default_bindings(TENANT, CALLER.key_id))
    request = ctx.api.request(
        deletions=(ctx.api.make_request("ScramCredentialDeletion", name="KSIBLING", mechanism=1),),
        upsertions=(
            ctx.api.make_request(
                "ScramCredentialUpsertion",
                name="KCALLER",
                mechanism=2,
                iterations=8192,
                salt=b"salt",
                salted_password=b"x" * 64,
            ),
        ),
    )
    before = [k.to_json() for k in KEYS]
    results = by_user(received(ctx, await alter(ctx, request)))
    assert sorted(results) == ["KCALLER", "KSIBLING"]
    for result in results.values():
        assert result.error_code == E.cluster_authorization_failed
        assert "rotate the key" in result.error_message
    assert [k.to_json() for k in KEYS] == before


async def test_alter_is_refused_the_same_whatever_the_callers_rights() -> None:
    ctx = context(ALTER, read_only_bindings(TENANT, CALLER.key_id))
    request = ctx.api.request(
        deletions=(ctx.api.make_request("ScramCredentialDeletion", name="KCALLER", mechanism=1),),
        upsertions=(),
    )
    [result] = received(ctx, await alter(ctx, request)).results
    assert result.error_code == E.cluster_authorization_failed
    assert "rotate the key" in result.error_message
