"""Transaction markers: writing them into partitions, here or on their leaders.

When a transaction is decided (PrepareCommit/PrepareAbort is in the state
topic), every partition it wrote to gets a control batch, Kafka's
EndTransactionMarker, from that partition's leader; only then may the
coordinator write CompleteCommit/CompleteAbort. The :class:`TxnMarkerSender`
keeps at it until every partition has its marker: a partition whose leader
is moving, unknown or unreachable is retried after a backoff; a partition
of a deleted topic is dropped (nothing left to mark); a partition that
answers INVALID_PRODUCER_EPOCH or TRANSACTION_COORDINATOR_FENCED has seen a
newer producer or coordinator, and the sender gives up the whole
transaction, as Kafka's does: whoever fenced us completes it.

Partitions this broker leads are written directly (:func:`write_markers`,
the same code the WriteTxnMarkers handler runs); others get WriteTxnMarkers
requests (API 27) on one :class:`PeerLink` per leader. One request is in
flight per leader at a time, and the markers of every transaction that waits
for it meanwhile go together in the next one, as Kafka's
TransactionMarkerChannelManager batches them per broker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from shoal.broker.cluster.model import ClusterImage, NodeId, TopicName
from shoal.broker.coordinator.coordinator import OFFSETS_TOPIC
from shoal.broker.log.log import LogError
from shoal.broker.log.producer_state import ProducerStateError
from shoal.broker.partition import Partition, PartitionError
from shoal.broker.replication.channel import ChannelError, PeerLink
from shoal.broker.txn.records import group_partitions

from shoal.wire import ApiSchema, ErrorCode, schema

log = logging.getLogger(__name__)

E = ErrorCode
WRITE_TXN_MARKERS: Final = 27
MARKERS_VERSION: Final = 1
_CONNECT_TIMEOUT_S: Final = 5.0
_REQUEST_TIMEOUT_S: Final = 30.0
MARKER_COMMIT_TIMEOUT_S: Final = 5.0
"""How long a marker waits for the in-sync replicas before the partition is retried."""

TopicPartition = tuple[str, int]

FENCED: Final = frozenset({E.invalid_producer_epoch, E.transaction_coordinator_fenced})


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """One transaction's outcome, for the partitions it wrote to."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: frozenset[TopicPartition]


class MarkerWriter(Protocol):
    async def write(self, marker: TxnMarker, wanted: Callable[[], bool]) -> bool:
        """Mark every partition; True when all have it, False if given up (fenced,
        or ``wanted()`` turned False: this broker no longer coordinates it)."""
        ...


PartitionLookup = Callable[[str, int], Partition]
"""The hosted partition, or PartitionError (unknown, or not hosted here)."""

CompleteOffsets = Callable[[int, int, bool], None]
"""GroupCoordinator.complete_transaction(offsets_partition, producer_id, commit)."""


async def write_markers(
    lookup: PartitionLookup,
    complete_offsets: CompleteOffsets,
    marker: TxnMarker,
    timeout_s: float = MARKER_COMMIT_TIMEOUT_S,
) -> dict[TopicPartition, ErrorCode]:
    """Append the marker to each partition this broker leads, and wait until it is
    committed (acks=all, as Kafka writes markers); an error code per partition."""

    async def one(tp: TopicPartition) -> ErrorCode:
        topic, index = tp
        try:
            partition = lookup(topic, index)
            info = partition.append_marker(
                marker.producer_id, marker.producer_epoch, marker.commit, marker.coordinator_epoch
            )
            await partition.wait_for_commit(info.last_offset + 1, timeout_s)
        except (PartitionError, ProducerStateError) as exc:
            return ErrorCode[exc.code]
        except (LogError, OSError) as exc:
            log.warning("event=txn_marker_failed partition=%s-%d error=%s", topic, index, exc)
            return E.unknown_server_error
        if topic == OFFSETS_TOPIC:
            complete_offsets(index, marker.producer_id, marker.commit)
        return E.none

    partitions = sorted(marker.partitions)
    codes = await asyncio.gather(*(one(tp) for tp in partitions))
    return dict(zip(partitions, codes, strict=True))


