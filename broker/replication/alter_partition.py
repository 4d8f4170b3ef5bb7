"""Leaders ask the controller to change their ISR, with AlterPartition, as KRaft's do.

A leader that sees a follower catch up, or fall behind for too long, proposes
a new ISR (:meth:`Partition.isr_expansion`, :meth:`Partition.isr_shrink`).
The sender batches the proposals of all partitions and sends them to the
controller named in the image; the controller checks them against the
partition's current leader and partition epochs and writes them with
compare-and-swap. Until the image shows the result, the partition keeps the
proposal as ``pending_isr`` (and counts it for the high watermark). A refused
or lost proposal is dropped; the leader proposes again on its next check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from shoal.broker.cluster.model import ClusterImage, NodeId, PartitionState
from shoal.broker.partition import Partition
from shoal.broker.replication.channel import ChannelError, PeerLink
from shoal.broker.tasks import cancel_and_wait

from shoal.wire import ErrorCode, schema

log = logging.getLogger(__name__)

ALTER_PARTITION: Final = 56
ALTER_PARTITION_VERSION: Final = 3
_CONNECT_TIMEOUT_S: Final = 5.0
_REQUEST_TIMEOUT_S: Final = 10.0
_BACKOFF_S: Final = 0.5

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class _Proposal:
    partition: Partition
    state: PartitionState
    base_partition_epoch: int
    """The partition epoch the proposal was made at: the controller refuses it if that moved."""
    reason: str
    """isr_shrink or isr_expand: the log event when it lands."""


class AlterPartitionSender:
    def __init__(self, node_id: NodeId, image: Callable[[], ClusterImage | None]) -> None:
        self.node_id = node_id
        self.image = image
        self._queue: dict[TopicPartition, _Proposal] = {}
        self._wake = asyncio.Event()
        self._link = PeerLink(f"shoal-broker-{node_id}")
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.applied: dict[str, int] = {}
        """ISR changes the controller accepted, by reason: isr_shrink, isr_expand."""

    def submit(self, partition: Partition, state: PartitionState, reason: str) -> None:
        partition.pending_isr = state.isr
        self._queue[(partition.topic, partition.index)] = _Proposal(
            partition, state, partition.state.partition_epoch, reason
        )
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="alter-partition")

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait(self._task)
        self._task = None
        await self._link.close()

    async def _run(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            batch, self._queue = self._queue, {}
            if not batch:
                continue
            try:
                response = await self._send(list(batch.values()))
            except ChannelError as exc:
                log.warning("event=alter_partition_failed error=%s", exc)
                self._drop(batch.values())
                await asyncio.sleep(_BACKOFF_S)
                continue
            self._settle(batch, response)

    async def _send(self, proposals: list[_Proposal]) -> Any:
        image = self.image()
        controller = image.controller if image is not None else None
        if image is None or controller is None:
            raise ChannelError("no controller elected")
        broker = image.brokers.get(controller.node_id)
        if broker is None:
            raise ChannelError(f"controller {controller.node_id} is not registered")
        channel = await self._link.to(broker.host, broker.port, _CONNECT_TIMEOUT_S)
        api = schema(ALTER_PARTITION, ALTER_PARTITION_VERSION)
        topics: dict[Any, list[Any]] = {}
        for proposal in proposals:
            state = proposal.state
            topics.setdefault(proposal.partition.topic_id, []).append(
                api.make_request(
                    "PartitionData",
                    partition_index=proposal.partition.index,
                    leader_epoch=state.leader_epoch,
                    new_isr_with_epochs=tuple(
                        api.make_request("BrokerState", broker_id=n, broker_epoch=-1)
                        for n in state.isr
                    ),
                    leader_recovery_state=0,
                    partition_epoch=proposal.base_partition_epoch,
                )
            )
        request = api.request(
            broker_id=self.node_id,
            broker_epoch=-1,
            topics=tuple(
                api.make_request("TopicData", topic_id=topic_id, partitions=tuple(parts))
                for topic_id, parts in topics.items()
            ),
        )
        response = await channel.call(api, request, _REQUEST_TIMEOUT_S)
        if response.error_code is not ErrorCode.none:
            raise ChannelError(f"controller refused: {response.error_code.name}")
        return response

    def _settle(self, batch: dict[TopicPartition, _Proposal], response: Any) -> None:
        by_id = {p.partition.topic_id: p.partition.topic for p in batch.values()}
        answered = set()
        for topic in response.topics:
            name = by_id.get(topic.topic_id)
            for result in topic.partitions:
                proposal = batch.get((name, result.partition_index)) if name else None
                if proposal is None:
                    continue
                answered.add((proposal.partition.topic, proposal.partition.index))
                partition = proposal.partition
                if result.error_code is ErrorCode.none:
                    self.applied[proposal.reason] = self.applied.get(proposal.reason, 0) + 1
                    log.info(
                        "event=%s topic=%s partition=%d new_isr=%s partition_epoch=%d",
                        proposal.reason,
                        partition.topic,
                        partition.index,
                        ",".join(map(str, result.isr)),
                        result.partition_epoch,
                    )
                    continue
                log.info(
                    "event=%s_refused topic=%s partition=%d error=%s",
                    proposal.reason,
                    partition.topic,
                    partition.index,
                    result.error_code.name,
                )
                self._drop([proposal])
        self._drop(p for tp, p in batch.items() if tp not in answered)

    @staticmethod
    def _drop(proposals: Iterable[_Proposal]) -> None:
        for proposal in proposals:
            if proposal.partition.pending_isr == proposal.state.isr:
                proposal.partition.pending_isr = None
