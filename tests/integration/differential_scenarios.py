"""Scenarios for the differential test: the same client calls against Apache Kafka and Shoal.

Each scenario is a plain function ``(env: Endpoint) -> Observation``. It makes
its own topics and groups (``env.topic_name(base)``, ``env.group_name(base)``,
unique per run), drives them with confluent-kafka (librdkafka) exactly as an
application would, and returns what the client observed as a JSON-able dict:
records with their keys, values, headers, partitions, offsets and
timestamps, error names (``KafkaError.name()``), offsets from ListOffsets,
group states and assignments, config values with their flags, admin results.
A scenario never asserts: whatever a system answers is the observation, and
the test compares Kafka's with Shoal's.

What is inherently different per run (the run's suffix on every name, cluster
ids, broker addresses, member ids, the broker's clock in LogAppendTime
stamps, CreateTime stamps relative to the run's base time) is left raw by the
scenarios and removed by :func:`normalise`, the one place that does it.

Timestamps: scenarios that read timestamps back produce with explicit
CreateTime stamps ``env.base_ts + n`` (a recent time: Kafka's retention check
runs 30 s after start and would delete segments older than seven days), so
``normalise`` can show them as ``"base+n"``.

A scenario declares the doors it makes sense on (``doors``): ``direct`` is
Shoal's brokers' internal listeners (no SASL, no namespace), ``gateway`` is a
tenant's SASL/PLAIN connection through the gateway. Kafka runs every scenario
once, on its plain listener.
"""

from __future__ import annotations

import hashlib
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    ElectionType,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

Observation = dict[str, Any]

DOORS = ("direct", "gateway")
TIMEOUT_S = 20.0
"""How long a scenario waits for anything (a record, a rebalance, an admin answer)."""
SHORT_S = 5.0
"""For waits that are expected to end without an answer (an error, nothing to read)."""
COMMON_KEYS = (
    "cleanup.policy",
    "compression.type",
    "delete.retention.ms",
    "max.message.bytes",
    "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.type",
    "min.insync.replicas",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.ms",
    "unclean.leader.election.enable",
)
"""Topic configs whose values, sources and flags the config scenarios compare."""


@dataclass(frozen=True)
class Endpoint:
    """One door to one system, for one scenario run."""

    system: str
    """``kafka``, ``shoal-direct`` or ``shoal-gateway``."""
    config: Mapping[str, Any]
    """confluent-kafka settings: bootstrap servers and, at the gateway, SASL/PLAIN."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    base_ts: int = field(default_factory=lambda: int(time.time()) * 1000)
    """CreateTime stamps are ``base_ts + n``; normalise shows them as ``base+n``."""
    _admin: list[AdminClient] = field(default_factory=list, compare=False, repr=False)

    def topic_name(self, base: str) -> str:
        return f"{base}-{self.run_id}"

    def group_name(self, base: str) -> str:
        return f"g-{base}-{self.run_id}"

    def client(self, **extra: Any) -> dict[str, Any]:
        return {**self.config, **extra}

    def admin(self) -> AdminClient:
        """One admin client per run, held here: a collected client cancels its futures."""
        if not self._admin:
            self._admin.append(AdminClient(self.client()))
        return self._admin[0]

    def producer(self, **extra: Any) -> Producer:
        return Producer(self.client(**{"linger.ms": 5, "acks": "all", **extra}))

    def consumer(self, group: str | None = None, **extra: Any) -> Consumer:
        settings = {
            "group.id": group or self.group_name("reader"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 250,
            "topic.metadata.refresh.interval.ms": 1000,
            **extra,
        }
        return Consumer(self.client(**settings))


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Endpoint], Observation]
    doors: tuple[str, ...]
    doc: str


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    doors: tuple[str, ...] = DOORS,
) -> Callable[[Callable[[Endpoint], Observation]], Callable[[Endpoint], Observation]]:
    def register(fn: Callable[[Endpoint], Observation]) -> Callable[[Endpoint], Observation]:
        assert fn.__name__ not in SCENARIOS, fn.__name__
        SCENARIOS[fn.__name__] = Scenario(fn.__name__, fn, doors, (fn.__doc__ or "").strip())
        return fn

    return register


# -- normalising -------------------------------------------------------------------------

VOLATILE = {
    "member_id": "<member-id>",
    "host": "<host>",
    "cluster_id": "<cluster-id>",
    "coordinator": "<node>",
    "controller": "<node>",
    "leader": "<node>",
    "topic_id": "<topic-id>",
}
"""Keys whose non-empty values differ per run or per system: replaced by a placeholder.

An empty or missing value stays as it is, so "is there one" is still compared."""
TIMESTAMP_WINDOW_MS = 86_400_000


def normalise(observation: Any, env: Endpoint) -> Any:
    """An observation with what differs per run removed, ready to compare across systems.

    One walk over the JSON-able value, which:

    * removes the run's suffix (``-<run_id>``) from every string and dict key, so
      topic and group names read as the scenario's base names;
    * replaces the non-empty value of a :data:`VOLATILE` key (member ids, client
      hosts, cluster and topic ids, which broker leads or coordinates) by a
      placeholder;
    * in a dict whose ``timestamp_type`` is ``LogAppendTime``, replaces
      ``timestamp`` by ``<log-append-time>`` (the broker's clock; scenarios record
      separately whether it fell inside the produce call's window);
    * shows any other value under a key named ``timestamp`` within a day of
      ``env.base_ts`` as ``"base+n"`` / ``"base-n"`` (the producer's CreateTime
      stamps are ``base_ts + n``); -1 and other values stay;
    * turns tuples into lists and bytes into text (:func:`show`).
    """
    suffix = f"-{env.run_id}"

    def text(value: str) -> str:
        return value.replace(suffix, "")

    def walk(value: Any, key: str | None = None) -> Any:
        if key in VOLATILE and value not in (None, "", -1):
            return VOLATILE[key]
        if isinstance(value, dict):
            out = {text(str(k)): walk(v, str(k)) for k, v in value.items()}
            if out.get("timestamp_type") == "LogAppendTime" and "timestamp" in out:
                out["timestamp"] = "<log-append-time>"
            return out
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        if isinstance(value, bytes):
            return show(value)
        if isinstance(value, str):
            return text(value)
        if (
            key == "timestamp"
            and isinstance(value, int)
            and not isinstance(value, bool)
            and abs(value - env.base_ts) <= TIMESTAMP_WINDOW_MS
        ):
            delta = value - env.base_ts
            return f"base+{delta}" if delta >= 0 else f"base{delta}"
        return value

    return walk(observation)


# -- helpers -----------------------------------------------------------------------------


def show(data: bytes | None) -> str | None:
    """Bytes as text for an observation: UTF-8 if it is, else hex; long values by digest."""
    if data is None:
        return None
    if len(data) > 256:
        return f"<{len(data)} bytes sha256:{hashlib.sha256(data).hexdigest()[:16]}>"
    try:
        decoded = data.decode()
    except UnicodeDecodeError:
        return "hex:" + data.hex()
    return decoded if decoded.isprintable() else "hex:" + data.hex()


def error_name(error: KafkaError | BaseException | None) -> str | None:
    """``KafkaError.name()`` of an error or of the KafkaException that carries it."""
    if error is None:
        return None
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return str(error.args[0].name())
    if isinstance(error, KafkaError):
        return str(error.name())
    return f"{type(error).__name__}: {error}"


def outcome(future: Any, view: Callable[[Any], Any] = lambda _: None) -> Any:
    """What an admin future came to: ``view(result)``, or ``{"error": name}``."""
    try:
        result = future.result(TIMEOUT_S)
    except KafkaException as exc:
        return {"error": error_name(exc)}
    return view(result)


TRANSIENT = frozenset(
    {"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"}
)
"""Errors Kafka's Java admin client retries; so do the group scenarios (a coordinator
that moved or is still loading its offsets partition is not what they observe)."""


def retrying(call: Callable[[], Any], timeout: float = SHORT_S * 2) -> Any:
    """``call()`` again while it comes to ``{"error": <transient>}``, for up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = call()
        transient = isinstance(result, dict) and result.get("error") in TRANSIENT
        if not transient or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def timestamp_view(message: Message) -> tuple[str, int]:
    kind, value = message.timestamp()
    names = {TIMESTAMP_CREATE_TIME: "CreateTime", TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime"}
    return names.get(kind, "NotAvailable"), value


def record_view(message: Message) -> Observation:
    kind, stamp = timestamp_view(message)
    headers = message.headers()
    return {
        "partition": message.partition(),
        "offset": message.offset(),
        "key": show(message.key()),
        "value": show(message.value()),
        "headers": None if headers is None else [[k, show(v)] for k, v in headers],
        "timestamp_type": kind,
        "timestamp": stamp,
    }


def wait_for(predicate: Callable[[], Any], timeout: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def topic_visible(admin: AdminClient, topic: str, partitions: int) -> bool:
    try:
        metadata = admin.list_topics(topic, timeout=5).topics.get(topic)
    except KafkaException:
        return False
    if metadata is None or metadata.error is not None:
        return False
    parts = metadata.partitions
    return len(parts) == partitions and all(p.leader >= 0 for p in parts.values())


def create_topic(
    env: Endpoint,
    base: str,
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    replication_factor: int = -1,
) -> str:
    """A new topic, created and visible with a leader for every partition."""
    name = env.topic_name(base)
    admin = env.admin()
    new = NewTopic(name, partitions, replication_factor, config=dict(config or {}))
    admin.create_topics([new])[name].result(TIMEOUT_S)
    # Kafka's controller answers before the brokers have the new metadata.
    if not wait_for(lambda: topic_visible(admin, name, partitions)):
        raise TimeoutError(f"{name} never showed {partitions} partitions with leaders")
    return name


def commit_when_known(consumer: Consumer, offsets: list[TopicPartition]) -> None:
    """Commit, waiting out UNKNOWN_TOPIC_OR_PART for a topic just created.

    A new topic reaches the group coordinator's metadata a moment after the
    broker that answered CreateTopics, in Kafka as in Shoal; an application
    that commits at once retries, as this does. An error that lasts is raised.
    """

    def committed() -> bool:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            return False
        return True

    if not wait_for(committed):
        consumer.commit(offsets=offsets, asynchronous=False)


Rec = dict[str, Any]
"""A record to produce: value, and optionally key, partition, headers, timestamp."""


def produce(
    env: Endpoint,
    topic: str,
    records: Iterable[Rec],
    flush_each: bool = False,
    stored: Callable[[], bool] | None = None,
    **config: Any,
) -> list[Observation]:
    """Produce the records in order; the delivery report of each, in the same order.

    ``stored``: keep the producer (and its connections) until this says the records
    are stored, or TIMEOUT_S passed. With acks=0 a flush returns once the bytes are
    sent, and a connection closed right behind them has lost them on Apache Kafka
    under load.
    """
    producer = env.producer(**config)
    reports: list[Observation | None] = []

    def on_delivery(index: int) -> Callable[[KafkaError | None, Message], None]:
        def report(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                reports[index] = {"error": error_name(error)}
            else:
                kind, stamp = timestamp_view(message)
                reports[index] = {
                    "partition": message.partition(),
                    "offset": message.offset(),
                    "timestamp_type": kind,
                    **({"timestamp": stamp} if kind == "LogAppendTime" else {}),
                }

        return report

    for index, record in enumerate(records):
        reports.append(None)
        kwargs: dict[str, Any] = {"value": record.get("value")}
        for name in ("key", "partition", "headers", "timestamp"):
            if name in record:
                kwargs[name] = record[name]
        try:
            producer.produce(topic, on_delivery=on_delivery(index), **kwargs)
        except (KafkaException, BufferError) as exc:
            reports[index] = {"error": error_name(exc)}
        if flush_each:
            producer.flush(TIMEOUT_S)
    remaining = producer.flush(TIMEOUT_S)
    if stored is not None:
        deadline = time.monotonic() + TIMEOUT_S
        while not stored() and time.monotonic() < deadline:
            time.sleep(0.1)
    return [r if r is not None else {"error": f"undelivered ({remaining} left)"} for r in reports]


def read(
    env: Endpoint,
    topic: str,
    partitions: Iterable[int] = (0,),
    offset: int = OFFSET_BEGINNING,
    timeout: float = TIMEOUT_S,
    limit: int | None = None,
    **config: Any,
) -> Observation:
    """Assign the partitions at ``offset`` and read until each reports its end.

    Returns the records in arrival order per partition (sorted by partition,
    then offset), each partition's end-of-partition offset, and any error
    events the consumer raised.
    """
    wanted = list(partitions)
    consumer = env.consumer(**config)
    records: list[Observation] = []
    eof: dict[int, int] = {}
    errors: list[str | None] = []
    try:
        consumer.assign([TopicPartition(topic, p, offset) for p in wanted])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(eof) < len(wanted):
            if limit is not None and len(records) >= limit:
                break
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    eof[message.partition()] = message.offset()
                else:
                    errors.append(error_name(error))
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        break
                continue
            eof.pop(message.partition(), None)
            records.append(record_view(message))
    finally:
        consumer.close()
    records.sort(key=lambda r: (r["partition"], r["offset"]))
    return {
        "records": records,
        "eof": {str(p): o for p, o in sorted(eof.items())},
        "errors": errors,
    }


def watermarks(env: Endpoint, topic: str, partitions: Iterable[int] = (0,)) -> Observation:
    consumer = env.consumer()
    try:
        out: Observation = {}
        for p in partitions:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=TIMEOUT_S, cached=False
                )
                out[str(p)] = [low, high]
            except KafkaException as exc:
                out[str(p)] = {"error": error_name(exc)}
        return out
    finally:
        consumer.close()


def list_offsets(
    env: Endpoint,
    topic: str,
    specs: Mapping[str, OffsetSpec],
    partition: int = 0,
    **kwargs: Any,
) -> Observation:
    """ListOffsets (AdminClient.list_offsets) for each named spec, one request each."""
    admin = env.admin()
    out = {}
    for label, spec in specs.items():
        tp = TopicPartition(topic, partition)
        future = admin.list_offsets({tp: spec}, request_timeout=TIMEOUT_S, **kwargs)[tp]
        out[label] = outcome(
            future,
            lambda r: {
                "offset": r.offset,
                "timestamp": r.timestamp,
                "leader_epoch": r.leader_epoch,
            },
        )
    return out


def source_name(source: Any) -> str:
    """A ConfigSource's name (synonyms carry it as a bare int)."""
    return str(ConfigSource(int(source.value if hasattr(source, "value") else source)).name)


def config_view(entry: ConfigEntry) -> Observation:
    return {
        "value": entry.value,
        "source": source_name(entry.source),
        "is_default": entry.is_default,
        "is_read_only": entry.is_read_only,
        "is_sensitive": entry.is_sensitive,
        "synonyms": [[name, source_name(s.source)] for name, s in entry.synonyms.items()],
    }


def describe_topic_configs(
    env: Endpoint, topic: str, keys: Iterable[str] = COMMON_KEYS
) -> Observation:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    future = env.admin().describe_configs([resource], request_timeout=TIMEOUT_S)[resource]
    wanted = list(keys)
    return outcome(
        future, lambda r: {k: config_view(r[k]) if k in r else "<absent>" for k in wanted}
    )


def group_description(env: Endpoint, group: str) -> Observation:
    return retrying(lambda: _group_description(env, group))


def _group_description(env: Endpoint, group: str) -> Observation:
    future = env.admin().describe_consumer_groups([group], request_timeout=TIMEOUT_S)[group]

    def view(d: Any) -> Observation:
        members = [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "host": m.host,
                "group_instance_id": m.group_instance_id,
                "assignment": sorted(
                    [tp.topic, tp.partition] for tp in m.assignment.topic_partitions
                ),
            }
            for m in d.members
        ]
        members.sort(key=lambda m: (m["client_id"], m["assignment"]))
        return {
            "group_id": d.group_id,
            "is_simple_consumer_group": d.is_simple_consumer_group,
            "state": d.state.name if d.state is not None else None,
            "type": d.type.name if d.type is not None else None,
            "partition_assignor": d.partition_assignor,
            "coordinator": d.coordinator.id if d.coordinator is not None else None,
            "members": members,
        }

    return outcome(future, view)


def group_offsets(env: Endpoint, group: str, topic: str, partitions: Iterable[int]) -> Observation:
    wanted = list(partitions)
    return retrying(lambda: _group_offsets(env, group, topic, wanted))


def _group_offsets(env: Endpoint, group: str, topic: str, partitions: list[int]) -> Observation:
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    future = env.admin().list_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group]

    def view(result: Any) -> Observation:
        return {
            str(tp.partition): {
                "offset": tp.offset,
                "metadata": tp.metadata,
                "error": error_name(tp.error),
            }
            for tp in sorted(result.topic_partitions, key=lambda t: t.partition)
        }

    return outcome(future, view)


