"""The JSON bodies of the Kafka-backed routes, shaped after Confluent REST v3.

Field names are Confluent's where it has the concept (``topic_name``,
``partitions_count``, ``error_code``, ``consumer_group_id``); v3's ``kind``,
``metadata`` and ``related`` links are left out: clients of this API follow
the documented routes, not links. Shoal's own additions (reading records,
growing partitions) use the same style.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter
from shoal.gateway.http.encoding import DataType

TOPIC_NAME_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"
"""Kafka's legal topic names (``Topic.validate``)."""
GROUP_ID_PATTERN = r"^[^\x00-\x1f]{1,249}$"

PartitionId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- clusters and topics -----------------------------------------------------------


class Cluster(BaseModel):
    cluster_id: str


class ClusterList(BaseModel):
    data: list[Cluster]


class Topic(BaseModel):
    cluster_id: str
    topic_name: str
    is_internal: bool = False
    partitions_count: int
    replication_factor: int


class TopicList(BaseModel):
    data: list[Topic]


class ConfigValue(_Strict):
    name: str = Field(min_length=1, max_length=255)
    value: str | None = Field(default=None, max_length=65536)


class CreateTopic(_Strict):
    topic_name: str = Field(pattern=TOPIC_NAME_PATTERN)
    partitions_count: int | None = Field(
        default=None, ge=1, le=10000, description="Omitted: the cluster's default (num.partitions)."
    )
    replication_factor: int | None = Field(
        default=None, ge=1, le=32767, description="Omitted: the cluster's default."
    )
    configs: list[ConfigValue] = Field(default_factory=list, max_length=100)


class UpdateTopic(_Strict):
    """Shoal extension: grow a topic to ``partitions_count`` partitions (never shrinks)."""

    partitions_count: int = Field(ge=1, le=10000)


class Partition(BaseModel):
    cluster_id: str
    topic_name: str
    partition_id: int
    leader_id: int | None
    replica_ids: list[int]
    isr_ids: list[int]


class PartitionList(BaseModel):
    data: list[Partition]


ConfigSource = Literal[
    "UNKNOWN",
    "DYNAMIC_TOPIC_CONFIG",
    "DYNAMIC_BROKER_CONFIG",
    "DYNAMIC_DEFAULT_BROKER_CONFIG",
    "STATIC_BROKER_CONFIG",
    "DEFAULT_CONFIG",
    "DYNAMIC_BROKER_LOGGER_CONFIG",
]


class TopicConfig(BaseModel):
    cluster_id: str
    topic_name: str
    name: str
    value: str | None
    is_default: bool
    is_read_only: bool
    is_sensitive: bool
    source: ConfigSource


class TopicConfigList(BaseModel):
    data: list[TopicConfig]


class SetConfig(_Strict):
    value: str | None = Field(max_length=65536)


class AlterConfig(_Strict):
    name: str = Field(min_length=1, max_length=255)
    value: str | None = Field(default=None, max_length=65536)
    operation: Literal["SET", "DELETE"] = "SET"


class AlterConfigs(_Strict):
    data: list[AlterConfig] = Field(min_length=1, max_length=100)


# -- records -------------------------------------------------------------------------


class RecordData(_Strict):
    """A key or value: ``BINARY`` data is base64, ``STRING`` text, ``JSON`` any JSON value."""

    type: DataType = DataType.JSON
    data: JsonValue = None


class RecordHeader(_Strict):
    name: str = Field(max_length=32767)
    value: str | None = Field(
        default=None, description="base64 of the header's bytes; null for none."
    )


class ProduceRecord(_Strict):
    """One record to produce. Without ``partition_id`` a keyed record goes where Kafka's
    default partitioner puts its key; records without a key are spread round robin."""

    partition_id: PartitionId | None = None
    headers: list[RecordHeader] = Field(default_factory=list, max_length=1000)
    key: RecordData | None = None
    value: RecordData | None = None
    timestamp: datetime | None = Field(default=None, description="Create time; omitted: now.")


# The results of producing are dataclasses, not models: one is built per record
# and the answer is encoded once by a TypeAdapter, where a model per record (and
# FastAPI's validation of the answer) cost more than encoding the records'
# batch (benchmarks/profiles/README.md). Pydantic still derives their schema.


