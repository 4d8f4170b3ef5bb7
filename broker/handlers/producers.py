"""InitProducerId (22), AddPartitionsToTxn (24), AddOffsetsToTxn (25) and EndTxn (26).

An idempotent producer asks for an id once and numbers its batches; the log
does the rest (:mod:`shoal.broker.log.producer_state`). Epoch bumps of
idempotent producers (KIP-360) are answered, as Kafka answers them, with a
fresh id at epoch 0.

A transactional producer's requests go to the transaction coordinator of its
transactional id (:mod:`shoal.broker.txn.coordinator`); these handlers only
translate. AddPartitionsToTxn checks the partitions exist first, as Kafka's
KafkaApis does: if one does not, nothing is added, that one is
UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED. Its v4+
form is the one brokers send (KIP-890): a batch of transactions, each added
or, with ``verify_only``, only checked (is this partition in the ongoing
transaction?) before a transactional batch is appended.
"""

from __future__ import annotations

import logging
from typing import Any

from shoal.broker.cluster.store import StoreError
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext

from shoal.wire import ErrorCode

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
KIP_360_VERSION = 3
"""InitProducerId carries the producer id and epoch a producer already has from here on."""
BATCHED_ADD_VERSION = 4
"""AddPartitionsToTxn from brokers (KIP-890): several transactions, each maybe verify_only."""


async def handle_init_producer_id(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    if request.transactional_id is not None:
        return await _init_transactional(services, ctx, request)
    try:
        producer_id = await services.producer_ids.generate()
    except StoreError as exc:
        log.warning("event=producer_id_unavailable error=%s", exc)
        return api.response(
            throttle_time=NO_THROTTLE,
            error_code=E.coordinator_not_available,
            producer_id=-1,
            producer_epoch=-1,
        )
    return api.response(
        throttle_time=NO_THROTTLE, error_code=E.none, producer_id=producer_id, producer_epoch=0
    )


async def _init_transactional(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    api = ctx.api

    def answer(code: ErrorCode, producer_id: int = -1, epoch: int = -1) -> Any:
        return api.response(
            throttle_time=NO_THROTTLE,
            error_code=code,
            producer_id=producer_id,
            producer_epoch=epoch,
        )

    expected = None
    if ctx.version >= KIP_360_VERSION:
        producer_id, epoch = request.producer_id, request.producer_epoch
        if (producer_id == NO_PRODUCER_ID) != (epoch == -1):
            return answer(E.invalid_request)
        if producer_id != NO_PRODUCER_ID:
            expected = (producer_id, epoch)
    timeout_ms = round(request.transaction_timeout.total_seconds() * 1000)
    result = await services.transactions.init_producer_id(
        request.transactional_id, timeout_ms, expected
    )
    return answer(result.error, result.producer_id, result.producer_epoch)


async def handle_add_partitions_to_txn(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    """A client's one transaction (v0-v3), or a broker's batch of them (v4+, KIP-890),
    each either added or, with ``verify_only``, checked."""
    api = ctx.api

    def topic_results(topics: Any, codes: dict[tuple[str, int], ErrorCode]) -> tuple[Any, ...]:
        return tuple(
            api.make(
                "AddPartitionsToTxnTopicResult",
                name=topic.name,
                results_by_partition=tuple(
                    api.make(
                        "AddPartitionsToTxnPartitionResult",
                        partition_index=p,
                        partition_error_code=codes[(topic.name, p)],
                    )
                    for p in topic.partitions
                ),
            )
            for topic in topics
        )

    if ctx.version < BATCHED_ADD_VERSION:
        codes = await _add(
            services,
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            request.v3_and_below_topics,
            verify_only=False,
        )
        return api.response(
            throttle_time=NO_THROTTLE,
            results_by_topic_v3_and_below=topic_results(request.v3_and_below_topics, codes),
        )
    results = []
    for txn in request.transactions:
        codes = await _add(
            services,
            txn.transactional_id,
            txn.producer_id,
            txn.producer_epoch,
            txn.topics,
            verify_only=txn.verify_only,
        )
        results.append(
            api.make(
                "AddPartitionsToTxnResult",
                transactional_id=txn.transactional_id,
                topic_results=topic_results(txn.topics, codes),
            )
        )
    return api.response(
        throttle_time=NO_THROTTLE, error_code=E.none, results_by_transaction=tuple(results)
    )


async def _add(
    services: BrokerServices,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    topics: Any,
    verify_only: bool,
) -> dict[tuple[str, int], ErrorCode]:
    wanted = [(t.name, p) for t in topics for p in t.partitions]
    if verify_only:
        return services.transactions.verify_partitions(
            transactional_id, producer_id, producer_epoch, wanted
        )
    unknown = {tp for tp in wanted if not _exists(services, *tp)}
    if unknown:
        return {
            tp: E.unknown_topic_or_partition if tp in unknown else E.operation_not_attempted
            for tp in wanted
        }
    code = await services.transactions.add_partitions(
        transactional_id, producer_id, producer_epoch, wanted
    )
    return dict.fromkeys(wanted, code)


def _exists(services: BrokerServices, topic: str, index: int) -> bool:
    known = services.topic(topic)
    return known is not None and 0 <= index < known.record.partition_count


async def handle_add_offsets_to_txn(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    code = await services.transactions.add_offsets(
        request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
    )
    return ctx.api.response(throttle_time=NO_THROTTLE, error_code=code)


async def handle_end_txn(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    code = await services.transactions.end_txn(
        request.transactional_id, request.producer_id, request.producer_epoch, request.committed
    )
    return ctx.api.response(throttle_time=NO_THROTTLE, error_code=code)
