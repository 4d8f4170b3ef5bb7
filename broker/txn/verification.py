"""Transaction verification (KIP-890 part 1): is this partition in that producer's
ongoing transaction, asked of the transaction coordinator before a broker appends.

Before KIP-890 a partition leader appended any transactional batch it was
given, and the group coordinator any TxnOffsetCommit, on the producer id and
epoch the request carried. A client that misbehaves (or a tenant who borrows
another tenant's producer id, producer ids being sequential) could so open a
transaction in a partition its coordinator never heard of: no marker ever
closes it, the last stable offset stays behind it, compaction stops there,
and a higher epoch it carried makes the real producer's markers be refused.

So the broker asks first. The first transactional batch of a producer in a
partition (and every TxnOffsetCommit) is checked with the coordinator of the
request's transactional id, the leader of its ``__transaction_state``
partition: directly when that is this broker
(:meth:`TransactionCoordinator.verify_partitions`), otherwise with an
AddPartitionsToTxn v5 request marked ``verify_only``, as Kafka's
AddPartitionsToTxnManager sends it. Verifications waiting for the same broker
go together in the next request, one request in flight per broker; a
transactional id appears once per request, so a second check of the same id
(same producer and epoch) joins the first and one with another producer or
epoch waits for the next request. Nothing is cached: every answer is the
coordinator's of the moment.

Answers come back in the codes a producer understands, as Kafka translates
them: PRODUCER_FENCED is INVALID_PRODUCER_EPOCH, a partition not in the
transaction is INVALID_TXN_STATE (TRANSACTION_ABORTABLE for the request
versions that know it: Produce v11+, TxnOffsetCommit v4+), an unreachable
coordinator NETWORK_EXCEPTION. The callers map the retriable ones further to
what their clients retry on (see the Produce and TxnOffsetCommit handlers).

Not done, unlike Kafka: the VerificationGuard that makes the append fail if a
marker closed the transaction between the answer and the append (it needs
the log's producer state to remember the verification).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from shoal.broker.cluster.model import ClusterImage, NodeId, TopicName
from shoal.broker.replication.channel import ChannelError, PeerLink
from shoal.broker.txn.coordinator import TXN_TOPIC
from shoal.broker.txn.markers import TopicPartition
from shoal.broker.txn.records import group_partitions

from shoal.wire import ApiSchema, ErrorCode, schema

log = logging.getLogger(__name__)

E = ErrorCode
ADD_PARTITIONS_TO_TXN: Final = 24
VERIFY_VERSION: Final = 5
"""AddPartitionsToTxn for brokers: v4 batches transactions, v5 may answer TRANSACTION_ABORTABLE."""
_CONNECT_TIMEOUT_S: Final = 5.0
REQUEST_TIMEOUT_S: Final = 30.0
"""Kafka's request.timeout.ms default, which its AddPartitionsToTxnManager waits."""


class LocalCoordinator(Protocol):
    """What the verifier needs of this broker's TransactionCoordinator."""

    def partition_of(self, transactional_id: str) -> int: ...

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]: ...


Sender = Callable[[NodeId, ApiSchema, Any], Awaitable[Any]]
"""Send one request to a broker and return its response; ChannelError if it cannot."""


@dataclass(frozen=True, slots=True)
class _Key:
    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(slots=True)
class _Waiting:
    key: _Key
    partitions: frozenset[TopicPartition]
    answer: asyncio.Future[dict[TopicPartition, ErrorCode]]


