"""LogConfig and the topic config catalogue: Kafka's names, defaults and validation."""

from __future__ import annotations

import dataclasses

import pytest
from shoal.broker.log.config import (
    LONG_MAX,
    TOPIC_CONFIGS,
    ConfigType,
    InvalidConfigError,
    LogConfig,
    parse_value,
    validate_broker_defaults,
    validate_overrides,
)

from shoal.records import Compression

# Kafka 4.0's topic-level defaults and broker synonyms (TopicConfig / ServerLogConfigs).
KAFKA_DEFAULTS = {
    "cleanup.policy": ("delete", "log.cleanup.policy"),
    "compression.gzip.level": ("-1", "compression.gzip.level"),
    "compression.lz4.level": ("9", "compression.lz4.level"),
    "compression.type": ("producer", "compression.type"),
    "compression.zstd.level": ("3", "compression.zstd.level"),
    "delete.retention.ms": ("86400000", "log.cleaner.delete.retention.ms"),
    "file.delete.delay.ms": ("60000", "log.segment.delete.delay.ms"),
    "flush.messages": ("9223372036854775807", "log.flush.interval.messages"),
    "flush.ms": ("9223372036854775807", "log.flush.interval.ms"),
    "index.interval.bytes": ("4096", "log.index.interval.bytes"),
    "max.compaction.lag.ms": ("9223372036854775807", "log.cleaner.max.compaction.lag.ms"),
    "max.message.bytes": ("1048588", "message.max.bytes"),
    "message.timestamp.after.max.ms": ("3600000", "log.message.timestamp.after.max.ms"),
    "message.timestamp.before.max.ms": (
        "9223372036854775807",
        "log.message.timestamp.before.max.ms",
    ),
    "message.timestamp.type": ("CreateTime", "log.message.timestamp.type"),
    "min.cleanable.dirty.ratio": ("0.5", "log.cleaner.min.cleanable.ratio"),
    "min.compaction.lag.ms": ("0", "log.cleaner.min.compaction.lag.ms"),
    "min.insync.replicas": ("1", "min.insync.replicas"),
    "preallocate": ("false", "log.preallocate"),
    "retention.bytes": ("-1", "log.retention.bytes"),
    "retention.ms": ("604800000", "log.retention.ms"),
    "segment.bytes": ("1073741824", "log.segment.bytes"),
    "segment.index.bytes": ("10485760", "log.index.size.max.bytes"),
    "segment.jitter.ms": ("0", "log.roll.jitter.ms"),
    "segment.ms": ("604800000", "log.roll.ms"),
    "unclean.leader.election.enable": ("false", "unclean.leader.election.enable"),
}


LOG_CONFIG_FIELDS = {field.name for field in dataclasses.fields(LogConfig)}


def _config_name(field_name: str) -> str:
    return field_name.replace("_", ".")


def _field_name(config_name: str) -> str:
    return config_name.replace(".", "_")


def test_catalogue_defaults_and_synonyms_are_kafkas() -> None:
    assert set(TOPIC_CONFIGS) == set(KAFKA_DEFAULTS)
    for name, key in TOPIC_CONFIGS.items():
        assert key.name == name
        assert (key.default, key.synonym) == KAFKA_DEFAULTS[name], name


def test_every_catalogue_default_parses_and_passes_its_own_check() -> None:
    for key in TOPIC_CONFIGS.values():
        parse_value(key, key.default)


def test_every_log_config_field_is_a_topic_config() -> None:
    for field in dataclasses.fields(LogConfig):
        assert _config_name(field.name) in TOPIC_CONFIGS, field.name


def test_log_config_field_defaults_equal_the_catalogue_defaults() -> None:
    config = LogConfig()
    for field in dataclasses.fields(LogConfig):
        key = TOPIC_CONFIGS[_config_name(field.name)]
        assert getattr(config, field.name) == parse_value(key, key.default), field.name
    assert LogConfig.from_overrides({}) == config


def test_topic_override_wins_over_broker_default_which_wins_over_kafkas() -> None:
    broker = {"log.retention.ms": "1000", "log.segment.bytes": "2048"}
    config = LogConfig.from_overrides({"retention.ms": "5"}, broker)
    assert config.retention_ms == 5
    assert config.segment_bytes == 2048
    assert config.retention_bytes == -1


def test_broker_defaults_are_keyed_by_broker_property_not_topic_name() -> None:
    # A topic config name in the broker defaults is not a broker property: ignored.
    assert LogConfig.from_overrides({}, {"retention.ms": "5"}).retention_ms == 604800000
    assert LogConfig.from_overrides({}, {"log.roll.ms": "7"}).segment_ms == 7
    assert LogConfig.from_overrides({}, {"message.max.bytes": "100"}).max_message_bytes == 100


def test_from_overrides_parses_each_type() -> None:
    config = LogConfig.from_overrides(
        {
            "cleanup.policy": " compact , delete ",
            "unclean.leader.election.enable": "TRUE",
            "message.timestamp.type": "LogAppendTime",
            "flush.messages": "9223372036854775807",
            "min.insync.replicas": " 2 ",
        }
    )
    assert config.cleanup_policy == ("compact", "delete")
    assert config.deletes
    assert config.unclean_leader_election_enable is True
    assert config.log_append_time
    assert config.flush_messages == LONG_MAX
    assert config.min_insync_replicas == 2