def values(count: int, prefix: str = "v") -> list[Rec]:
    return [{"key": f"k{i}".encode(), "value": f"{prefix}{i}".encode()} for i in range(count)]


def stamped(env: Endpoint, records: list[Rec], step: int = 1) -> list[Rec]:
    return [{**r, "timestamp": env.base_ts + i * step} for i, r in enumerate(records)]


# -- records in, records out --------------------------------------------------------------


@scenario()
def produce_consume_roundtrip(env: Endpoint) -> Observation:
    """Keyed records with CreateTime stamps are read back with their partition and offsets."""
    topic = create_topic(env, "roundtrip")
    delivered = produce(env, topic, stamped(env, values(5), step=7))
    return {"delivered": delivered, "read": read(env, topic)}


@scenario()
def null_and_empty_keys_and_values(env: Endpoint) -> Observation:
    """A null key or value stays null, an empty one stays empty."""
    topic = create_topic(env, "nulls")
    records: list[Rec] = [
        {"key": None, "value": None},
        {"key": b"", "value": b""},
        {"key": None, "value": b"value-only"},
        {"key": b"key-only", "value": None},
        {"key": b"\x00\xff", "value": b"\x80binary\x00"},
    ]
    delivered = produce(env, topic, stamped(env, records))
    return {"delivered": delivered, "read": read(env, topic)}


@scenario()
def headers_roundtrip(env: Endpoint) -> Observation:
    """Headers come back in order: repeated keys, a null value, an empty value, binary."""
    topic = create_topic(env, "headers")
    records: list[Rec] = [
        {
            "value": b"with-headers",
            "headers": [
                ("trace", b"abc"),
                ("trace", b"def"),
                ("empty", b""),
                ("null", None),
                ("binary", b"\x00\x01\xfe\xff"),
                ("unicode-\u00e9", "\u00e9t\u00e9".encode()),
            ],
        },
        {"value": b"no-headers"},
        {"value": b"empty-list", "headers": []},
    ]
    delivered = produce(env, topic, stamped(env, records))
    return {"delivered": delivered, "read": read(env, topic)}


@scenario()
def explicit_partitions_and_watermarks(env: Endpoint) -> Observation:
    """Records sent to given partitions land there at offsets from 0; the high watermarks follow."""
    topic = create_topic(env, "partitions", partitions=3)
    records = [
        {"value": f"p{p}-{i}".encode(), "partition": p} for p in range(3) for i in range(p + 1)
    ]
    delivered = produce(env, topic, stamped(env, records))
    return {
        "delivered": delivered,
        "watermarks": watermarks(env, topic, range(3)),
        "read": read(env, topic, range(3)),
    }


@scenario()
def keyed_records_spread_by_the_client_partitioner(env: Endpoint) -> Observation:
    """The murmur2 partitioner (the Java client's) puts each key where Kafka's clients would."""
    topic = create_topic(env, "keyed", partitions=4)
    records = [{"key": f"key-{i}".encode(), "value": b"x"} for i in range(12)]
    delivered = produce(env, topic, records, partitioner="murmur2_random")
    return {"partitions": [d.get("partition", d) for d in delivered]}


def _codec_scenario(codec: str) -> Callable[[Endpoint], Observation]:
    def run(env: Endpoint) -> Observation:
        topic = create_topic(env, f"codec-{codec}")
        records = [
            {"key": f"k{i}".encode(), "value": (f"{codec}-record-{i}-" * 20).encode()}
            for i in range(20)
        ]
        delivered = produce(
            env, topic, stamped(env, records), **{"compression.type": codec, "linger.ms": 50}
        )
        return {
            "delivered": [d.get("offset", d) for d in delivered],
            "read": read(env, topic),
        }

    run.__name__ = f"compressed_batches_{codec}"
    run.__doc__ = f"Twenty records in {codec} batches (linger 50 ms) are read back byte for byte."
    return run


for _codec in ("none", "gzip", "snappy", "lz4", "zstd"):
    scenario()(_codec_scenario(_codec))


@scenario()
def topic_max_message_bytes(env: Endpoint) -> Observation:
    """A batch over the topic's max.message.bytes is refused; one under it is stored."""
    topic = create_topic(env, "maxbytes", config={"max.message.bytes": "20000"})
    records = [{"value": b"a" * 15000}, {"value": b"b" * 25000}, {"value": b"c" * 19000}]
    delivered = produce(env, topic, stamped(env, records), flush_each=True, **{"linger.ms": 0})
    return {"delivered": delivered, "read": read(env, topic)}


@scenario()
def record_too_large_for_the_broker_default(env: Endpoint) -> Observation:
    """Near the default limit (1048588 bytes per batch) a record is stored; over it, refused."""
    topic = create_topic(env, "default-limit")
    records = [{"value": b"n" * 1_040_000}, {"value": b"o" * 1_100_000}]
    delivered = produce(
        env,
        topic,
        stamped(env, records),
        flush_each=True,
        **{"linger.ms": 0, "message.max.bytes": 2_000_000, "compression.type": "none"},
    )
    return {"delivered": delivered, "read": read(env, topic)}


@scenario()
def produce_to_an_unknown_topic(env: Endpoint) -> Observation:
    """A producer writing to a topic nobody created: Kafka creates it, Shoal refuses."""
    topic = env.topic_name("unknown")
    delivered = produce(
        env,
        topic,
        [{"value": b"hello"}],
        **{"message.timeout.ms": 5000, "topic.metadata.propagation.max.ms": 2000},
    )
    metadata = env.admin().list_topics(topic, timeout=10).topics.get(topic)
    exists = metadata is not None and metadata.error is None
    return {
        "delivered": delivered,
        "topic_exists": exists,
        "partitions": len(metadata.partitions) if exists and metadata else None,
    }


