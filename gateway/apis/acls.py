"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31): a tenant's own bindings.

The gateway answers these itself from the tenancy store; no broker holds
ACLs (the brokers answer SECURITY_DISABLED, as Kafka without an authorizer).
What a tenant sees and changes, and why (docs/acls.md):

* **Only its own bindings.** Bindings are stored per tenant, resource names
  are the tenant's (``orders``, never ``acme.orders``), so no filter, however
  broad, selects or deletes another tenant's binding, and no pattern a tenant
  writes can reach another tenant's names.
* **Principals are Kafka's** ``User:<name>``: a key id for SASL/PLAIN, the
  token's principal for OAUTHBEARER (a key id for the gateway's own tokens),
  and ``User:*`` for every principal of the tenant. Other principal types
  name nobody here.
* **Kafka's permissions:** DESCRIBE on the cluster to describe, ALTER on the
  cluster to create or delete. The cluster is the tenant's own; a key's role
  gives DESCRIBE, and ALTER only where a Tenant resource grants it.
* **No escalation:** an ALLOW that would give anyone more than the calling
  key may do is refused (:mod:`shoal.gateway.acl_grants`).
* **Declared bindings stay:** a binding declared on the Tenant resource (or by
  a key's role, or with the CLI) is shown by DescribeAcls but only the
  operator changes it; DeleteAcls removes only bindings made with CreateAcls.
  A binding made with CreateAcls that repeats a declared one is kept beside
  it and shown once.
* **Hosts:** Shoal does not filter by client address, so every binding's host
  is ``*``; a creation for another host is refused rather than silently widened.

Error codes are Kafka's: CLUSTER_AUTHORIZATION_FAILED for the missing cluster
right (for every filter or creation, as Kafka's ``getErrorResponse`` fills
them), INVALID_REQUEST for a value Kafka's ``AclControlManager`` would refuse
or Shoal cannot hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import Any, Final, TypeVar

from shoal.gateway.acl_grants import ungranted
from shoal.gateway.apis.base import NO_THROTTLE, Answer, E, RequestContext, Step
from shoal.tenancy.acl import CLUSTER_NAME
from shoal.tenancy.acl_filter import AclFilter, PatternFilter
from shoal.tenancy.model import (
    AclBinding,
    BindingSource,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    TenancyError,
)
from shoal.tenancy.store import TenancyStoreError

USER: Final = "User:"
"""Kafka's principal type for an authenticated client (``KafkaPrincipal.USER_TYPE``)."""
ANY_HOST: Final = "*"
_UNKNOWN: Final = 0
_ANY: Final = 1
_DESCRIBE_REFUSED: Final = "describing ACLs needs DESCRIBE on the cluster"
_ALTER_REFUSED: Final = "creating or deleting ACLs needs ALTER on the cluster"


_Code = TypeVar("_Code", bound=IntEnum)


class AclRequestError(ValueError):
    """A creation or filter Kafka would call invalid, or Shoal cannot hold."""


# -- the wire's forms and the tenant's -----------------------------------------------


def principal_inward(principal: str) -> str:
    """``User:<name>`` -> ``<name>`` (``*`` for ``User:*``); other forms are refused."""
    kind, colon, name = principal.partition(":")
    if not colon or not kind:
        raise AclRequestError(f"principal {principal!r}: use User:<key id> or User:*")
    if kind + colon != USER or not name:
        raise AclRequestError(f"principal {principal!r}: a tenant's principals are User:<name>")
    return name


def principal_outward(principal: str) -> str:
    return USER + principal


def _enum_or_none(enum_type: Any, code: int, what: str) -> Any:
    """``code`` as a member of ``enum_type``; None for ANY; refuses UNKNOWN.

    A code Kafka knows but Shoal does not (resource type USER, operation
    CREATE_TOKENS) raises LookupError: a filter for it matches nothing.
    """
    if code == _UNKNOWN:
        raise AclRequestError(f"Unknown {what} in the filter.")
    if code == _ANY:
        return None
    try:
        return enum_type(code)
    except ValueError:
        raise LookupError(code) from None


def acl_filter(entity: Any) -> AclFilter | None:
    """A DescribeAcls request's or DeleteAcls filter's selection; None selects nothing
    here (a principal, host or resource type no binding of a tenant can have)."""
    try:
        pattern = PatternFilter(entity.pattern_type_filter)
    except ValueError:
        raise AclRequestError("Unknown patternFilter.") from None
    try:
        resource_type = _enum_or_none(ResourceType, entity.resource_type_filter, "resource type")
        operation = _enum_or_none(Operation, entity.operation, "operation")
        permission = _enum_or_none(Permission, entity.permission_type, "permission type")
    except LookupError:
        return None
    principal = None
    if entity.principal_filter is not None:
        try:
            principal = principal_inward(entity.principal_filter)
        except AclRequestError:
            return None
    if entity.host_filter not in (None, ANY_HOST):
        return None
    return AclFilter(
        resource_type, entity.resource_name_filter, pattern, principal, operation, permission
    )


_FILTER_ONLY: Final = {0: "UNKNOWN", 1: "ANY", 2: "MATCH"}
"""Codes a filter may hold and a binding may not (MATCH is a pattern type only)."""


def _creation_value(enum_type: type[_Code], code: int, what: str) -> _Code:
    """``code`` as a member of ``enum_type``, or Kafka's refusal, or Shoal's."""
    try:
        return enum_type(code)
    except ValueError:
        pass
    if code in _FILTER_ONLY and (code != 2 or enum_type is PatternType):
        raise AclRequestError(f"Invalid {what} {_FILTER_ONLY[code]}")
    held = ", ".join(member.name for member in enum_type)
    raise AclRequestError(f"{what} {code}: a tenant's bindings hold {held}")


def binding_from_creation(tenant: str, creation: Any) -> AclBinding:
    """A CreateAcls creation as one of ``tenant``'s bindings; refuses what Kafka's
    ``AclControlManager.validateNewAcl`` refuses (with its messages), and what a
    tenant cannot hold (resource type USER, operation CREATE_TOKENS, ...)."""
    resource_type = _creation_value(ResourceType, creation.resource_type, "resourceType")
    pattern_type = _creation_value(PatternType, creation.resource_pattern_type, "patternType")
    operation = _creation_value(Operation, creation.operation, "operation")
    permission = _creation_value(Permission, creation.permission_type, "permissionType")
    name = creation.resource_name
    if not name:
        raise AclRequestError("Invalid empty resource name")
    if resource_type == ResourceType.CLUSTER and name != CLUSTER_NAME:
        raise AclRequestError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if creation.host != ANY_HOST:
        raise AclRequestError(f"host {creation.host!r}: Shoal's bindings apply from any host (*)")
    return AclBinding(
        tenant,
        principal_inward(creation.principal),
        resource_type,
        pattern_type,
        name,
        operation,
        permission,
        BindingSource.KAFKA_API,
    )


def _entry_key(binding: AclBinding) -> tuple[int, str, int, int, str, int, int]:
    return (
        binding.resource_type,
        binding.resource_name,
        binding.pattern_type,
        binding.permission,
        binding.principal,
        binding.operation,
        0 if binding.source is BindingSource.DECLARED else 1,
    )


def _distinct(bindings: Iterable[AclBinding]) -> list[AclBinding]:
    """Sorted, and a binding made both ways shown once (the wire has no source)."""
    seen: dict[tuple[object, ...], AclBinding] = {}
    for binding in sorted(bindings, key=_entry_key):
        seen.setdefault(_entry_key(binding)[:-1], binding)
    return list(seen.values())


# -- DescribeAcls ----------------------------------------------------------------------


async def describe_acls(ctx: RequestContext, request: Any) -> Step:
    api = ctx.api

    def answer(code: E, message: str | None, bindings: Sequence[AclBinding] = ()) -> Answer:
        return Answer(
            api.response(
                throttle_time=NO_THROTTLE,
                error_code=code,
                error_message=message,
                resources=_resources(api, bindings),
            )
        )

    if not ctx.access.may_cluster(Operation.DESCRIBE):
        return answer(E.cluster_authorization_failed, _DESCRIBE_REFUSED)
    try:
        selection = acl_filter(request)
    except AclRequestError as exc:
        return answer(E.invalid_request, str(exc))
    if selection is None:
        return answer(E.none, None)
    try:
        bindings = await ctx.acl_store.bindings(ctx.access.tenant)
    except TenancyStoreError as exc:
        return answer(E.unknown_server_error, str(exc))
    return answer(E.none, None, [b for b in _distinct(bindings) if selection.matches(b)])


def _resources(api: Any, bindings: Sequence[AclBinding]) -> tuple[Any, ...]:
    """Kafka's DescribeAclsResponse shape: one entry per resource pattern, its ACLs inside."""
    by_pattern: dict[tuple[ResourceType, str, PatternType], list[AclBinding]] = {}
    for binding in bindings:
        pattern = (binding.resource_type, binding.resource_name, binding.pattern_type)
        by_pattern.setdefault(pattern, []).append(binding)
    return tuple(
        api.make(
            "DescribeAclsResource",
            resource_type=resource_type,
            resource_name=name,
            pattern_type=pattern_type,
            acls=tuple(
                api.make(
                    "AclDescription",
                    principal=principal_outward(b.principal),
                    host=ANY_HOST,
                    operation=b.operation,
                    permission_type=b.permission,
                )
                for b in acls
            ),
        )
        for (resource_type, name, pattern_type), acls in by_pattern.items()
    )


# -- CreateAcls ------------------------------------------------------------------------


async def create_acls(ctx: RequestContext, request: Any) -> Step:
    api = ctx.api
    access = ctx.access
    outcomes: list[tuple[E, str | None]] = []
    wanted: list[AclBinding] = []
    for creation in request.creations:
        if not access.may_cluster(Operation.ALTER):
            outcomes.append((E.cluster_authorization_failed, _ALTER_REFUSED))
            continue
        try:
            binding = binding_from_creation(access.tenant, creation)
        except (AclRequestError, TenancyError) as exc:
            outcomes.append((E.invalid_request, str(exc)))
            continue
        missing = ungranted(access, binding)
        if missing:
            # Kafka refuses a caller without the right to change ACLs with
            # CLUSTER_AUTHORIZATION_FAILED; granting beyond one's own rights is
            # the same kind of refusal, and clients report it as an authorization
            # error rather than a malformed request.
            names = ", ".join(op.name for op in missing)
            outcomes.append(
                (E.cluster_authorization_failed, f"this key may not grant what it lacks: {names}")
            )
            continue
        wanted.append(binding)
        outcomes.append((E.none, None))
    if wanted:
        try:
            await ctx.acl_store.add(access.tenant, wanted)
        except (TenancyStoreError, TenancyError) as exc:
            outcomes = [
                (E.unknown_server_error, str(exc)) if code == E.none else (code, message)
                for code, message in outcomes
            ]
    return Answer(
        api.response(
            throttle_time=NO_THROTTLE,
            results=tuple(
                api.make("AclCreationResult", error_code=code, error_message=message)
                for code, message in outcomes
            ),
        )
    )


# -- DeleteAcls ------------------------------------------------------------------------


async def delete_acls(ctx: RequestContext, request: Any) -> Step:
    api = ctx.api
    access = ctx.access

    def result(code: E, message: str | None, matched: Sequence[AclBinding] = ()) -> Any:
        return api.make(
            "DeleteAclsFilterResult",
            error_code=code,
            error_message=message,
            matching_acls=tuple(
                api.make(
                    "DeleteAclsMatchingAcl",
                    error_code=E.none,
                    error_message=None,
                    resource_type=b.resource_type,
                    resource_name=b.resource_name,
                    pattern_type=b.pattern_type,
                    principal=principal_outward(b.principal),
                    host=ANY_HOST,
                    operation=b.operation,
                    permission_type=b.permission,
                )
                for b in matched
            ),
        )

    def answer(results: Iterable[Any]) -> Answer:
        return Answer(api.response(throttle_time=NO_THROTTLE, filter_results=tuple(results)))

    if not access.may_cluster(Operation.ALTER):
        return answer(
            result(E.cluster_authorization_failed, _ALTER_REFUSED) for _ in request.filters
        )
    try:
        # Only what CreateAcls made is the tenant's to delete; declared bindings
        # are the Tenant resource's, and the operator would only put them back.
        made = [
            b
            for b in await ctx.acl_store.bindings(access.tenant)
            if b.source is BindingSource.KAFKA_API
        ]
    except TenancyStoreError as exc:
        return answer(result(E.unknown_server_error, str(exc)) for _ in request.filters)
    outcomes: list[tuple[E, str | None, list[AclBinding]]] = []
    doomed: dict[AclBinding, None] = {}
    for entity in request.filters:
        try:
            selection = acl_filter(entity)
        except AclRequestError as exc:
            outcomes.append((E.invalid_request, str(exc), []))
            continue
        matched = [] if selection is None else [b for b in made if selection.matches(b)]
        doomed.update(dict.fromkeys(matched))
        outcomes.append((E.none, None, matched))
    if doomed:
        try:
            await ctx.acl_store.remove(access.tenant, list(doomed))
        except TenancyStoreError as exc:
            return answer(result(E.unknown_server_error, str(exc)) for _ in request.filters)
    return answer(result(code, message, matched) for code, message, matched in outcomes)