class TxnMarkerSender:
    """Writes markers until every partition has one (see the module docstring)."""

    def __init__(
        self,
        node_id: NodeId,
        image: Callable[[], ClusterImage],
        write_local: Callable[[TxnMarker], Awaitable[dict[TopicPartition, ErrorCode]]],
        retry_backoff_ms: int,
    ) -> None:
        self.node_id = node_id
        self.image = image
        self.write_local = write_local
        self.retry_backoff_ms = retry_backoff_ms
        self._queues: dict[NodeId, _NodeQueue] = {}

    async def write(self, marker: TxnMarker, wanted: Callable[[], bool]) -> bool:
        remaining = set(marker.partitions)
        while True:
            if not wanted():
                return False
            image = self.image()
            by_leader: dict[NodeId, set[TopicPartition]] = {}
            for tp in list(remaining):
                topic = image.topics.get(TopicName(tp[0]))
                if topic is None or tp[1] not in topic.partitions:
                    log.info("event=txn_marker_dropped partition=%s-%d reason=deleted", *tp)
                    remaining.discard(tp)
                    continue
                leader = topic.partitions[tp[1]].leader
                if leader in image.brokers:
                    by_leader.setdefault(leader, set()).add(tp)
            results = await asyncio.gather(
                *(self._send(node, marker, parts) for node, parts in by_leader.items())
            )
            for codes in results:
                for tp, code in codes.items():
                    if code is E.none:
                        remaining.discard(tp)
                    elif code in FENCED:
                        log.warning(
                            "event=txn_markers_abandoned producer_id=%d epoch=%d"
                            " partition=%s-%d error=%s",
                            marker.producer_id,
                            marker.producer_epoch,
                            tp[0],
                            tp[1],
                            code.name,
                        )
                        return False
            if not remaining:
                return True
            await asyncio.sleep(self.retry_backoff_ms / 1000)

    async def _send(
        self, node: NodeId, marker: TxnMarker, partitions: set[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        one = TxnMarker(
            marker.producer_id,
            marker.producer_epoch,
            marker.commit,
            marker.coordinator_epoch,
            frozenset(partitions),
        )
        if node == self.node_id:
            return await self.write_local(one)
        if node not in self.image().brokers:
            return dict.fromkeys(partitions, E.not_leader_or_follower)
        queue = self._queues.get(node)
        if queue is None:
            queue = self._queues[node] = _NodeQueue(PeerLink(f"shoal-txn-markers-{self.node_id}"))
        answer: asyncio.Future[dict[TopicPartition, ErrorCode]] = (
            asyncio.get_running_loop().create_future()
        )
        queue.pending.append((one, answer))
        if queue.task is None or queue.task.done():
            queue.task = asyncio.get_running_loop().create_task(
                self._drain(node, queue), name=f"txn-markers-to-{node}"
            )
        return await answer

    async def _drain(self, node: NodeId, queue: _NodeQueue) -> None:
        """Send what waits for ``node``, all in one request, until nothing does."""
        while queue.pending:
            batch, queue.pending = queue.pending, []
            try:
                answers = await self._request(node, queue.link, [m for m, _ in batch])
            except Exception:
                # Never leave a transaction waiting on an answer that will not come.
                log.exception("event=txn_markers_request_failed node=%d", node)
                answers = [dict.fromkeys(m.partitions, E.unknown_server_error) for m, _ in batch]
            for (_marker, future), codes in zip(batch, answers, strict=True):
                if not future.done():
                    future.set_result(codes)

    async def _request(
        self, node: NodeId, link: PeerLink, markers: list[TxnMarker]
    ) -> list[dict[TopicPartition, ErrorCode]]:
        """One WriteTxnMarkers request; the codes per marker (all retriable if it failed)."""
        answers = [dict.fromkeys(m.partitions, E.unknown_server_error) for m in markers]
        broker = self.image().brokers.get(node)
        if broker is None:
            return [dict.fromkeys(m.partitions, E.not_leader_or_follower) for m in markers]
        api = schema(WRITE_TXN_MARKERS, MARKERS_VERSION)
        request = api.request(markers=tuple(_request_marker(api, m) for m in markers))
        try:
            channel = await link.to(broker.host, broker.port, _CONNECT_TIMEOUT_S)
            response = await channel.call(api, request, _REQUEST_TIMEOUT_S)
        except ChannelError as exc:
            log.info("event=txn_markers_unsent node=%d error=%s", node, exc)
            return [dict.fromkeys(m.partitions, E.not_leader_or_follower) for m in markers]
        # Kafka answers per producer id: one request never carries two markers of one
        # producer, as a transactional id has one transaction at a time.
        by_producer = {m.producer_id: codes for m, codes in zip(markers, answers, strict=True)}
        for result in response.markers:
            codes = by_producer.get(result.producer_id)
            if codes is None:
                continue
            for topic in result.topics:
                for p in topic.partitions:
                    if (topic.name, p.partition_index) in codes:
                        codes[(topic.name, p.partition_index)] = p.error_code
        return answers

    async def close(self) -> None:
        for queue in self._queues.values():
            if queue.task is not None:
                queue.task.cancel()
            await queue.link.close()
        self._queues.clear()


@dataclass(slots=True)
class _NodeQueue:
    """Markers waiting for one broker, and the one request in flight to it."""

    link: PeerLink
    pending: list[tuple[TxnMarker, asyncio.Future[dict[TopicPartition, ErrorCode]]]] = field(
        default_factory=list
    )
    task: asyncio.Task[None] | None = None


def _request_marker(api: ApiSchema, marker: TxnMarker) -> Any:
    return api.make_request(
        "WritableTxnMarker",
        producer_id=marker.producer_id,
        producer_epoch=marker.producer_epoch,
        transaction_result=marker.commit,
        topics=tuple(
            api.make_request("WritableTxnMarkerTopic", name=topic, partition_indexes=indexes)
            for topic, indexes in group_partitions(marker.partitions)
        ),
        coordinator_epoch=marker.coordinator_epoch,
    )
