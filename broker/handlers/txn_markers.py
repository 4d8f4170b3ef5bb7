"""WriteTxnMarkers (27): a transaction coordinator has the partitions this broker leads
marked with a transaction's outcome.

Each partition of each marker gets Kafka's control batch (COMMIT or ABORT)
through :func:`~shoal.broker.txn.markers.write_markers`, the same code the
coordinator uses for partitions it leads itself: append as leader, wait for
the in-sync replicas, and for a ``__consumer_offsets`` partition let the
group coordinator commit or drop the offsets the producer staged there. The
answer carries an error code per partition; the coordinator retries those
that failed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from shoal.broker.handlers.base import BrokerServices, RequestContext
from shoal.broker.txn.markers import TxnMarker, write_markers
from shoal.broker.txn.records import group_partitions


async def handle_write_txn_markers(
    services: BrokerServices, ctx: RequestContext, request: Any
) -> Any:
    api = ctx.api

    async def one(marker: Any) -> Any:
        txn = TxnMarker(
            marker.producer_id,
            marker.producer_epoch,
            marker.transaction_result,
            marker.coordinator_epoch,
            frozenset((t.name, p) for t in marker.topics for p in t.partition_indexes),
        )
        codes = await write_markers(services.partition, services.groups.complete_transaction, txn)
        return api.make(
            "WritableTxnMarkerResult",
            producer_id=marker.producer_id,
            topics=tuple(
                api.make(
                    "WritableTxnMarkerTopicResult",
                    name=topic,
                    partitions=tuple(
                        api.make(
                            "WritableTxnMarkerPartitionResult",
                            partition_index=index,
                            error_code=codes[(topic, index)],
                        )
                        for index in indexes
                    ),
                )
                for topic, indexes in group_partitions(txn.partitions)
            ),
        )

    results = await asyncio.gather(*(one(marker) for marker in request.markers))
    return api.response(markers=tuple(results))
