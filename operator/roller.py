"""Rolling restarts of brokers, one at a time, as Strimzi's KafkaRoller does them.

Whether a broker may restart is asked of the cluster (Metadata's leaders and
ISRs, each topic's ``min.insync.replicas``), never of Kubernetes: a pod can be
Ready while its replicas are still catching up.

The rule (:func:`restart_blockers`), for every partition the broker hosts:

* **The broker is not in the ISR**: its restart cannot shrink the ISR, so it
  never blocks, whatever state the partition is in. Strimzi blocks when such a
  partition is already under min ISR ("it might be first to catch up"); we do
  not, because the broker that is down or lagging is often the one whose
  restart repairs the partition (a crash-looping pod whose spec was fixed), and
  a follower keeps its log across the restart, so it loses little catch-up.
* **The partition is offline** (no leader): nothing serves it, so a restart
  cannot make it worse. The controller keeps the last ISR of an offline
  partition, so this broker may still be listed there while it is down.
* **Replication factor 1**: nothing can keep such a partition available
  through a restart of its only replica; blocking would forbid every roll of
  a cluster holding one. Allowed (Strimzi allows it too); the restart's log
  line counts these unavoidable outages.
* **The broker is the last member of the ISR** (replication factor above 1):
  blocked. Its restart takes the partition offline, while waiting lets a
  lagging replica rejoin first.
* **Replication factor above min.insync.replicas**: blocked when the ISR
  without this broker would be smaller than min.insync.replicas; that
  includes a partition already under its minimum where this broker is one of
  the few in-sync copies left (Strimzi's rule exactly).
* **Replication factor at or below min.insync.replicas** (above 1): allowed
  unless it is the last ISR member. Every restart of any of its replicas
  stalls ``acks=all`` producers whatever the order, so waiting never helps;
  Strimzi allows these too.

Internal topics (the consumer offsets topic) are ordinary topics here and
follow the same rule, so a broker holding the only in-sync copy of an offsets
partition waits like any other.

:class:`Roller` polls that rule until it holds (bounded), restarts the broker,
then waits (bounded) until the broker is registered again and back in the ISR
of every partition it replicates, before the next one: at most one broker is
ever out of the ISRs because of the roller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from typing import Final

from shoal.operator.cluster_state import PartitionInfo
from shoal.operator.kafka_admin import ClusterAdmin, KafkaAdminError

log = logging.getLogger(__name__)

DEFAULT_MIN_ISR: Final = 1
"""Kafka's default min.insync.replicas, for a topic whose config could not be read
(it appeared or vanished between two requests)."""
SHOWN_REASONS: Final = 5
"""How many reasons an exception's message spells out; ``.reasons`` keeps them all."""


def _summary(reasons: Sequence[str]) -> str:
    shown = "; ".join(reasons[:SHOWN_REASONS])
    more = len(reasons) - SHOWN_REASONS
    return f"{shown}; and {more} more" if more > 0 else shown


class RollBlocked(Exception):  # noqa: N818 (the name other modules catch)
    """The broker did not become safe to restart in time; it was not restarted."""

    def __init__(self, node_id: int, reasons: Sequence[str]) -> None:
        self.node_id = node_id
        self.reasons = list(reasons)
        super().__init__(f"broker {node_id} cannot restart safely: {_summary(self.reasons)}")


class RollStalled(Exception):  # noqa: N818 (the name other modules catch)
    """The broker was restarted but did not rejoin every ISR in time; the roll stops here."""

    def __init__(self, node_id: int, reasons: Sequence[str]) -> None:
        self.node_id = node_id
        self.reasons = list(reasons)
        super().__init__(f"broker {node_id} has not rejoined: {_summary(self.reasons)}")


def _name(p: PartitionInfo) -> str:
    return f"{p.topic}-{p.partition}"


def restart_blockers(
    node_id: int, partitions: Sequence[PartitionInfo], min_isr: Mapping[str, int]
) -> list[str]:
    """Why broker ``node_id`` must not restart now, one reason per partition; empty = safe.

    ``partitions`` may hold the whole cluster (other brokers' partitions are
    ignored); ``min_isr`` maps topics to min.insync.replicas. The rule is the
    module's docstring.
    """
    reasons = []
    for p in partitions:
        if node_id not in p.isr or p.offline or len(p.replicas) <= 1:
            continue
        minimum = min_isr.get(p.topic, DEFAULT_MIN_ISR)
        remaining = len(p.isr) - 1
        if remaining == 0:
            reasons.append(
                f"{_name(p)}: broker {node_id} is its last in-sync replica "
                f"(replicas {list(p.replicas)}, ISR {list(p.isr)}); a restart takes it offline"
            )
        elif len(p.replicas) > minimum and remaining < minimum:
            reasons.append(
                f"{_name(p)}: ISR {list(p.isr)} without broker {node_id} has {remaining} "
                f"member(s), below min.insync.replicas={minimum}"
            )
    return reasons


