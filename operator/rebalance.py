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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import networkx as nx
from shoal.operator.cluster_state import PartitionInfo

PartitionKey = tuple[str, int]
Plan = dict[PartitionKey, tuple[int, ...]]
_SINK = "rounded-up shares"


class ReassignmentImpossible(Exception):  # noqa: N818 - the name the handlers code against
    """The brokers asked for cannot hold every partition's replicas."""


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
    changed = sorted(key for key, p in by_key.items() if set(members[key]) != set(p.replicas))
    leading = Counter(
        _leader(p) for key, p in by_key.items() if key not in changed or _leader(p) in members[key]
    )
    plan: Plan = {}
    for key in changed:
        replicas = members[key]
        leader = _leader(by_key[key])
        if leader not in replicas:
            leader = min(replicas, key=lambda b: (leading[b], replicas.index(b)))
            leading[leader] += 1
        plan[key] = (leader, *(r for r in replicas if r != leader))
    return plan