@scenario()
def produce_to_an_unknown_partition(env: Endpoint) -> Observation:
    """Partition 5 of a one-partition topic: refused by the client from the metadata."""
    topic = create_topic(env, "unknown-partition")
    delivered = produce(env, topic, [{"value": b"x", "partition": 5}])
    return {"delivered": delivered}


@scenario()
def idempotent_producer(env: Endpoint) -> Observation:
    """An idempotent producer's records land once each, in order, on both partitions."""
    topic = create_topic(env, "idempotent", partitions=2)
    records = [{"value": f"i{i}".encode(), "partition": i % 2} for i in range(10)]
    delivered = produce(
        env,
        topic,
        stamped(env, records),
        **{"enable.idempotence": True, "max.in.flight.requests.per.connection": 5},
    )
    return {"delivered": delivered, "read": read(env, topic, range(2))}


@scenario()
def acks_zero_one_and_all(env: Endpoint) -> Observation:
    """acks=0 reports no offset; acks=1 and acks=all report the offsets; all are stored."""
    topic = create_topic(env, "acks")
    out: Observation = {}
    for count, acks in enumerate(("0", "1", "all"), start=1):
        out[f"acks={acks}"] = produce(
            env,
            topic,
            stamped(env, [{"value": f"acks-{acks}".encode()}]),
            stored=lambda count=count: len(read(env, topic, timeout=2)["records"]) >= count,
            acks=acks,
        )
    out["read"] = read(env, topic)
    return out


@scenario()
def create_time_too_far_in_the_future(env: Endpoint) -> Observation:
    """message.timestamp.after.max.ms (1 h): 30 min ahead is stored, 2 h ahead is refused."""
    topic = create_topic(env, "future")
    records: list[Rec] = [
        {"value": b"soon", "timestamp": env.base_ts + 1_800_000},
        {"value": b"too-late", "timestamp": env.base_ts + 7_200_000},
    ]
    delivered = produce(env, topic, records, flush_each=True, **{"linger.ms": 0})
    return {"delivered": delivered, "read": read(env, topic)}


@scenario()
def log_append_time_topic(env: Endpoint) -> Observation:
    """message.timestamp.type=LogAppendTime: the broker's clock replaces the producer's stamp."""
    topic = create_topic(env, "log-append", config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    delivered = produce(env, topic, stamped(env, values(3)))
    after = int(time.time() * 1000)
    got = read(env, topic)
    stamps = [r["timestamp"] for r in got["records"]]
    reported = [d.get("timestamp") for d in delivered]
    return {
        "delivered": delivered,
        "read": got,
        "stamped_within_the_produce_call": all(before - 1000 <= t <= after + 1000 for t in stamps),
        "delivery_reports_carry_the_stored_stamp": reported == stamps,
    }


# -- offsets and fetching ---------------------------------------------------------------


@scenario()
def list_offsets_earliest_latest_max_and_by_time(env: Endpoint) -> Observation:
    """ListOffsets for earliest, latest, max timestamp and several timestamps."""
    topic = create_topic(env, "list-offsets")
    produce(env, topic, stamped(env, values(4), step=10))
    specs = {
        "earliest": OffsetSpec.earliest(),
        "latest": OffsetSpec.latest(),
        "max_timestamp": OffsetSpec.max_timestamp(),
        "before_first": OffsetSpec.for_timestamp(env.base_ts - 100),
        "exact_first": OffsetSpec.for_timestamp(env.base_ts),
        "between": OffsetSpec.for_timestamp(env.base_ts + 15),
        "exact_last": OffsetSpec.for_timestamp(env.base_ts + 30),
        "after_last": OffsetSpec.for_timestamp(env.base_ts + 31),
        "far_future": OffsetSpec.for_timestamp(env.base_ts + 10**9),
    }
    return list_offsets(env, topic, specs)


@scenario()
def list_offsets_with_out_of_order_timestamps(env: Endpoint) -> Observation:
    """Stamps out of order: by-time finds the first offset at or after, max the largest."""
    topic = create_topic(env, "out-of-order")
    records = [
        {"value": f"v{i}".encode(), "timestamp": env.base_ts + t}
        for i, t in enumerate((30, 10, 20, 40, 5))
    ]
    produce(env, topic, records, flush_each=True, **{"linger.ms": 0})
    specs = {
        "max_timestamp": OffsetSpec.max_timestamp(),
        "at_5": OffsetSpec.for_timestamp(env.base_ts + 5),
        "at_15": OffsetSpec.for_timestamp(env.base_ts + 15),
        "at_35": OffsetSpec.for_timestamp(env.base_ts + 35),
        "at_41": OffsetSpec.for_timestamp(env.base_ts + 41),
    }
    return list_offsets(env, topic, specs)


@scenario()
def list_offsets_of_an_empty_topic(env: Endpoint) -> Observation:
    """Every ListOffsets spec on an empty partition."""
    topic = create_topic(env, "empty-offsets")
    specs = {
        "earliest": OffsetSpec.earliest(),
        "latest": OffsetSpec.latest(),
        "max_timestamp": OffsetSpec.max_timestamp(),
        "by_time": OffsetSpec.for_timestamp(env.base_ts),
    }
    return {"offsets": list_offsets(env, topic, specs), "watermarks": watermarks(env, topic)}


@scenario()
def list_offsets_of_unknown_partitions_and_topics(env: Endpoint) -> Observation:
    """ListOffsets for a partition past the topic's count and for a topic that does not exist."""
    topic = create_topic(env, "lo-unknown")
    missing = env.topic_name("lo-missing")
    return {
        "unknown_partition": list_offsets(env, topic, {"latest": OffsetSpec.latest()}, partition=3),
        "unknown_topic": list_offsets(env, missing, {"latest": OffsetSpec.latest()}),
        "watermarks_unknown_partition": watermarks(env, topic, [3]),
    }


@scenario()
def read_committed_without_transactions(env: Endpoint) -> Observation:
    """isolation.level=read_committed reads every non-transactional record; LSO = high watermark."""
    topic = create_topic(env, "read-committed")
    produce(env, topic, stamped(env, values(3)))
    committed_latest = list_offsets(
        env, topic, {"latest": OffsetSpec.latest()}, isolation_level=IsolationLevel.READ_COMMITTED
    )
    return {
        "latest_read_committed": committed_latest,
        "read": read(env, topic, **{"isolation.level": "read_committed"}),
    }


@scenario()
def consumer_offsets_for_times(env: Endpoint) -> Observation:
    """Consumer.offsets_for_times: first offset at or after each stamp, -1 past the end."""
    topic = create_topic(env, "for-times", partitions=2)
    records = [{"value": f"v{i}".encode(), "partition": i % 2} for i in range(6)]
    produce(env, topic, stamped(env, records, step=100))
    consumer = env.consumer()
    try:
        out: Observation = {}
        for label, stamp in (("start", 0), ("mid", 250), ("end", 500), ("past", 10_000)):
            query = [TopicPartition(topic, p, env.base_ts + stamp) for p in range(2)]
            try:
                found = consumer.offsets_for_times(query, timeout=TIMEOUT_S)
                out[label] = [[tp.partition, tp.offset, error_name(tp.error)] for tp in found]
            except KafkaException as exc:
                out[label] = {"error": error_name(exc)}
        return out
    finally:
        consumer.close()


@scenario()
def fetch_out_of_range_with_reset_error(env: Endpoint) -> Observation:
    """Fetching past the log end with auto.offset.reset=error raises _AUTO_OFFSET_RESET."""
    topic = create_topic(env, "oor-error")
    produce(env, topic, stamped(env, values(3)))
    return read(env, topic, offset=100, timeout=SHORT_S * 2, **{"auto.offset.reset": "error"})


@scenario()
def fetch_out_of_range_with_reset_earliest(env: Endpoint) -> Observation:
    """Fetching past the log end with auto.offset.reset=earliest starts again at offset 0."""
    topic = create_topic(env, "oor-earliest")
    produce(env, topic, stamped(env, values(3)))
    return read(env, topic, offset=100, **{"auto.offset.reset": "earliest"})


@scenario()
def fetch_out_of_range_with_reset_latest(env: Endpoint) -> Observation:
    """Past the log end with auto.offset.reset=latest: nothing old, then only the new record."""
    topic = create_topic(env, "oor-latest")
    produce(env, topic, stamped(env, values(3)))
    consumer = env.consumer(**{"auto.offset.reset": "latest"})
    seen: list[Observation] = []
    events: list[str | None] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 100)])
        at_end = wait_for(lambda: _poll_until_eof(consumer, seen, events), TIMEOUT_S)
        produce(env, topic, [{"value": b"new", "timestamp": env.base_ts + 99}])
        wait_for(lambda: _poll_until_eof(consumer, seen, events) and seen, TIMEOUT_S)
    finally:
        consumer.close()
    return {"reached_end_first": bool(at_end), "records": seen, "errors": events}


def _poll_until_eof(consumer: Consumer, seen: list[Observation], errors: list[str | None]) -> bool:
    message = consumer.poll(0.2)
    if message is None:
        return False
    error = message.error()
    if error is None:
        seen.append(record_view(message))
        return False
    if error.code() == KafkaError._PARTITION_EOF:
        return True
    errors.append(error_name(error))
    return False


@scenario()
def fetch_from_the_log_end(env: Endpoint) -> Observation:
    """Assigned at OFFSET_END: end of partition at the high watermark, then the next record."""
    topic = create_topic(env, "log-end")
    produce(env, topic, stamped(env, values(3)))
    consumer = env.consumer()
    seen: list[Observation] = []
    events: list[str | None] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
        wait_for(lambda: _poll_until_eof(consumer, seen, events), TIMEOUT_S)
        position = consumer.position([TopicPartition(topic, 0)])[0].offset
        produce(env, topic, [{"value": b"after-end", "timestamp": env.base_ts + 50}])
        wait_for(lambda: _poll_until_eof(consumer, seen, events) and seen, TIMEOUT_S)
    finally:
        consumer.close()
    return {"position_at_end": position, "records": seen, "errors": events}


@scenario()
def empty_topic_reads_nothing(env: Endpoint) -> Observation:
    """An empty partition: end of partition at 0, watermarks 0 and 0."""
    topic = create_topic(env, "empty")
    return {"read": read(env, topic), "watermarks": watermarks(env, topic)}


@scenario()
def small_fetch_limits_still_return_whole_records(env: Endpoint) -> Observation:
    """Fetch limits below a record's size: the first batch is returned whole (KIP-74)."""
    topic = create_topic(env, "small-fetch")
    records = [{"value": bytes([65 + i]) * 3000} for i in range(4)]
    produce(env, topic, stamped(env, records), flush_each=True, **{"linger.ms": 0})
    limits = {"fetch.max.bytes": 1000, "max.partition.fetch.bytes": 1000, "message.max.bytes": 1000}
    return read(env, topic, **limits)


# -- topics --------------------------------------------------------------------------------


def _create_errors(env: Endpoint, topics: Mapping[str, NewTopic], **kwargs: Any) -> Observation:
    admin = env.admin()
    futures = admin.create_topics(list(topics.values()), request_timeout=TIMEOUT_S, **kwargs)
    return {label: outcome(futures[t.topic], lambda _: "created") for label, t in topics.items()}


