"""Where a new partition's replicas go: pure functions, no I/O.

Kafka's scheme (``AdminUtils.assignReplicasToBrokers``), with and without racks.

Without racks, the first replica of partition ``p`` goes to broker ``(start + p) % n``
of the sorted brokers, and followers follow at a shift that grows every ``n``
partitions, so leaders and followers both spread evenly.

With racks, the same walk runs over a rack-alternated list (one broker from each
rack in turn), so brokers next to each other sit in different racks. Walking to a
partition's followers skips a broker whose rack already holds one of its replicas
while some rack still holds none, and a broker already chosen. A partition's
replicas therefore span ``min(replication factor, racks)`` racks.

Rack information is all or nothing: if any broker lacks a rack, placement ignores
racks altogether (Kafka refuses such a mix unless told to ignore racks).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from shoal.broker.cluster.model import NodeId


class PlacementError(ValueError):
    pass


def assign_replicas(
    brokers: Sequence[NodeId],
    partitions: int,
    replication_factor: int,
    first_partition: int = 0,
    start: int | None = None,
    *,
    racks: Mapping[NodeId, str | None] | None = None,
) -> list[tuple[NodeId, ...]]:
    """Replica lists for ``partitions`` partitions from ``first_partition``, leader first.

    ``start`` fixes where the leaders' round-robin begins (and the followers' shift
    at its origin); ``None`` picks both at random, so that topics created one after
    another do not all lead on the same broker.

    ``racks`` maps brokers to their rack. Placement is rack-aware only when every
    broker in ``brokers`` has a rack that is not ``None``; with partial rack
    information (or none) it falls back to rack-unaware placement.
    """
    nodes = sorted(brokers)
    _check_factor(replication_factor, len(nodes))
    rack_of = _complete_racks(nodes, racks)
    if rack_of is None:
        return _rack_unaware(nodes, partitions, replication_factor, first_partition, start)
    return _rack_aware(rack_of, partitions, replication_factor, first_partition, start)


def _check_factor(replication_factor: int, count: int) -> None:
    if replication_factor < 1:
        raise PlacementError("replication factor must be at least 1")
    if replication_factor > count:
        raise PlacementError(
            f"Replication factor: {replication_factor} larger than available brokers: {count}."
        )


def _complete_racks(
    nodes: Sequence[NodeId], racks: Mapping[NodeId, str | None] | None
) -> dict[NodeId, str] | None:
    """Each broker's rack, or None when any broker has none."""
    if racks is None:
        return None
    rack_of: dict[NodeId, str] = {}
    for node in nodes:
        rack = racks.get(node)
        if rack is None:
            # Half the cluster in racks says nothing about where the other half is;
            # a rack-aware walk would treat them as one more rack, which they need not be.
            return None
        rack_of[node] = rack
    return rack_of


def _rack_unaware(
    nodes: Sequence[NodeId],
    partitions: int,
    replication_factor: int,
    first_partition: int,
    start: int | None,
) -> list[tuple[NodeId, ...]]:
    count = len(nodes)
    begin = random.randrange(count) if start is None else start  # noqa: S311 - spreading, not security
    shift = random.randrange(count) if start is None else 0  # noqa: S311
    result = []
    for p in range(first_partition, first_partition + partitions):
        if p > 0 and p % count == 0:
            shift += 1
        first = (begin + p) % count
        followers = [
            nodes[(first + 1 + (shift + j) % (count - 1)) % count]
            for j in range(replication_factor - 1)
        ]
        result.append((nodes[first], *followers))
    return result


def _rack_aware(
    rack_of: Mapping[NodeId, str],
    partitions: int,
    replication_factor: int,
    first_partition: int,
    start: int | None,
) -> list[tuple[NodeId, ...]]:
    order = rack_alternated(rack_of)
    count = len(order)
    # Duplicate broker ids collapse here, so the factor is checked again against
    # distinct brokers: the walk below needs that many to choose from.
    _check_factor(replication_factor, count)
    rack_count = len(set(rack_of.values()))
    begin = random.randrange(count) if start is None else start  # noqa: S311 - spreading, not security
    base_shift = random.randrange(count) if start is None else 0  # noqa: S311
    result = []
    for p in range(first_partition, first_partition + partitions):
        # Derived from p rather than counted from first_partition, so partitions
        # added later (CreatePartitions) get what they would have got at creation.
        # Whole rack rounds keep the first follower in the leader's neighbour rack.
        shift = (base_shift + p // count) * rack_count
        first = (begin + p) % count
        leader = order[first]
        replicas = [leader]
        racks_used = {rack_of[leader]}
        step = 0
        # Terminates: count - 1 steps visit every other broker, and while a rack
        # holds no replica its brokers are all unchosen and acceptable.
        while len(replicas) < replication_factor:
            broker = order[(first + 1 + (shift + step) % (count - 1)) % count]
            step += 1
            rack = rack_of[broker]
            if broker in replicas or (rack in racks_used and len(racks_used) < rack_count):
                continue
            replicas.append(broker)
            racks_used.add(rack)
        result.append(tuple(replicas))
    return result


def rack_alternated(rack_of: Mapping[NodeId, str]) -> list[NodeId]:
    """Brokers taken one per rack in turn (racks and brokers in sorted order).

    Racks a: 0, 1, 2; b: 3; c: 4, 5 give 0, 3, 4, 1, 5, 2. A rack that runs out
    drops out of the rotation, as in Kafka's ``getRackAlternatedBrokerList``, so
    with uneven racks only the tail of the list repeats a rack.
    """
    by_rack: dict[str, list[NodeId]] = {}
    for node in sorted(rack_of):
        by_rack.setdefault(rack_of[node], []).append(node)
    columns = [by_rack[rack] for rack in sorted(by_rack)]
    depth = max((len(column) for column in columns), default=0)
    return [column[i] for i in range(depth) for column in columns if i < len(column)]
