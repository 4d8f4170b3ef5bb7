"""The OAuth 2.0 endpoints: the client-credentials token endpoint, discovery, JWKS.

``GET /oauth2/userinfo`` answers who a Bearer token (or API key) is to the
gateway, OpenID Connect's userinfo reduced to ``sub`` and ``tenant``.

``POST /oauth2/token`` (RFC 6749 section 4.4): form-encoded
``grant_type=client_credentials``; the client is an API key, authenticated
with ``client_secret_basic`` (HTTP Basic, id and secret form-encoded first as
section 2.3.1 says) or ``client_secret_post`` (``client_id`` and
``client_secret`` in the form), never both. Errors are RFC 6749's JSON
``{"error", "error_description"}`` (not the API's ``error_code`` body: OAuth
clients such as librdkafka read these names), ``invalid_client`` with 401 and
a ``WWW-Authenticate`` challenge. ``scope`` is accepted and recorded in the
token, but grants nothing: a token carries its key's ACLs.

Written by hand rather than with Authlib's ``AuthorizationServer``: Authlib
ships server integrations for Flask and Django only, and its grant classes
call client lookup and secret checks synchronously, while ours are async
(scrypt runs in a worker thread behind the key verifier's cache). Adapting
it would take more code than this one grant needs; the JOSE work is
Authlib's (joserfc).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Final
from urllib.parse import parse_qsl, unquote_plus

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from shoal.gateway.http.auth import Caller
from shoal.gateway.http.errors import COMMON_ERRORS, ApiError, ErrorCode
from shoal.gateway.oauth.authority import GatewayTokens, InvalidClientError
from shoal.gateway.oauth.keys import ALGORITHM

router = APIRouter(tags=["oauth"])

TOKEN_PATH: Final = "/oauth2/token"  # noqa: S105 - a path, not a secret
JWKS_PATH: Final = "/oauth2/jwks"
USERINFO_PATH: Final = "/oauth2/userinfo"
_MAX_FORM_BYTES: Final = 8192
_SCOPE: Final = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]+( [\x21\x23-\x5b\x5d-\x7e]+)*$")
_NO_STORE: Final = {"Cache-Control": "no-store", "Pragma": "no-cache"}
_CLIENT_CHALLENGE: Final = {**_NO_STORE, "WWW-Authenticate": 'Basic realm="shoal"'}


class TokenResponse(BaseModel):
    access_token: str
    token_type: str = "Bearer"  # noqa: S105 - RFC 6750's token type
    expires_in: int
    scope: str | None = None


class UserInfo(BaseModel):
    sub: str
    """The principal: an API key id, or an external token's principal claim."""
    tenant: str


class OAuthErrorBody(BaseModel):
    error: str
    error_description: str


class _OAuthError(Exception):
    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.error = error
        self.description = description
        self.status = status

    def response(self) -> JSONResponse:
        body = OAuthErrorBody(error=self.error, error_description=self.description)
        headers = _CLIENT_CHALLENGE if self.status == 401 else _NO_STORE
        return JSONResponse(body.model_dump(), status_code=self.status, headers=headers)


def _authority(request: Request) -> GatewayTokens:
    tokens = request.app.state.services.tokens
    if not isinstance(tokens, GatewayTokens):
        raise ApiError(ErrorCode.NOT_FOUND, "this gateway issues no tokens")
    return tokens


_FORM_BODY: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/x-www-form-urlencoded": {
                "schema": {
                    "type": "object",
                    "required": ["grant_type"],
                    "properties": {
                        "grant_type": {"type": "string", "enum": ["client_credentials"]},
                        "scope": {"type": "string"},
                        "client_id": {"type": "string"},
                        "client_secret": {"type": "string"},
                    },
                }
            }
        },
    }
}


