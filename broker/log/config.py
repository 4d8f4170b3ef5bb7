"""Topic-level log configuration, under Kafka's names and with Kafka's defaults.

:data:`TOPIC_CONFIGS` is the catalogue: each key's type, default, broker-level
synonym and a one-line description, used by CreateTopics, DescribeConfigs and
IncrementalAlterConfigs alike. :class:`LogConfig` is the typed view the log
works with, built from a topic's overrides on top of the defaults.

A few keys are accepted for compatibility but have no effect yet; their
description says so and DescribeConfigs reports it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from shoal.records import Compression

LONG_MAX: Final = 2**63 - 1
INT_MAX: Final = 2**31 - 1


COMPRESSION_TYPES: Final = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
"""compression.type's values, in Kafka's order (BrokerCompressionType)."""
_CODECS: Final = {
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


class ConfigType(enum.IntEnum):
    """DescribeConfigs' config_type numbering."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7


class InvalidConfigError(ValueError):
    """A config name or value Kafka would refuse with INVALID_CONFIG."""


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    type: ConfigType
    default: str
    doc: str
    synonym: str | None = None
    """The broker-wide default's name (log.retention.ms for retention.ms)."""
    check: Callable[[Any], str | None] | None = None
    """Returns a complaint about a parsed value, or None when it is fine."""