@scenario()
def create_topic_with_invalid_partitions(env: Endpoint) -> Observation:
    """CreateTopics with 0 partitions (librdkafka itself refuses negative counts but -1)."""
    return _create_errors(
        env,
        {
            "zero": NewTopic(env.topic_name("zero-partitions"), 0),
        },
    )


@scenario()
def create_topic_with_invalid_replication_factor(env: Endpoint) -> Observation:
    """CreateTopics with more replicas than brokers, and with zero replicas."""
    return _create_errors(
        env,
        {
            "four_of_three": NewTopic(env.topic_name("rf-four"), 1, 4),
            "zero": NewTopic(env.topic_name("rf-zero"), 1, 0),
        },
    )


@scenario()
def create_an_existing_topic(env: Endpoint) -> Observation:
    """CreateTopics for a name that exists, then for the same name twice in one request."""
    topic = create_topic(env, "exists")
    again = _create_errors(env, {"again": NewTopic(topic, 1)})
    return {"again": again}


@scenario()
def create_topic_with_invalid_configs(env: Endpoint) -> Observation:
    """Config values Kafka refuses: not a number, unknown names, values out of range."""
    cases = {
        "retention_ms_not_a_number": {"retention.ms": "soon"},
        "unknown_config_name": {"retention.forever": "1"},
        "cleanup_policy_unknown": {"cleanup.policy": "shred"},
        "min_insync_replicas_zero": {"min.insync.replicas": "0"},
        "segment_bytes_too_small": {"segment.bytes": "10"},
        "timestamp_type_unknown": {"message.timestamp.type": "WallClock"},
        "compression_gzip": {"compression.type": "gzip"},
        "compression_unknown": {"compression.type": "brotli"},
        "compression_uncompressed": {"compression.type": "uncompressed"},
        "gzip_level_zero": {"compression.gzip.level": "0"},
        "lz4_level_too_high": {"compression.lz4.level": "18"},
        "zstd_level_negative": {"compression.zstd.level": "-7"},
    }
    topics = {
        label: NewTopic(env.topic_name(f"cfg-{i}"), 1, config=config)
        for i, (label, config) in enumerate(cases.items())
    }
    return _create_errors(env, topics, validate_only=True)


@scenario()
def create_topic_with_invalid_names(env: Endpoint) -> Observation:
    """Topic names Kafka refuses: bad characters, too long, '.' and '..'."""
    names = {
        "space_and_bang": "bad name!",
        "slash": "a/b",
        "dot": ".",
        "dot_dot": "..",
        "too_long_250": "x" * 250,
        "longest_valid_249": "y" * 249,
    }
    topics = {label: NewTopic(name, 1) for label, name in names.items()}
    return _create_errors(env, topics, validate_only=True)


@scenario()
def create_topics_that_collide_on_dot_and_underscore(env: Endpoint) -> Observation:
    """'a.b' exists, so 'a_b' collides (Kafka's metric names would clash)."""
    create_topic(env, "collide.x")
    return _create_errors(env, {"underscore": NewTopic(env.topic_name("collide_x"), 1)})


@scenario()
def create_topic_validate_only(env: Endpoint) -> Observation:
    """validate_only answers success and creates nothing."""
    name = env.topic_name("validate-only")
    result = _create_errors(env, {"validate": NewTopic(name, 2)}, validate_only=True)
    return {"result": result, "listed": listed(env, name), "describe": describe_topic(env, name)}


def listed(env: Endpoint, topic: str) -> bool:
    """Whether Metadata for all topics lists ``topic`` (a Metadata request naming an
    unknown topic would have Kafka create it)."""
    return topic in env.admin().list_topics(timeout=TIMEOUT_S).topics


@scenario()
def create_topic_with_broker_defaults(env: Endpoint) -> Observation:
    """Partitions and replication factor -1: the broker's defaults (1 partition, 3 replicas)."""
    topic = create_topic(env, "defaults")
    return described_whole(env, topic, 1)


def described_whole(env: Endpoint, topic: str, partitions: int) -> Observation:
    """DescribeTopics once the answer shows every partition with a leader and a full ISR.

    Kafka's brokers apply a new topic's metadata a moment apart, and a freshly
    created partition's followers join the ISR a moment later in either system;
    the last answer is returned if it never settles.
    """

    def whole() -> Observation | None:
        found = describe_topic(env, topic)
        parts = found.get("partitions", [])
        complete = len(parts) == partitions and all(
            p["leader"] is not None and p["isr"] == p["replicas"] for p in parts
        )
        return found if complete else None

    return wait_for(whole, SHORT_S * 2) or describe_topic(env, topic)


def describe_topic(env: Endpoint, topic: str) -> Observation:
    future = env.admin().describe_topics(TopicCollection([topic]), request_timeout=TIMEOUT_S)[topic]

    def view(d: Any) -> Observation:
        return {
            "name": d.name,
            "topic_id": str(d.topic_id),
            "is_internal": d.is_internal,
            "partitions": [
                {
                    "id": p.id,
                    "leader": p.leader.id if p.leader is not None else None,
                    "replicas": len(p.replicas),
                    "isr": len(p.isr),
                    "leader_is_a_replica": p.leader is not None
                    and p.leader.id in [r.id for r in p.replicas],
                }
                for p in sorted(d.partitions, key=lambda p: p.id)
            ],
        }

    return outcome(future, view)


@scenario()
def describe_a_topic(env: Endpoint) -> Observation:
    """DescribeTopics: partitions with a leader among three in-sync replicas, not internal."""
    topic = create_topic(env, "describe", partitions=3)
    return described_whole(env, topic, 3)


@scenario()
def describe_an_unknown_topic(env: Endpoint) -> Observation:
    """DescribeTopics and Metadata for a topic that does not exist."""
    missing = env.topic_name("nowhere")
    return {"describe": describe_topic(env, missing), "listed": listed(env, missing)}


@scenario()
def create_partitions_grows_a_topic(env: Endpoint) -> Observation:
    """CreatePartitions 1 -> 3: the new partitions have leaders and take records."""
    topic = create_topic(env, "grow")
    admin = env.admin()
    result = outcome(admin.create_partitions([NewPartitions(topic, 3)])[topic], lambda _: "ok")
    wait_for(lambda: topic_visible(admin, topic, 3))
    delivered = produce(env, topic, stamped(env, [{"value": b"p2", "partition": 2}]))
    return {"result": result, "describe": described_whole(env, topic, 3), "delivered": delivered}


@scenario()
def create_partitions_cannot_shrink(env: Endpoint) -> Observation:
    """CreatePartitions to fewer, to as many, and for an unknown topic."""
    topic = create_topic(env, "shrink", partitions=3)
    missing = env.topic_name("shrink-missing")
    admin = env.admin()
    out = {}
    for label, name, count in (("fewer", topic, 2), ("same", topic, 3), ("unknown", missing, 2)):
        future = admin.create_partitions([NewPartitions(name, count)], request_timeout=TIMEOUT_S)
        out[label] = outcome(future[name], lambda _: "ok")
    return out


@scenario()
def delete_topics_known_and_unknown(env: Endpoint) -> Observation:
    """DeleteTopics: an unknown name fails alone; a deleted topic is then unknown."""
    topic = create_topic(env, "delete-me")
    missing = env.topic_name("never-was")
    admin = env.admin()
    futures = admin.delete_topics([topic, missing], request_timeout=TIMEOUT_S)
    result = {
        "existing": outcome(futures[topic], lambda _: "deleted"),
        "unknown": outcome(futures[missing], lambda _: "deleted"),
    }

    # Kafka's brokers learn of a deletion one by one, and each call may ask
    # another: what is observed is the first answer in which both agree (or the
    # last one, if they never do).
    seen: dict[str, Any] = {}

    def gone() -> bool:
        seen.update(describe_after=describe_topic(env, topic), listed_after=listed(env, topic))
        return "error" in seen["describe_after"] and not seen["listed_after"]

    wait_for(gone)
    return {"delete": result, **seen}


# -- configs ---------------------------------------------------------------------------------


@scenario()
def describe_configs_lists_the_topic_config_names(env: Endpoint) -> Observation:
    """DescribeConfigs of a topic without overrides: which config names it lists."""
    topic = create_topic(env, "config-names")
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    future = env.admin().describe_configs([resource], request_timeout=TIMEOUT_S)[resource]
    return {"names": outcome(future, lambda r: dict.fromkeys(sorted(r), True))}


@scenario()
def describe_configs_defaults(env: Endpoint) -> Observation:
    """Values, sources, synonyms and flags of a topic's configs with no overrides."""
    topic = create_topic(env, "config-defaults")
    return describe_topic_configs(env, topic)


@scenario()
def describe_configs_overrides(env: Endpoint) -> Observation:
    """Overrides given at creation are DYNAMIC_TOPIC_CONFIG, the rest unchanged."""
    topic = create_topic(
        env,
        "config-overrides",
        config={
            "retention.ms": "3600000",
            "max.message.bytes": "500000",
            "cleanup.policy": "compact",
            "min.insync.replicas": "1",
        },
    )
    return describe_topic_configs(env, topic)


def _alter(env: Endpoint, topic: str, entries: list[ConfigEntry], **kwargs: Any) -> Any:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    future = env.admin().incremental_alter_configs([resource], request_timeout=TIMEOUT_S, **kwargs)
    return outcome(future[resource], lambda _: "ok")


def _set(
    name: str, value: str | None, op: AlterConfigOpType = AlterConfigOpType.SET
) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=op)


