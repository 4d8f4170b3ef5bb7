"""The operator's Kafka admin client: the brokers' internal listener, no authentication.

librdkafka's AdminClient speaks the admin protocol; its calls block or return
concurrent futures, so each is awaited without holding the event loop (the
operator serves every resource from one loop). Names here are broker-side:
a tenant's topic ``orders`` is ``acme.orders``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from shoal.operator.cluster_state import PartitionInfo, TopicState
from shoal.operator.reassign_client import (
    OngoingReassignment,
    PartitionKey,
    ReassignmentRequestError,
    alter_reassignments,
    list_reassignments,
)

TIMEOUT_S: Final = 15.0
REQUEST_ERRORS: Final = frozenset(
    {
        KafkaError.INVALID_CONFIG,
        KafkaError.INVALID_PARTITIONS,
        KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.INVALID_REPLICA_ASSIGNMENT,
        KafkaError.INVALID_REQUEST,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.POLICY_VIOLATION,
        KafkaError.UNSUPPORTED_VERSION,
    }
)
"""Refusals of the request itself: asking the same again cannot succeed."""


class KafkaAdminError(Exception):
    """The cluster refused a request or did not answer in time.

    ``code`` is Kafka's error (``KafkaError.UNKNOWN_TOPIC_OR_PART``, ...) when the
    brokers answered with one, None when they did not answer; ``retriable`` says
    whether asking again later may succeed without anyone changing the request:
    false only for the refusals in :data:`REQUEST_ERRORS` (librdkafka sets its
    own retriable flag on few errors, so it cannot tell).
    """

    def __init__(self, message: str, code: int | None = None, retriable: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.retriable = retriable

    @classmethod
    def of(cls, exc: KafkaException) -> KafkaAdminError:
        error = exc.args[0]
        if isinstance(error, KafkaError):
            return cls(error.str(), error.code(), error.code() not in REQUEST_ERRORS)
        return cls(str(error))


class ClusterAdmin:
    def __init__(self, bootstrap: str, timeout_s: float = TIMEOUT_S) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._client = AdminClient(
            {
                "bootstrap.servers": bootstrap,
                "client.id": "shoal-operator",
                "socket.timeout.ms": int(timeout_s * 1000),
            }
        )

    async def __aenter__(self) -> ClusterAdmin:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """librdkafka closes its connections when the client is collected; nothing to await."""

    async def _wait(self, future: Future[Any]) -> Any:
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except KafkaException as exc:
            raise KafkaAdminError.of(exc) from exc
        except TimeoutError as exc:
            raise KafkaAdminError(
                f"no answer from the brokers at {self.bootstrap} within {self.timeout_s:g} s"
            ) from exc

    async def _metadata(self) -> Any:
        try:
            return await asyncio.to_thread(self._client.list_topics, timeout=self.timeout_s)
        except KafkaException as exc:
            raise KafkaAdminError.of(exc) from exc

    async def broker_ids(self) -> list[int]:
        return sorted((await self._metadata()).brokers)

    async def partitions(self, topics: Iterable[str] | None = None) -> list[PartitionInfo]:
        """Leader, replicas and ISR of every partition (of ``topics`` only, when given)."""
        wanted = None if topics is None else set(topics)
        found = [
            PartitionInfo(name, p.id, p.leader, tuple(p.replicas), tuple(sorted(p.isrs)))
            for name, topic in (await self._metadata()).topics.items()
            if wanted is None or name in wanted
            for p in topic.partitions.values()
        ]
        return sorted(found, key=lambda p: (p.topic, p.partition))

    async def topic_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str]]:
        """Every config of each topic, as DescribeConfigs reports it (defaults included)."""
        resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
        if not resources:
            return {}
        futures = self._client.describe_configs(resources)
        configs = {}
        for resource, future in futures.items():
            entries = await self._wait(future)
            configs[resource.name] = {
                name: entry.value for name, entry in entries.items() if entry.value is not None
            }
        return configs

    async def min_insync_replicas(self, topics: Iterable[str]) -> dict[str, int]:
        return {
            topic: int(config.get("min.insync.replicas", "1"))
            for topic, config in (await self.topic_configs(topics)).items()
        }

    async def controller_id(self) -> int | None:
        """The broker Metadata names as the controller; None while there is none."""
        controller = int((await self._metadata()).controller_id)
        return controller if controller >= 0 else None

    # -- topic administration ----------------------------------------------------

    async def describe_topic(self, topic: str) -> TopicState | None:
        """The topic's id and partitions; None if the brokers do not know it."""
        futures = self._client.describe_topics(TopicCollection([topic]))
        try:
            found = await self._wait(futures[topic])
        except KafkaAdminError as exc:
            if exc.code == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise
        partitions = tuple(
            PartitionInfo(
                topic,
                p.id,
                -1 if p.leader is None else p.leader.id,
                tuple(r.id for r in p.replicas),
                tuple(sorted(r.id for r in p.isr)),
            )
            for p in sorted(found.partitions, key=lambda p: p.id)
        )
        return TopicState(topic, str(found.topic_id), partitions)

    async def topic_overrides(self, topic: str) -> dict[str, str]:
        """The configs set on the topic itself (DYNAMIC_TOPIC_CONFIG), not inherited ones."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = await self._wait(self._client.describe_configs([resource])[resource])
        return {
            name: entry.value
            for name, entry in entries.items()
            if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value and entry.value is not None
        }

    async def create_topic(
        self, topic: str, partitions: int, replicas: int, config: Mapping[str, str]
    ) -> None:
        new = NewTopic(topic, partitions, replicas, config=dict(config))
        await self._wait(self._client.create_topics([new])[topic])

    async def create_partitions(self, topic: str, total: int) -> None:
        """Grow the topic to ``total`` partitions."""
        await self._wait(self._client.create_partitions([NewPartitions(topic, total)])[topic])

    async def alter_topic_config(
        self, topic: str, set_: Mapping[str, str], reset: Iterable[str]
    ) -> None:
        """IncrementalAlterConfigs: set ``set_``, return ``reset`` to the cluster's defaults."""
        entries = [
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in set_.items()
        ] + [
            ConfigEntry(name, None, incremental_operation=AlterConfigOpType.DELETE)
            for name in reset
        ]
        if not entries:
            return
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
        await self._wait(self._client.incremental_alter_configs([resource])[resource])

    async def consumer_groups(self) -> list[str]:
        listed = await self._wait(self._client.list_consumer_groups())
        return sorted(g.group_id for g in listed.valid)

    async def delete_consumer_groups(self, groups: Iterable[str]) -> None:
        """Delete the groups and their committed offsets; already-gone ones are no error.

        A group with members is refused by the brokers (NON_EMPTY_GROUP): retriable,
        since members whose connections were closed leave at their session timeout.
        """
        names = list(groups)
        if not names:
            return
        for name, future in self._client.delete_consumer_groups(names).items():
            try:
                await self._wait(future)
            except KafkaAdminError as exc:
                if exc.code != KafkaError.GROUP_ID_NOT_FOUND:
                    raise KafkaAdminError(f"group {name}: {exc}", exc.code) from exc

    async def delete_topics(self, topics: Iterable[str]) -> None:
        """Delete the topics; already-gone ones are no error."""
        names = list(topics)
        if not names:
            return
        for future in self._client.delete_topics(names).values():
            try:
                await self._wait(future)
            except KafkaAdminError as exc:
                if exc.code != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise

    async def reassign(self, plan: Mapping[PartitionKey, Sequence[int] | None]) -> None:
        """Move each partition to its replica list (None cancels its move under way)."""
        try:
            await alter_reassignments(self.bootstrap, plan, self.timeout_s)
        except ReassignmentRequestError as exc:
            raise KafkaAdminError(str(exc)) from exc

    async def reassignments_in_progress(self) -> dict[PartitionKey, OngoingReassignment]:
        try:
            return await list_reassignments(self.bootstrap, self.timeout_s)
        except ReassignmentRequestError as exc:
            raise KafkaAdminError(str(exc)) from exc
