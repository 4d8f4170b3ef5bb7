"""DescribeLogDirs (35): how many bytes each hosted partition keeps on disk.

Answered as Kafka answers it, for the broker's one log directory
(``log.dirs``): per partition replica this broker hosts, leader or follower,
``partition_size`` is the bytes of its segment files (the ``.log`` files; the
indexes are not counted, as in Kafka's ``UnifiedLog.size``), ``offset_lag``
is how far the replica's log end is behind the leader's high watermark (0 on
the leader, and 0 on a follower that has not heard the leader's high
watermark yet), and ``is_future_key`` is always false: there is no
AlterReplicaLogDirs, so no log is ever moving between directories.

``topics`` null asks for every hosted partition; otherwise only the listed
partitions of the listed topics, and those this broker does not host are
left out rather than reported as errors (Kafka's behaviour too). Volume
sizes (v4+) come from the file system; a directory whose volume cannot be
read reports them as -1, Kafka's "unknown".

The gateway asks it of every broker to tell a tenant its storage; tenants
never reach it over the Kafka door (the gateway does not forward it), so,
like the rest of the broker, it checks no ACLs.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext
from shoal.broker.partition import Partition

_UNKNOWN = -1


@dataclass(frozen=True, slots=True)
class ReplicaSize:
    topic: str
    partition: int
    size: int
    offset_lag: int


def offset_lag(is_leader: bool, leader_high_watermark: int | None, log_end_offset: int) -> int:
    """How far a replica's log end is behind the leader's high watermark (never negative)."""
    if is_leader or leader_high_watermark is None:
        return 0
    return max(0, leader_high_watermark - log_end_offset)


def replica_size(partition: Partition) -> ReplicaSize:
    log = partition.log
    lag = offset_lag(partition.is_leader, partition.leader_high_watermark, log.log_end_offset)
    return ReplicaSize(partition.topic, partition.index, log.size, lag)


def requested_partitions(
    topics: Iterable[tuple[str, Iterable[int]]] | None,
) -> Mapping[str, frozenset[int]] | None:
    """The request's filter as topic -> partitions; None for every partition.

    A topic named twice asks for the union of its partitions.
    """
    if topics is None:
        return None
    wanted: dict[str, set[int]] = {}
    for name, partitions in topics:
        wanted.setdefault(name, set()).update(partitions)
    return {name: frozenset(partitions) for name, partitions in wanted.items()}


def select(
    replicas: Iterable[ReplicaSize], wanted: Mapping[str, frozenset[int]] | None
) -> dict[str, list[ReplicaSize]]:
    """The replicas the filter asks for, by topic, topics and partitions in order."""
    by_topic: dict[str, list[ReplicaSize]] = {}
    for replica in replicas:
        if wanted is None or replica.partition in wanted.get(replica.topic, ()):
            by_topic.setdefault(replica.topic, []).append(replica)
    return {
        topic: sorted(found, key=lambda r: r.partition) for topic, found in sorted(by_topic.items())
    }


def _volume(directory: Path) -> tuple[int, int]:
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return _UNKNOWN, _UNKNOWN
    return usage.total, usage.free


async def handle_describe_log_dirs(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    wanted = requested_partitions(
        None if request.topics is None else ((t.topic, t.partitions) for t in request.topics)
    )
    chosen = select((replica_size(p) for p in services.replicas.partitions.values()), wanted)
    topics = tuple(
        api.make(
            "DescribeLogDirsTopic",
            name=topic,
            partitions=tuple(
                api.make(
                    "DescribeLogDirsPartition",
                    partition_index=r.partition,
                    partition_size=r.size,
                    offset_lag=r.offset_lag,
                    is_future_key=False,
                )
                for r in replicas
            ),
        )
        for topic, replicas in chosen.items()
    )
    directory = services.config.data_dir.resolve()
    total, usable = _volume(directory)
    result = api.make(
        "DescribeLogDirsResult",
        error_code=E.none,
        log_dir=str(directory),
        topics=topics,
        total_bytes=total,
        usable_bytes=usable,
        is_cordoned=False,
    )
    return api.response(throttle_time=NO_THROTTLE, error_code=E.none, results=(result,))
