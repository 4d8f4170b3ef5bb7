"""Broker pods: whether one is Ready, and restarting one for the roller.

The broker StatefulSet uses ``updateStrategy: OnDelete``: Kubernetes
recreates a deleted pod from the current template but never replaces one on
its own, so the roller decides when each broker restarts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from shoal.operator.builders import TEMPLATE_HASH
from shoal.operator.kube import KubeClient

log = logging.getLogger(__name__)


class PodNotBack(Exception):  # noqa: N818 (reads as what happened)
    """A restarted pod did not come back Ready with the wanted template in time."""


class TemplateNotSeen(PodNotBack):
    """The StatefulSet controller did not take up the applied template in time."""


def pod_ready(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_template_hash(pod: Mapping[str, Any]) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(TEMPLATE_HASH)
    return value if isinstance(value, str) else None


async def template_seen(
    kube: KubeClient, namespace: str, statefulset: str, timeout_s: float, poll_s: float
) -> None:
    """Wait until the StatefulSet controller has seen ``statefulset``'s latest spec.

    A pod deleted before then is made again from the template the controller
    last saw: the old one, right after an apply. The roller would wait for the
    new template in vain and, on its next attempt, restart that broker again.
    """
    generation = 0

    async def seen() -> bool:
        nonlocal generation
        found = await kube.get("apps/v1", "StatefulSet", namespace, statefulset)
        if found is None:
            raise TemplateNotSeen(f"StatefulSet {statefulset} is gone")
        generation = found["metadata"].get("generation", 0)
        return bool((found.get("status") or {}).get("observedGeneration", 0) >= generation)

    if not await _polled(seen, timeout_s, poll_s):
        raise TemplateNotSeen(
            f"the StatefulSet controller did not take up generation {generation} of "
            f"{statefulset} in {timeout_s:g} s"
        )


async def restart_pod(
    kube: KubeClient,
    namespace: str,
    name: str,
    template_hash: str,
    timeout_s: float,
    poll_s: float,
) -> None:
    """Delete pod ``name`` and wait until its successor is Ready with ``template_hash``.

    Returns only after the old pod is gone (not merely terminating), as the
    roller requires: until then the old broker may still hold its ISR places.
    """
    old = await kube.get("v1", "Pod", namespace, name)
    old_uid = (old or {}).get("metadata", {}).get("uid")
    await kube.delete("v1", "Pod", namespace, name)
    log.info("event=broker_pod_deleted namespace=%s pod=%s", namespace, name)

    async def back() -> bool:
        pod = await kube.get("v1", "Pod", namespace, name)
        return (
            pod is not None
            and pod["metadata"].get("uid") != old_uid
            and pod_template_hash(pod) == template_hash
            and pod_ready(pod)
        )

    if not await _polled(back, timeout_s, poll_s):
        raise PodNotBack(
            f"pod {name} did not come back Ready with the new template in {timeout_s:g} s"
        )


async def _polled(check: Callable[[], Awaitable[bool]], timeout_s: float, poll_s: float) -> bool:
    """Whether ``check`` came true, asked every ``poll_s`` for ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(poll_s)
    return True
