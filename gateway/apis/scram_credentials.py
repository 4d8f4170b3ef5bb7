"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), for a tenant's own keys.

A SCRAM user is an API key: its id is the username, its credentials were
derived from its secret when it was minted (:mod:`shoal.tenancy.scram`). The
gateway answers both APIs from the tenancy records; no broker holds any.

* **Describe** needs DESCRIBE on the cluster, as in Kafka. No names (or an
  empty list) lists every live key of the caller's tenant that has SCRAM
  credentials, with each mechanism and its iterations; a named key that is
  not the tenant's, is revoked, or predates SCRAM is RESOURCE_NOT_FOUND with
  Kafka's message, so other tenants' key ids cannot be probed. A name asked
  for twice is DUPLICATE_RESOURCE, as Kafka answers it.
* **Alter** changes nothing. A key's SCRAM password is its secret, which the
  gateway never sees again after minting; an upsertion would give SCRAM a
  password that PLAIN and HTTP do not know, and a deletion would take SCRAM
  away from a key behind its owner's lifecycle (Tenant resource, HTTP API).
  Every user named gets CLUSTER_AUTHORIZATION_FAILED, whatever the caller's
  rights (nobody may do this over Kafka's API), with a message saying to
  rotate the key instead.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.gateway.apis.base import NO_THROTTLE, Answer, E, RequestContext, Step
from shoal.tenancy.model import ApiKey, Operation

_NOT_FOUND: Final = "Attempt to describe a user credential that does not exist"
_TWICE: Final = "Cannot describe SCRAM credentials for the same user twice in a single request"
_NOT_ALTERABLE: Final = (
    "SCRAM credentials of an API key are made from its secret when the key is minted;"
    " to change them, rotate the key (HTTP API or Tenant resource)"
)


def _live_with_scram(ctx: RequestContext) -> dict[str, ApiKey]:
    return {k.key_id: k for k in ctx.tenant_keys(ctx.access.tenant) if not k.revoked and k.scram}


async def describe(ctx: RequestContext, request: Any) -> Step:
    api = ctx.api
    if not ctx.access.may_cluster(Operation.DESCRIBE):
        return Answer(
            api.response(
                throttle_time=NO_THROTTLE,
                error_code=E.cluster_authorization_failed,
                error_message=None,
                results=(),
            )
        )
    keys = _live_with_scram(ctx)
    names = [u.name for u in request.users or ()]
    wanted = names or sorted(keys)
    results = []
    for name in dict.fromkeys(wanted):
        key = keys.get(name)
        if names.count(name) > 1:
            code, message, infos = E.duplicate_resource, _TWICE, ()
        elif key is None:
            code, message, infos = E.resource_not_found, _NOT_FOUND, ()
        else:
            code, message = E.none, None
            infos = tuple(
                api.make(
                    "CredentialInfo", mechanism=c.mechanism.kafka_type, iterations=c.iterations
                )
                for c in sorted(key.scram, key=lambda c: c.mechanism.kafka_type)
            )
        results.append(
            api.make(
                "DescribeUserScramCredentialsResult",
                user=name,
                error_code=code,
                error_message=message,
                credential_infos=infos,
            )
        )
    return Answer(
        api.response(
            throttle_time=NO_THROTTLE, error_code=E.none, error_message=None, results=tuple(results)
        )
    )


async def alter(ctx: RequestContext, request: Any) -> Step:
    api = ctx.api
    users = dict.fromkeys(
        [d.name for d in request.deletions] + [u.name for u in request.upsertions]
    )
    results = tuple(
        api.make(
            "AlterUserScramCredentialsResult",
            user=user,
            error_code=E.cluster_authorization_failed,
            error_message=_NOT_ALTERABLE,
        )
        for user in users
    )
    return Answer(api.response(throttle_time=NO_THROTTLE, results=results))
