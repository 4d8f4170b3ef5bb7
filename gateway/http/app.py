"""The gateway's HTTP application: tenant routes, OAuth, health and metrics.

Routes live in routers of their own modules; this one assembles them, maps
:class:`~shoal.gateway.http.errors.ApiError` and validation failures onto the
JSON error body, and answers the probes Kubernetes asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from shoal.gateway.http.errors import (
    ApiError,
    ErrorBody,
    ErrorCode,
    api_error_handler,
    error_response,
    validation_error_handler,
)
from shoal.gateway.http.oauth import router as oauth_router

if TYPE_CHECKING:
    from shoal.gateway.server import GatewayServices

_DESCRIPTION = """\
Shoal's HTTP door for tenants: produce and read records, manage topics,
consumer groups and API keys, and read usage. Shaped after Confluent's REST v3
API. Authenticate with an API key (HTTP Basic: key id and secret) or a Bearer
JWT from `/oauth2/token`. Names are the tenant's own; errors are JSON
`{"error_code", "message"}`.
"""


def create_app(services: GatewayServices) -> FastAPI:
    app = FastAPI(
        title="Shoal gateway",
        version="3",
        description=_DESCRIPTION,
        docs_url="/docs",
        openapi_url="/openapi.json",
        redoc_url=None,
    )
    app.state.services = services
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.include_router(oauth_router)

    @app.get("/healthz", tags=["health"], summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        summary="Tenancy records are loaded and brokers are known",
        responses={503: {"model": ErrorBody}},
    )
    async def readyz() -> Any:
        if services.tenancy.snapshot.revision == 0 or not services.cluster.brokers:
            return error_response(ErrorCode.UNAVAILABLE, "not ready: no tenancy records or brokers")
        return JSONResponse({"status": "ready"})

    return app
