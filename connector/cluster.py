"""What the driver asks the cluster: topics, partitions and offsets.

Everything goes through one confluent-kafka AdminClient, a Kafka client like
any other, so through the gateway a read sees only its tenant's topics and
is held to its ACLs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from shoal.connector.offsets import EARLIEST, LATEST, PartitionOffsets, TopicPartition
from shoal.connector.options import OptionError, Subscription

REQUEST_TIMEOUT_S = 30.0


class ClusterError(RuntimeError):
    """The cluster refused or failed a request the read needs."""


class Cluster:
    """The driver's view of the cluster, for one read."""

    def __init__(self, client: Mapping[str, str]) -> None:
        try:
            self._admin = AdminClient(dict(client))
        except (KafkaException, ValueError, TypeError) as error:
            raise OptionError(
                f"the kafka.* options are not valid librdkafka settings: {error}"
            ) from error
        self._isolation = (
            IsolationLevel.READ_COMMITTED
            if client.get("isolation.level") == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )

    def partitions(
        self, subscription: Subscription, must_exist: bool = True
    ) -> list[TopicPartition]:
        """The partitions the subscription covers now.

        Topics named by ``subscribe`` or ``assign`` that do not exist fail the
        read, naming them, unless ``must_exist`` is false; a pattern may match
        nothing yet.
        """
        try:
            metadata = self._admin.list_topics(timeout=REQUEST_TIMEOUT_S)
        except KafkaException as error:
            raise ClusterError(f"could not list topics: {error.args[0]}") from error
        existing: dict[str, list[int]] = {}
        for name, topic in metadata.topics.items():
            if topic.error is None and not name.startswith("__"):
                existing[name] = sorted(topic.partitions)
        if subscription.pattern is not None:
            return [
                TopicPartition(name, p)
                for name in sorted(existing)
                if subscription.matches(name)
                for p in existing[name]
            ]
        if subscription.assigned:
            missing = [
                f"{tp.topic}-{tp.partition}"
                for tp in subscription.assigned
                if tp.partition not in existing.get(tp.topic, [])
            ]
            if missing and must_exist:
                raise ClusterError(f"assigned partitions do not exist: {', '.join(missing)}")
            return [
                tp for tp in subscription.assigned if tp.partition in existing.get(tp.topic, [])
            ]
        missing = [t for t in subscription.topics if t not in existing]
        if missing and must_exist:
            raise ClusterError(
                f"topics do not exist or are not readable with these credentials: "
                f"{', '.join(missing)}"
            )
        return [TopicPartition(t, p) for t in subscription.topics for p in existing.get(t, [])]

    def offsets(self, wanted: Mapping[TopicPartition, int]) -> PartitionOffsets:
        """Resolve EARLIEST and LATEST; concrete offsets pass through unchanged."""
        specs = {
            tp: OffsetSpec.earliest() if offset == EARLIEST else OffsetSpec.latest()
            for tp, offset in wanted.items()
            if offset in (EARLIEST, LATEST)
        }
        resolved = self._list_offsets(specs)
        return {tp: resolved.get(tp, offset) for tp, offset in wanted.items()}

    def earliest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets:
        return self._list_offsets({tp: OffsetSpec.earliest() for tp in partitions})

    def latest(self, partitions: Iterable[TopicPartition]) -> PartitionOffsets:
        return self._list_offsets({tp: OffsetSpec.latest() for tp in partitions})

    def offsets_for_timestamp(
        self, partitions: Iterable[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        """The first offset at or after the timestamp, or None where there is none."""
        found = self._list_offsets(
            {tp: OffsetSpec.for_timestamp(timestamp_ms) for tp in partitions}
        )
        return {tp: offset if offset >= 0 else None for tp, offset in found.items()}

    def _list_offsets(self, specs: Mapping[TopicPartition, Any]) -> PartitionOffsets:
        if not specs:
            return {}
        request = {KafkaTopicPartition(tp.topic, tp.partition): spec for tp, spec in specs.items()}
        futures = self._admin.list_offsets(
            request, isolation_level=self._isolation, request_timeout=REQUEST_TIMEOUT_S
        )
        result: PartitionOffsets = {}
        for kafka_tp, future in futures.items():
            tp = TopicPartition(kafka_tp.topic, kafka_tp.partition)
            try:
                result[tp] = future.result().offset
            except KafkaException as error:
                raise ClusterError(
                    f"could not list offsets of {tp.topic}-{tp.partition}: {error.args[0]}"
                ) from error
        return result
