"""The group coordinator's settings, under Kafka's names and with Kafka's defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Kafka's group coordinator settings, under their Kafka names."""

    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3000
    max_size: int = 2**31 - 1
    offsets_retention_ms: int = 604_800_000
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4096
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 104_857_600
    consumer_session_timeout_ms: int = 45_000
    """group.consumer.session.timeout.ms: a KIP-848 member silent this long is fenced."""
    consumer_heartbeat_interval_ms: int = 5_000
    """group.consumer.heartbeat.interval.ms: how often KIP-848 members are told to heartbeat."""
    consumer_max_size: int = 2**31 - 1
    """group.consumer.max.size."""
