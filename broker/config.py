"""The broker's settings: one typed model, read from flags and ``SHOAL_*`` variables.

Every field is documented once, here; ``shoal broker --help`` shows these
descriptions, and each field also reads ``SHOAL_<FIELD>`` from the
environment (``SHOAL_NODE_ID``, ``SHOAL_DATA_DIR``, ...). Fields that are
Kafka broker properties carry Kafka's name in their description and Kafka's
default.
"""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from shoal.broker.coordinator.config import GroupConfig
from shoal.broker.log.config import validate_broker_defaults
from shoal.broker.txn.config import TransactionConfig

from shoal.host_port import split_host_port


class BrokerConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_", extra="forbid")

    node_id: int = Field(0, ge=0, description="This broker's id in the cluster (node.id).")
    data_dir: Path = Field(Path("data"), description="Where partition logs live (log.dirs).")
    listen: str = Field(
        "127.0.0.1:9092",
        description="HOST:PORT of the Kafka listener; ':9092' listens on every interface.",
    )
    advertise: str | None = Field(
        None,
        description="HOST:PORT clients are told to connect to (advertised.listeners);"
        " defaults to the listen address, or this host's name when listening on every interface.",
    )
    etcd: str = Field(
        "http://127.0.0.1:2379",
        description="etcd endpoint, optionally with a chroot path: http://host:2379/shoal.",
    )
    rack: str | None = Field(None, description="Rack or zone of this broker (broker.rack).")
    metrics_listen: str | None = Field(
        None,
        description="HOST:PORT where Prometheus scrapes /metrics; none by default.",
    )
    log_level: str = Field("INFO", description="Logging level.")
    log_format: str = Field("text", description="Log line format: text (key=value) or json.")
    socket_request_max_bytes: int = Field(
        104857600, ge=1024, description="Largest request accepted (socket.request.max.bytes)."
    )
    num_partitions: int = Field(
        1, ge=1, description="Partitions of a topic created without a count (num.partitions)."
    )
    default_replication_factor: int = Field(
        1, ge=1, description="Replicas of a topic created without a factor."
    )
    max_partitions_per_topic: int = Field(
        10000,
        ge=1,
        description="Most partitions one topic may have; more is refused with POLICY_VIOLATION.",
    )
    auto_create_topics_enable: bool = Field(
        False,
        description="Create unknown topics on Metadata requests that allow it. Off by"
        " default: topics are declared (CreateTopics, the CLI, or a Topic resource).",
    )
    log_retention_check_interval_ms: int = Field(
        300000, ge=10, description="How often retention runs (log.retention.check.interval.ms)."
    )
    log_flush_scheduler_interval_ms: int = Field(
        1000, ge=10, description="How often flush.ms and rolled segments are checked."
    )
    log_flush_offset_checkpoint_interval_ms: int = Field(
        60000, ge=10, description="How often recovery points are checkpointed."
    )
    replica_high_watermark_checkpoint_interval_ms: int = Field(
        5000, ge=10, description="How often high watermarks are checkpointed."
    )
    log_cleaner_enable: bool = Field(
        True,
        description="Run the log cleaner, which compacts cleanup.policy=compact topics"
        " (log.cleaner.enable).",
    )
    log_cleaner_threads: int = Field(
        1, ge=1, description="Log cleaner workers (log.cleaner.threads)."
    )
    log_cleaner_io_max_bytes_per_second: float = Field(
        1.7976931348623157e308,
        gt=0,
        description="Bytes per second the log cleaner may read and write, all workers"
        " together (log.cleaner.io.max.bytes.per.second); unlimited by default.",
    )
    log_cleaner_dedupe_buffer_size: int = Field(
        134217728,
        ge=1024,
        description="Memory budget of the cleaner's key -> offset maps, shared by the"
        " workers (log.cleaner.dedupe.buffer.size).",
    )
    log_cleaner_backoff_ms: int = Field(
        15000,
        ge=1,
        description="How long a cleaner worker sleeps when no log needs cleaning"
        " (log.cleaner.backoff.ms).",
    )
    topic_defaults: dict[str, str] = Field(
        default_factory=dict,
        description="Broker-wide defaults of topic configs, by Kafka broker property:"
        " log.retention.ms=86400000 (repeatable). SHOAL_TOPIC_DEFAULTS takes a JSON object.",
    )
    offsets_topic_num_partitions: int = Field(
        50, ge=1, description="Partitions of __consumer_offsets (offsets.topic.num.partitions)."
    )
    offsets_topic_replication_factor: int = Field(
        3,
        ge=1,
        description="Replicas of __consumer_offsets (offsets.topic.replication.factor); until"
        " this many brokers are up, groups get COORDINATOR_NOT_AVAILABLE.",
    )
    offsets_retention_minutes: int = Field(
        10080,
        ge=1,
        description="How long committed offsets of a group without members are kept"
        " (offsets.retention.minutes).",
    )
    offsets_retention_check_interval_ms: int = Field(
        600000, ge=10, description="How often expired offsets are removed."
    )
    offset_metadata_max_bytes: int = Field(
        4096, ge=0, description="Largest metadata string of a committed offset."
    )
    group_min_session_timeout_ms: int = Field(
        6000, ge=1, description="Shortest session timeout a group member may ask for."
    )
    group_max_session_timeout_ms: int = Field(
        1800000, ge=1, description="Longest session timeout a group member may ask for."
    )
    group_initial_rebalance_delay_ms: int = Field(
        3000,
        ge=0,
        description="How long the first rebalance of an empty group waits for more members.",
    )
    group_max_size: int = Field(
        2**31 - 1, ge=1, description="Most members a group may have (group.max.size)."
    )
    group_consumer_session_timeout_ms: int = Field(
        45000,
        ge=1,
        description="How long a KIP-848 consumer group member may stay silent before it is"
        " fenced (group.consumer.session.timeout.ms).",
    )
    group_consumer_heartbeat_interval_ms: int = Field(
        5000,
        ge=1,
        description="How often KIP-848 consumer group members are told to heartbeat"
        " (group.consumer.heartbeat.interval.ms).",
    )
    transaction_max_timeout_ms: int = Field(
        900000,
        ge=1,
        description="Longest transaction timeout a producer may ask for; longer ones get"
        " INVALID_TRANSACTION_TIMEOUT (transaction.max.timeout.ms).",
    )
    transaction_state_log_num_partitions: int = Field(
        50,
        ge=1,
        description="Partitions of __transaction_state (transaction.state.log.num.partitions).",
    )
    transaction_state_log_replication_factor: int | None = Field(
        None,
        ge=1,
        description="Replicas of __transaction_state (transaction.state.log.replication.factor,"
        " 3 in Kafka); by default the offsets topic's, so one setting sizes both internal"
        " topics. Until this many brokers are up, transactional producers get"
        " COORDINATOR_NOT_AVAILABLE.",
    )
    transaction_state_log_min_isr: int = Field(
        2,
        ge=1,
        description="min.insync.replicas of __transaction_state, at most its replication"
        " factor (transaction.state.log.min.isr).",
    )
    transaction_state_log_segment_bytes: int = Field(
        104857600,
        ge=1024,
        description="Segment size of __transaction_state (transaction.state.log.segment.bytes).",
    )
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = Field(
        10000,
        ge=10,
        description="How often transactions past their timeout are aborted"
        " (transaction.abort.timed.out.transaction.cleanup.interval.ms).",
    )
    transactional_id_expiration_ms: int = Field(
        604800000,
        ge=1,
        description="How long the state of a transactional id without transactions is kept"
        " (transactional.id.expiration.ms).",
    )
    transaction_remove_expired_transaction_cleanup_interval_ms: int = Field(
        3600000,
        ge=10,
        description="How often expired transactional ids are removed"
        " (transaction.remove.expired.transaction.cleanup.interval.ms).",
    )
    producer_id_expiration_ms: int = Field(
        86400000,
        ge=1,
        description="How long an idle idempotent producer's state is kept"
        " (producer.id.expiration.ms).",
    )
    producer_id_expiration_check_interval_ms: int = Field(
        600000, ge=10, description="How often idle producers' state is dropped."
    )
    replica_lag_time_max_ms: int = Field(
        30000,
        ge=100,
        description="A follower not caught up for this long leaves the ISR"
        " (replica.lag.time.max.ms).",
    )
    replica_fetch_wait_max_ms: int = Field(
        500,
        ge=1,
        description="How long a follower's fetch waits for data (replica.fetch.wait.max.ms).",
    )
    replica_fetch_max_bytes: int = Field(
        1048576,
        ge=1024,
        description="Bytes a follower fetches per partition (replica.fetch.max.bytes).",
    )
    replica_fetch_response_max_bytes: int = Field(
        10485760,
        ge=1024,
        description="Bytes a follower fetches per request (replica.fetch.response.max.bytes).",
    )
    replica_fetch_backoff_ms: int = Field(
        1000, ge=1, description="Pause after a failed follower fetch (replica.fetch.backoff.ms)."
    )
    max_incremental_fetch_session_cache_slots: int = Field(
        1000,
        ge=0,
        description="Fetch sessions (KIP-227) this broker keeps for followers and consumers;"
        " 0 turns sessions off (max.incremental.fetch.session.cache.slots).",
    )
    auto_leader_rebalance_enable: bool = Field(
        True,
        description="Move leadership back to preferred replicas (auto.leader.rebalance.enable).",
    )
    leader_imbalance_check_interval_seconds: int = Field(
        300,
        ge=1,
        description="How often the controller checks preferred leaders"
        " (leader.imbalance.check.interval.seconds).",
    )
    leader_imbalance_per_broker_percentage: int = Field(
        10,
        ge=0,
        le=100,
        description="Share of a broker's preferred partitions led elsewhere that triggers a"
        " rebalance (leader.imbalance.per.broker.percentage).",
    )
    controlled_shutdown_timeout_ms: int = Field(
        30000,
        ge=0,
        description="How long SIGTERM waits for leadership to move off this broker"
        " before it stops.",
    )
    broker_session_timeout_ms: int = Field(
        3000,
        ge=2000,
        description="How long a silent broker stays registered (broker.session.timeout.ms):"
        " how soon a frozen broker's partitions move.",
    )
    broker_heartbeat_interval_ms: int = Field(
        250,
        ge=100,
        description="How often a broker renews its etcd lease (broker.heartbeat.interval.ms);"
        " at most a third of the session timeout is used.",
    )
    broker_loop_stall_timeout_ms: int = Field(
        9000,
        ge=1000,
        description="How long the event loop may stall before the broker stops renewing its"
        " session (a wedged broker is then fenced as a frozen one is).",
    )
    broker_peer_probe_interval_ms: int = Field(
        500,
        ge=0,
        description="How often a broker knocks on its peers' listeners; a peer whose port"
        " refuses connections (its process is gone) is fenced at once (0: never).",
    )

    @field_validator("topic_defaults")
    @classmethod
    def _topic_defaults(cls, value: dict[str, str]) -> dict[str, str]:
        return validate_broker_defaults(value)

    @field_validator("listen", "advertise", "metrics_listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)
        return value

    def group_config(self) -> GroupConfig:
        return GroupConfig(
            min_session_timeout_ms=self.group_min_session_timeout_ms,
            max_session_timeout_ms=self.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=self.group_initial_rebalance_delay_ms,
            max_size=self.group_max_size,
            offsets_retention_ms=self.offsets_retention_minutes * 60_000,
            offsets_retention_check_interval_ms=self.offsets_retention_check_interval_ms,
            offset_metadata_max_bytes=self.offset_metadata_max_bytes,
            offsets_topic_num_partitions=self.offsets_topic_num_partitions,
            offsets_topic_replication_factor=self.offsets_topic_replication_factor,
            consumer_session_timeout_ms=self.group_consumer_session_timeout_ms,
            consumer_heartbeat_interval_ms=self.group_consumer_heartbeat_interval_ms,
        )

    def transaction_config(self) -> TransactionConfig:
        return TransactionConfig(
            transaction_max_timeout_ms=self.transaction_max_timeout_ms,
            transaction_state_log_num_partitions=self.transaction_state_log_num_partitions,
            transaction_state_log_replication_factor=(
                self.transaction_state_log_replication_factor
                or self.offsets_topic_replication_factor
            ),
            transaction_state_log_min_isr=self.transaction_state_log_min_isr,
            transaction_state_log_segment_bytes=self.transaction_state_log_segment_bytes,
            transaction_abort_timed_out_transaction_cleanup_interval_ms=(
                self.transaction_abort_timed_out_transaction_cleanup_interval_ms
            ),
            transactional_id_expiration_ms=self.transactional_id_expiration_ms,
            transaction_remove_expired_transaction_cleanup_interval_ms=(
                self.transaction_remove_expired_transaction_cleanup_interval_ms
            ),
        )

    @property
    def listen_address(self) -> tuple[str, int]:
        return split_host_port(self.listen)

    @property
    def advertised_address(self) -> tuple[str, int]:
        if self.advertise:
            return split_host_port(self.advertise)
        host, port = self.listen_address
        if host in ("0.0.0.0", "::", ""):  # noqa: S104
            host = socket.getfqdn()
        return host, port