@scenario()
def incremental_alter_configs_set_delete_append_subtract(env: Endpoint) -> Observation:
    """IncrementalAlterConfigs: SET, DELETE back to the default, APPEND and SUBTRACT a list."""
    topic = create_topic(env, "alter")
    keys = ("retention.ms", "cleanup.policy", "max.message.bytes")
    plan = [
        ("set", [_set("retention.ms", "7200000"), _set("max.message.bytes", "300000")],
         {"retention.ms": "7200000", "max.message.bytes": "300000"}),
        ("delete", [_set("retention.ms", None, AlterConfigOpType.DELETE)],
         {"retention.ms": "604800000"}),
        ("append", [_set("cleanup.policy", "compact", AlterConfigOpType.APPEND)],
         {"cleanup.policy": "delete,compact"}),
        ("subtract", [_set("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT)],
         {"cleanup.policy": "compact"}),
    ]  # fmt: skip
    steps: Observation = {}
    for label, entries, expected in plan:
        result = _alter(env, topic, entries)
        steps[label] = {"result": result, "configs": settled(env, topic, keys, expected)}
    return steps


def settled(env: Endpoint, topic: str, keys: Iterable[str], expected: Mapping[str, str]) -> Any:
    """The topic's configs once they show ``expected`` (or after a few seconds regardless).

    Kafka's brokers apply a config change a moment after the controller has
    acknowledged it, so a DescribeConfigs right after may still see the old value.
    """

    def shows_expected() -> Any:
        configs = describe_topic_configs(env, topic, keys)
        matches = isinstance(configs, dict) and all(
            isinstance(configs.get(k), dict) and configs[k]["value"] == v
            for k, v in expected.items()
        )
        return configs if matches else None

    return wait_for(shows_expected, SHORT_S) or describe_topic_configs(env, topic, keys)


@scenario()
def incremental_alter_configs_refusals(env: Endpoint) -> Observation:
    """IncrementalAlterConfigs: a bad value, an unknown name, an unknown topic, validate_only."""
    topic = create_topic(env, "alter-bad")
    missing = env.topic_name("alter-missing")
    return {
        "bad_value": _alter(env, topic, [_set("retention.ms", "forever")]),
        "unknown_name": _alter(env, topic, [_set("retention.forever", "1")]),
        "unknown_topic": _alter(env, missing, [_set("retention.ms", "1000")]),
        "validate_only": _alter(env, topic, [_set("retention.ms", "5000")], validate_only=True),
        "after": describe_topic_configs(env, topic, ["retention.ms"]),
    }


@scenario()
def legacy_alter_configs(env: Endpoint) -> Observation:
    """AlterConfigs (API 33, the non-incremental one) replacing a topic's overrides."""
    topic = create_topic(env, "legacy-alter", config={"retention.ms": "3600000"})
    resource = ConfigResource(
        ConfigResource.Type.TOPIC, topic, set_config={"max.message.bytes": "400000"}
    )
    with warnings.catch_warnings():  # deprecated in the client, still served by Kafka 4
        warnings.simplefilter("ignore", DeprecationWarning)
        future = env.admin().alter_configs([resource], request_timeout=SHORT_S * 2)[resource]
    result = outcome(future, lambda _: "ok")
    keys = ["retention.ms", "max.message.bytes"]
    return {
        "result": result,
        "after": settled(env, topic, keys, {"max.message.bytes": "400000"}),
    }


@scenario()
def elect_leaders_without_an_election_to_make(env: Endpoint) -> Observation:
    """ElectLeaders (API 43) where the preferred replica leads, and for missing partitions."""
    topic = create_topic(env, "elect")
    missing = env.topic_name("elect-missing")
    labels = {topic: "topic", missing: "missing"}
    admin = env.admin()

    def elect(kind: ElectionType, partitions: list[TopicPartition]) -> Any:
        future = admin.elect_leaders(kind, partitions)
        return outcome(
            future,
            lambda result: sorted(
                [f"{labels[tp.topic]}-{tp.partition}", error_name(error)]
                for tp, error in result.items()
            ),
        )

    return {
        "preferred": elect(ElectionType.PREFERRED, [TopicPartition(topic, 0)]),
        "unclean": elect(ElectionType.UNCLEAN, [TopicPartition(topic, 0)]),
        "missing_partition": elect(ElectionType.PREFERRED, [TopicPartition(topic, 7)]),
        "missing_topic": elect(ElectionType.PREFERRED, [TopicPartition(missing, 0)]),
    }


@scenario()
def describe_configs_of_an_unknown_topic(env: Endpoint) -> Observation:
    """DescribeConfigs for a topic that does not exist."""
    return describe_topic_configs(env, env.topic_name("config-missing"))


@scenario()
def retention_configs_changed_on_a_topic_with_records(env: Endpoint) -> Observation:
    """retention.ms and retention.bytes changed on a live topic: described back, records kept."""
    topic = create_topic(env, "retention")
    produce(env, topic, stamped(env, values(3)))
    result = _alter(
        env, topic, [_set("retention.ms", "86400000"), _set("retention.bytes", "1048576")]
    )
    keys = ("retention.ms", "retention.bytes")
    configs = settled(env, topic, keys, {"retention.ms": "86400000", "retention.bytes": "1048576"})
    return {"result": result, "configs": configs, "watermarks": watermarks(env, topic)}


# -- records removed, transactions, cluster ------------------------------------------------


@scenario()
def delete_records_moves_the_log_start(env: Endpoint) -> Observation:
    """DeleteRecords up to offset 2: the low watermark moves and reads start there."""
    topic = create_topic(env, "delete-records")
    produce(env, topic, stamped(env, values(5)))
    tp = TopicPartition(topic, 0, 2)
    future = env.admin().delete_records([tp], request_timeout=SHORT_S * 2)[tp]
    result = outcome(future, lambda r: {"low_watermark": r.low_watermark})
    return {
        "result": result,
        "earliest": list_offsets(env, topic, {"earliest": OffsetSpec.earliest()}),
        "read": read(env, topic),
    }


@scenario()
def transactional_producer(env: Endpoint) -> Observation:
    """A producer with a transactional.id initialises, commits one record, and it is read."""
    topic = create_topic(env, "txn")
    producer = Producer(
        env.client(
            **{"transactional.id": env.topic_name("txn-id"), "transaction.timeout.ms": 30000}
        )
    )
    steps: Observation = {}
    try:
        producer.init_transactions(TIMEOUT_S)
        steps["init"] = "ok"
        producer.begin_transaction()
        producer.produce(topic, value=b"in-txn", timestamp=env.base_ts)
        producer.commit_transaction(TIMEOUT_S)
        steps["commit"] = "ok"
    except KafkaException as exc:
        error = exc.args[0]
        steps["error"] = error_name(exc)
        steps["fatal"] = error.fatal()
    steps["read"] = read(env, topic, timeout=SHORT_S, **{"isolation.level": "read_committed"})
    return steps


def transactional(env: Endpoint, name: str) -> Producer:
    producer = Producer(
        env.client(**{"transactional.id": env.topic_name(name), "transaction.timeout.ms": 30000})
    )
    producer.init_transactions(TIMEOUT_S)
    return producer


COMMITTED = {"isolation.level": "read_committed"}
LATEST = {"latest": OffsetSpec.latest()}


@scenario()
def transactions_committed_and_aborted(env: Endpoint) -> Observation:
    """Commit two records, abort two, commit one: what each isolation level reads, at which
    offsets (markers take one each), and ListOffsets latest at both levels."""
    topic = create_topic(env, "txn-mixed")
    producer = transactional(env, "txn-mixed-id")
    for label, count, commit in (("a", 2, True), ("b", 2, False), ("c", 1, True)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, value=f"{label}{i}".encode(), timestamp=env.base_ts + i)
        if commit:
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.flush(TIMEOUT_S)
            producer.abort_transaction(TIMEOUT_S)
    return {
        "read_committed": read(env, topic, **COMMITTED),
        "read_uncommitted": read(env, topic),
        "latest": list_offsets(env, topic, LATEST),
        "latest_read_committed": list_offsets(
            env, topic, LATEST, isolation_level=IsolationLevel.READ_COMMITTED
        ),
        "watermarks": watermarks(env, topic),
    }


@scenario()
def an_open_transaction_holds_back_read_committed(env: Endpoint) -> Observation:
    """Two plain records, then a transaction left open: read_committed and ListOffsets latest
    at read_committed stop before it (the last stable offset); after its commit, both
    move past its marker."""
    topic = create_topic(env, "txn-open")
    produce(env, topic, stamped(env, values(2)))
    producer = transactional(env, "txn-open-id")
    producer.begin_transaction()
    producer.produce(topic, value=b"open", timestamp=env.base_ts + 5)
    producer.flush(TIMEOUT_S)

    def seen() -> Observation:
        # The read first: Kafka answers the commit before its markers are written, so
        # ListOffsets right after it may still give the old last stable offset.
        read_committed = read(env, topic, timeout=SHORT_S, **COMMITTED)
        return {
            "read_committed": read_committed,
            "latest": list_offsets(env, topic, LATEST),
            "latest_read_committed": list_offsets(
                env, topic, LATEST, isolation_level=IsolationLevel.READ_COMMITTED
            ),
        }

    during = seen()
    producer.commit_transaction(TIMEOUT_S)
    return {"during": during, "after": seen()}


@scenario()
def a_fenced_producer_cannot_commit(env: Endpoint) -> Observation:
    """A second producer with the same transactional id fences the first, whose commit then
    fails with a fatal error; only the second one's record is read."""
    topic = create_topic(env, "txn-fenced")
    zombie = transactional(env, "txn-fenced-id")
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie", timestamp=env.base_ts)
    zombie.flush(TIMEOUT_S)
    successor = transactional(env, "txn-fenced-id")
    successor.begin_transaction()
    successor.produce(topic, value=b"successor", timestamp=env.base_ts + 1)
    successor.commit_transaction(TIMEOUT_S)
    out: Observation = {}
    try:
        zombie.commit_transaction(TIMEOUT_S)
        out["zombie_commit"] = "ok"
    except KafkaException as exc:
        out["zombie_commit"] = error_name(exc)
        out["fatal"] = exc.args[0].fatal()
    out["read"] = read(env, topic, **COMMITTED)
    return out


@scenario()
def offsets_sent_with_a_transaction(env: Endpoint) -> Observation:
    """send_offsets_to_transaction: an aborted transaction leaves the group's offset where
    it was; a committed one moves it."""
    topic = create_topic(env, "txn-offsets")
    produce(env, topic, stamped(env, values(4)))
    group = env.group_name("txn-offsets")
    producer = transactional(env, "txn-offsets-id")
    metadata = env.consumer(group)
    try:
        out: Observation = {}
        for label, offset, commit in (("aborted", 2, False), ("committed", 3, True)):
            producer.begin_transaction()
            producer.send_offsets_to_transaction(
                [TopicPartition(topic, 0, offset)], metadata.consumer_group_metadata(), TIMEOUT_S
            )
            if commit:
                producer.commit_transaction(TIMEOUT_S)
            else:
                producer.abort_transaction(TIMEOUT_S)
            found = metadata.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_S)
            out[label] = [tp.offset for tp in found]
        return out
    finally:
        metadata.close()


@scenario()
def describe_cluster(env: Endpoint) -> Observation:
    """DescribeCluster: three brokers, a controller, a cluster id."""
    future = env.admin().describe_cluster(request_timeout=TIMEOUT_S)
    return outcome(
        future,
        lambda r: {
            "nodes": len(r.nodes),
            "controller": r.controller.id if r.controller is not None else None,
            "cluster_id": r.cluster_id,
        },
    )


# -- consumer groups ---------------------------------------------------------------------------


def poll_until(
    consumers: Mapping[str, Consumer], until: Callable[[], bool], timeout: float = TIMEOUT_S
) -> bool:
    """Poll every consumer in turn (joins and rebalances happen in poll) until ``until()``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for consumer in consumers.values():
            consumer.poll(0.05)
        if until():
            return True
    return False


def _assignment(consumer: Consumer) -> list[list[Any]]:
    return sorted([tp.topic, tp.partition] for tp in consumer.assignment())


@scenario()
def group_member_commits_and_the_group_empties(env: Endpoint) -> Observation:
    """One member reads and commits: described Stable with its assignment, then Empty."""
    topic = create_topic(env, "group-one", partitions=2)
    produce(
        env,
        topic,
        stamped(env, [{"value": f"v{i}".encode(), "partition": i % 2} for i in range(6)]),
    )
    group = env.group_name("one")
    consumer = env.consumer(group, **{"client.id": "member-a"})
    consumer.subscribe([topic])
    try:
        records: list[Observation] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(records) < 6 and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                records.append(record_view(message))
        commit = consumer.commit(asynchronous=False)
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in range(2)], timeout=TIMEOUT_S
        )
        stable = group_description(env, group)
    finally:
        consumer.close()
    empty = wait_for(
        lambda: (d := group_description(env, group)).get("state") == "EMPTY" and d, SHORT_S
    ) or group_description(env, group)
    return {
        "records": len(records),
        "commit": sorted([tp.partition, tp.offset] for tp in commit or []),
        "committed": [[tp.partition, tp.offset] for tp in committed],
        "while_member": stable,
        "after_close": empty,
        "admin_offsets": group_offsets(env, group, topic, range(2)),
    }


def _rebalance(env: Endpoint, assignor: str) -> Observation:
    topic = create_topic(env, f"rebalance-{assignor}", partitions=4)
    produce(
        env,
        topic,
        stamped(env, [{"value": f"v{i}".encode(), "partition": i % 4} for i in range(8)]),
    )
    group = env.group_name(f"rebalance-{assignor}")
    settings = {"partition.assignment.strategy": assignor}
    first = env.consumer(group, **{"client.id": "member-1"}, **settings)
    second = env.consumer(group, **{"client.id": "member-2"}, **settings)
    out: Observation = {}
    open_ = [first, second]
    try:
        first.subscribe([topic])
        poll_until({"1": first}, lambda: len(first.assignment()) == 4)
        out["alone"] = _assignment(first)
        second.subscribe([topic])
        both = {"1": first, "2": second}
        poll_until(
            both,
            lambda: (
                len(first.assignment()) + len(second.assignment()) == 4
                and bool(second.assignment())
            ),
        )
        out["shared"] = sorted(
            [[p for _, p in _assignment(first)], [p for _, p in _assignment(second)]]
        )
        out["described"] = group_description(env, group)
        for c in both.values():
            assigned = c.assignment()
            if assigned:
                positions = [TopicPartition(tp.topic, tp.partition, 2) for tp in assigned]
                c.commit(offsets=positions, asynchronous=False)
        second.close()  # LeaveGroup: the first member takes every partition back
        open_ = [first]
        poll_until({"1": first}, lambda: len(first.assignment()) == 4)
        out["after_leave"] = _assignment(first)
        out["committed_after_leave"] = [
            [tp.partition, tp.offset]
            for tp in first.committed(
                [TopicPartition(topic, p) for p in range(4)], timeout=TIMEOUT_S
            )
        ]
    finally:
        for consumer in open_:
            consumer.close()
    return out


@scenario()
def group_rebalance_range(env: Endpoint) -> Observation:
    """Two members under the range assignor share four partitions; one leaves, offsets stay."""
    return _rebalance(env, "range")


@scenario()
def group_rebalance_roundrobin(env: Endpoint) -> Observation:
    """Two members under the roundrobin assignor share four partitions; one leaves, offsets stay."""
    return _rebalance(env, "roundrobin")


@scenario()
def commit_beyond_the_log_end(env: Endpoint) -> Observation:
    """A committed offset past the log end is stored as given; a member then resets to earliest."""
    topic = create_topic(env, "commit-beyond")
    produce(env, topic, stamped(env, values(3)))
    group = env.group_name("beyond")
    standalone = env.consumer(group)
    try:
        standalone.assign([TopicPartition(topic, 0)])
        standalone.commit(offsets=[TopicPartition(topic, 0, 1000)], asynchronous=False)
        committed = standalone.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_S)[0].offset
    finally:
        standalone.close()
    member = env.consumer(group)
    records: list[Observation] = []
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT_S
        while len(records) < 3 and time.monotonic() < deadline:
            message = member.poll(0.2)
            if message is not None and message.error() is None:
                records.append(record_view(message))
    finally:
        member.close()
    return {"committed": committed, "read_after_reset": [r["offset"] for r in records]}


@scenario()
def commit_with_metadata(env: Endpoint) -> Observation:
    """Committed metadata and leader epochs come back; metadata over 4096 bytes is refused."""
    topic = create_topic(env, "commit-metadata", partitions=3)
    group = env.group_name("metadata")
    consumer = env.consumer(group)
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(3)])
        offsets = [
            TopicPartition(topic, 0, 5, metadata="checkpoint-\u00e9", leader_epoch=0),
            TopicPartition(topic, 1, 0, metadata=""),
        ]
        commit_when_known(consumer, offsets)
        try:
            too_large = [TopicPartition(topic, 2, 1, metadata="m" * 5000)]
            refused = consumer.commit(offsets=too_large, asynchronous=False)
            oversized: Any = [error_name(tp.error) for tp in refused or []]
        except KafkaException as exc:
            oversized = {"error": error_name(exc)}
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in range(3)], timeout=TIMEOUT_S
        )
    finally:
        consumer.close()
    return {
        "consumer": [[tp.partition, tp.offset, tp.metadata, tp.leader_epoch] for tp in committed],
        "oversized_metadata": oversized,
        "admin": group_offsets(env, group, topic, range(3)),
    }


@scenario()
def offsets_of_an_unknown_group(env: Endpoint) -> Observation:
    """OffsetFetch for a group that never existed: no offsets, no error."""
    topic = create_topic(env, "unknown-group")
    group = env.group_name("never")
    consumer = env.consumer(group)
    try:
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_S)
    finally:
        consumer.close()
    return {
        "consumer": [[tp.partition, tp.offset, error_name(tp.error)] for tp in committed],
        "admin": group_offsets(env, group, topic, [0]),
    }


@scenario()
def describe_an_unknown_group(env: Endpoint) -> Observation:
    """DescribeGroups for a group that never existed."""
    return group_description(env, env.group_name("ghost"))


@scenario()
def simple_consumer_group(env: Endpoint) -> Observation:
    """Assign and commit without subscribing: a group with offsets and no members."""
    topic = create_topic(env, "simple")
    produce(env, topic, stamped(env, values(4)))
    group = env.group_name("simple")
    consumer = env.consumer(group)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        commit_when_known(consumer, [TopicPartition(topic, 0, 3)])
    finally:
        consumer.close()
    listed = _listed_groups(env, [group])
    latest = list_offsets(env, topic, {"latest": OffsetSpec.latest()})
    offsets = group_offsets(env, group, topic, [0])
    return {
        "described": group_description(env, group),
        "listed": listed,
        "offsets": offsets,
        "lag": latest["latest"]["offset"] - offsets["0"]["offset"]
        if "error" not in latest["latest"] and "error" not in offsets
        else None,
    }


def _listed_groups(env: Endpoint, groups: Iterable[str], **kwargs: Any) -> Any:
    wanted = set(groups)

    def view(result: Any) -> Observation:
        return {
            "groups": sorted(
                [
                    [
                        g.group_id,
                        g.is_simple_consumer_group,
                        g.state.name if g.state else None,
                        g.type.name if g.type else None,
                    ]
                    for g in result.valid
                    if g.group_id in wanted
                ]
            ),
            "errors": [error_name(e) for e in result.errors],
        }

    return outcome(env.admin().list_consumer_groups(request_timeout=TIMEOUT_S, **kwargs), view)


@scenario()
def list_groups_by_state(env: Endpoint) -> Observation:
    """ListGroups with a state filter: a Stable group with a member, an Empty one with offsets."""
    topic = create_topic(env, "list-groups")
    active, idle = env.group_name("active"), env.group_name("idle")
    parked = env.consumer(idle)
    try:
        parked.assign([TopicPartition(topic, 0)])
        parked.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        parked.close()
    member = env.consumer(active)
    try:
        member.subscribe([topic])
        poll_until({"m": member}, lambda: bool(member.assignment()))
        wait_for(lambda: group_description(env, active).get("state") == "STABLE", SHORT_S)
        return {
            "all": _listed_groups(env, [active, idle]),
            "stable": _listed_groups(env, [active, idle], states={ConsumerGroupState.STABLE}),
            "empty": _listed_groups(env, [active, idle], states={ConsumerGroupState.EMPTY}),
            "classic": _listed_groups(env, [active, idle], types={ConsumerGroupType.CLASSIC}),
            "consumer": _listed_groups(env, [active, idle], types={ConsumerGroupType.CONSUMER}),
        }
    finally:
        member.close()


@scenario()
def delete_groups(env: Endpoint) -> Observation:
    """DeleteGroups: an empty group goes, an unknown one and one with a member are refused."""
    topic = create_topic(env, "delete-groups")
    empty, busy, unknown = (env.group_name(n) for n in ("del-empty", "del-busy", "del-unknown"))
    parked = env.consumer(empty)
    try:
        parked.assign([TopicPartition(topic, 0)])
        parked.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        parked.close()
    member = env.consumer(busy)
    try:
        member.subscribe([topic])
        poll_until({"m": member}, lambda: bool(member.assignment()))
        futures = env.admin().delete_consumer_groups(
            [empty, busy, unknown], request_timeout=TIMEOUT_S
        )
        result = {
            "empty": outcome(futures[empty], lambda _: "deleted"),
            "busy": outcome(futures[busy], lambda _: "deleted"),
            "unknown": outcome(futures[unknown], lambda _: "deleted"),
        }
    finally:
        member.close()
    return {"delete": result, "offsets_after": group_offsets(env, empty, topic, [0])}


@scenario()
def alter_group_offsets(env: Endpoint) -> Observation:
    """AlterConsumerGroupOffsets on an empty group, and on one with a live member."""
    topic = create_topic(env, "alter-offsets", partitions=2)
    produce(env, topic, stamped(env, values(4)))
    idle, busy = env.group_name("alter-idle"), env.group_name("alter-busy")
    admin = env.admin()

    def alter(group: str, offsets: list[tuple[int, int]]) -> Any:
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(topic, p, o) for p, o in offsets]
        )
        future = admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group]
        return outcome(
            future,
            lambda r: sorted(
                [tp.partition, tp.offset, error_name(tp.error)] for tp in r.topic_partitions
            ),
        )

    out: Observation = {"idle": alter(idle, [(0, 1), (1, 0)])}
    out["idle_after"] = group_offsets(env, idle, topic, range(2))
    member = env.consumer(busy)
    try:
        member.subscribe([topic])
        poll_until({"m": member}, lambda: len(member.assignment()) == 2)
        out["busy"] = alter(busy, [(0, 2)])
    finally:
        member.close()
    return out


@scenario()
def regex_subscription(env: Endpoint) -> Observation:
    """A regex subscription matches the run's two topics and reads both."""
    first = create_topic(env, "rx-a")
    second = create_topic(env, "rx-b")
    produce(env, first, stamped(env, [{"value": b"from-a"}]))
    produce(env, second, stamped(env, [{"value": b"from-b"}]))
    consumer = env.consumer(env.group_name("regex"))
    got: list[Observation] = []
    try:
        consumer.subscribe([f"^rx-.*-{env.run_id}$"])
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 2 and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append({"topic": message.topic(), "value": show(message.value())})
        assignment = _assignment(consumer)
    finally:
        consumer.close()
    return {"records": sorted(got, key=lambda r: r["topic"]), "assignment": assignment}


# -- more edges ----------------------------------------------------------------------------------


@scenario()
def acks_all_with_too_few_in_sync_replicas(env: Endpoint) -> Observation:
    """min.insync.replicas=4 on three replicas: acks=all is refused, acks=1 is stored."""
    topic = create_topic(env, "min-isr", config={"min.insync.replicas": "4"})
    no_retry = {"retries": 0, "message.timeout.ms": 10000}
    return {
        "acks_all": produce(env, topic, stamped(env, [{"value": b"all"}]), acks="all", **no_retry),
        "acks_one": produce(env, topic, stamped(env, [{"value": b"one"}]), acks="1", **no_retry),
        "read": read(env, topic),
    }


@scenario()
def create_topic_with_a_replica_assignment(env: Endpoint) -> Observation:
    """An explicit replica assignment is kept in order; one naming a missing broker is refused."""
    name = env.topic_name("assigned")
    admin = env.admin()
    good = NewTopic(name, 2, replica_assignment=[[2, 0], [1, 2]])
    bad = NewTopic(env.topic_name("assigned-bad"), 1, replica_assignment=[[0, 9]])
    futures = admin.create_topics([good, bad], request_timeout=TIMEOUT_S)
    result = {
        "good": outcome(futures[name], lambda _: "created"),
        "bad": outcome(futures[bad.topic], lambda _: "created"),
    }
    wait_for(lambda: topic_visible(admin, name, 2))

    def replicas() -> Any:
        future = admin.describe_topics(TopicCollection([name]), request_timeout=TIMEOUT_S)[name]
        return outcome(
            future,
            lambda d: [
                {
                    "id": p.id,
                    "replicas": [r.id for r in p.replicas],
                    "preferred_leader_leads": p.leader is not None
                    and p.leader.id == p.replicas[0].id,
                }
                for p in sorted(d.partitions, key=lambda p: p.id)
            ],
        )

    # Kafka's brokers learn of a new topic a moment apart; ask until one answers it whole.
    def whole() -> Any:
        found = replicas()
        return found if isinstance(found, list) and len(found) == 2 else None

    return {"result": result, "replicas": wait_for(whole, SHORT_S) or replicas()}


@scenario()
def internal_topics_in_metadata(env: Endpoint) -> Observation:
    """__consumer_offsets, once a group has committed: listed, internal, 3 replicas."""
    topic = create_topic(env, "internal")
    consumer = env.consumer(env.group_name("internal"))
    try:
        consumer.assign([TopicPartition(topic, 0)])
        commit_when_known(consumer, [TopicPartition(topic, 0, 0)])
    finally:
        consumer.close()
    name = "__consumer_offsets"
    future = env.admin().describe_topics(TopicCollection([name]), request_timeout=TIMEOUT_S)[name]
    return {
        "listed": listed(env, name),
        "describe": outcome(
            future,
            lambda d: {
                "is_internal": d.is_internal,
                "replicas": sorted({len(p.replicas) for p in d.partitions}),
            },
        ),
    }


BROKER_KEYS = (
    "auto.create.topics.enable",
    "default.replication.factor",
    "num.partitions",
    "min.insync.replicas",
    "message.max.bytes",
    "log.segment.bytes",
    "log.retention.check.interval.ms",
)


@scenario()
def describe_broker_configs(env: Endpoint) -> Observation:
    """DescribeConfigs of broker 0: a few settings both systems have, with their sources."""
    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    future = env.admin().describe_configs([resource], request_timeout=TIMEOUT_S)[resource]

    def view(result: Any) -> Observation:
        return {
            k: {
                key: value
                for key, value in config_view(result[k]).items()
                if key in ("value", "source", "is_read_only", "is_sensitive")
            }
            if k in result
            else "<absent>"
            for k in BROKER_KEYS
        }

    return outcome(future, view)


@scenario()
def subscribe_to_a_missing_topic(env: Endpoint) -> Observation:
    """Subscribing to a topic that does not exist: an error event, no topic created."""
    missing = env.topic_name("sub-missing")
    consumer = env.consumer(env.group_name("sub-missing"))
    errors: list[str | None] = []
    try:
        consumer.subscribe([missing])
        deadline = time.monotonic() + SHORT_S * 2
        while not errors and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is not None:
                errors.append(error_name(message.error()))
    finally:
        consumer.close()
    return {"errors": errors, "listed": listed(env, missing)}


@scenario()
def group_offsets_of_every_partition(env: Endpoint) -> Observation:
    """OffsetFetch without naming partitions returns every committed one, over two topics."""
    first = create_topic(env, "all-offsets-a", partitions=2)
    second = create_topic(env, "all-offsets-b")
    group = env.group_name("all-offsets")
    consumer = env.consumer(group)
    try:
        offsets = [
            TopicPartition(first, 0, 4),
            TopicPartition(first, 1, 0),
            TopicPartition(second, 0, 7),
        ]
        consumer.assign(offsets)
        commit_when_known(consumer, offsets)
    finally:
        consumer.close()
    request = ConsumerGroupTopicPartitions(group)
    future = env.admin().list_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group]
    return outcome(
        future,
        lambda r: sorted(
            [tp.topic, tp.partition, tp.offset, error_name(tp.error)] for tp in r.topic_partitions
        ),
    )


