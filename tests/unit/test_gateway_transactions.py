"""The gateway's rewriters for the operators' transaction tools (KIP-664):
DescribeTransactions, ListTransactions and DescribeProducers.

What a tenant must notice, with the stubs and codec round trips of
test_gateway_rewrite.py: its transactional ids and topics go to the brokers
under their namespaced names and come back under its own; Kafka's checks
refuse what the key may not see (DESCRIBE on a transactional id, READ on a
topic for its producers) in that slot; and another tenant's ids and topics
never appear in an answer, even when the brokers return them.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import pytest
from shoal.gateway.apis import REWRITERS, transactions
from shoal.gateway.apis.base import RequestContext
from shoal.gateway.server import offered_versions
from shoal.tenancy.model import Operation
from test_gateway_rewrite import (
    TOPIC,
    TXN,
    answered,
    broker_receives,
    context,
    denying,
    finished,
    other_tenant_context,
)

from shoal.wire import ApiSchema, ErrorCode

E = ErrorCode
DESCRIBE_PRODUCERS = 61
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def test_the_gateway_offers_the_operators_transaction_apis() -> None:
    versions = offered_versions({61: (0, 0), 65: (0, 0), 66: (0, 1)})
    assert {key: versions[key] for key in (61, 65, 66)} == {61: (0, 0), 65: (0, 0), 66: (0, 1)}
    assert {key: REWRITERS[key][1] for key in (61, 65, 66)} == {
        61: transactions.describe_producers,
        65: transactions.describe_transactions,
        66: transactions.list_transactions,
    }


# DescribeTransactions


def txn_state(api: ApiSchema, transactional_id: str, topics: dict[str, Sequence[int]]) -> Any:
    return api.make(
        "TransactionState",
        error_code=E.none,
        transactional_id=transactional_id,
        transaction_state="Ongoing",
        transaction_timeout=datetime.timedelta(minutes=1),
        transaction_start_time=START,
        producer_id=7,
        producer_epoch=0,
        topics=tuple(
            api.make("TopicData", topic=name, partitions=tuple(parts))
            for name, parts in topics.items()
        ),
    )


def describe_response(api: ApiSchema, *states: Any) -> Any:
    return api.response(throttle_time=datetime.timedelta(0), transaction_states=states)


async def test_describe_transactions_maps_ids_in_and_out_with_their_partitions() -> None:
    ctx = context(DESCRIBE_TRANSACTIONS, 0)
    request = ctx.api.request(transactional_ids=("tx-1",))

    step = await transactions.describe_transactions(ctx, request)

    assert broker_receives(ctx.api, step).transactional_ids == ("acme.tx-1",)
    response = finished(
        ctx.api,
        step,
        describe_response(ctx.api, txn_state(ctx.api, "acme.tx-1", {"acme.orders": [0, 2]})),
    )
    (state,) = response.transaction_states
    assert (state.error_code, state.transactional_id, state.transaction_state) == (
        E.none,
        "tx-1",
        "Ongoing",
    )
    assert [(t.topic, t.partitions) for t in state.topics] == [("orders", (0, 2))]


async def test_describe_transactions_refuses_an_id_the_key_may_not_describe() -> None:
    ctx = context(DESCRIBE_TRANSACTIONS, 0, bindings=denying(TXN, "secret", Operation.DESCRIBE))
    request = ctx.api.request(transactional_ids=("tx-1", "secret"))

    step = await transactions.describe_transactions(ctx, request)

    assert broker_receives(ctx.api, step).transactional_ids == ("acme.tx-1",)
    response = finished(
        ctx.api, step, describe_response(ctx.api, txn_state(ctx.api, "acme.tx-1", {}))
    )
    codes = {s.transactional_id: s.error_code for s in response.transaction_states}
    assert codes == {"tx-1": E.none, "secret": E.transactional_id_authorization_failed}


async def test_describe_transactions_answers_alone_when_every_id_is_refused() -> None:
    ctx = context(DESCRIBE_TRANSACTIONS, 0, bindings=denying(TXN, "secret", Operation.DESCRIBE))

    step = await transactions.describe_transactions(
        ctx, ctx.api.request(transactional_ids=("secret", ""))
    )

    response = answered(ctx.api, step)
    assert [(s.transactional_id, s.error_code) for s in response.transaction_states] == [
        ("secret", E.transactional_id_authorization_failed),
        ("", E.transactional_id_authorization_failed),
    ]


async def test_describe_transactions_hides_partitions_of_topics_the_key_may_not_describe() -> None:
    ctx = context(DESCRIBE_TRANSACTIONS, 0, bindings=denying(TOPIC, "secret", Operation.DESCRIBE))
    step = await transactions.describe_transactions(ctx, ctx.api.request(transactional_ids=("tx",)))

    response = finished(
        ctx.api,
        step,
        describe_response(
            ctx.api,
            txn_state(
                ctx.api, "acme.tx", {"acme.orders": [0], "acme.secret": [1], "globex.pay": [0]}
            ),
        ),
    )

    (state,) = response.transaction_states
    assert [t.topic for t in state.topics] == ["orders"]


async def test_describe_transactions_keeps_each_tenants_ids_apart() -> None:
    theirs = other_tenant_context(DESCRIBE_TRANSACTIONS, 0)

    # Naming acme's id as the brokers know it stays inside globex's namespace.
    step = await transactions.describe_transactions(
        theirs, theirs.api.request(transactional_ids=("acme.tx",))
    )

    assert broker_receives(theirs.api, step).transactional_ids == ("globex.acme.tx",)
    leaked = finished(
        theirs.api, step, describe_response(theirs.api, txn_state(theirs.api, "acme.tx", {}))
    )
    assert leaked.transaction_states == ()


# ListTransactions


def list_response(api: ApiSchema, *ids: str) -> Any:
    return api.response(
        throttle_time=datetime.timedelta(0),
        error_code=E.none,
        unknown_state_filters=(),
        transaction_states=tuple(
            api.make(
                "TransactionState", transactional_id=i, producer_id=n, transaction_state="Ongoing"
            )
            for n, i in enumerate(ids)
        ),
    )


@pytest.mark.parametrize("version", [0, 1])
async def test_list_transactions_shows_only_the_tenants_ids_under_its_names(version: int) -> None:
    ctx = context(LIST_TRANSACTIONS, version)
    fields: dict[str, Any] = {"state_filters": ("Ongoing",), "producer_id_filters": (7,)}
    if version >= 1:
        fields["duration_filter"] = 60_000
    step = await transactions.list_transactions(ctx, ctx.api.request(**fields))

    sent = broker_receives(ctx.api, step)
    assert (sent.state_filters, sent.producer_id_filters) == (("Ongoing",), (7,))
    response = finished(
        ctx.api, step, list_response(ctx.api, "acme.tx-1", "globex.tx-1", "acme.b.c", "acme.")
    )
    assert [s.transactional_id for s in response.transaction_states] == ["tx-1", "b.c"]


async def test_list_transactions_leaves_out_ids_the_key_may_not_describe() -> None:
    ctx = context(LIST_TRANSACTIONS, 1, bindings=denying(TXN, "secret", Operation.DESCRIBE))
    request = ctx.api.request(state_filters=(), producer_id_filters=(), duration_filter=-1)

    step = await transactions.list_transactions(ctx, request)

    response = finished(ctx.api, step, list_response(ctx.api, "acme.tx", "acme.secret"))
    assert [s.transactional_id for s in response.transaction_states] == ["tx"]


async def test_list_transactions_of_another_tenant_shows_none_of_acmes() -> None:
    theirs = other_tenant_context(LIST_TRANSACTIONS, 1)
    request = theirs.api.request(state_filters=(), producer_id_filters=(), duration_filter=-1)

    step = await transactions.list_transactions(theirs, request)

    response = finished(theirs.api, step, list_response(theirs.api, "acme.tx", "globex.mine"))
    assert [s.transactional_id for s in response.transaction_states] == ["mine"]


# DescribeProducers


def producers_request(ctx: RequestContext, topics: dict[str, Sequence[int]]) -> Any:
    return ctx.api.request(
        topics=tuple(
            ctx.api.make_request("TopicRequest", name=name, partition_indexes=tuple(parts))
            for name, parts in topics.items()
        )
    )


def producers_response(api: ApiSchema, topics: dict[str, Sequence[int]]) -> Any:
    return api.response(
        throttle_time=datetime.timedelta(0),
        topics=tuple(
            api.make(
                "TopicResponse",
                name=name,
                partitions=tuple(
                    api.make(
                        "PartitionResponse",
                        partition_index=index,
                        error_code=E.none,
                        error_message=None,
                        active_producers=(
                            api.make(
                                "ProducerState",
                                producer_id=7,
                                producer_epoch=0,
                                last_sequence=4,
                                last_timestamp=1_700_000_000_000,
                                coordinator_epoch=-1,
                                current_txn_start_offset=12,
                            ),
                        ),
                    )
                    for index in parts
                ),
            )
            for name, parts in topics.items()
        ),
    )


async def test_describe_producers_maps_topics_in_and_out() -> None:
    ctx = context(DESCRIBE_PRODUCERS, 0)
    step = await transactions.describe_producers(ctx, producers_request(ctx, {"orders": [0, 1]}))

    sent = broker_receives(ctx.api, step)
    assert [(t.name, t.partition_indexes) for t in sent.topics] == [("acme.orders", (0, 1))]
    response = finished(ctx.api, step, producers_response(ctx.api, {"acme.orders": [0, 1]}))
    (topic,) = response.topics
    assert topic.name == "orders"
    assert [p.active_producers[0].current_txn_start_offset for p in topic.partitions] == [12, 12]


async def test_describe_producers_needs_read_on_the_topic() -> None:
    ctx = context(DESCRIBE_PRODUCERS, 0, bindings=denying(TOPIC, "secret", Operation.READ))
    step = await transactions.describe_producers(
        ctx, producers_request(ctx, {"orders": [0], "secret": [0, 1]})
    )

    assert [t.name for t in broker_receives(ctx.api, step).topics] == ["acme.orders"]
    response = finished(ctx.api, step, producers_response(ctx.api, {"acme.orders": [0]}))
    codes = {
        t.name: [(p.partition_index, p.error_code) for p in t.partitions] for t in response.topics
    }
    assert codes == {
        "orders": [(0, E.none)],
        "secret": [(0, E.topic_authorization_failed), (1, E.topic_authorization_failed)],
    }


async def test_describe_producers_answers_alone_when_every_topic_is_refused() -> None:
    ctx = context(DESCRIBE_PRODUCERS, 0, bindings=denying(TOPIC, "secret", Operation.READ))

    step = await transactions.describe_producers(ctx, producers_request(ctx, {"secret": [3]}))

    (topic,) = answered(ctx.api, step).topics
    assert (topic.name, topic.partitions[0].error_code) == ("secret", E.topic_authorization_failed)


async def test_describe_producers_never_shows_another_tenants_topic() -> None:
    theirs = other_tenant_context(DESCRIBE_PRODUCERS, 0)
    step = await transactions.describe_producers(
        theirs, producers_request(theirs, {"acme.orders": [0]})
    )

    assert [t.name for t in broker_receives(theirs.api, step).topics] == ["globex.acme.orders"]
    response = finished(theirs.api, step, producers_response(theirs.api, {"acme.orders": [0]}))
    assert response.topics == ()
