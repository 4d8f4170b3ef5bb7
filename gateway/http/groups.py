"""Consumer groups for the HTTP door: list them, describe one, and its lag.

Groups live on their coordinators, so listing asks every broker (each lists
the groups it coordinates) and describing asks the group's coordinator. Lag
is Kafka's: per partition the group committed to, the partition's high
watermark (ListOffsets latest, READ_UNCOMMITTED) minus the committed offset
(OffsetFetch). The member that owns each partition comes from the members'
assignments, which for the ``consumer`` protocol are Kafka's
ConsumerProtocolAssignment bytes.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from shoal.gateway.http.errors import ApiError, ErrorCode
from shoal.gateway.http.models import (
    Consumer,
    ConsumerGroup,
    ConsumerGroupLagSummary,
    ConsumerGroupList,
    ConsumerGroupSummary,
    ConsumerLag,
    ConsumerLagList,
    TopicPartitions,
)
from shoal.gateway.tenant_client import LATEST, KafkaCallError, TenantClient

CONSUMER_PROTOCOL: Final = "consumer"
DEAD: Final = "Dead"
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")


def parse_assignment(data: bytes) -> dict[str, list[int]]:
    """Topic -> partitions of a ConsumerProtocolAssignment (any version); {} if malformed.

    version int16, then [topic string (int16 length), partitions [int32]], then
    user data; only the partitions are read.
    """
    try:
        pos = _INT16.size
        (count,) = _INT32.unpack_from(data, pos)
        pos += _INT32.size
        out: dict[str, list[int]] = {}
        for _ in range(max(0, count)):
            (length,) = _INT16.unpack_from(data, pos)
            pos += _INT16.size
            if length < 0 or pos + length > len(data):
                return {}
            topic = bytes(data[pos : pos + length]).decode("utf-8")
            pos += length
            (partitions,) = _INT32.unpack_from(data, pos)
            pos += _INT32.size
            if partitions < 0 or pos + partitions * _INT32.size > len(data):
                return {}
            out[topic] = [
                _INT32.unpack_from(data, pos + i * _INT32.size)[0] for i in range(partitions)
            ]
            pos += partitions * _INT32.size
        return out
    except (struct.error, UnicodeDecodeError):
        return {}


class GroupsController:
    def __init__(self, client: TenantClient, cluster_id: str) -> None:
        self.client = client
        self.cluster_id = cluster_id

    async def list_groups(self) -> ConsumerGroupList:
        return ConsumerGroupList(
            data=[
                ConsumerGroupSummary(
                    cluster_id=self.cluster_id,
                    consumer_group_id=group.group_id,
                    state=group.group_state,
                    is_simple=not group.protocol_type,
                )
                for group in await self.client.list_groups()
            ]
        )

    async def _described(self, group_id: str) -> tuple[int, Any]:
        node_id, group = await self.client.describe_group(group_id)
        if group.group_state in ("", DEAD):
            raise ApiError(ErrorCode.GROUP_NOT_FOUND, f"no consumer group {group_id!r}")
        return node_id, group

    async def get(self, group_id: str) -> ConsumerGroup:
        node_id, group = await self._described(group_id)
        return ConsumerGroup(
            cluster_id=self.cluster_id,
            consumer_group_id=group_id,
            state=group.group_state,
            is_simple=not group.protocol_type,
            partition_assignor=group.protocol_data,
            coordinator_id=node_id,
            consumers=[
                Consumer(
                    consumer_id=member.member_id,
                    instance_id=member.group_instance_id,
                    client_id=member.client_id,
                    host=member.client_host,
                    assignments=[
                        TopicPartitions(topic_name=topic, partition_ids=partitions)
                        for topic, partitions in _assignment(group, member).items()
                    ],
                )
                for member in group.members
            ],
        )

    async def lags(self, group_id: str) -> ConsumerLagList:
        node_id, group = await self._described(group_id)
        committed = await self.client.committed_offsets(group_id, node_id)
        owners: dict[tuple[str, int], Any] = {}
        for member in group.members:
            for topic, partitions in _assignment(group, member).items():
                for partition in partitions:
                    owners[topic, partition] = member
        ends: dict[tuple[str, int], int] = {}
        for topic in sorted({t for t, _ in committed}):
            wanted = {p: LATEST for t, p in committed if t == topic}
            try:
                found = await self.client.list_offsets(topic, wanted)
            except KafkaCallError:
                continue  # deleted since the commit, or no longer visible: no lag to show
            for partition, end in found.items():
                ends[topic, partition] = end
        lags = []
        for (topic, partition), offset in sorted(committed.items()):
            log_end = ends.get((topic, partition))
            if log_end is None:
                continue
            owner = owners.get((topic, partition))
            lags.append(
                ConsumerLag(
                    cluster_id=self.cluster_id,
                    consumer_group_id=group_id,
                    topic_name=topic,
                    partition_id=partition,
                    current_offset=offset,
                    log_end_offset=log_end,
                    lag=max(0, log_end - offset),
                    consumer_id=None if owner is None else owner.member_id,
                    instance_id=None if owner is None else owner.group_instance_id,
                    client_id=None if owner is None else owner.client_id,
                )
            )
        return ConsumerLagList(data=lags)

    async def lag_summary(self, group_id: str) -> ConsumerGroupLagSummary:
        lags = (await self.lags(group_id)).data
        worst = max(lags, key=lambda lag: lag.lag, default=None)
        return ConsumerGroupLagSummary(
            cluster_id=self.cluster_id,
            consumer_group_id=group_id,
            max_lag_consumer_id=None if worst is None else worst.consumer_id,
            max_lag_instance_id=None if worst is None else worst.instance_id,
            max_lag_client_id=None if worst is None else worst.client_id,
            max_lag_topic_name=None if worst is None else worst.topic_name,
            max_lag_partition_id=None if worst is None else worst.partition_id,
            max_lag=0 if worst is None else worst.lag,
            total_lag=sum(lag.lag for lag in lags),
        )


def _assignment(group: Any, member: Any) -> dict[str, list[int]]:
    if group.protocol_type != CONSUMER_PROTOCOL or not member.member_assignment:
        return {}
    return parse_assignment(member.member_assignment)
