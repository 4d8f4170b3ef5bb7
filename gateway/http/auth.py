"""Who is calling: an API key as HTTP Basic, or a Bearer JWT.

Both end in the same :class:`~shoal.gateway.access.TenantAccess` the Kafka
door builds for a connection, so every route is held to the same ACLs,
namespace and quotas as a Kafka client with that key. Basic credentials are
checked by the tenancy view's verifier (its cache spares the slow hash on
every request); Bearer tokens by the gateway's token authority
(:mod:`shoal.gateway.oauth`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Protocol

from fastapi import Depends, Request
from fastapi.security import (
    HTTPAuthorizationCredentials,
    HTTPBasic,
    HTTPBasicCredentials,
    HTTPBearer,
)
from shoal.gateway.access import TenantAccess
from shoal.gateway.http.errors import ApiError, ErrorCode

_basic = HTTPBasic(auto_error=False, description="API key id and secret.")
_bearer = HTTPBearer(auto_error=False, description="A JWT from /oauth2/token or a trusted issuer.")
_CHALLENGE = {"WWW-Authenticate": 'Basic realm="shoal", Bearer realm="shoal"'}


class TokenError(Exception):
    """A Bearer token was refused; the message is safe to show the caller."""


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """A token that was accepted: what it allows, and for how long.

    ``current`` gives the rights again later (ACLs change; None once the key
    is revoked or the tenant deleted): a Kafka connection asks per request.
    """

    access: TenantAccess
    expires_at: float
    """The token's ``exp``, Unix seconds."""
    current: Callable[[], TenantAccess | None]


class TokenAuthority(Protocol):
    async def access(self, token: str) -> TenantAccess:
        """The rights the token carries; raises :class:`TokenError` if refused."""
        ...

    async def grant(self, token: str) -> TokenGrant:
        """The token checked, with its expiry; raises :class:`TokenError` if refused."""
        ...


def _unauthorized(message: str) -> ApiError:
    return ApiError(ErrorCode.UNAUTHORIZED, message, headers=_CHALLENGE)


async def caller(
    request: Request,
    basic: Annotated[HTTPBasicCredentials | None, Depends(_basic)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> TenantAccess:
    """The dependency every tenant route takes: the caller's rights, or 401."""
    services = request.app.state.services
    tenancy = services.tenancy
    if basic is not None:
        key = await tenancy.verifier.verify(basic.username, basic.password)
        if key is not None and tenancy.access(key.key_id) is None:
            # Made since the last poll: read the records now, as the Kafka door does.
            await tenancy.load()
        access: TenantAccess | None = None if key is None else tenancy.access(key.key_id)
        if access is None:
            raise _unauthorized("invalid API key or secret")
        return access
    if bearer is not None:
        authority: TokenAuthority | None = services.tokens
        if authority is None:
            raise _unauthorized("this gateway does not accept Bearer tokens")
        try:
            return await authority.access(bearer.credentials)
        except TokenError as exc:
            raise _unauthorized(str(exc)) from None
    raise _unauthorized("give an API key (HTTP Basic) or a Bearer token")


Caller = Annotated[TenantAccess, Depends(caller)]
