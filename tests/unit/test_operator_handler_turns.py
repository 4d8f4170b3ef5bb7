"""An object's handlers and timers take turns, and a timer reports only what it saw.

kopf hands timers (and, once an object has a timer, its handlers too) a live
body that it replaces in place as watch events arrive. These tests stand in
for that replacement during the one await that matters.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping
from typing import Any, cast

import pytest
from shoal.operator import handlers
from shoal.operator.cluster_reconcile import ClusterHealth
from shoal.operator.cluster_spec import ClusterSpec
from shoal.operator.context import OperatorContext
from shoal.operator.endpoints import ClusterEndpoints


def context() -> OperatorContext:
    ctx = OperatorContext(default_image="shoal:test")
    ctx.kube = cast(Any, object())  # never called: observing and writing are stood in for
    return ctx


async def test_the_cluster_timer_writes_the_generation_and_spec_it_observed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    meta: dict[str, Any] = {"generation": 2}
    spec: dict[str, Any] = {"brokers": {"replicas": 4}}
    status: dict[str, Any] = {"observedGeneration": 2, "brokers": {"desired": 4, "ready": 4}}
    written: list[Mapping[str, Any]] = []

    async def observe(
        kube: Any, namespace: str, name: str, cluster: ClusterSpec, endpoints: ClusterEndpoints
    ) -> ClusterHealth:
        # Meanwhile the user scales down to three: kopf replaces the body in place.
        meta["generation"] = 3
        spec["brokers"]["replicas"] = 3
        return ClusterHealth(desired=cluster.brokers, ready=cluster.brokers, partitions=6)

    async def write_status(
        kube: Any, kind: str, namespace: str, name: str, fresh: Mapping[str, Any]
    ) -> None:
        written.append(fresh)

    monkeypatch.setattr(handlers, "observe", observe)
    monkeypatch.setattr(handlers, "_write_status", write_status)
    await handlers._cluster_observe(context(), "demo", "streams", meta, spec, status)

    [fresh] = written
    assert fresh["observedGeneration"] == 2
    assert fresh["brokers"] == {"desired": 4, "ready": 4}
    assert all(c["observedGeneration"] == 2 for c in fresh["conditions"])


async def test_the_cluster_timer_leaves_an_unreconciled_generation_to_its_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def fail(*args: Any) -> None:
        raise AssertionError("the timer must not observe or write")

    monkeypatch.setattr(handlers, "observe", fail)
    monkeypatch.setattr(handlers, "_write_status", fail)
    await handlers._cluster_observe(
        context(), "demo", "streams", {"generation": 3}, {}, {"observedGeneration": 2}
    )


async def test_one_object_one_lock_and_a_waiter_runs_after_the_holder() -> None:
    ctx = context()
    lock = ctx.lock("Topic", "streams", "orders")
    assert ctx.lock("Topic", "streams", "orders") is lock
    assert ctx.lock("Tenant", "streams", "orders") is not lock
    assert ctx.lock("Topic", "other", "orders") is not lock

    order: list[str] = []

    async def turn(who: str) -> None:
        async with ctx.lock("Topic", "streams", "orders"):
            order.append(f"{who} in")
            await asyncio.sleep(0.01)
            order.append(f"{who} out")

    await asyncio.gather(turn("handler"), turn("timer"))
    assert order == ["handler in", "handler out", "timer in", "timer out"]


def test_a_lock_nobody_holds_is_dropped() -> None:
    ctx = context()
    ctx.lock("Topic", "streams", "gone")
    gc.collect()
    assert ("Topic", "streams", "gone") not in ctx._locks
