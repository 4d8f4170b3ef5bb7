"""uvicorn inside the gateway's event loop, next to the Kafka listeners."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signals to its host process.

    uvicorn installs its own SIGINT/SIGTERM handlers while serving and re-raises
    the signal when it stops; the gateway already turns those signals into an
    orderly stop of every listener, HTTP included.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def embedded_server(app: FastAPI, host: str, port: int) -> EmbeddedServer:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        # Streamed produce requests may stay open as long as the client writes.
        timeout_keep_alive=30,
        timeout_graceful_shutdown=5,
    )
    return EmbeddedServer(config)
