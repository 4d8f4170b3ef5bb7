"""Where a new partition's replicas go: pure functions, no I/O.

Kafka's scheme without racks: the first replica of partition ``p`` goes to
broker ``(start + p) % n``, and followers follow at a shift that grows every
``n`` partitions, so leaders and followers both spread evenly. Rack-aware
placement comes with the replication issue.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from shoal.broker.cluster.model import NodeId


class PlacementError(ValueError):
    pass


def assign_replicas(
    brokers: Sequence[NodeId],
    partitions: int,
    replication_factor: int,
    first_partition: int = 0,
    start: int | None = None,
) -> list[tuple[NodeId, ...]]:
    """Replica lists for ``partitions`` partitions from ``first_partition``, leader first."""
    nodes = sorted(brokers)
    count = len(nodes)
    if replication_factor < 1:
        raise PlacementError("replication factor must be at least 1")
    if replication_factor > count:
        raise PlacementError(
            f"Replication factor: {replication_factor} larger than available brokers: {count}."
        )
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
