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