@dataclass(slots=True)
class _NodeQueue:
    """Verifications waiting for one broker, and the one request in flight to it."""

    pending: list[_Waiting] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class TransactionVerifier:
    """Asks transaction coordinators whether partitions are in ongoing transactions.

    Event loop only. ``send`` is injected for tests; by default requests go
    on one :class:`PeerLink` per coordinator broker.
    """

    def __init__(
        self,
        node_id: NodeId,
        image: Callable[[], ClusterImage],
        coordinator: LocalCoordinator,
        send: Sender | None = None,
    ) -> None:
        self.node_id = node_id
        self.image = image
        self.coordinator = coordinator
        self._links: dict[NodeId, PeerLink] = {}
        self._send: Sender = send or self._send_on_link
        self._queues: dict[NodeId, _NodeQueue] = {}

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
        abortable: bool,
    ) -> dict[TopicPartition, ErrorCode]:
        """A code per partition: NONE when it is in the ongoing transaction of this
        producer id and epoch of ``transactional_id``; otherwise why not, in the
        producer's codes (``abortable``: the client knows TRANSACTION_ABORTABLE)."""
        wanted = frozenset(partitions)
        if not wanted:
            return {}
        node = self._coordinator_of(transactional_id)
        if node is None:
            codes = dict.fromkeys(wanted, E.coordinator_not_available)
        elif node == self.node_id:
            codes = self.coordinator.verify_partitions(
                transactional_id, producer_id, producer_epoch, sorted(wanted)
            )
        else:
            key = _Key(transactional_id, producer_id, producer_epoch)
            codes = await self._remote(node, key, wanted)
        answer = {
            tp: _client_code(codes.get(tp, E.unknown_server_error), abortable) for tp in wanted
        }
        refused = {tp: code for tp, code in answer.items() if code is not E.none}
        if refused:
            log.info(
                "event=txn_verification_failed transactional_id=%s producer_id=%d epoch=%d"
                " coordinator=%s partitions=%s error=%s",
                transactional_id,
                producer_id,
                producer_epoch,
                node,
                ",".join(f"{t}-{p}" for t, p in sorted(refused)),
                ",".join(sorted({c.name for c in refused.values()})),
            )
        return answer

    def _coordinator_of(self, transactional_id: str) -> NodeId | None:
        """The live leader of the transactional id's __transaction_state partition."""
        image = self.image()
        topic = image.topics.get(TopicName(TXN_TOPIC))
        state = (
            topic.partitions.get(self.coordinator.partition_of(transactional_id)) if topic else None
        )
        if state is None or state.leader not in image.brokers:
            return None
        return state.leader

    async def _remote(
        self, node: NodeId, key: _Key, partitions: frozenset[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        queue = self._queues.setdefault(node, _NodeQueue())
        answer: asyncio.Future[dict[TopicPartition, ErrorCode]] = (
            asyncio.get_running_loop().create_future()
        )
        queue.pending.append(_Waiting(key, partitions, answer))
        if queue.task is None or queue.task.done():
            queue.task = asyncio.get_running_loop().create_task(
                self._drain(node, queue), name=f"txn-verify-to-{node}"
            )
        return await answer

    async def _drain(self, node: NodeId, queue: _NodeQueue) -> None:
        """Send what waits for ``node``, as few requests as the rule of one entry per
        transactional id allows, until nothing waits."""
        while queue.pending:
            batch, queue.pending = _take_batch(queue.pending)
            try:
                codes = await self._request(node, batch)
            except asyncio.CancelledError:
                _settle(batch, {}, E.network_exception)
                raise
            except Exception:
                # Never leave a produce waiting on an answer that will not come.
                log.exception("event=txn_verification_request_failed node=%d", node)
                codes = {}
            _settle(batch, codes, E.unknown_server_error)

    async def _request(
        self, node: NodeId, batch: dict[_Key, list[_Waiting]]
    ) -> dict[_Key, dict[TopicPartition, ErrorCode]]:
        """One AddPartitionsToTxn verify_only request; the coordinator's codes per
        transaction (every partition NETWORK_EXCEPTION if it could not be had)."""
        wanted = {
            key: frozenset(tp for w in waiting for tp in w.partitions)
            for key, waiting in batch.items()
        }
        api = schema(ADD_PARTITIONS_TO_TXN, VERIFY_VERSION)
        request = api.request(
            transactions=tuple(
                api.make_request(
                    "AddPartitionsToTxnTransaction",
                    transactional_id=key.transactional_id,
                    producer_id=key.producer_id,
                    producer_epoch=key.producer_epoch,
                    verify_only=True,
                    topics=tuple(
                        api.make_request("AddPartitionsToTxnTopic", name=topic, partitions=indexes)
                        for topic, indexes in group_partitions(parts)
                    ),
                )
                for key, parts in wanted.items()
            )
        )
        try:
            response = await self._send(node, api, request)
        except ChannelError as exc:
            log.info("event=txn_verification_unsent node=%d error=%s", node, exc)
            return {key: dict.fromkeys(parts, E.network_exception) for key, parts in wanted.items()}
        if response.error_code is not E.none:
            # As Kafka: a client is not told of the brokers' own authorization.
            code = response.error_code
            if code is E.cluster_authorization_failed:
                code = E.invalid_txn_state
            return {key: dict.fromkeys(parts, code) for key, parts in wanted.items()}
        by_id = {key.transactional_id: key for key in wanted}
        codes: dict[_Key, dict[TopicPartition, ErrorCode]] = {key: {} for key in wanted}
        for result in response.results_by_transaction:
            key = by_id.get(result.transactional_id)
            if key is None:
                continue
            for topic in result.topic_results:
                for p in topic.results_by_partition:
                    codes[key][(topic.name, p.partition_index)] = p.partition_error_code
        return codes

    async def _send_on_link(self, node: NodeId, api: ApiSchema, request: Any) -> Any:
        broker = self.image().brokers.get(node)
        if broker is None:
            raise ChannelError(f"broker {node} is not registered")
        link = self._links.get(node)
        if link is None:
            link = self._links[node] = PeerLink(f"shoal-txn-verify-{self.node_id}")
        channel = await link.to(broker.host, broker.port, _CONNECT_TIMEOUT_S)
        return await channel.call(api, request, REQUEST_TIMEOUT_S)

    async def close(self) -> None:
        for queue in self._queues.values():
            if queue.task is not None:
                queue.task.cancel()
            for waiting in queue.pending:
                if not waiting.answer.done():
                    waiting.answer.set_result(
                        dict.fromkeys(waiting.partitions, E.network_exception)
                    )
        self._queues.clear()
        for link in self._links.values():
            await link.close()
        self._links.clear()


def _take_batch(pending: list[_Waiting]) -> tuple[dict[_Key, list[_Waiting]], list[_Waiting]]:
    """The verifications for the next request (one entry per transactional id: the first
    producer and epoch asked for it, with every other ask for the same), and the rest."""
    batch: dict[_Key, list[_Waiting]] = {}
    chosen: dict[str, _Key] = {}
    rest = []
    for waiting in pending:
        key = chosen.setdefault(waiting.key.transactional_id, waiting.key)
        if key == waiting.key:
            batch.setdefault(key, []).append(waiting)
        else:
            rest.append(waiting)
    return batch, rest


def _settle(
    batch: dict[_Key, list[_Waiting]],
    codes: dict[_Key, dict[TopicPartition, ErrorCode]],
    missing: ErrorCode,
) -> None:
    """Answer every verification of ``batch``; ``missing`` for a partition not answered."""
    for key, waiting in batch.items():
        found = codes.get(key, {})
        for one in waiting:
            if not one.answer.done():
                one.answer.set_result({tp: found.get(tp, missing) for tp in one.partitions})


def _client_code(code: ErrorCode, abortable: bool) -> ErrorCode:
    """The coordinator's answer as Kafka's AddPartitionsToTxnManager hands it on."""
    if code is E.producer_fenced:
        return E.invalid_producer_epoch
    if code is E.transaction_abortable and not abortable:
        return E.invalid_txn_state
    return code
