"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31): Kafka without an authorizer.

The brokers' listener is the platform's internal one; tenants' ACLs live in
the tenancy store and the gateway serves them (docs/acls.md). A broker holds
no ACLs, so it answers as Apache Kafka does when ``authorizer.class.name`` is
unset (``AclApis``): SECURITY_DISABLED with Kafka's own messages, on the
response for DescribeAcls and on every creation or filter for the others.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext

_DESCRIBE_MESSAGE: Final = "No Authorizer is configured on the broker"
_ALTER_MESSAGE: Final = "No Authorizer is configured."


async def handle_describe_acls(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    return ctx.api.response(
        throttle_time=NO_THROTTLE,
        error_code=E.security_disabled,
        error_message=_DESCRIBE_MESSAGE,
        resources=(),
    )


async def handle_create_acls(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    return api.response(
        throttle_time=NO_THROTTLE,
        results=tuple(
            api.make(
                "AclCreationResult", error_code=E.security_disabled, error_message=_ALTER_MESSAGE
            )
            for _ in request.creations
        ),
    )


async def handle_delete_acls(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api
    return api.response(
        throttle_time=NO_THROTTLE,
        filter_results=tuple(
            api.make(
                "DeleteAclsFilterResult",
                error_code=E.security_disabled,
                error_message=_ALTER_MESSAGE,
                matching_acls=(),
            )
            for _ in request.filters
        ),
    )