def test_compact_only_policy_does_not_delete() -> None:
    assert not LogConfig.from_overrides({"cleanup.policy": "compact"}).deletes
    assert not LogConfig().log_append_time


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("retention.ms", "a week"),
        ("retention.ms", "-2"),
        ("retention.ms", str(2**63)),
        ("retention.bytes", "1.5"),
        ("segment.bytes", "13"),
        ("segment.bytes", str(2**31)),
        ("segment.ms", "0"),
        ("segment.index.bytes", "3"),
        ("flush.messages", "0"),
        ("max.message.bytes", "-1"),
        ("preallocate", "yes"),
        ("cleanup.policy", "delete,archive"),
        ("cleanup.policy", " , "),
        ("message.timestamp.type", "createtime"),
        ("compression.type", "brotli"),
        ("compression.type", "none"),
        ("compression.type", "GZIP"),
        ("compression.gzip.level", "0"),
        ("compression.gzip.level", "10"),
        ("compression.gzip.level", "-2"),
        ("compression.lz4.level", "0"),
        ("compression.lz4.level", "18"),
        ("compression.zstd.level", "23"),
        ("compression.zstd.level", "-131073"),
        ("min.cleanable.dirty.ratio", "1.5"),
        ("min.cleanable.dirty.ratio", "half"),
        ("min.insync.replicas", "0"),
    ],
)
def test_invalid_value_raises_invalid_config_naming_the_config(name: str, raw: str) -> None:
    with pytest.raises(InvalidConfigError, match=name.replace(".", r"\.")):
        parse_value(TOPIC_CONFIGS[name], raw)
    with pytest.raises(InvalidConfigError, match=name.replace(".", r"\.")):
        validate_overrides({name: raw})
    if _field_name(name) in LOG_CONFIG_FIELDS:
        with pytest.raises(InvalidConfigError, match=name.replace(".", r"\.")):
            LogConfig.from_overrides({name: raw})


@pytest.mark.parametrize(
    ("value", "codec"),
    [
        ("producer", None),
        ("uncompressed", Compression.NONE),
        ("gzip", Compression.GZIP),
        ("snappy", Compression.SNAPPY),
        ("lz4", Compression.LZ4),
        ("zstd", Compression.ZSTD),
    ],
)
def test_compression_type_accepts_kafkas_values_and_names_the_codec(
    value: str, codec: Compression | None
) -> None:
    assert validate_overrides({"compression.type": value}) == {"compression.type": value}
    assert LogConfig.from_overrides({"compression.type": value}).compression is codec


def test_compression_type_broker_default_applies_under_its_own_name() -> None:
    assert validate_broker_defaults({"compression.type": "zstd"})
    config = LogConfig.from_overrides({}, {"compression.type": "zstd"})
    assert config.compression is Compression.ZSTD
    assert (
        LogConfig.from_overrides(
            {"compression.type": "producer"}, {"compression.type": "zstd"}
        ).compression
        is None
    )


def test_compression_level_is_the_target_codecs_with_kafkas_defaults() -> None:
    def level(**overrides: str) -> int | None:
        return LogConfig.from_overrides(
            {k.replace("_", "."): v for k, v in overrides.items()}
        ).compression_level

    assert level(compression_type="gzip") is None  # -1: zlib's default
    assert level(compression_type="gzip", compression_gzip_level="1") == 1
    assert level(compression_type="lz4") == 9
    assert level(compression_type="lz4", compression_lz4_level="17") == 17
    assert level(compression_type="zstd") == 3
    assert level(compression_type="zstd", compression_zstd_level="-5") == -5
    assert level(compression_type="snappy", compression_zstd_level="7") is None
    assert level(compression_type="producer") is None


def test_boundary_values_are_accepted() -> None:
    assert parse_value(TOPIC_CONFIGS["retention.ms"], "-1") == -1
    assert parse_value(TOPIC_CONFIGS["segment.bytes"], "14") == 14
    assert parse_value(TOPIC_CONFIGS["segment.bytes"], str(2**31 - 1)) == 2**31 - 1
    assert parse_value(TOPIC_CONFIGS["min.cleanable.dirty.ratio"], "1") == 1.0
    assert parse_value(TOPIC_CONFIGS["retention.ms"], str(LONG_MAX)) == LONG_MAX


def test_unknown_topic_config_is_refused_by_name() -> None:
    with pytest.raises(InvalidConfigError, match=r"retention\.hours"):
        validate_overrides({"retention.hours": "1"})


def test_validate_overrides_drops_none_and_keeps_raw_strings() -> None:
    clean = validate_overrides({"retention.ms": " 100 ", "segment.bytes": None})
    assert clean == {"retention.ms": " 100 "}


def test_validate_broker_defaults_checks_names_and_values() -> None:
    good = {"log.retention.ms": "100", "message.max.bytes": "2000"}
    assert validate_broker_defaults(good) == good
    with pytest.raises(InvalidConfigError, match=r"retention\.ms"):
        validate_broker_defaults({"retention.ms": "100"})
    with pytest.raises(InvalidConfigError, match=r"segment\.bytes"):
        validate_broker_defaults({"log.segment.bytes": "1"})


def test_invalid_broker_default_fails_when_building_a_config() -> None:
    with pytest.raises(InvalidConfigError, match=r"retention\.ms"):
        LogConfig.from_overrides({}, {"log.retention.ms": "soon"})


def test_config_types_match_kafkas_describe_configs_numbering() -> None:
    assert TOPIC_CONFIGS["cleanup.policy"].type is ConfigType.LIST
    assert TOPIC_CONFIGS["retention.ms"].type is ConfigType.LONG
    assert TOPIC_CONFIGS["segment.bytes"].type is ConfigType.INT
    assert TOPIC_CONFIGS["preallocate"].type is ConfigType.BOOLEAN
    assert TOPIC_CONFIGS["min.cleanable.dirty.ratio"].type is ConfigType.DOUBLE
    assert [t.value for t in ConfigType] == [1, 2, 3, 4, 5, 6, 7]
