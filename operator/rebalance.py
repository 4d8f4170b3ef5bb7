"""Where partitions should live after the set of brokers changes: a pure planner.

Scaling a Cluster up leaves the new brokers empty; scaling it down must first
empty the leaving brokers. :func:`plan_reassignment` answers both with new
replica lists, in the form AlterPartitionReassignments takes.

Choosing replicas is a minimum-cost flow (networkx's network simplex), which
is exact where greedy placement is not: every partition sends one unit per
replica, each to a distinct allowed broker; every broker takes the mean
number of replicas rounded down, and up to one more while the total lasts,
so replica counts end within one of each other. A unit sent to a broker the
partition does not use yet costs one move; moves outweigh everything else, and
among the cheapest plans those keeping each partition's current leader win.
Leaders stay first where their broker stays; a partition that loses its
leader gets, as preferred leader, the member that leads fewest partitions.

:func:`drain_brokers` and :func:`spread_onto` are what the Cluster handler
calls before shrinking and after growing the broker StatefulSet: read the
partitions, plan, send the plan (AlterPartitionReassignments), and wait,
bounded, until the brokers report every move done. Both are idempotent: a
move still under way is planned from its target, so calling again after a
timeout or an operator restart picks up where the last call stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

import networkx as nx
from shoal.operator.cluster_state import PartitionInfo
from shoal.operator.kafka_admin import ClusterAdmin, KafkaAdminError

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]
Plan = dict[PartitionKey, tuple[int, ...]]
_SINK = "rounded-up shares"
MOVE_TIMEOUT_S: Final = 600.0
"""How long a drain or spread waits for the brokers to copy partitions."""
_POLL_S: Final = 0.5


class ReassignmentImpossible(Exception):  # noqa: N818 - the name the handlers code against
    """The brokers asked for cannot hold every partition's replicas."""


class ReassignmentTimeoutError(Exception):
    """Moves were started but did not finish in time; they carry on in the cluster."""


def _leader(partition: PartitionInfo) -> int:
    """The current leader, or the preferred one while the partition is offline."""
    if partition.leader in partition.replicas:
        return partition.leader
    return partition.replicas[0]


def plan_reassignment(partitions: Sequence[PartitionInfo], brokers: Sequence[int]) -> Plan:
    """New replica lists that put every partition only on ``brokers``, evenly spread.

    Each broker ends with the mean number of replicas rounded down or up,
    as few replicas move as possible, and a partition's current leader stays
    first when its broker stays. Partitions that need no change are left out.
    Raises ReassignmentImpossible when a partition has more replicas than
    there are brokers.
    """
    allowed = sorted(set(brokers))
    for partition in partitions:
        if len(partition.replicas) > len(allowed):
            raise ReassignmentImpossible(
                f"partition {partition.topic}-{partition.partition} has"
                f" {len(partition.replicas)} replicas, but only {len(allowed)} brokers"
                f" ({', '.join(map(str, allowed)) or 'none'}) may hold them"
            )
    if not partitions:
        return {}
    by_key = {(p.topic, p.partition): p for p in partitions}
    return _order(by_key, _members(by_key, allowed))


def _members(
    by_key: dict[PartitionKey, PartitionInfo], allowed: list[int]
) -> dict[PartitionKey, list[int]]:
    """Each partition's brokers in the cheapest balanced placement."""
    total = sum(len(p.replicas) for p in by_key.values())
    base, extra = divmod(total, len(allowed))
    # A move costs more than losing every leader, so no plan trades a move for a leader.
    move = len(by_key) + 1
    graph: nx.DiGraph[object] = nx.DiGraph()
    graph.add_node(_SINK, demand=extra)
    for broker in allowed:
        graph.add_node(broker, demand=base)
        if extra:
            graph.add_edge(broker, _SINK, capacity=1, weight=0)
    for key, partition in by_key.items():
        graph.add_node(key, demand=-len(partition.replicas))
        leader = _leader(partition)
        for broker in allowed:
            weight = (0 if broker in partition.replicas else move) - (1 if broker == leader else 0)
            graph.add_edge(key, broker, capacity=1, weight=weight)
    flow = nx.min_cost_flow(graph)
    members = {}
    for key, partition in by_key.items():
        kept = [b for b in partition.replicas if flow[key].get(b)]
        added = [b for b in allowed if flow[key][b] and b not in partition.replicas]
        members[key] = kept + added
    return members


def _order(
    by_key: dict[PartitionKey, PartitionInfo], members: dict[PartitionKey, list[int]]
) -> Plan:
    """The changed partitions' lists, leader first: the current one if it stays, else
    the member leading fewest partitions."""
    changed = {key for key, p in by_key.items() if set(members[key]) != set(p.replicas)}
    leading = Counter(
        _leader(p) for key, p in by_key.items() if key not in changed or _leader(p) in members[key]
    )
    plan: Plan = {}
    for key in sorted(changed):
        replicas = members[key]
        leader = _leader(by_key[key])
        if leader not in replicas:
            leader = min(replicas, key=lambda b: (leading[b], replicas.index(b)))
            leading[leader] += 1
        plan[key] = (leader, *(r for r in replicas if r != leader))
    return plan


async def drain_brokers(
    admin: ClusterAdmin, leaving: set[int], timeout_s: float = MOVE_TIMEOUT_S
) -> Plan:
    """Move every replica off ``leaving`` onto the other registered brokers, evenly,
    and wait until done; the plan sent. Raises ReassignmentImpossible (nothing is
    moved) when the brokers that stay cannot hold some partition's replicas.

    Call it while every broker is up: one that is down is not registered, so
    it is not among the brokers that stay, and its replicas move too.
    """
    staying = [b for b in await admin.broker_ids() if b not in leaving]
    return await _rebalance(admin, staying, timeout_s)


async def spread_onto(
    admin: ClusterAdmin, brokers: Sequence[int], timeout_s: float = MOVE_TIMEOUT_S
) -> Plan:
    """Spread every partition evenly over ``brokers`` (new ones included) and wait until
    done; the plan sent. KafkaAdminError while a broker has not registered yet."""
    missing = sorted(set(brokers) - set(await admin.broker_ids()))
    if missing:
        raise KafkaAdminError(f"brokers {missing} have not joined the cluster yet")
    return await _rebalance(admin, brokers, timeout_s)


async def _rebalance(admin: ClusterAdmin, brokers: Sequence[int], timeout_s: float) -> Plan:
    ongoing = await admin.reassignments_in_progress()
    partitions = [
        replace(p, replicas=ongoing[key].target)
        if (key := (p.topic, p.partition)) in ongoing
        else p
        for p in await admin.partitions()
    ]
    plan = plan_reassignment(partitions, brokers)
    if plan:
        log.info(
            "event=reassignment_planned brokers=%s partitions=%d",
            ",".join(map(str, brokers)),
            len(plan),
        )
        await admin.reassign(plan)
    await _wait_until_done(admin, set(plan) | set(ongoing), timeout_s)
    return plan


async def _wait_until_done(
    admin: ClusterAdmin, moving: set[PartitionKey], timeout_s: float
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while moving:
        moving &= set(await admin.reassignments_in_progress())
        if not moving:
            return
        if loop.time() >= deadline:
            names = ", ".join(f"{t}-{i}" for t, i in sorted(moving))
            raise ReassignmentTimeoutError(
                f"{len(moving)} partitions still moving after {timeout_s:g} s: {names}"
            )
        await asyncio.sleep(_POLL_S)
