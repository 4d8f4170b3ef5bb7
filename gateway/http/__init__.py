"""The gateway's HTTP door: FastAPI, served in the gateway process.

Module map:

* :mod:`~shoal.gateway.http.app` - the application: routers, error handlers, health.
* :mod:`~shoal.gateway.http.auth` - who is calling: API key (HTTP Basic) or Bearer JWT.
* :mod:`~shoal.gateway.http.errors` - the JSON error body every route answers with.
* :mod:`~shoal.gateway.http.serving` - uvicorn inside the gateway's event loop.
"""
