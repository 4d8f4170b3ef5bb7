"""DescribeClientQuotas and AlterClientQuotas: quotas as Kafka's admin tools read and set them.

Shoal's quotas are per tenant, so the one entity type is ``user`` and its
name is the tenant (``kafka-configs --entity-type users --entity-name acme``).
Keys are Kafka's ``producer_byte_rate``, ``consumer_byte_rate``,
``controller_mutation_rate`` (partitions a second, KIP-599) and
``connection_creation_rate`` (connections a second, KIP-612; a Tenant's
``maxConnectionRate``) and ``request_percentage`` (percent of a request
thread's time, KIP-124; a Tenant's ``requestPercentage``), plus Shoal's ``max_partitions`` and
``max_storage_bytes``. The gateway answers both APIs itself from the tenancy
records; no broker is involved.

Who sees what: a key made with ``--platform-admin`` sees and changes every
tenant's quotas. Any other key may describe its own tenant's quotas, so that
a client can learn the limits it works within (``kafka-configs --describe
--entity-type users`` with the tenant's credentials): with no filter, a
``user`` match-any, or an exact match of its own tenant's name, it sees its
own entry and nobody else's; an exact match of any other name answers an
empty list, the same answer as for a name that does not exist, so a tenant
learns nothing of other tenants, not even whether they exist. A tenant's
answer comes from the records the gateway enforces (read every poll), a
platform admin's from etcd. Only platform admin keys may alter quotas; any
other key gets CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from dataclasses import replace as replace_record
from typing import Any, Final

from shoal.gateway.apis.base import NO_THROTTLE, Answer, E, RequestContext, Step
from shoal.tenancy.model import Quotas

USER: Final = "user"
MATCH_EXACT: Final = 0
MATCH_DEFAULT: Final = 1
MATCH_ANY: Final = 2
_KEYS: Final = {
    "producer_byte_rate": "producer_byte_rate",
    "consumer_byte_rate": "consumer_byte_rate",
    "max_partitions": "max_partitions",
    "controller_mutation_rate": "controller_mutation_rate",
    "max_storage_bytes": "max_storage_bytes",
    "connection_creation_rate": "max_connection_rate",
    "request_percentage": "request_percentage",
}
_WHOLE_NUMBERS: Final = frozenset({"max_partitions", "max_storage_bytes"})
_ADMIN_ONLY: Final = "only platform admin keys may alter client quotas"


def _values(quotas: Quotas) -> dict[str, float]:
    return {
        key: float(value)
        for key, attribute in _KEYS.items()
        if (value := getattr(quotas, attribute)) is not None
    }


async def describe_client_quotas(ctx: RequestContext, request: Any) -> Step:
    api = ctx.api

    nothing = Answer(
        api.response(throttle_time=NO_THROTTLE, error_code=E.none, error_message=None, entries=())
    )
    wanted: str | None = None
    for component in request.components:
        if component.entity_type != USER:
            if request.strict:
                return nothing
            continue
        if component.match_type == MATCH_EXACT:
            wanted = component.match
        elif component.match_type == MATCH_DEFAULT:
            # Shoal has no default-user quota; nothing matches.
            return nothing
    # A tenant's key sees its own tenant's entry only, the quotas the gateway enforces
    # on it now (no etcd read on its behalf); asking for another name finds nothing,
    # as a name that does not exist finds nothing.
    access = ctx.access
    known = (
        await ctx.quota_store.all_quotas()
        if access.platform_admin
        else {access.tenant: access.quotas}
    )
    entries = []
    for tenant, quotas in sorted(known.items()):
        values = _values(quotas)
        if (wanted is not None and tenant != wanted) or not values:
            continue
        entries.append(
            api.make(
                "EntryData",
                entity=(api.make("EntityData", entity_type=USER, entity_name=tenant),),
                values=tuple(
                    api.make("ValueData", key=key, value=value) for key, value in values.items()
                ),
            )
        )
    return Answer(
        api.response(
            throttle_time=NO_THROTTLE, error_code=E.none, error_message=None, entries=tuple(entries)
        )
    )


async def alter_client_quotas(ctx: RequestContext, request: Any) -> Step:
    api = ctx.api
    known = await ctx.quota_store.all_quotas() if ctx.access.platform_admin else {}
    results = []
    for entry in request.entries:
        code, message = E.none, None
        tenant = None
        if not ctx.access.platform_admin:
            code, message = E.cluster_authorization_failed, _ADMIN_ONLY
        elif len(entry.entity) != 1 or entry.entity[0].entity_type != USER:
            code, message = E.invalid_request, "quotas are set per tenant: one 'user' entity"
        else:
            tenant = entry.entity[0].entity_name
            if tenant not in known:
                code, message = E.invalid_request, f"tenant {tenant!r} does not exist"
        if code == E.none and tenant is not None:
            quotas = known[tenant]
            for op in entry.ops:
                attribute = _KEYS.get(op.key)
                if attribute is None:
                    code, message = E.invalid_request, f"unknown quota key {op.key!r}"
                    break
                value: float | int | None = None if op.remove else op.value
                if value is not None and value <= 0:
                    code, message = E.invalid_request, f"{op.key} must be positive"
                    break
                if attribute in _WHOLE_NUMBERS and value is not None:
                    value = int(value)
                quotas = replace_record(quotas, **{attribute: value})  # type: ignore[arg-type]
            if code == E.none and not request.validate_only:
                await ctx.quota_store.set_quotas(tenant, quotas)
        results.append(
            api.make(
                "EntryData",
                error_code=code,
                error_message=message,
                entity=tuple(
                    api.make("EntityData", entity_type=e.entity_type, entity_name=e.entity_name)
                    for e in entry.entity
                ),
            )
        )
    return Answer(api.response(throttle_time=NO_THROTTLE, entries=tuple(results)))
