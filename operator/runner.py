"""Running the operator: kopf with our registry, settings and context, until told to stop.

``shoal operator`` calls :func:`run_operator` from its signal-handling loop;
the tests run it in a thread of its own (kopf, when it stops, cancels every
task of its loop that it did not find there when it started) with a context
that points at the fake API server and local brokers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import kopf
from shoal.operator.context import MEMO_KEY, OperatorContext
from shoal.operator.handlers import Peering, build_registry, operator_settings

from shoal.metrics import serve_metrics

Flag = asyncio.Event | threading.Event
"""What kopf takes as a stop or ready flag: the CLI passes asyncio's, tests threading's."""


async def run_operator(
    ctx: OperatorContext,
    stop: Flag,
    namespaces: Sequence[str] = (),
    liveness_endpoint: str | None = None,
    ready: Flag | None = None,
    metrics: tuple[str, int] | None = None,
    peering: Peering | None = None,
) -> None:
    """Serve Clusters, Topics and Tenants in ``namespaces`` (all when empty) until ``stop``.

    ``liveness_endpoint`` (e.g. ``http://0.0.0.0:8081/healthz``) is kopf's
    probe; ``ready`` is set once kopf has started watching; ``metrics`` is
    where to serve Prometheus metrics, if anywhere; ``peering``: one of
    several replicas (see :class:`~shoal.operator.handlers.Peering`), else
    the only one.
    """
    memo = kopf.Memo()
    memo[MEMO_KEY] = ctx
    server = await serve_metrics(ctx.metrics.registry, *metrics) if metrics else None
    try:
        await _run_kopf(ctx, memo, stop, namespaces, liveness_endpoint, ready, peering)
    except asyncio.CancelledError:
        # kopf ends a stop-flag shutdown by cancelling its own tasks and lets
        # the cancellation out: after a requested stop, that is a clean exit.
        if not stop.is_set():
            raise
    finally:
        if server is not None:
            server.close()
            await server.wait_closed()


async def _run_kopf(
    ctx: OperatorContext,
    memo: kopf.Memo,
    stop: Flag,
    namespaces: Sequence[str],
    liveness_endpoint: str | None,
    ready: Flag | None,
    peering: Peering | None,
) -> None:
    await kopf.operator(
        registry=build_registry(ctx.intervals),
        settings=operator_settings(namespaced=bool(namespaces), peering=peering),
        memo=memo,
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        liveness_endpoint=liveness_endpoint,
        standalone=peering is None,
        stop_flag=stop,
        ready_flag=ready,
    )
