"""The gateway's HTTP door: FastAPI, served in the gateway process.

Module map:

* :mod:`~shoal.gateway.http.app` - the application: routers, error handlers, health.
* :mod:`~shoal.gateway.http.auth` - who is calling: API key (HTTP Basic) or Bearer JWT.
* :mod:`~shoal.gateway.http.errors` - the JSON error body every route answers with.
* :mod:`~shoal.gateway.http.serving` - uvicorn inside the gateway's event loop.
* :mod:`~shoal.gateway.http.routes` - the Kafka-backed routes under ``/v3/clusters``;
  their controllers are :mod:`~shoal.gateway.http.topics`,
  :mod:`~shoal.gateway.http.records` and :mod:`~shoal.gateway.http.groups`, their
  bodies :mod:`~shoal.gateway.http.models`, their pure parts (partitioning, data
  types, streamed bodies) :mod:`~shoal.gateway.http.encoding`. Kafka goes through
  :mod:`shoal.gateway.tenant_client`.
"""
