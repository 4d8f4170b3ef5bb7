"""Fetch sessions (KIP-227) through the gateway: the Fetch rewriter with a connection's session.

A client connection's session is its broker's; the gateway passes the id
through, accepts it only on that connection, keeps refused topics out of the
broker's session while answering them every time, and judges the session's
topics again when the tenant's ACLs change. Each test plays one connection's
requests through :func:`shoal.gateway.apis.records.fetch` and the broker's
answers through ``finish``, with the real codec on both sides.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from shoal.gateway.apis import records
from shoal.gateway.apis.base import Forward, RequestContext, replace
from shoal.gateway.fetch_session import ClientFetchSession
from shoal.tenancy.acl import default_bindings
from shoal.tenancy.model import AclBinding, Operation, ResourceType
from test_gateway_rewrite import (
    KEY,
    ORDERS_ID,
    TENANT,
    UNKNOWN_ID,
    answered,
    broker_receives,
    context,
    denying,
    fetch_request,
    fetch_response,
    finished,
)

from shoal.wire import ErrorCode

BROKER_SESSION = 4242
READ_DENIED = denying(ResourceType.TOPIC, "secret", Operation.READ)
ALLOWED = default_bindings(TENANT, KEY)


def connection_context(
    session: ClientFetchSession, version: int = 12, bindings: Sequence[AclBinding] | None = None
) -> RequestContext:
    return replace(context(1, version, bindings=bindings), fetch_session=session)


def session_request(
    ctx: RequestContext,
    topics: Sequence[str | uuid.UUID],
    session_id: int,
    epoch: int,
    *,
    forgotten: Sequence[str | uuid.UUID] = (),
    partitions: int = 1,
) -> Any:
    request = fetch_request(
        ctx.api, topics, forgotten=forgotten, partition_max_bytes=(2_000,) * partitions
    )
    return replace(request, session_id=session_id, session_epoch=epoch)


def broker_answer(
    ctx: RequestContext,
    topics: Sequence[str | uuid.UUID],
    session_id: int,
    code: ErrorCode = ErrorCode.none,
) -> Any:
    response = (
        fetch_response(ctx.api, topics) if code is ErrorCode.none else fetch_response(ctx.api, [])
    )
    return replace(response, session_id=session_id, error_code=code)


def upstream(ctx: RequestContext, step: Any) -> tuple[int, int, list[Any], list[Any]]:
    """(session id, epoch, [(topic, partitions)], [(forgotten topic, partitions)])."""
    sent = broker_receives(ctx.api, step)
    key = "topic_id" if ctx.api.version >= 13 else "topic"
    return (
        sent.session_id,
        sent.session_epoch,
        [(getattr(t, key), [p.partition for p in t.partitions]) for t in sent.topics],
        [(getattr(t, key), list(t.partitions)) for t in sent.forgotten_topics_data],
    )


async def opened(
    session: ClientFetchSession,
    topics: Sequence[str | uuid.UUID],
    version: int = 12,
    bindings: Sequence[AclBinding] | None = None,
    partitions: int = 1,
) -> Any:
    """Open the connection's session on ``topics``; the client's answer (the broker's
    carried every topic it was asked for)."""
    ctx = connection_context(session, version, bindings)
    step = await records.fetch(ctx, session_request(ctx, topics, 0, 0, partitions=partitions))
    asked = [topic for topic, _ in upstream(ctx, step)[2]]
    return finished(ctx.api, step, broker_answer(ctx, asked, BROKER_SESSION))


def slots(response: Any, key: str = "topic") -> dict[Any, list[tuple[int, ErrorCode]]]:
    return {
        getattr(t, key): [(p.partition_index, p.error_code) for p in t.partitions]
        for t in response.responses
    }


@pytest.mark.parametrize("version", [7, 12, 13, 16])
async def test_the_brokers_session_reaches_the_client_and_goes_on_incrementally(
    version: int,
) -> None:
    session = ClientFetchSession()
    topic: str | uuid.UUID = ORDERS_ID if version >= 13 else "orders"
    broker_topic: str | uuid.UUID = ORDERS_ID if version >= 13 else "acme.orders"
    ctx = connection_context(session, version)

    first = await records.fetch(ctx, session_request(ctx, [topic], 0, 0))

    assert upstream(ctx, first) == (0, 0, [(broker_topic, [0])], [])
    answer = finished(ctx.api, first, broker_answer(ctx, [broker_topic], BROKER_SESSION))
    assert (answer.error_code, answer.session_id) == (ErrorCode.none, BROKER_SESSION)

    nothing_new = await records.fetch(ctx, session_request(ctx, [], BROKER_SESSION, 1))
    assert upstream(ctx, nothing_new) == (BROKER_SESSION, 1, [], [])
    quiet = finished(ctx.api, nothing_new, broker_answer(ctx, [], BROKER_SESSION))
    assert (quiet.session_id, quiet.responses) == (BROKER_SESSION, ())

    dropped = await records.fetch(
        ctx, session_request(ctx, [], BROKER_SESSION, 2, forgotten=[topic])
    )
    assert upstream(ctx, dropped) == (BROKER_SESSION, 2, [], [(broker_topic, [0])])


@pytest.mark.parametrize("named", [BROKER_SESSION + 1, 0, 2**31 - 1])
async def test_only_the_connections_own_session_id_is_accepted(named: int) -> None:
    session = ClientFetchSession()
    await opened(session, ["orders"])
    ctx = connection_context(session)

    step = await records.fetch(ctx, session_request(ctx, ["orders"], named, 1))

    refused = answered(ctx.api, step)
    assert refused.error_code == ErrorCode.fetch_session_id_not_found
    assert (refused.session_id, refused.responses) == (0, ())


async def test_another_connection_cannot_name_a_session_it_did_not_open() -> None:
    mine, theirs = ClientFetchSession(), ClientFetchSession()
    answer = await opened(theirs, ["orders"])
    ctx = connection_context(mine)

    step = await records.fetch(ctx, session_request(ctx, ["orders"], answer.session_id, 1))

    assert answered(ctx.api, step).error_code == ErrorCode.fetch_session_id_not_found


async def test_a_full_fetch_closes_the_connections_session_whatever_id_it_names() -> None:
    session = ClientFetchSession()
    await opened(session, ["orders"])
    ctx = connection_context(session)

    # A new session, naming someone else's id: the broker is asked to close this
    # connection's own, not the named one.
    step = await records.fetch(ctx, session_request(ctx, ["orders"], 999, 0))
    assert upstream(ctx, step)[:2] == (BROKER_SESSION, 0)
    answer = finished(ctx.api, step, broker_answer(ctx, ["acme.orders"], 777))
    assert answer.session_id == 777

    sessionless = await records.fetch(ctx, session_request(ctx, ["orders"], 0, -1))
    assert upstream(ctx, sessionless)[:2] == (777, -1)
    finished(ctx.api, sessionless, broker_answer(ctx, ["acme.orders"], 0))
    late = await records.fetch(ctx, session_request(ctx, [], 777, 1))
    assert answered(ctx.api, late).error_code == ErrorCode.fetch_session_id_not_found


@pytest.mark.parametrize(
    "code", [ErrorCode.invalid_fetch_session_epoch, ErrorCode.fetch_session_id_not_found]
)
async def test_after_a_session_error_only_a_full_fetch_goes_on(code: ErrorCode) -> None:
    session = ClientFetchSession()
    await opened(session, ["orders"])
    ctx = connection_context(session)
    step = await records.fetch(ctx, session_request(ctx, [], BROKER_SESSION, 5))

    answer = finished(ctx.api, step, broker_answer(ctx, [], 0, code))

    assert (answer.error_code, answer.responses) == (code, ())
    again = await records.fetch(ctx, session_request(ctx, [], BROKER_SESSION, 6))
    assert answered(ctx.api, again).error_code == ErrorCode.fetch_session_id_not_found
    # Java's client then sends (its id, epoch 0): the broker closes the old session,
    # if it still has it.
    fresh = await records.fetch(ctx, session_request(ctx, ["orders"], BROKER_SESSION, 0))
    still_held = code is ErrorCode.invalid_fetch_session_epoch
    assert upstream(ctx, fresh)[:2] == (BROKER_SESSION if still_held else 0, 0)


async def test_a_refused_topic_stays_out_of_the_brokers_session_and_in_every_answer() -> None:
    session = ClientFetchSession()
    answer = await opened(session, ["orders", "secret"], bindings=READ_DENIED, partitions=2)
    assert slots(answer)["secret"] == [
        (0, ErrorCode.topic_authorization_failed),
        (1, ErrorCode.topic_authorization_failed),
    ]
    ctx = connection_context(session, bindings=READ_DENIED)

    step = await records.fetch(ctx, session_request(ctx, [], BROKER_SESSION, 1))

    assert upstream(ctx, step) == (BROKER_SESSION, 1, [], [])
    quiet = finished(ctx.api, step, broker_answer(ctx, [], BROKER_SESSION))
    assert slots(quiet) == {
        "secret": [
            (0, ErrorCode.topic_authorization_failed),
            (1, ErrorCode.topic_authorization_failed),
        ]
    }
    # Forgetting it is the gateway's business alone.
    forgets = await records.fetch(
        ctx, session_request(ctx, [], BROKER_SESSION, 2, forgotten=["secret"])
    )
    assert upstream(ctx, forgets) == (BROKER_SESSION, 2, [], [])
    after = finished(ctx.api, forgets, broker_answer(ctx, [], BROKER_SESSION))
    assert slots(after) == {"secret": [(1, ErrorCode.topic_authorization_failed)]}


async def test_a_session_of_only_refused_topics_is_answered_without_a_session() -> None:
    session = ClientFetchSession()
    ctx = connection_context(session, bindings=READ_DENIED)

    step = await records.fetch(ctx, session_request(ctx, ["secret"], 0, 0))

    answer = answered(ctx.api, step)
    assert (answer.session_id, slots(answer)) == (
        0,
        {"secret": [(0, ErrorCode.topic_authorization_failed)]},
    )


async def test_revoking_read_drops_the_topic_from_the_session_and_granting_it_back_relists_it() -> (
    None
):
    session = ClientFetchSession()
    await opened(session, ["orders", "secret"], partitions=2)
    revoked = connection_context(session, bindings=READ_DENIED)

    step = await records.fetch(revoked, session_request(revoked, [], BROKER_SESSION, 1))

    assert upstream(revoked, step) == (BROKER_SESSION, 1, [], [("acme.secret", [0, 1])])
    answer = finished(revoked.api, step, broker_answer(revoked, [], BROKER_SESSION))
    assert slots(answer) == {
        "secret": [
            (0, ErrorCode.topic_authorization_failed),
            (1, ErrorCode.topic_authorization_failed),
        ]
    }

    granted = connection_context(session)
    step = await records.fetch(granted, session_request(granted, [], BROKER_SESSION, 2))
    session_id, epoch, listed, forgotten = upstream(granted, step)
    assert (session_id, epoch, listed, forgotten) == (
        BROKER_SESSION,
        2,
        [("acme.secret", [0, 1])],
        [],
    )
    assert slots(finished(granted.api, step, broker_answer(granted, [], BROKER_SESSION))) == {}


async def test_a_listed_topic_newly_refused_is_forgotten_upstream() -> None:
    session = ClientFetchSession()
    await opened(session, ["orders", "secret"])
    ctx = connection_context(session, bindings=READ_DENIED)

    step = await records.fetch(ctx, session_request(ctx, ["secret"], BROKER_SESSION, 1))

    assert upstream(ctx, step) == (BROKER_SESSION, 1, [], [("acme.secret", [0])])


async def test_an_unknown_topic_id_is_answered_until_it_names_a_topic() -> None:
    session = ClientFetchSession()
    # The same bindings throughout: only the refused topic is judged again.
    answer = await opened(session, [ORDERS_ID, UNKNOWN_ID], version=13, bindings=ALLOWED)
    assert slots(answer, "topic_id")[UNKNOWN_ID] == [(0, ErrorCode.unknown_topic_id)]
    ctx = connection_context(session, version=13, bindings=ALLOWED)
    ctx.lookups.topic_ids[UNKNOWN_ID] = "acme.late"  # type: ignore[attr-defined]

    step = await records.fetch(ctx, session_request(ctx, [], BROKER_SESSION, 1))

    assert upstream(ctx, step) == (BROKER_SESSION, 1, [(UNKNOWN_ID, [0])], [])


async def test_an_unchanged_acl_judges_only_the_refused_topics_again() -> None:
    session = ClientFetchSession()
    await opened(session, ["orders", "secret"], bindings=ALLOWED)
    # Were "secret" judged again, this DENY (in a bindings object the session has
    # already judged with) would forget it upstream.
    ALLOWED.append(READ_DENIED[-1])
    try:
        ctx = connection_context(session, bindings=ALLOWED)
        step = await records.fetch(ctx, session_request(ctx, [], BROKER_SESSION, 1))
    finally:
        ALLOWED.pop()

    assert upstream(ctx, step) == (BROKER_SESSION, 1, [], [])


async def test_an_answer_carries_only_what_the_session_lets_the_broker_answer() -> None:
    session = ClientFetchSession()
    await opened(session, ["orders", "secret"], bindings=READ_DENIED)
    ctx = connection_context(session, bindings=READ_DENIED)
    step = await records.fetch(ctx, session_request(ctx, [], BROKER_SESSION, 1))

    drifted = broker_answer(ctx, ["acme.orders", "acme.secret", "acme.other"], BROKER_SESSION)
    answer = finished(ctx.api, step, drifted)

    assert slots(answer) == {
        "orders": [(0, ErrorCode.none)],
        "secret": [(0, ErrorCode.topic_authorization_failed)],
    }


async def test_a_full_fetch_of_only_refused_topics_closes_the_old_session_and_opens_none() -> None:
    session = ClientFetchSession()
    await opened(session, ["orders"])
    ctx = connection_context(session, bindings=READ_DENIED)

    step = await records.fetch(ctx, session_request(ctx, ["secret"], 0, 0))

    assert upstream(ctx, step) == (BROKER_SESSION, -1, [], [])
    answer = finished(ctx.api, step, broker_answer(ctx, [], 0))
    assert (answer.session_id, slots(answer)) == (
        0,
        {"secret": [(0, ErrorCode.topic_authorization_failed)]},
    )


async def test_a_session_the_broker_no_longer_knows_is_not_named_again() -> None:
    session = ClientFetchSession()
    await opened(session, ["orders"])
    ctx = connection_context(session)
    step = await records.fetch(ctx, session_request(ctx, [], BROKER_SESSION, 1))
    finished(ctx.api, step, broker_answer(ctx, [], 0, ErrorCode.fetch_session_id_not_found))

    fresh = await records.fetch(ctx, session_request(ctx, ["orders"], 0, 0))

    assert upstream(ctx, fresh)[:2] == (0, 0)


async def test_switching_between_names_and_ids_in_a_session_is_refused() -> None:
    session = ClientFetchSession()
    await opened(session, ["orders"], version=12)
    ctx = connection_context(session, version=13)

    step = await records.fetch(ctx, session_request(ctx, [ORDERS_ID], BROKER_SESSION, 1))

    assert answered(ctx.api, step).error_code == ErrorCode.fetch_session_topic_id_error


async def test_a_session_the_broker_ends_ends_at_the_gateway() -> None:
    session = ClientFetchSession()
    await opened(session, ["orders"])
    ctx = connection_context(session)
    step = await records.fetch(
        ctx, session_request(ctx, [], BROKER_SESSION, 1, forgotten=["orders"])
    )

    answer = finished(ctx.api, step, broker_answer(ctx, [], 0))

    assert answer.session_id == 0
    late = await records.fetch(ctx, session_request(ctx, [], BROKER_SESSION, 2))
    assert answered(ctx.api, late).error_code == ErrorCode.fetch_session_id_not_found


async def test_a_full_fetch_ignores_forgotten_topics_as_kafka_does() -> None:
    session = ClientFetchSession()
    ctx = connection_context(session)

    step = await records.fetch(ctx, session_request(ctx, ["orders"], 0, 0, forgotten=["orders"]))

    assert upstream(ctx, step) == (0, 0, [("acme.orders", [0])], [])
    assert isinstance(step, Forward)
