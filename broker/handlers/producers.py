"""InitProducerId (22) for idempotent producers, and the transaction APIs' clear refusal.

An idempotent producer asks for an id once and numbers its batches; the log
does the rest (:mod:`shoal.broker.log.producer_state`). Epoch bumps of
idempotent producers (KIP-360) are answered, as Kafka answers them, with a
fresh id at epoch 0.

Transactions come in a later release. Until then a transactional producer
is told so at once, not left retrying: FindCoordinator for a transactional
id and InitProducerId with one answer TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
the error every client (librdkafka included) treats as final, with the
reason in FindCoordinator's message; AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn and TxnOffsetCommit answer
INVALID_PRODUCER_ID_MAPPING, since no producer id belongs to a
transactional id here.
"""

from __future__ import annotations

import logging
from typing import Any

from shoal.broker.cluster.store import StoreError
from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext

log = logging.getLogger(__name__)


async def handle_init_producer_id(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    if request.transactional_id is not None:
        log.info(
            "event=transactions_refused transactional_id=%s client_id=%s",
            request.transactional_id,
            ctx.header.client_id,
        )
        return api.response(
            throttle_time=NO_THROTTLE,
            error_code=E.transactional_id_authorization_failed,
            producer_id=-1,
            producer_epoch=-1,
        )
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


async def handle_add_partitions_to_txn(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    topics = tuple(
        api.make(
            "AddPartitionsToTxnTopicResult",
            name=topic.name,
            results_by_partition=tuple(
                api.make(
                    "AddPartitionsToTxnPartitionResult",
                    partition_index=p,
                    partition_error_code=E.invalid_producer_id_mapping,
                )
                for p in topic.partitions
            ),
        )
        for topic in request.v3_and_below_topics
    )
    return api.response(throttle_time=NO_THROTTLE, results_by_topic_v3_and_below=topics)


async def handle_add_offsets_to_txn(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    return ctx.api.response(throttle_time=NO_THROTTLE, error_code=E.invalid_producer_id_mapping)


async def handle_end_txn(services: BrokerServices, ctx: RequestContext, request: Any) -> Any:
    return ctx.api.response(throttle_time=NO_THROTTLE, error_code=E.invalid_producer_id_mapping)


async def handle_txn_offset_commit(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    topics = tuple(
        api.make(
            "TxnOffsetCommitResponseTopic",
            name=topic.name,
            partitions=tuple(
                api.make(
                    "TxnOffsetCommitResponsePartition",
                    partition_index=p.partition_index,
                    error_code=E.invalid_producer_id_mapping,
                )
                for p in topic.partitions
            ),
        )
        for topic in request.topics
    )
    return api.response(throttle_time=NO_THROTTLE, topics=topics)
