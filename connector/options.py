"""The data source's options, parsed and checked before anything connects.

Names and meanings follow Spark's Kafka source (spark-sql-kafka), so a job
moves to Shoal by changing the format name and the credentials. Spark hands
options over with lower-cased keys and string values; errors name options as
the user wrote them in the documentation (``startingOffsets``, not
``startingoffsets``).

``kafka.*`` options are librdkafka settings, passed to the client with the
prefix removed; ``shoal.bootstrap`` is a shorter ``kafka.bootstrap.servers``.

``exactlyOnce`` and ``transactionalIdPrefix`` go beyond spark-sql-kafka, whose
sink is at-least-once: each task of a batch write produces in one Kafka
transaction (see ``writing.produce_transaction``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from shoal.connector.offsets import EARLIEST, LATEST, PartitionOffsets, TopicPartition

KAFKA_PREFIX = "kafka."

# The canonical spelling of every option, keyed by the lower-cased form Spark
# delivers.
_READ_OPTIONS = (
    "shoal.bootstrap",
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestampStrategy",
    "maxOffsetsPerTrigger",
    "minPartitions",
    "includeHeaders",
    "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs",
)
_WRITE_OPTIONS = ("shoal.bootstrap", "topic", "exactlyOnce", "transactionalIdPrefix")
_CANONICAL = {name.lower(): name for name in (*_READ_OPTIONS, *_WRITE_OPTIONS)}

# librdkafka settings the connector owns: the source decides where reading
# starts and never commits, and the writer sends bytes as they are.
_CONNECTOR_OWNED = {
    "auto.offset.reset": "set the source option startingOffsets instead",
    "enable.auto.commit": "offsets live in Spark's checkpoint, never in a consumer group",
    "enable.auto.offset.store": "offsets live in Spark's checkpoint, never in a consumer group",
    "enable.partition.eof": "the reader needs end-of-partition events to finish a range",
    "key.deserializer": "keys and values are returned as bytes; cast them in Spark",
    "value.deserializer": "keys and values are returned as bytes; cast them in Spark",
    "key.serializer": "key and value columns must be string or binary",
    "value.serializer": "key and value columns must be string or binary",
    "sasl.jaas.config": (
        "a Java client setting; use kafka.sasl.mechanism, kafka.sasl.username "
        "and kafka.sasl.password (as in Shoal's client.properties)"
    ),
}

DEFAULT_POLL_TIMEOUT_MS = 120_000

# ASCII digits only: str.isdigit() also takes "²", which int() refuses.
_PARTITION = re.compile(r"[0-9]+")


class OptionError(ValueError):
    """An option is unknown, malformed or contradicts another one."""


class Mode(Enum):
    BATCH = "batch"
    STREAMING = "streaming"


@dataclass(frozen=True)
class Subscription:
    """Which topics to read: exactly one of the three ways Spark offers."""

    topics: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None
    assigned: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            # Kafka's subscribePattern must match the whole name (Java's matches()).
            return self.pattern.fullmatch(topic) is not None
        if self.assigned:
            return any(tp.topic == topic for tp in self.assigned)
        return topic in self.topics


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends.

    Exactly one of: ``default`` (EARLIEST or LATEST for every partition),
    ``offsets`` (per partition; EARLIEST/LATEST allowed as values, and
    partitions not named take ``default``), or ``timestamp_ms``.
    """

    default: int
    offsets: PartitionOffsets = field(default_factory=dict)
    timestamp_ms: int | None = None

    def moves(self, partitions: Iterable[TopicPartition]) -> bool:
        """True if resolving it twice on ``partitions`` may give two answers
        (latest, timestamps)."""
        if self.timestamp_ms is not None:
            return True
        return any(self.offsets.get(tp, self.default) == LATEST for tp in partitions)


@dataclass(frozen=True)
class ReadOptions:
    client: dict[str, str]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    # With no record at or after startingTimestamp: fail, or start at the end.
    timestamp_not_found_is_error: bool
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    include_headers: bool
    fail_on_data_loss: bool
    poll_timeout_ms: int


@dataclass(frozen=True)
class WriteOptions:
    client: dict[str, str]
    topic: str | None
    # One transaction per task, its id derived from the prefix and the task's
    # partition; the prefix is None when the user gave none (the writer picks one).
    exactly_once: bool = False
    transactional_id_prefix: str | None = None