def _at_least(low: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"must be at least {low}"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        values = value if isinstance(value, tuple) else (value,)
        bad = [v for v in values if v not in choices]
        return f"must be one of {', '.join(choices)}" if bad or not values else None

    return check


def _between(low: int, high: int) -> Callable[[Any], str | None]:
    return lambda v: None if low <= v <= high else f"must be between {low} and {high}"


def _gzip_level(value: int) -> str | None:
    return None if value == -1 or 1 <= value <= 9 else "must be between 1 and 9, or -1"


def _ratio(value: float) -> str | None:
    return None if 0.0 <= value <= 1.0 else "must be between 0 and 1"


_KEYS = [
    ConfigKey("cleanup.policy", ConfigType.LIST, "delete",
              "delete: drop old segments by retention. compact: the log cleaner keeps the "
              "latest record of each key. Both may be given (compact,delete).",
              "log.cleanup.policy", _one_of("delete", "compact")),
    ConfigKey("compression.gzip.level", ConfigType.INT, "-1",
              "The gzip level (1-9, or -1 for zlib's default, 6) for batches the leader "
              "recompresses to gzip.", "compression.gzip.level", _gzip_level),
    ConfigKey("compression.lz4.level", ConfigType.INT, "9",
              "The lz4 level (1-17) for batches the leader recompresses to lz4.",
              "compression.lz4.level", _between(1, 17)),
    ConfigKey("compression.type", ConfigType.STRING, "producer",
              "The topic's final codec: uncompressed, gzip, snappy, lz4 or zstd; the leader "
              "recompresses a batch that arrives with another codec. producer keeps each "
              "batch as the producer compressed it.", "compression.type",
              _one_of(*COMPRESSION_TYPES)),
    ConfigKey("compression.zstd.level", ConfigType.INT, "3",
              "The zstd level (-131072-22) for batches the leader recompresses to zstd.",
              "compression.zstd.level", _between(-131072, 22)),
    ConfigKey("delete.retention.ms", ConfigType.LONG, "86400000",
              "How long a tombstone stays on a compacted topic after the cleaner first "
              "cleaned it.", "log.cleaner.delete.retention.ms", _at_least(0)),
    ConfigKey("file.delete.delay.ms", ConfigType.LONG, "60000",
              "How long a deleted segment's files stay before they are removed.",
              "log.segment.delete.delay.ms", _at_least(0)),
    ConfigKey("flush.messages", ConfigType.LONG, str(LONG_MAX),
              "fsync the log after this many messages; by default the page cache and "
              "replication carry durability.", "log.flush.interval.messages", _at_least(1)),
    ConfigKey("flush.ms", ConfigType.LONG, str(LONG_MAX),
              "fsync the log when its oldest unflushed write is this old.",
              "log.flush.interval.ms", _at_least(0)),
    ConfigKey("index.interval.bytes", ConfigType.INT, "4096",
              "Bytes of log between two offset index entries.",
              "log.index.interval.bytes", _at_least(0)),
    ConfigKey("max.compaction.lag.ms", ConfigType.LONG, str(LONG_MAX),
              "Longest a message stays uncompacted: a log whose oldest dirty record is "
              "older is cleaned whatever its dirty ratio.",
              "log.cleaner.max.compaction.lag.ms", _at_least(1)),
    ConfigKey("max.message.bytes", ConfigType.INT, "1048588",
              "Largest record batch the topic accepts; larger ones get MESSAGE_TOO_LARGE.",
              "message.max.bytes", _at_least(0)),
    ConfigKey("message.timestamp.after.max.ms", ConfigType.LONG, "3600000",
              "How far in the future a CreateTime timestamp may be.",
              "log.message.timestamp.after.max.ms", _at_least(0)),
    ConfigKey("message.timestamp.before.max.ms", ConfigType.LONG, str(LONG_MAX),
              "How far in the past a CreateTime timestamp may be.",
              "log.message.timestamp.before.max.ms", _at_least(0)),
    ConfigKey("message.timestamp.type", ConfigType.STRING, "CreateTime",
              "CreateTime keeps the producer's timestamps; LogAppendTime stamps the "
              "broker's clock on each batch.", "log.message.timestamp.type",
              _one_of("CreateTime", "LogAppendTime")),
    ConfigKey("min.cleanable.dirty.ratio", ConfigType.DOUBLE, "0.5",
              "Dirty share of a compacted log that triggers cleaning.",
              "log.cleaner.min.cleanable.ratio", _ratio),
    ConfigKey("min.compaction.lag.ms", ConfigType.LONG, "0",
              "Shortest time a message stays uncompacted.",
              "log.cleaner.min.compaction.lag.ms", _at_least(0)),
    ConfigKey("min.insync.replicas", ConfigType.INT, "1",
              "In-sync replicas an acks=all write needs.", "min.insync.replicas",
              _at_least(1)),
    ConfigKey("preallocate", ConfigType.BOOLEAN, "false",
              "Accepted for compatibility; segments are not preallocated.",
              "log.preallocate"),
    ConfigKey("retention.bytes", ConfigType.LONG, "-1",
              "Largest size a partition's log may reach before old segments are deleted; "
              "-1 for no limit.", "log.retention.bytes", _at_least(-1)),
    ConfigKey("retention.ms", ConfigType.LONG, "604800000",
              "Age after which a segment (by its newest record) is deleted; -1 keeps "
              "everything.", "log.retention.ms", _at_least(-1)),
    ConfigKey("segment.bytes", ConfigType.INT, "1073741824",
              "Size at which the active segment rolls.", "log.segment.bytes", _at_least(14)),
    ConfigKey("segment.index.bytes", ConfigType.INT, "10485760",
              "Largest offset index; a full index rolls the segment.",
              "log.index.size.max.bytes", _at_least(4)),
    ConfigKey("segment.jitter.ms", ConfigType.LONG, "0",
              "Random amount subtracted from segment.ms per segment.",
              "log.roll.jitter.ms", _at_least(0)),
    ConfigKey("segment.ms", ConfigType.LONG, "604800000",
              "Age at which the active segment rolls, so retention can delete it.",
              "log.roll.ms", _at_least(1)),
    ConfigKey("unclean.leader.election.enable", ConfigType.BOOLEAN, "false",
              "Whether an out-of-sync replica may become leader, losing data.",
              "unclean.leader.election.enable"),
]  # fmt: skip

TOPIC_CONFIGS: Final[Mapping[str, ConfigKey]] = {key.name: key for key in _KEYS}


def parse_value(key: ConfigKey, raw: str) -> Any:
    """Parse and check one value as Kafka's ConfigDef would; raises InvalidConfigError."""
    text = raw.strip()
    try:
        value: Any
        match key.type:
            case ConfigType.BOOLEAN:
                if text.lower() not in ("true", "false"):
                    raise ValueError(text)
                value = text.lower() == "true"
            case ConfigType.INT | ConfigType.SHORT:
                value = int(text)
                if not -(2**31) <= value <= INT_MAX:
                    raise ValueError(text)
            case ConfigType.LONG:
                value = int(text)
                if not -(2**63) <= value <= LONG_MAX:
                    raise ValueError(text)
            case ConfigType.DOUBLE:
                value = float(text)
            case ConfigType.LIST:
                value = tuple(part.strip() for part in text.split(",") if part.strip())
            case ConfigType.STRING:
                value = text
    except ValueError:
        raise InvalidConfigError(
            f"Invalid value {raw} for configuration {key.name}: not a valid {key.type.name.lower()}"
        ) from None
    complaint = key.check(value) if key.check else None
    if complaint:
        raise InvalidConfigError(f"Invalid value {raw} for configuration {key.name}: {complaint}")
    return value


def validate_broker_defaults(defaults: Mapping[str, str]) -> dict[str, str]:
    """Check broker-wide topic defaults, keyed by broker property name."""
    by_synonym = {key.synonym: key for key in TOPIC_CONFIGS.values() if key.synonym}
    for name, raw in defaults.items():
        key = by_synonym.get(name)
        if key is None:
            raise InvalidConfigError(f"Unknown broker default for a topic config: {name}")
        parse_value(key, raw)
    return dict(defaults)


def validate_overrides(overrides: Mapping[str, str | None]) -> dict[str, str]:
    """Check topic overrides by name and value; None values are dropped (use default)."""
    clean: dict[str, str] = {}
    for name, raw in overrides.items():
        key = TOPIC_CONFIGS.get(name)
        if key is None:
            raise InvalidConfigError(f"Unknown topic config name: {name}")
        if raw is None:
            continue
        parse_value(key, raw)
        clean[name] = raw
    return clean


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The settings one partition's log runs with."""

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    retention_ms: int = 604800000
    retention_bytes: int = -1
    cleanup_policy: tuple[str, ...] = ("delete",)
    max_message_bytes: int = 1048588
    message_timestamp_type: str = "CreateTime"
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = 3600000
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    file_delete_delay_ms: int = 60000
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    delete_retention_ms: int = 86400000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3

    @classmethod
    def from_overrides(
        cls, overrides: Mapping[str, str], broker_defaults: Mapping[str, str] | None = None
    ) -> LogConfig:
        """Topic overrides win over the broker's defaults, which win over Kafka's.

        ``broker_defaults`` are keyed by broker property (``log.retention.ms``),
        ``overrides`` by topic config (``retention.ms``).
        """
        defaults = broker_defaults or {}
        merged = {
            key.name: defaults[key.synonym]
            for key in TOPIC_CONFIGS.values()
            if key.synonym and key.synonym in defaults
        }
        merged.update(overrides)
        values: dict[str, Any] = {}
        for field_name in cls.__dataclass_fields__:
            name = field_name.replace("_", ".")
            if name in merged:
                values[field_name] = parse_value(TOPIC_CONFIGS[name], merged[name])
        return cls(**values)

    @property
    def deletes(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """Age at which the active segment rolls: segment.ms, or sooner on a compacted
        topic whose max.compaction.lag.ms is shorter (KIP-354), since the cleaner only
        reaches rolled segments."""
        if self.compacts and self.max_compaction_lag_ms > 0:
            return min(self.segment_ms, self.max_compaction_lag_ms)
        return self.segment_ms

    @property
    def compacts(self) -> bool:
        """cleanup.policy names compact: the log cleaner works on this log."""
        return "compact" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def compression(self) -> Compression | None:
        """The codec every stored batch must have; None keeps the producer's."""
        return _CODECS.get(self.compression_type)

    @property
    def compression_level(self) -> int | None:
        """The level to recompress at (KIP-390), None for the codec's default."""
        match self.compression:
            case Compression.GZIP:
                return None if self.compression_gzip_level == -1 else self.compression_gzip_level
            case Compression.LZ4:
                return self.compression_lz4_level
            case Compression.ZSTD:
                return self.compression_zstd_level
            case _:
                return None
