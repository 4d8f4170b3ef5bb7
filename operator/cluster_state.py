"""What the operator learns from a running Shoal cluster about its partitions."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as Metadata reports it (broker-side topic names)."""

    topic: str
    partition: int
    leader: int
    """-1 when the partition has no leader (offline)."""
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @property
    def offline(self) -> bool:
        return self.leader < 0


@dataclass(frozen=True, slots=True)
class TopicState:
    """One topic as the brokers describe it (broker-side name)."""

    name: str
    topic_id: str
    """Kafka's topic id in its usual base64 spelling (what ``kafka-topics --describe`` prints)."""
    partitions: tuple[PartitionInfo, ...]

    @property
    def replicas(self) -> int:
        """The replication factor: the longest replica list (all are equal unless a
        reassignment is under way)."""
        return max((len(p.replicas) for p in self.partitions), default=0)

    @property
    def under_replicated(self) -> int:
        return sum(1 for p in self.partitions if p.under_replicated)