@scenario()
def commit_offsets_for_unknown_topics_and_partitions(env: Endpoint) -> Observation:
    """OffsetCommit naming a topic that does not exist and a partition past the count."""
    topic = create_topic(env, "commit-unknown")
    missing = env.topic_name("commit-missing")
    group = env.group_name("commit-unknown")
    admin = env.admin()
    out: Observation = {}
    for label, tp in (
        ("unknown_topic", TopicPartition(missing, 0, 1)),
        ("unknown_partition", TopicPartition(topic, 3, 1)),
    ):
        request = ConsumerGroupTopicPartitions(group, [tp])
        future = admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group]
        out[label] = outcome(
            future,
            lambda r: [[t.partition, t.offset, error_name(t.error)] for t in r.topic_partitions],
        )
    out["offsets_after"] = group_offsets(env, group, topic, [0, 3])
    out["listed_missing"] = listed(env, missing)
    return out


@scenario()
def static_member_leaves_without_a_rebalance(env: Endpoint) -> Observation:
    """A static member (group.instance.id) that closes stays in the group; its twin takes over."""
    topic = create_topic(env, "static", partitions=2)
    group = env.group_name("static")
    settings = {"group.instance.id": "instance-1", "client.id": "static-member"}
    first = env.consumer(group, **settings)
    try:
        first.subscribe([topic])
        poll_until({"1": first}, lambda: len(first.assignment()) == 2)
        before = group_description(env, group)
    finally:
        first.close()
    after_close = group_description(env, group)
    twin = env.consumer(group, **settings)
    try:
        twin.subscribe([topic])
        poll_until({"2": twin}, lambda: len(twin.assignment()) == 2)
        rejoined = group_description(env, group)
        assignment = _assignment(twin)
    finally:
        twin.close()
    return {
        "before": before,
        "after_close": after_close,
        "rejoined": rejoined,
        "twin_assignment": assignment,
    }