@router.post(
    TOKEN_PATH,
    summary="Exchange an API key for an access token (client-credentials grant)",
    response_model=TokenResponse,
    response_model_exclude_none=True,
    responses={
        400: {"model": OAuthErrorBody, "description": "invalid_request, unsupported_grant_type"},
        401: {"model": OAuthErrorBody, "description": "invalid_client"},
    },
    openapi_extra=_FORM_BODY,
)
async def token(request: Request) -> JSONResponse:
    authority = _authority(request)
    try:
        form = await _read_form(request)
        grant_type = form.get("grant_type")
        if not grant_type:
            raise _OAuthError("invalid_request", "grant_type is missing")
        if grant_type != "client_credentials":
            raise _OAuthError(
                "unsupported_grant_type", "only grant_type=client_credentials is supported"
            )
        client_id, client_secret = _client_credentials(request, form)
        scope = form.get("scope") or None
        if scope is not None and (len(scope) > 1024 or not _SCOPE.match(scope)):
            raise _OAuthError("invalid_scope", "scope is not a space-separated list of tokens")
        try:
            issued = await authority.issue(client_id, client_secret, scope)
        except InvalidClientError as exc:
            raise _OAuthError("invalid_client", str(exc), 401) from None
    except _OAuthError as exc:
        return exc.response()
    body = TokenResponse(
        access_token=issued.access_token, expires_in=issued.expires_in, scope=issued.scope
    )
    return JSONResponse(body.model_dump(exclude_none=True), headers=_NO_STORE)


async def _read_form(request: Request) -> dict[str, str]:
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/x-www-form-urlencoded":
        raise _OAuthError("invalid_request", "send the form as application/x-www-form-urlencoded")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_FORM_BYTES:
            raise _OAuthError("invalid_request", "the form is too large")
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body))
    except (UnicodeDecodeError, ValueError):
        raise _OAuthError("invalid_request", "the form is not valid form encoding") from None
    form: dict[str, str] = {}
    for name, value in pairs:
        if name in form:
            # RFC 6749 section 3.2: a parameter must not be sent twice.
            raise _OAuthError("invalid_request", f"{name} is given more than once")
        form[name] = value
    return form


def _client_credentials(request: Request, form: dict[str, str]) -> tuple[str, str]:
    header = request.headers.get("authorization")
    in_form = "client_secret" in form
    if header is not None:
        if in_form:
            raise _OAuthError("invalid_request", "use one client authentication method, not two")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            raise _OAuthError("invalid_client", "authenticate with HTTP Basic", 401)
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise _OAuthError(
                "invalid_client", "the Basic credentials are malformed", 401
            ) from None
        raw_id, colon, raw_secret = decoded.partition(":")
        if not colon:
            raise _OAuthError("invalid_client", "the Basic credentials are malformed", 401)
        client_id, client_secret = unquote_plus(raw_id), unquote_plus(raw_secret)
        if form.get("client_id") not in (None, client_id):
            raise _OAuthError("invalid_request", "client_id differs from the authenticated client")
    else:
        client_id, client_secret = form.get("client_id", ""), form.get("client_secret", "")
    if not client_id or not client_secret:
        raise _OAuthError(
            "invalid_client", "give the API key id and secret as client credentials", 401
        )
    return client_id, client_secret


@router.get(
    "/.well-known/openid-configuration",
    summary="OAuth 2.0 / OpenID Connect discovery document",
)
async def discovery(request: Request) -> dict[str, Any]:
    issuer = _authority(request).policy.issuer
    base = issuer.rstrip("/")
    return {
        "issuer": issuer,
        "token_endpoint": base + TOKEN_PATH,
        "jwks_uri": base + JWKS_PATH,
        "userinfo_endpoint": base + USERINFO_PATH,
        "grant_types_supported": ["client_credentials"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        "response_types_supported": ["token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": [ALGORITHM],
    }


@router.get(JWKS_PATH, summary="The public keys tokens are signed with (JWKS)")
async def jwks(request: Request) -> JSONResponse:
    # Short caching: a rotated-in key must be fetchable before tokens signed with it.
    return JSONResponse(_authority(request).jwks(), headers={"Cache-Control": "public, max-age=60"})


@router.get(
    USERINFO_PATH,
    summary="Who the caller is to the gateway: principal and tenant",
    response_model=UserInfo,
    responses=COMMON_ERRORS,
)
async def userinfo(caller: Caller) -> UserInfo:
    """What a token (or API key) maps to: the check to run after configuring an
    external issuer's tenant and principal claims."""
    return UserInfo(sub=caller.key_id, tenant=caller.tenant)
