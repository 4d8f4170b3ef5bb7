"""The transaction coordinator's settings, under Kafka's names and with Kafka's defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    transaction_max_timeout_ms: int = 900_000
    transaction_state_log_num_partitions: int = 50
    transaction_state_log_replication_factor: int = 3
    transaction_state_log_min_isr: int = 2
    transaction_state_log_segment_bytes: int = 104_857_600
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    transactional_id_expiration_ms: int = 604_800_000
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3_600_000
    marker_retry_backoff_ms: int = 100
    """How long the marker sender waits before retrying partitions that failed."""
