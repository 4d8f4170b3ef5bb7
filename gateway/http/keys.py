"""``/v3/api-keys``: the caller's tenant's API keys, listed, made and revoked.

Thin: parse, call :class:`~shoal.gateway.keys.KeyManager`, answer. The rules
(one tenant's keys only, another tenant's key id answers 404 as a missing
one does, no key can make or revoke a key with rights it lacks, revocation
applies at once on this gateway) are that module's and are written there.

A key's secret appears once, in the answer to its creation; no answer ever
carries a hash.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, Field
from shoal.gateway.http.auth import Caller
from shoal.gateway.http.errors import COMMON_ERRORS, ApiError, ErrorBody, ErrorCode
from shoal.gateway.keys import KeyForbiddenError, KeyManager, KeyNotFoundError
from shoal.tenancy.model import ApiKey, TenancyError
from shoal.tenancy.store import TenancyStoreError

router = APIRouter(prefix="/v3/api-keys", tags=["api-keys"])

Responses = dict[int | str, dict[str, object]]
_NOT_FOUND: Responses = {
    404: {"model": ErrorBody, "description": "No such key in the caller's tenant."}
}
_UNAVAILABLE: Responses = {
    503: {"model": ErrorBody, "description": "The tenancy store is unreachable."}
}

KeyId = Annotated[str, Path(min_length=1, max_length=64, description="The key's id.")]


class KeyInfo(BaseModel):
    id: str = Field(description="The key id: the SASL/PLAIN username, the HTTP Basic user.")
    description: str
    created: datetime
    revoked: bool
    revoked_at: datetime | None = None
    scram_mechanisms: list[str] = Field(
        default_factory=list,
        description="SASL/SCRAM mechanisms the key signs in with; empty for a key made"
        " before SCRAM sign-in existed (rotate it to use SCRAM).",
    )


class KeyList(BaseModel):
    data: list[KeyInfo]


class NewKey(BaseModel):
    description: str = Field("", max_length=256, description="What the key is for.")
    read_only: bool = Field(
        False, description="Read and describe only (consume, join groups), never write or change."
    )


class CreatedKeyInfo(KeyInfo):
    secret: str = Field(description="The key's secret: shown now and never again.")
    read_only: bool


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _info(key: ApiKey) -> KeyInfo:
    return KeyInfo(
        id=key.key_id,
        description=key.description,
        created=_time(key.created_ms),
        revoked=key.revoked,
        revoked_at=None if key.revoked_ms is None else _time(key.revoked_ms),
        scram_mechanisms=[c.mechanism.value for c in key.scram],
    )


def _manager(request: Request) -> KeyManager:
    return KeyManager(request.app.state.services.tenancy)


def _translate(exc: Exception) -> ApiError:
    if isinstance(exc, KeyNotFoundError):
        return ApiError(ErrorCode.NOT_FOUND, str(exc))
    if isinstance(exc, KeyForbiddenError):
        return ApiError(ErrorCode.FORBIDDEN, str(exc))
    if isinstance(exc, TenancyError):
        # The caller's tenant was deleted between authentication and the write.
        return ApiError(ErrorCode.UNAUTHORIZED, str(exc))
    return ApiError(ErrorCode.UNAVAILABLE, "the tenancy store is unreachable; try again")


_ERRORS = (KeyNotFoundError, KeyForbiddenError, TenancyError, TenancyStoreError)


@router.get(
    "",
    summary="List the tenant's API keys (never their secrets)",
    responses={**COMMON_ERRORS, **_UNAVAILABLE},
)
async def list_keys(request: Request, caller: Caller) -> KeyList:
    try:
        keys = await _manager(request).list(caller)
    except _ERRORS as exc:
        raise _translate(exc) from None
    return KeyList(data=[_info(k) for k in keys])


@router.post(
    "",
    status_code=201,
    summary="Create an API key; its secret is in this answer only",
    responses={**COMMON_ERRORS, **_UNAVAILABLE},
)
async def create_key(request: Request, caller: Caller, body: NewKey) -> CreatedKeyInfo:
    try:
        created = await _manager(request).create(caller, body.description, body.read_only)
    except _ERRORS as exc:
        raise _translate(exc) from None
    return CreatedKeyInfo(
        **_info(created.key).model_dump(), secret=created.secret, read_only=body.read_only
    )


@router.get(
    "/{key_id}",
    summary="Describe one of the tenant's API keys",
    responses={**COMMON_ERRORS, **_NOT_FOUND, **_UNAVAILABLE},
)
async def get_key(request: Request, caller: Caller, key_id: KeyId) -> KeyInfo:
    try:
        key = await _manager(request).get(caller, key_id)
    except _ERRORS as exc:
        raise _translate(exc) from None
    return _info(key)


@router.delete(
    "/{key_id}",
    status_code=204,
    summary="Revoke one of the tenant's API keys",
    description="The key stops authenticating at once on this gateway and its Kafka "
    "connections close; other gateways follow within their tenancy poll.",
    responses={**COMMON_ERRORS, **_NOT_FOUND, **_UNAVAILABLE},
)
async def revoke_key(request: Request, caller: Caller, key_id: KeyId) -> Response:
    try:
        await _manager(request).revoke(caller, key_id)
    except _ERRORS as exc:
        raise _translate(exc) from None
    return Response(status_code=204)
