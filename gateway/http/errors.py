"""The JSON error body every route answers with, shaped as Confluent's REST v3.

``{"error_code": 40403, "message": "..."}``: ``error_code`` is the HTTP status
times 100 plus a number that tells apart errors of one status, so a client
can branch on it without parsing the message. The codes are a contract:
never renumber one, only add.
"""

from __future__ import annotations

import enum

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel


class ErrorCode(enum.IntEnum):
    BAD_REQUEST = 40000
    INVALID_INPUT = 40001
    UNAUTHORIZED = 40100
    FORBIDDEN = 40300
    NOT_FOUND = 40400
    TOPIC_NOT_FOUND = 40403
    CONFLICT = 40900
    TOO_MANY_REQUESTS = 42900
    INTERNAL = 50000
    UNAVAILABLE = 50300


class ErrorBody(BaseModel):
    error_code: int
    message: str


class ApiError(Exception):
    """Raised by routes; answered as :class:`ErrorBody` with its HTTP status."""

    def __init__(
        self, code: ErrorCode, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.headers = headers

    @property
    def status(self) -> int:
        return int(self.code) // 100


def error_response(
    code: ErrorCode, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error_code=int(code), message=message)
    return JSONResponse(body.model_dump(), status_code=int(code) // 100, headers=headers)


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    del request
    assert isinstance(exc, ApiError)
    return error_response(exc.code, exc.message, exc.headers)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    del request
    assert isinstance(exc, RequestValidationError)
    problems = "; ".join(
        f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
    )
    return error_response(ErrorCode.INVALID_INPUT, problems or "invalid request")


# Every route may answer these; listing them keeps the OpenAPI document honest
# for clients and for schemathesis.
COMMON_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "The request is malformed."},
    401: {"model": ErrorBody, "description": "No valid API key or token."},
    403: {"model": ErrorBody, "description": "The tenant's ACLs do not allow it."},
}
