"""DescribeClientQuotas and AlterClientQuotas: the platform admin's quota APIs.

Shoal's quotas are per tenant, so the one entity type is ``user`` and its
name is the tenant (``kafka-configs --entity-type users --entity-name acme``).
Keys are Kafka's ``producer_byte_rate``, ``consumer_byte_rate`` and
``controller_mutation_rate`` (partitions a second, KIP-599), plus Shoal's
``max_partitions``. Only keys made with ``--platform-admin`` may use
these APIs, because they see and change every tenant; any other key gets
CLUSTER_AUTHORIZATION_FAILED. The gateway answers them itself from the
tenancy records; no broker is involved.
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
}
_ADMIN_ONLY: Final = "client quotas are for platform admin keys only"


def _values(quotas: Quotas) -> dict[str, float]:
    return {
        key: float(value)
        for key, attribute in _KEYS.items()
        if (value := getattr(quotas, attribute)) is not None
    }


async def describe_client_quotas(ctx: RequestContext, request: Any) -> Step:
    api = ctx.api

    def refuse(code: E, message: str) -> Answer:
        return Answer(
            api.response(
                throttle_time=NO_THROTTLE, error_code=code, error_message=message, entries=None
            )
        )

    if not ctx.access.platform_admin:
        return refuse(E.cluster_authorization_failed, _ADMIN_ONLY)
    wanted: str | None = None
    for component in request.components:
        if component.entity_type != USER:
            if request.strict:
                return Answer(
                    api.response(
                        throttle_time=NO_THROTTLE, error_code=E.none, error_message=None, entries=()
                    )
                )
            continue
        if component.match_type == MATCH_EXACT:
            wanted = component.match
        elif component.match_type == MATCH_DEFAULT:
            # Shoal has no default-user quota; nothing matches.
            return Answer(
                api.response(
                    throttle_time=NO_THROTTLE, error_code=E.none, error_message=None, entries=()
                )
            )
    entries = []
    for tenant, quotas in sorted((await ctx.quota_store.all_quotas()).items()):
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
                if attribute == "max_partitions" and value is not None:
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