def parse_read_options(options: Mapping[str, str], mode: Mode) -> ReadOptions:
    """Check a read's options and turn them into a ReadOptions."""
    given = _split(options, allowed=_READ_OPTIONS, role="reading")
    client = _client_settings(options)
    starting_default = EARLIEST if mode is Mode.BATCH else LATEST
    starting = _offset_spec(given, "startingOffsets", "startingTimestamp", starting_default)
    ending = _offset_spec(given, "endingOffsets", "endingTimestamp", LATEST)
    if mode is Mode.STREAMING:
        for name in ("endingOffsets", "endingTimestamp"):
            if name in given:
                raise OptionError(f"{name} applies to batch reads only, not to streaming queries")
    else:
        if starting.default == LATEST or LATEST in starting.offsets.values():
            raise OptionError("startingOffsets can't be latest (-1) for batch reads")
        if ending.default == EARLIEST or EARLIEST in ending.offsets.values():
            raise OptionError("endingOffsets can't be earliest (-2) for batch reads")
    strategy = given.get("startingOffsetsByTimestampStrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f"startingOffsetsByTimestampStrategy must be error or latest, not {strategy!r}"
        )
    return ReadOptions(
        client=client,
        subscription=_subscription(given),
        starting=starting,
        ending=ending,
        timestamp_not_found_is_error=strategy == "error",
        max_offsets_per_trigger=_positive_int(given, "maxOffsetsPerTrigger"),
        min_partitions=_positive_int(given, "minPartitions"),
        include_headers=_boolean(given, "includeHeaders", default=False),
        fail_on_data_loss=_boolean(given, "failOnDataLoss", default=True),
        poll_timeout_ms=_positive_int(given, "kafkaConsumer.pollTimeoutMs")
        or DEFAULT_POLL_TIMEOUT_MS,
    )


def parse_write_options(options: Mapping[str, str], mode: Mode = Mode.BATCH) -> WriteOptions:
    """Check a write's options and turn them into a WriteOptions."""
    given = _split(options, allowed=_WRITE_OPTIONS, role="writing")
    topic = given.get("topic")
    if topic is not None and not topic:
        raise OptionError("topic must not be empty")
    client = _client_settings(options)
    exactly_once = _boolean(given, "exactlyOnce", default=False)
    prefix = given.get("transactionalIdPrefix")
    if prefix is not None and not exactly_once:
        raise OptionError("transactionalIdPrefix applies only with exactlyOnce=true")
    if prefix is not None and not prefix.strip():
        raise OptionError("transactionalIdPrefix must not be empty")
    if exactly_once:
        if mode is Mode.STREAMING:
            raise OptionError(
                "exactlyOnce applies to batch writes only: Spark may run a micro-batch "
                "again after a failure, and its tasks cannot tell that the first run "
                "already committed, so streaming writes stay at-least-once"
            )
        _check_transactional_client(client)
    elif "transactional.id" in client:
        raise OptionError(
            "option kafka.transactional.id is not supported: set exactlyOnce=true "
            "(and transactionalIdPrefix) for transactional writes"
        )
    return WriteOptions(
        client=client, topic=topic, exactly_once=exactly_once, transactional_id_prefix=prefix
    )


def _check_transactional_client(client: Mapping[str, str]) -> None:
    """Refuse the librdkafka settings a transactional producer cannot have."""
    if "transactional.id" in client:
        raise OptionError(
            "option kafka.transactional.id is not supported with exactlyOnce=true: "
            "each task derives its own from transactionalIdPrefix and its partition"
        )
    if client.get("enable.idempotence", "true").strip().lower() != "true":
        raise OptionError(
            "kafka.enable.idempotence=false contradicts exactlyOnce=true: "
            "a transactional producer is idempotent"
        )
    if client.get("acks", "all").strip().lower() not in ("all", "-1"):
        raise OptionError(
            "exactlyOnce=true needs kafka.acks=all (or -1), which is the default; "
            f"not {client['acks']!r}"
        )


def _split(options: Mapping[str, str], allowed: tuple[str, ...], role: str) -> dict[str, str]:
    """The non-``kafka.*`` options under their canonical names; unknown ones fail."""
    allowed_lower = {name.lower() for name in allowed}
    given: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower.startswith(KAFKA_PREFIX):
            continue
        if lower not in allowed_lower:
            known = _CANONICAL.get(lower)
            if known is not None:
                raise OptionError(f"option {known} does not apply to {role}")
            raise OptionError(
                f"unknown option {key!r} for {role}; "
                f"known options: {', '.join(sorted(allowed))} and kafka.*"
            )
        given[_CANONICAL[lower]] = value
    return given


