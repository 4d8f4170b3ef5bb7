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

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource
from shoal.operator.cluster_state import PartitionInfo
from shoal.operator.reassign_client import (
    OngoingReassignment,
    PartitionKey,
    ReassignmentRequestError,
    alter_reassignments,
    list_reassignments,
)

TIMEOUT_S: Final = 15.0


class KafkaAdminError(Exception):
    """The cluster refused a request or did not answer in time."""


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
            raise KafkaAdminError(str(exc.args[0])) from exc
        except TimeoutError as exc:
            raise KafkaAdminError(
                f"no answer from the brokers at {self.bootstrap} within {self.timeout_s:g} s"
            ) from exc

    async def _metadata(self) -> Any:
        try:
            return await asyncio.to_thread(self._client.list_topics, timeout=self.timeout_s)
        except KafkaException as exc:
            raise KafkaAdminError(str(exc.args[0])) from exc

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