@scenario()
def group_rebalance_cooperative_sticky(env: Endpoint) -> Observation:
    """Two members under cooperative-sticky (incremental) share four partitions; one leaves."""
    return _rebalance(env, "cooperative-sticky")


@scenario()
def create_partitions_validate_only(env: Endpoint) -> Observation:
    """CreatePartitions with validate_only answers success and adds nothing."""
    topic = create_topic(env, "grow-validate")
    future = env.admin().create_partitions(
        [NewPartitions(topic, 4)], validate_only=True, request_timeout=TIMEOUT_S
    )[topic]
    result = outcome(future, lambda _: "ok")
    return {"result": result, "describe": describe_topic(env, topic)}


@scenario()
def delete_and_recreate_a_topic(env: Endpoint) -> Observation:
    """A deleted topic's name can be created again; the new topic starts empty at offset 0."""
    topic = create_topic(env, "recreate")
    produce(env, topic, stamped(env, values(3)))
    admin = env.admin()
    deleted = outcome(
        admin.delete_topics([topic], request_timeout=TIMEOUT_S)[topic], lambda _: "ok"
    )
    wait_for(lambda: "error" in describe_topic(env, topic))

    def recreate() -> Any:
        result = outcome(admin.create_topics([NewTopic(topic, 2)])[topic], lambda _: "created")
        return result if result == "created" else None

    created = wait_for(recreate) or outcome(
        admin.create_topics([NewTopic(topic, 2)])[topic], lambda _: "created"
    )
    wait_for(lambda: topic_visible(admin, topic, 2))
    # Every leader must know the new topic before ListOffsets reaches it: in
    # CI, Kafka's admin saw it while a leader still answered UNKNOWN_PARTITION.
    wait_for(lambda: all(isinstance(w, list) for w in watermarks(env, topic, range(2)).values()))
    return {
        "deleted": deleted,
        "created": created,
        "watermarks": watermarks(env, topic, range(2)),
        "delivered": produce(env, topic, stamped(env, [{"value": b"again", "partition": 0}])),
    }


def _one_batch(
    env: Endpoint, topic: str, stamps: Iterable[int], **config: Any
) -> list[Observation]:
    """Records with the given stamps (relative to base) in a single batch."""
    records = [
        {"value": f"b{i}".encode(), "timestamp": env.base_ts + t} for i, t in enumerate(stamps)
    ]
    return produce(env, topic, records, **{"linger.ms": 200, **config})


@scenario()
def list_offsets_within_one_batch(env: Endpoint) -> Observation:
    """Out-of-order stamps inside one batch: by-time and max-timestamp point at the record."""
    topic = create_topic(env, "one-batch")
    delivered = _one_batch(env, topic, (10, 30, 20, 5))
    specs = {
        "max_timestamp": OffsetSpec.max_timestamp(),
        "at_15": OffsetSpec.for_timestamp(env.base_ts + 15),
        "at_25": OffsetSpec.for_timestamp(env.base_ts + 25),
        "at_31": OffsetSpec.for_timestamp(env.base_ts + 31),
    }
    return {"delivered": delivered, "offsets": list_offsets(env, topic, specs)}


@scenario()
def list_offsets_within_one_compressed_batch(env: Endpoint) -> Observation:
    """The same over a gzip batch: the broker looks inside the compressed records."""
    topic = create_topic(env, "one-gzip-batch")
    delivered = _one_batch(env, topic, (10, 30, 20, 5), **{"compression.type": "gzip"})
    specs = {
        "max_timestamp": OffsetSpec.max_timestamp(),
        "at_15": OffsetSpec.for_timestamp(env.base_ts + 15),
        "at_25": OffsetSpec.for_timestamp(env.base_ts + 25),
    }
    return {"delivered": delivered, "offsets": list_offsets(env, topic, specs)}


@scenario()
def list_offsets_on_a_log_append_time_topic(env: Endpoint) -> Observation:
    """LogAppendTime: max timestamp and by-time lookups use the broker's stamps."""
    topic = create_topic(env, "lat-offsets", config={"message.timestamp.type": "LogAppendTime"})
    produce(env, topic, stamped(env, values(2)), flush_each=True, **{"linger.ms": 0})
    produce(env, topic, stamped(env, values(3)), **{"linger.ms": 100})
    found = list_offsets(
        env,
        topic,
        {
            "max_timestamp": OffsetSpec.max_timestamp(),
            "producer_stamp": OffsetSpec.for_timestamp(env.base_ts),
        },
    )
    for result in found.values():
        if "timestamp" in result and result["timestamp"] != -1:
            result["timestamp_type"] = "LogAppendTime"
    return found


