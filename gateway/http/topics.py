"""Topic administration for the HTTP door: list, create, describe, grow, delete, configs.

A controller over :class:`~shoal.gateway.tenant_client.TenantClient`: it
speaks Kafka (CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
IncrementalAlterConfigs, Metadata) and answers with the v3-shaped models;
the routes only parse and delegate. Every name is the tenant's own; the
client's rewriters put it in the tenant's namespace, so a name that belongs
to another tenant simply does not exist here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Final

from shoal.gateway.http.errors import ApiError, ErrorCode
from shoal.gateway.http.models import (
    AlterConfigs,
    ConfigSource,
    CreateTopic,
    Partition,
    PartitionList,
    Topic,
    TopicConfig,
    TopicConfigList,
    TopicList,
)
from shoal.gateway.tenant_client import KafkaCallError, TenantClient, TopicLayout
from shoal.gateway.upstream import UpstreamError

SET: Final = 0
DELETE: Final = 1
_SOURCES: Final[dict[int, ConfigSource]] = {
    0: "UNKNOWN",
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
    6: "DYNAMIC_BROKER_LOGGER_CONFIG",
}
DEFAULT_CONFIG_SOURCE: Final = 5
SETTLE_S: Final = 5.0
"""How long a change waits for every broker to see it before it is answered anyway."""
_SETTLE_POLL_S: Final = 0.05


class TopicsController:
    def __init__(self, client: TenantClient, cluster_id: str) -> None:
        self.client = client
        self.cluster_id = cluster_id

    def _topic(self, layout: TopicLayout) -> Topic:
        return Topic(
            cluster_id=self.cluster_id,
            topic_name=layout.name,
            partitions_count=layout.partitions,
            replication_factor=layout.replication_factor,
        )

    async def list_topics(self) -> TopicList:
        return TopicList(data=[self._topic(t) for t in await self.client.topics()])

    async def get(self, name: str) -> Topic:
        return self._topic(await self.client.topic(name))

    async def create(self, body: CreateTopic) -> Topic:
        result = await self.client.create_topic(
            body.topic_name,
            -1 if body.partitions_count is None else body.partitions_count,
            -1 if body.replication_factor is None else body.replication_factor,
            {c.name: c.value for c in body.configs},
        )
        await self._settle(body.topic_name, result.num_partitions)
        return Topic(
            cluster_id=self.cluster_id,
            topic_name=body.topic_name,
            partitions_count=result.num_partitions,
            replication_factor=result.replication_factor,
        )

    async def delete(self, name: str) -> None:
        await self.client.delete_topic(name)
        await self._settle(name, None)

    async def grow(self, name: str, partitions: int) -> Topic:
        await self.client.create_partitions(name, partitions)
        await self._settle(name, partitions)
        return await self.get(name)

    async def _settle(self, name: str, partitions: int | None) -> None:
        """Wait until every broker shows ``name`` with ``partitions`` (None: gone).

        Kafka answers an admin request once the controller has the change; the
        other brokers learn it moments later, and the HTTP door sends each
        request to any broker. Waiting here gives HTTP callers read-your-writes:
        the next request sees the change whichever broker it reaches. Past
        :data:`SETTLE_S` the change is answered anyway, as Kafka would.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_S
        for node_id in list(self.client.services.cluster.brokers):
            while loop.time() < deadline:
                try:
                    seen: int | None = (await self.client.topic(name, node_id)).partitions
                except KafkaCallError:
                    seen = None
                except UpstreamError:
                    break  # a broker that is down learns the change when it is back
                if seen == partitions:
                    break
                await asyncio.sleep(_SETTLE_POLL_S)

    async def partitions(self, name: str) -> PartitionList:
        layout = await self.client.topic(name)
        return PartitionList(
            data=[
                Partition(
                    cluster_id=self.cluster_id,
                    topic_name=name,
                    partition_id=p,
                    leader_id=leader if leader >= 0 else None,
                    replica_ids=list(layout.replicas[p]),
                    isr_ids=list(layout.isr[p]),
                )
                for p, leader in layout.leaders.items()
            ]
        )

    async def configs(self, name: str) -> TopicConfigList:
        entries = await self.client.describe_configs(name, None)
        return TopicConfigList(data=sorted(self._configs(name, entries), key=lambda c: c.name))

    async def config(self, name: str, config_name: str) -> TopicConfig:
        entries = await self.client.describe_configs(name, [config_name])
        found = [c for c in self._configs(name, entries) if c.name == config_name]
        if not found:
            raise ApiError(
                ErrorCode.CONFIG_NOT_FOUND, f"topic {name!r} has no config {config_name!r}"
            )
        return found[0]

    async def set_config(self, name: str, config_name: str, value: str | None) -> None:
        await self.client.alter_configs(name, [(config_name, SET, value)])

    async def reset_config(self, name: str, config_name: str) -> None:
        await self.client.alter_configs(name, [(config_name, DELETE, None)])

    async def alter_configs(self, name: str, body: AlterConfigs) -> None:
        await self.client.alter_configs(
            name,
            [
                (
                    c.name,
                    SET if c.operation == "SET" else DELETE,
                    c.value if c.operation == "SET" else None,
                )
                for c in body.data
            ],
        )

    def _configs(self, name: str, entries: Iterable[Any]) -> list[TopicConfig]:
        return [
            TopicConfig(
                cluster_id=self.cluster_id,
                topic_name=name,
                name=entry.name,
                value=None if entry.is_sensitive else entry.value,
                is_default=entry.config_source == DEFAULT_CONFIG_SOURCE,
                is_read_only=entry.read_only,
                is_sensitive=entry.is_sensitive,
                source=_SOURCES.get(entry.config_source, "UNKNOWN"),
            )
            for entry in entries
        ]