def _client_settings(options: Mapping[str, str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if not lower.startswith(KAFKA_PREFIX):
            continue
        name = lower[len(KAFKA_PREFIX) :]
        if name in _CONNECTOR_OWNED:
            raise OptionError(f"option kafka.{name} is not supported: {_CONNECTOR_OWNED[name]}")
        settings[name] = value
    bootstrap = options.get("shoal.bootstrap")
    if bootstrap is not None:
        if "bootstrap.servers" in settings and settings["bootstrap.servers"] != bootstrap:
            raise OptionError(
                "shoal.bootstrap and kafka.bootstrap.servers disagree; give only one of them"
            )
        settings["bootstrap.servers"] = bootstrap
    if not settings.get("bootstrap.servers"):
        raise OptionError(
            "kafka.bootstrap.servers (or shoal.bootstrap) is required: "
            "the gateway's bootstrap address, host:port"
        )
    return settings


def _subscription(given: Mapping[str, str]) -> Subscription:
    ways = [name for name in ("subscribe", "subscribePattern", "assign") if name in given]
    if len(ways) != 1:
        named = ", ".join(ways) if ways else "none"
        raise OptionError(
            "give exactly one of subscribe, subscribePattern and assign (given: " + named + ")"
        )
    way = ways[0]
    value = given[way]
    if way == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError("subscribe needs at least one topic name")
        return Subscription(topics=topics)
    if way == "subscribePattern":
        try:
            return Subscription(pattern=re.compile(value))
        except re.error as error:
            raise OptionError(
                f"subscribePattern is not a valid regular expression: {error}"
            ) from error
    parsed = _json_object(value, "assign", 'a JSON object like {"events":[0,1]}')
    assigned: list[TopicPartition] = []
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise OptionError(
                f'assign: topic {topic!r} needs a list of partition numbers, as {{"{topic}":[0,1]}}'
            )
        assigned.extend(TopicPartition(topic, p) for p in partitions)
    if not assigned:
        raise OptionError("assign names no partitions")
    return Subscription(assigned=tuple(sorted(set(assigned))))


def _offset_spec(
    given: Mapping[str, str], offsets_name: str, timestamp_name: str, default: int
) -> OffsetSpec:
    if offsets_name in given and timestamp_name in given:
        raise OptionError(f"give {offsets_name} or {timestamp_name}, not both")
    if timestamp_name in given:
        timestamp = _non_negative_int(given[timestamp_name], timestamp_name)
        return OffsetSpec(default=default, timestamp_ms=timestamp)
    value = given.get(offsets_name)
    if value is None:
        return OffsetSpec(default=default)
    word = value.strip().lower()
    if word == "earliest":
        return OffsetSpec(default=EARLIEST)
    if word == "latest":
        return OffsetSpec(default=LATEST)
    parsed = _json_object(value, offsets_name, "earliest, latest or JSON offsets")
    offsets: PartitionOffsets = {}
    for topic, by_partition in parsed.items():
        if not isinstance(by_partition, dict):
            raise OptionError(
                f'{offsets_name}: topic {topic!r} needs {{"partition": offset}}, '
                f'as {{"{topic}":{{"0":23}}}}'
            )
        for partition, offset in by_partition.items():
            if not _PARTITION.fullmatch(partition):
                raise OptionError(f"{offsets_name}: {partition!r} is not a partition number")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise OptionError(
                    f"{offsets_name}: offset of {topic}-{partition} must be an offset, "
                    "-2 (earliest) or -1 (latest)"
                )
            offsets[TopicPartition(topic, int(partition))] = offset
    return OffsetSpec(default=default, offsets=offsets)


def _json_object(value: str, name: str, expected: str) -> dict[str, object]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise OptionError(f"{name} must be {expected}; not JSON: {error}") from error
    if not isinstance(parsed, dict):
        raise OptionError(f"{name} must be a JSON object keyed by topic")
    return parsed


def _positive_int(given: Mapping[str, str], name: str) -> int | None:
    value = given.get(name)
    if value is None:
        return None
    number = _non_negative_int(value, name)
    if number == 0:
        raise OptionError(f"{name} must be positive")
    return number


def _non_negative_int(value: str, name: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise OptionError(f"{name} must be a whole number, not {value!r}") from None
    if number < 0:
        raise OptionError(f"{name} must not be negative")
    return number


def _boolean(given: Mapping[str, str], name: str, default: bool) -> bool:
    value = given.get(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise OptionError(f"{name} must be true or false, not {value!r}")
    return word == "true"