@dataclass(slots=True, kw_only=True)
class DataSize:
    type: DataType
    size: int


@dataclass(slots=True, kw_only=True)
class ProduceResult:
    """A delivery report: ``error_code`` 200 when the record is stored."""

    error_code: int
    message: str | None = None
    kafka_error: Annotated[
        str | None, Field(description="Kafka's error name, when Kafka refused.")
    ] = None
    cluster_id: str | None = None
    topic_name: str | None = None
    partition_id: int | None = None
    offset: int | None = None
    timestamp: datetime | None = None
    key: DataSize | None = None
    value: DataSize | None = None


@dataclass(slots=True, kw_only=True)
class QuotaRefusal(ProduceResult):
    """A record refused because its tenant is over a quota."""

    retry_after_ms: Annotated[int, Field(exclude=True)] = 0
    """Not part of the body: a single record's 429 says it in Retry-After."""


class ProduceBatchEntry(ProduceRecord):
    id: str = Field(min_length=1, max_length=80)


class ProduceBatch(_Strict):
    entries: list[ProduceBatchEntry] = Field(min_length=1, max_length=1000)


@dataclass(slots=True, kw_only=True)
class ProduceBatchSuccess(ProduceResult):
    id: str

    @classmethod
    def of(cls, entry_id: str, result: ProduceResult) -> ProduceBatchSuccess:
        return cls(
            id=entry_id,
            error_code=result.error_code,
            message=result.message,
            kafka_error=result.kafka_error,
            cluster_id=result.cluster_id,
            topic_name=result.topic_name,
            partition_id=result.partition_id,
            offset=result.offset,
            timestamp=result.timestamp,
            key=result.key,
            value=result.value,
        )


@dataclass(slots=True, kw_only=True)
class ProduceBatchFailure:
    id: str
    error_code: int
    message: str
    kafka_error: str | None = None


@dataclass(slots=True, kw_only=True)
class ProduceBatchResult:
    successes: list[ProduceBatchSuccess]
    failures: list[ProduceBatchFailure]


PRODUCE_RESULT: Final = TypeAdapter(ProduceResult)
PRODUCE_BATCH_RESULT: Final = TypeAdapter(ProduceBatchResult)


class ReadHeader(BaseModel):
    name: str
    value: str | None = Field(description="base64 of the header's bytes.")


TimestampKind = Literal["CREATE_TIME", "LOG_APPEND_TIME"]


class ReadRecord(BaseModel):
    partition_id: int
    offset: int
    timestamp: datetime
    timestamp_type: TimestampKind
    key: JsonValue
    value: JsonValue
    headers: list[ReadHeader]


class ReadRecords(BaseModel):
    cluster_id: str
    topic_name: str
    partition_id: int
    records: list[ReadRecord]
    next_offset: int = Field(description="The offset to read from next.")


# -- consumer groups -------------------------------------------------------------------


class ConsumerGroupSummary(BaseModel):
    cluster_id: str
    consumer_group_id: str
    state: str
    is_simple: bool


class ConsumerGroupList(BaseModel):
    data: list[ConsumerGroupSummary]


class TopicPartitions(BaseModel):
    topic_name: str
    partition_ids: list[int]


class Consumer(BaseModel):
    consumer_id: str
    instance_id: str | None
    client_id: str
    host: str
    assignments: list[TopicPartitions]


class ConsumerGroup(BaseModel):
    cluster_id: str
    consumer_group_id: str
    state: str
    is_simple: bool
    partition_assignor: str
    coordinator_id: int
    consumers: list[Consumer]


class ConsumerLag(BaseModel):
    cluster_id: str
    consumer_group_id: str
    topic_name: str
    partition_id: int
    current_offset: int
    log_end_offset: int
    lag: int
    consumer_id: str | None
    instance_id: str | None
    client_id: str | None


class ConsumerLagList(BaseModel):
    data: list[ConsumerLag]


class ConsumerGroupLagSummary(BaseModel):
    cluster_id: str
    consumer_group_id: str
    max_lag_consumer_id: str | None
    max_lag_instance_id: str | None
    max_lag_client_id: str | None
    max_lag_topic_name: str | None
    max_lag_partition_id: int | None
    max_lag: int
    total_lag: int