@scenario()
def compressed_batch_over_the_limit_uncompressed(env: Endpoint) -> Observation:
    """max.message.bytes applies to the batch as sent: 60 kB that gzip to little are stored."""
    topic = create_topic(env, "compressed-limit", config={"max.message.bytes": "20000"})
    records = [{"value": b"z" * 60000}]
    delivered = produce(
        env, topic, stamped(env, records), **{"compression.type": "gzip", "linger.ms": 0}
    )
    return {"delivered": delivered, "read": read(env, topic)}


@scenario()
def create_time_too_far_in_the_past(env: Endpoint) -> Observation:
    """message.timestamp.before.max.ms=1h: 30 min old is stored, 2 h old is refused."""
    topic = create_topic(env, "past", config={"message.timestamp.before.max.ms": "3600000"})
    records: list[Rec] = [
        {"value": b"recent", "timestamp": env.base_ts - 1_800_000},
        {"value": b"stale", "timestamp": env.base_ts - 7_200_000},
    ]
    delivered = produce(env, topic, records, flush_each=True, **{"linger.ms": 0})
    return {"delivered": delivered, "read": read(env, topic)}


@scenario()
def log_append_time_ignores_the_producer_stamp_limits(env: Endpoint) -> Observation:
    """On a LogAppendTime topic a CreateTime 2 h ahead is not checked: the broker restamps."""
    topic = create_topic(env, "lat-future", config={"message.timestamp.type": "LogAppendTime"})
    records: list[Rec] = [{"value": b"from-the-future", "timestamp": env.base_ts + 7_200_000}]
    delivered = produce(env, topic, records, **{"linger.ms": 0})
    return {"delivered": delivered, "read": read(env, topic)}


@scenario()
def incremental_alter_configs_list_ops_on_scalars(env: Endpoint) -> Observation:
    """APPEND and SUBTRACT on a config that is not a list are refused."""
    topic = create_topic(env, "alter-scalar")
    return {
        "append": _alter(env, topic, [_set("retention.ms", "5", AlterConfigOpType.APPEND)]),
        "subtract": _alter(env, topic, [_set("retention.ms", "5", AlterConfigOpType.SUBTRACT)]),
        "delete_unset": _alter(env, topic, [_set("segment.ms", None, AlterConfigOpType.DELETE)]),
        "after": describe_topic_configs(env, topic, ["retention.ms", "segment.ms"]),
    }


@scenario()
def consumer_group_protocol(env: Endpoint) -> Observation:
    """A KIP-848 consumer (group.protocol=consumer) joins, is assigned, and reads."""
    topic = create_topic(env, "kip848", partitions=2)
    produce(env, topic, stamped(env, [{"value": b"x", "partition": p} for p in range(2)]))
    consumer = Consumer(
        env.client(
            **{
                "group.id": env.group_name("kip848"),
                "group.protocol": "consumer",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
    )
    records: list[Observation] = []
    errors: list[str | None] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + SHORT_S
        while len(records) < 2 and not errors and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                errors.append(error_name(message.error()))
            else:
                records.append(record_view(message))
        assignment = _assignment(consumer)
    finally:
        consumer.close()
    return {"records": len(records), "errors": errors[:1], "assignment": assignment}


def _raw_coordinator(env: Endpoint, group: str) -> str:
    """The group's coordinator, from FindCoordinator v4 asked with a raw request."""
    from raw_kafka import RawConnection, request_class

    find = request_class(10, 4)
    first = str(env.config["bootstrap.servers"]).split(",")[0]
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        with RawConnection(first) as conn:
            found = conn.call(find(key_type=0, coordinator_keys=(group,))).coordinators[0]
        if found.port > 0 or time.monotonic() > deadline:
            return f"{found.host}:{found.port}"
        time.sleep(0.2)


@scenario(doors=("direct",))
def consumer_group_heartbeat_errors(env: Endpoint) -> Observation:
    """ConsumerGroupHeartbeat (KIP-848) refusals: malformed joins, unknown and fenced members,
    leaving, a classic group's id, and OffsetCommit v9's member epoch checks."""
    from datetime import timedelta

    from raw_kafka import RawConnection, request_class

    topic = create_topic(env, "kip848-errors", partitions=2)
    group, classic = env.group_name("kip848-errors"), env.group_name("kip848-classic")
    heartbeat = request_class(68, 1)
    join_fields = {
        "rebalance_timeout": timedelta(seconds=30),
        "subscribed_topic_names": (topic,),
        "topic_partitions": (),
    }

    def beat(conn: RawConnection, member: str, epoch: int, **fields: Any) -> Any:
        fields.setdefault("topic_partitions", None)
        return conn.call(
            heartbeat(
                group_id=fields.pop("group", group), member_id=member, member_epoch=epoch, **fields
            )
        )

    def code(response: Any) -> str:
        return str(response.error_code.name)

    out: dict[str, Any] = {}
    with RawConnection(_raw_coordinator(env, group)) as conn:
        out["empty_member_id"] = code(beat(conn, "", 0, **join_fields))
        out["unknown_group"] = code(beat(conn, "m1", 1))
        out["no_rebalance_timeout"] = code(
            beat(conn, "m1", 0, subscribed_topic_names=(topic,), topic_partitions=())
        )
        out["unknown_assignor"] = code(beat(conn, "m1", 0, server_assignor="nope", **join_fields))
        joined = beat(conn, "m1", 0, **join_fields)
        epoch = joined.member_epoch
        out["join"] = [code(joined), epoch > 0, joined.assignment is not None]
        out["fenced_ahead"] = code(beat(conn, "m1", epoch + 5))
        out["unknown_member"] = code(beat(conn, "nobody", epoch))
        out["invalid_epoch"] = code(beat(conn, "m1", -3))
        out["static_leave_without_instance"] = code(beat(conn, "m1", -2))
        out["leave_unknown"] = code(beat(conn, "nobody", -1))
        commit = request_class(8, 9)
        commit_topic = request_class(8, 9, "OffsetCommitRequestTopic")
        commit_partition = request_class(8, 9, "OffsetCommitRequestPartition")

        def committed(member: str, member_epoch: int) -> str:
            answer = conn.call(
                commit(
                    group_id=group,
                    generation_id_or_member_epoch=member_epoch,
                    member_id=member,
                    group_instance_id=None,
                    topics=(
                        commit_topic(
                            name=topic,
                            partitions=(
                                commit_partition(
                                    partition_index=0,
                                    committed_offset=0,
                                    committed_leader_epoch=-1,
                                    committed_metadata="",
                                ),
                            ),
                        ),
                    ),
                )
            )
            return str(answer.topics[0].partitions[0].error_code.name)

        out["commit"] = {
            "stale_epoch": committed("m1", epoch + 7),
            "unknown_member": committed("nobody", epoch),
            "no_member": committed("", -1),
            "current": committed("m1", epoch),
        }
        left = beat(conn, "m1", -1)
        out["leave"] = [code(left), left.member_epoch]
        out["after_leave"] = code(beat(conn, "m1", epoch))
    join_group = request_class(11, 9)
    protocol = request_class(11, 9, "JoinGroupRequestProtocol")
    with RawConnection(_raw_coordinator(env, classic)) as conn:

        def join_classic(member: str) -> Any:
            return conn.call(
                join_group(
                    group_id=classic,
                    session_timeout=timedelta(seconds=10),
                    rebalance_timeout=timedelta(seconds=10),
                    member_id=member,
                    group_instance_id=None,
                    protocol_type="consumer",
                    protocols=(protocol(name="range", metadata=b""),),
                    reason=None,
                )
            )

        classic_member = join_classic(join_classic("").member_id)
        out["classic_join"] = code(classic_member)
        out["heartbeat_to_classic_group"] = code(beat(conn, "m1", 0, group=classic, **join_fields))
    return out


@scenario(doors=("direct",))
def fetch_sessions(env: Endpoint) -> Observation:
    """Fetch sessions (KIP-227) with raw Fetch v12 requests to one leader: a session opened,
    incremental fetches that carry only what changed, a forgotten partition, a stale epoch,
    an unknown session, and the session closed."""
    from datetime import timedelta

    from raw_kafka import RawConnection, request_class

    topic = create_topic(env, "fetch-sessions", partitions=6)
    metadata = env.admin().list_topics(topic, timeout=TIMEOUT_S)
    by_leader: dict[int, list[int]] = {}
    for index, part in sorted(metadata.topics[topic].partitions.items()):
        by_leader.setdefault(part.leader, []).append(index)
    leader, (first, second, *_) = max(by_leader.items(), key=lambda item: len(item[1]))
    address = metadata.brokers[leader]
    fetch = request_class(1, 12)
    fetch_topic = request_class(1, 12, "FetchTopic")
    fetch_partition = request_class(1, 12, "FetchPartition")
    forgotten_topic = request_class(1, 12, "ForgottenTopic")

    def wanted(index: int, offset: int) -> Any:
        return fetch_partition(
            partition=index,
            current_leader_epoch=-1,
            fetch_offset=offset,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )

    def call(
        conn: RawConnection,
        session_id: int,
        epoch: int,
        partitions: dict[int, int],
        forget: tuple[int, ...] = (),
    ) -> Any:
        return conn.call(
            fetch(
                replica_id=-1,
                max_wait=timedelta(0),
                min_bytes=0,
                max_bytes=1 << 20,
                isolation_level=0,
                session_id=session_id,
                session_epoch=epoch,
                topics=(
                    (
                        fetch_topic(
                            topic=topic,
                            partitions=tuple(wanted(i, o) for i, o in partitions.items()),
                        ),
                    )
                    if partitions
                    else ()
                ),
                forgotten_topics_data=(
                    (forgotten_topic(topic=topic, partitions=forget),) if forget else ()
                ),
                rack_id="",
            )
        )

    def view(response: Any) -> Observation:
        carried = sorted(
            (
                {
                    "partition": "first" if p.partition_index == first else "second",
                    "error": p.error_code.name,
                    "high_watermark": p.high_watermark,
                    "records": bool(p.records),
                }
                for t in response.responses
                for p in t.partitions
            ),
            key=lambda p: p["partition"],
        )
        return {"error": response.error_code.name, "partitions": carried}

    produce(env, topic, [{"value": b"a", "partition": first}, {"value": b"b", "partition": first}])
    out: dict[str, Any] = {}
    with RawConnection(f"{address.host}:{address.port}") as conn:
        opened = call(conn, 0, 0, {first: 0, second: 0})
        session = opened.session_id
        out["open"] = {**view(opened), "has_session": session != 0}
        out["nothing_new"] = view(call(conn, session, 1, {first: 2}))
        produce(env, topic, [{"value": b"c", "partition": second}])
        out["new_records_unlisted"] = view(call(conn, session, 2, {}))
        out["stale_epoch"] = view(call(conn, session, 2, {}))
        produce(env, topic, [{"value": b"d", "partition": second}])
        out["forgotten"] = view(call(conn, session, 3, {}, forget=(second,)))
        out["unknown_session"] = view(call(conn, session ^ 0x5A5A5A, 1, {}))
        closed = call(conn, session, -1, {first: 2, second: 0})
        out["closed"] = {**view(closed), "session_id": closed.session_id}
        out["after_close"] = view(call(conn, session, 4, {}))
    return out
