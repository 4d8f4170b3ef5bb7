"""The gateway's HTTP application: tenant routes, OAuth and health (metrics are
served on a port of their own, :mod:`shoal.gateway.metrics`).

Routes live in routers of their own modules; this one assembles them, maps
:class:`~shoal.gateway.http.errors.ApiError` and validation failures onto the
JSON error body, and answers the probes Kubernetes asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from shoal.gateway.apis.base import Lookups
from shoal.gateway.http import keys, routes, usage
from shoal.gateway.http.errors import (
    ApiError,
    ErrorBody,
    ErrorCode,
    api_error_handler,
    error_response,
    http_error_handler,
    validation_error_handler,
)
from shoal.gateway.http.oauth import router as oauth_router
from shoal.gateway.metrics import install_metrics
from shoal.gateway.tenant_client import BrokerPool, HomeBrokers
from starlette.exceptions import HTTPException as StarletteHTTPException

if TYPE_CHECKING:
    from shoal.gateway.server import GatewayServices

_DESCRIPTION = """\
Shoal's HTTP door for tenants: produce and read records, manage topics,
consumer groups and API keys, and read usage. Shaped after Confluent's REST v3
API. Authenticate with an API key (HTTP Basic: key id and secret) or a Bearer
JWT from `/oauth2/token`. Names are the tenant's own; errors are JSON
`{"error_code", "message"}`.
"""


MAX_BODY_BYTES: Final = 8 * 2**20
"""The largest request body a route reads whole (JSON is parsed in one piece, on
the event loop, and before the caller is authenticated: the bound keeps an
anonymous client from filling the gateway's memory). Larger produce requests
are streamed to ``.../records``, which reads records as they arrive."""


def build_api() -> FastAPI:
    """The routes, their documentation and error handling, without the services
    they use: exactly what ``/openapi.json`` describes, so tests can build the
    document without a cluster."""
    app = FastAPI(
        title="Shoal gateway",
        version="3",
        description=_DESCRIPTION,
        docs_url="/docs",
        openapi_url="/openapi.json",
        redoc_url=None,
    )
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    for exception, handler in routes.EXCEPTION_HANDLERS.items():
        app.add_exception_handler(exception, handler)
    # Set per router, not on the app: the app's limit answers in plain text
    # before the exception handlers, a router's raises into them (JSON, 41300).
    for router in (routes.router, keys.router, usage.router, oauth_router):
        app.include_router(router, max_body_size=MAX_BODY_BYTES)

    app.openapi = _with_raw_bodies(app)  # type: ignore[method-assign]

    @app.get("/healthz", tags=["health"], summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        summary="Tenancy records are loaded and brokers are known",
        responses={503: {"model": ErrorBody}},
    )
    async def readyz(request: Request) -> Any:
        services: GatewayServices = request.app.state.services
        if services.tenancy.snapshot.revision == 0 or not services.cluster.brokers:
            return error_response(ErrorCode.UNAVAILABLE, "not ready: no tenancy records or brokers")
        return JSONResponse({"status": "ready"})

    return app


def _with_raw_bodies(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """``app.openapi`` with the schemas of the bodies routes parse themselves."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schemas = generate().setdefault("components", {}).setdefault("schemas", {})
            for model in routes.RAW_BODIES:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                # FastAPI's own rendering of a shared component wins (it differs only
                # in style: no "default": null, float bounds).
                for name, nested in schema.pop("$defs", {}).items():
                    schemas.setdefault(name, nested)
                schemas.setdefault(model.__name__, schema)
        return app.openapi_schema  # type: ignore[return-value]

    return openapi


def create_app(services: GatewayServices, lookups: Lookups | None = None) -> FastAPI:
    """The application serving ``services``; ``lookups`` are the rewriters' (a
    listener's), needed by the Kafka-backed routes, which answer 503 without them."""
    app = build_api()
    app.state.services = services
    app.state.lookups = lookups
    app.state.broker_pool = BrokerPool()
    app.state.home_brokers = HomeBrokers()
    app.state.storage = services.storage
    if services.tracing is not None:
        services.tracing.instrument(app)
    install_metrics(app, services)
    return app