def rejoin_pending(
    node_id: int, partitions: Sequence[PartitionInfo], offline_before: Collection[tuple[str, int]]
) -> list[str]:
    """Partitions replicated on ``node_id`` whose ISR it has not rejoined; empty = rejoined.

    A partition that was offline before the restart (``offline_before``, as
    (topic, partition)) is not waited for: with no leader to follow, the
    broker cannot rejoin it. Any other must have a leader and list the broker
    in its ISR.
    """
    pending = []
    for p in partitions:
        if node_id not in p.replicas or (p.topic, p.partition) in offline_before:
            continue
        if p.offline:
            pending.append(f"{_name(p)}: no leader yet")
        elif node_id not in p.isr:
            pending.append(f"{_name(p)}: broker {node_id} not in ISR {list(p.isr)}")
    return pending


def roll_order(
    node_ids: Iterable[int], controller_id: int | None, registered: Collection[int]
) -> list[int]:
    """The order to restart ``node_ids`` in.

    As Strimzi: brokers that are not registered first (they serve nothing,
    and restarting them is what repairs their partitions), then the others by
    id descending (a StatefulSet's own order), the controller last so that the
    cluster changes controller once, not at every step.
    """

    def rank(node: int) -> tuple[int, int]:
        if node not in registered:
            group = 0
        elif node == controller_id:
            group = 2
        else:
            group = 1
        return group, -node

    return sorted(set(node_ids), key=rank)


class Roller:
    """Restarts brokers one at a time, each only when the cluster says it is safe.

    Every wait is bounded; the roller raises rather than waits forever, so the
    caller (a kopf handler) can report the reason and retry later.
    """

    def __init__(
        self,
        admin: ClusterAdmin,
        *,
        safe_timeout_s: float = 300,
        rejoin_timeout_s: float = 600,
        poll_s: float = 2,
    ) -> None:
        self._admin = admin
        self.safe_timeout_s = safe_timeout_s
        self.rejoin_timeout_s = rejoin_timeout_s
        self.poll_s = poll_s

    async def order(self, node_ids: Iterable[int]) -> list[int]:
        """``node_ids`` in :func:`roll_order`, with the cluster's registrations and controller."""
        registered = await self._admin.broker_ids()
        return roll_order(node_ids, await self._admin.controller_id(), registered)

    async def roll(
        self, node_ids: Sequence[int], restart: Callable[[int], Awaitable[None]]
    ) -> None:
        """Restart every broker of ``node_ids``, in that order, one at a time."""
        for node_id in node_ids:
            await self.restart_safely(node_id, partial(restart, node_id))

    async def restart_safely(self, node_id: int, restart: Callable[[], Awaitable[None]]) -> None:
        """Wait until ``node_id`` may restart, call ``restart``, wait until it has rejoined.

        ``restart`` must return only once the old broker process has stopped
        (for a pod: deleted and gone, not merely marked for deletion);
        otherwise the old process's registration and ISR memberships would
        pass for the new one's.

        Raises :class:`RollBlocked` (``restart`` not called) or
        :class:`RollStalled` (called, but the broker did not rejoin in time).
        """
        blockers = await self._poll(partial(self._blockers, node_id), self.safe_timeout_s)
        if blockers:
            log.warning("event=roll_blocked node_id=%d reasons=%d", node_id, len(blockers))
            raise RollBlocked(node_id, blockers)
        before = await self._admin.partitions()
        offline_before = {(p.topic, p.partition) for p in before if p.offline}
        log.info(
            "event=broker_restart node_id=%d unavoidable_outages=%d",
            node_id,
            sum(1 for p in before if p.replicas == (node_id,) and not p.offline),
        )
        await restart()
        pending = await self._poll(
            partial(self._rejoin_pending, node_id, offline_before), self.rejoin_timeout_s
        )
        if pending:
            log.warning("event=roll_stalled node_id=%d pending=%d", node_id, len(pending))
            raise RollStalled(node_id, pending)
        log.info("event=broker_rejoined node_id=%d", node_id)

    async def _blockers(self, node_id: int) -> list[str]:
        partitions = await self._admin.partitions()
        in_isr = [p for p in partitions if node_id in p.isr]
        min_isr = await self._admin.min_insync_replicas({p.topic for p in in_isr})
        return restart_blockers(node_id, in_isr, min_isr)

    async def _rejoin_pending(
        self, node_id: int, offline_before: Collection[tuple[str, int]]
    ) -> list[str]:
        if node_id not in await self._admin.broker_ids():
            return [f"broker {node_id} is not registered"]
        return rejoin_pending(node_id, await self._admin.partitions(), offline_before)

    async def _poll(self, check: Callable[[], Awaitable[list[str]]], timeout_s: float) -> list[str]:
        """Run ``check`` every ``poll_s`` until it finds nothing or ``timeout_s`` passes.

        Returns the last reasons (empty when the condition was met). A cluster
        that does not answer is a reason like any other: the wait goes on.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                reasons = await check()
            except KafkaAdminError as exc:
                reasons = [f"cannot ask the cluster: {exc}"]
            if not reasons:
                return []
            log.debug("event=roll_waiting reasons=%d first=%r", len(reasons), reasons[0])
            if loop.time() >= deadline:
                return reasons
            await asyncio.sleep(self.poll_s)
