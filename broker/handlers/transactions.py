"""DescribeTransactions (65) and ListTransactions (66): what the transaction coordinator
of this broker knows, for ``kafka-transactions.sh`` and admin clients (KIP-664).

Describe answers for the transactional ids this broker coordinates (others get
NOT_COORDINATOR, as in Kafka: the admin client asks each id's coordinator);
List answers for every id this broker coordinates, and admin clients ask every
broker.
"""

from __future__ import annotations

import datetime
from typing import Any

from shoal.broker.handlers.base import NO_THROTTLE, BrokerServices, E, RequestContext
from shoal.broker.txn.metadata import TxnState
from shoal.broker.txn.records import group_partitions


async def handle_describe_transactions(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    states = []
    for transactional_id in request.transactional_ids:
        code, metadata = services.transactions.describe(transactional_id)
        if metadata is None:
            states.append(
                api.make(
                    "TransactionState",
                    error_code=code,
                    transactional_id=transactional_id,
                    transaction_state="",
                    transaction_timeout=datetime.timedelta(0),
                    transaction_start_time=_time(-1),
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=(),
                )
            )
            continue
        states.append(
            api.make(
                "TransactionState",
                error_code=E.none,
                transactional_id=transactional_id,
                transaction_state=metadata.state.kafka_name,
                transaction_timeout=datetime.timedelta(milliseconds=metadata.timeout_ms),
                transaction_start_time=_time(metadata.start_timestamp),
                producer_id=metadata.producer_id,
                producer_epoch=metadata.producer_epoch,
                topics=tuple(
                    api.make("TopicData", topic=topic, partitions=indexes)
                    for topic, indexes in group_partitions(metadata.partitions)
                ),
            )
        )
    return api.response(throttle_time=NO_THROTTLE, transaction_states=tuple(states))


def _time(ms: int) -> datetime.datetime:
    """Kafka writes -1 for "not started"; kio's timestamps cannot, so the epoch stands in."""
    return datetime.datetime.fromtimestamp(max(ms, 0) / 1000, datetime.UTC)


async def handle_list_transactions(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api
    states: set[TxnState] = set()
    unknown = []
    for name in request.state_filters:
        state = TxnState.from_kafka_name(name)
        if state is None:
            unknown.append(name)
        else:
            states.add(state)
    duration = getattr(request, "duration_filter", -1)
    code, found = services.transactions.list_transactions(
        states, set(request.producer_id_filters), duration
    )
    if unknown and not states:
        found = []  # every filter named an unknown state: nothing matches
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=code,
        unknown_state_filters=tuple(unknown),
        transaction_states=tuple(
            api.make(
                "TransactionState",
                transactional_id=m.transactional_id,
                producer_id=m.producer_id,
                transaction_state=m.state.kafka_name,
            )
            for m in sorted(found, key=lambda m: m.transactional_id)
        ),
    )
