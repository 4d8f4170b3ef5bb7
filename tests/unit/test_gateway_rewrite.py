"""The gateway's per-API rewriters (shoal.gateway.apis), without sockets or brokers.

Each test builds kio's request entity for one API version, runs the rewriter
with a :class:`StubLookups` (topic ids, partition counts, gateway addresses)
and checks what a tenant would notice: which names the broker is asked
about, which slots come back refused and with which Kafka error, and what
the client finally reads once ``finish`` has mapped the broker's answer.

"What the broker receives" and "what the client reads" go through the real
codec (:func:`broker_receives`, :func:`client_receives`), so a rewritten
entity that cannot be encoded, or that the broker's request guard would
refuse, fails here rather than on a live connection. The last section runs
every rewriter in :data:`REWRITERS` at its lowest and highest version with a
generated minimal request, for a full-access, a read-only and a no-access key.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
import types
import typing
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from acl_store_stub import StubAclStore
from shoal.gateway.access import TenantAccess
from shoal.gateway.apis import (
    REWRITERS,
    broker_configs,
    client_quotas,
    cluster,
    consumer_groups,
    elections,
    groups,
    records,
    topics,
    transactions,
)
from shoal.gateway.apis.base import (
    NOT_REQUESTED,
    Answer,
    Forward,
    RefusedRequestError,
    RequestContext,
    Step,
    replace,
)
from shoal.gateway.mutation_quota import MutationVerdict
from shoal.gateway.server import offered_versions
from shoal.tenancy.acl import CLUSTER_NAME, default_bindings, read_only_bindings
from shoal.tenancy.model import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    Quotas,
    ResourceType,
)

from shoal.wire import (
    ApiSchema,
    ErrorCode,
    UnsupportedVersionError,
    decode_request,
    schema,
)
from shoal.wire.codec import encode_request

TENANT = "acme"
OTHER_TENANT = "globex"
KEY = "key-1"

ORDERS_ID = uuid.UUID("00000000-0000-4000-8000-000000000001")
SECRET_ID = uuid.UUID("00000000-0000-4000-8000-000000000002")
THEIRS_ID = uuid.UUID("00000000-0000-4000-8000-000000000003")
UNKNOWN_ID = uuid.UUID("00000000-0000-4000-8000-00000000dead")
ZERO_ID = uuid.UUID(int=0)
TOPIC_IDS: Mapping[uuid.UUID, str] = {
    ORDERS_ID: "acme.orders",
    SECRET_ID: "acme.secret",
    THEIRS_ID: "globex.payments",
}
NO_THROTTLE = datetime.timedelta(0)
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
BROKER_LOGGER_RESOURCE = 8

TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
TXN = ResourceType.TRANSACTIONAL_ID
CLUSTER = ResourceType.CLUSTER


# Stubs and helpers


@dataclass
class StubLookups:
    """Topic ids to brokers' names, partition counts, and node -> ("gw", 9100 + node)."""

    topic_ids: dict[uuid.UUID, str] = field(default_factory=lambda: dict(TOPIC_IDS))
    partitions: dict[str, int] = field(default_factory=dict)
    default_partitions: int = 1
    """What the brokers would create for ``num_partitions=-1``."""
    nodes: frozenset[int] = frozenset({0, 1, 2})
    remembered: dict[uuid.UUID, str] = field(default_factory=dict)
    created_asked: list[list[str]] = field(default_factory=list)

    async def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return self.topic_ids.get(topic_id)

    async def topic_partitions(self) -> Mapping[str, int]:
        return dict(self.partitions)

    async def created_partitions(self, request: Any, version: int) -> Mapping[str, int]:
        self.created_asked.append([t.name for t in request.topics])
        return {
            t.name: t.num_partitions if t.num_partitions > 0 else self.default_partitions
            for t in request.topics
        }

    def remember_topic_ids(self, ids: Mapping[uuid.UUID, str]) -> None:
        self.remembered.update(ids)

    def gateway_address(self, node_id: int) -> tuple[str, int] | None:
        return ("gw", 9100 + node_id) if node_id in self.nodes else None


@dataclass
class StubQuotaStore:
    quotas: dict[str, Quotas] = field(default_factory=dict)
    writes: list[tuple[str, Quotas]] = field(default_factory=list)

    async def all_quotas(self) -> Mapping[str, Quotas]:
        return dict(self.quotas)

    async def set_quotas(self, tenant: str, quotas: Quotas) -> None:
        self.writes.append((tenant, quotas))
        self.quotas[tenant] = quotas


def context(
    api_key: int,
    version: int,
    *,
    bindings: Sequence[AclBinding] | None = None,
    quotas: Quotas | None = None,
    platform_admin: bool = False,
    lookups: StubLookups | None = None,
    store: StubQuotaStore | None = None,
    fetch_cap: int | None = None,
    mutations: StubMutations | None = None,
    storage_refusal: str | None = None,
) -> RequestContext:
    access = TenantAccess(
        TENANT,
        KEY,
        default_bindings(TENANT, KEY) if bindings is None else bindings,
        quotas or Quotas(),
        platform_admin,
    )
    return RequestContext(
        access,
        schema(api_key, version),
        lookups or StubLookups(),
        store or StubQuotaStore(),
        fetch_cap,
        acl_store=StubAclStore(),
        **({} if mutations is None else {"charge_mutations": mutations.charge}),
        storage_refusal=lambda: storage_refusal,
    )


@dataclass
class StubMutations:
    """A controller mutation quota that refuses the topics at ``refuse`` (indexes)."""

    refuse: frozenset[int] = frozenset()
    throttle_ms: int = 0
    calls: list[tuple[list[int], bool]] = field(default_factory=list)

    def charge(self, costs: Sequence[int], strict: bool) -> MutationVerdict:
        self.calls.append((list(costs), strict))
        refused = self.refuse if strict else frozenset()
        return MutationVerdict(refused, self.throttle_ms, 0)


def denying(resource_type: ResourceType, name: str, operation: Operation) -> list[AclBinding]:
    """The default bindings plus one DENY: everything but ``operation`` on ``name``."""
    deny = AclBinding(
        TENANT, KEY, resource_type, PatternType.LITERAL, name, operation, Permission.DENY
    )
    return [*default_bindings(TENANT, KEY), deny]


def broker_receives(api: ApiSchema, step: Step) -> Any:
    """The forwarded request as the broker decodes it (through the request guard)."""
    assert isinstance(step, Forward), f"expected a Forward, got {step!r}"
    frame = encode_request(api, 7, "test-client", step.request)
    _, _, body = decode_request(frame[4:], {api.api_key: (api.version, api.version)})
    return body


def client_receives(api: ApiSchema, response: Any) -> Any:
    """A response as the client decodes it."""
    body, _ = api.read_response(memoryview(api.encode_body(response)), 0)
    return body


def answered(api: ApiSchema, step: Step) -> Any:
    assert isinstance(step, Answer), f"expected an Answer, got {step!r}"
    return client_receives(api, step.response)


def finished(api: ApiSchema, step: Step, broker_response: Any) -> Any:
    assert isinstance(step, Forward), f"expected a Forward, got {step!r}"
    return client_receives(api, step.finish(broker_response))


def by_name(entities: Iterable[Any], key: str = "name") -> dict[Any, Any]:
    return {getattr(e, key): e for e in entities}


# Produce


def produce_request(
    api: ApiSchema,
    names: Sequence[str],
    *,
    acks: int = -1,
    transactional_id: str | None = None,
) -> Any:
    return api.request(
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(seconds=30),
        topic_data=tuple(
            api.make_request(
                "TopicProduceData",
                name=name,
                partition_data=(api.make_request("PartitionProduceData", index=0, records=None),),
            )
            for name in names
        ),
    )


def produce_response(api: ApiSchema, answers: Mapping[str, tuple[int, str | None]]) -> Any:
    """Broker names -> (base offset, partition error message)."""
    return api.response(
        throttle_time=NO_THROTTLE,
        responses=tuple(
            api.make(
                "TopicProduceResponse",
                name=name,
                partition_responses=(
                    api.make(
                        "PartitionProduceResponse",
                        index=0,
                        error_code=ErrorCode.none,
                        base_offset=offset,
                        log_append_time=None,
                        log_start_offset=0,
                        record_errors=(),
                        error_message=message,
                    ),
                ),
            )
            for name, (offset, message) in answers.items()
        ),
    )


@pytest.mark.parametrize("version", [3, 9, 11])
async def test_produce_forwards_topics_under_the_brokers_names(version: int) -> None:
    ctx = context(0, version)
    request = produce_request(ctx.api, ["orders", "payments.eu"])

    sent = broker_receives(ctx.api, await records.produce(ctx, request))

    assert [t.name for t in sent.topic_data] == ["acme.orders", "acme.payments.eu"]
    assert sent.transactional_id is None


async def test_produce_refuses_a_denied_topic_in_its_slot_and_forwards_the_rest() -> None:
    ctx = context(0, 9, bindings=denying(TOPIC, "secret", Operation.WRITE))
    request = produce_request(ctx.api, ["orders", "secret"])

    step = await records.produce(ctx, request)

    sent = broker_receives(ctx.api, step)
    assert [t.name for t in sent.topic_data] == ["acme.orders"]
    assert isinstance(step, Forward)
    merged = step.finish(produce_response(ctx.api, {"acme.orders": (42, None)}))
    topics = by_name(merged.responses)
    assert set(topics) == {"orders", "secret"}
    (orders,) = topics["orders"].partition_responses
    assert (orders.error_code, orders.base_offset) == (ErrorCode.none, 42)
    (secret,) = topics["secret"].partition_responses
    assert (secret.index, secret.error_code) == (0, ErrorCode.topic_authorization_failed)


@pytest.mark.parametrize("version", [3, 9, 11])
async def test_produce_refusals_can_be_sent_to_the_client(version: int) -> None:
    # A key that may write nothing is answered by the gateway alone; the answer
    # must encode at the client's version.
    ctx = context(0, version, bindings=read_only_bindings(TENANT, KEY))

    step = await records.produce(ctx, produce_request(ctx.api, ["orders"]))

    response = answered(ctx.api, step)
    (topic,) = response.responses
    assert topic.name == "orders"
    assert topic.partition_responses[0].error_code == ErrorCode.topic_authorization_failed


async def test_produce_maps_the_transactional_id_inward() -> None:
    ctx = context(0, 9)
    request = produce_request(ctx.api, ["orders"], transactional_id="tx-1")

    sent = broker_receives(ctx.api, await records.produce(ctx, request))

    assert sent.transactional_id == "acme.tx-1"
    assert [t.name for t in sent.topic_data] == ["acme.orders"]


async def test_produce_with_a_denied_transactional_id_refuses_every_topic() -> None:
    ctx = context(0, 9, bindings=denying(TXN, "tx-1", Operation.WRITE))
    request = produce_request(ctx.api, ["orders", "audit"], transactional_id="tx-1")

    step = await records.produce(ctx, request)

    assert isinstance(step, Answer)
    codes = {t.name: [p.error_code for p in t.partition_responses] for t in step.response.responses}
    assert codes == {
        "orders": [ErrorCode.transactional_id_authorization_failed],
        "audit": [ErrorCode.transactional_id_authorization_failed],
    }


async def test_produce_acks_0_to_a_denied_topic_closes_the_connection() -> None:
    # With acks=0 there is no response to carry a refused slot in.
    ctx = context(0, 9, bindings=denying(TOPIC, "secret", Operation.WRITE))
    request = produce_request(ctx.api, ["orders", "secret"], acks=0)

    with pytest.raises(RefusedRequestError):
        await records.produce(ctx, request)


FULL = "tenant acme stores 250 KB, its limit (maxStorageBytes) is 200 KB: delete records"


@pytest.mark.parametrize("version", [3, 8, 9, 11])
async def test_produce_over_the_storage_limit_is_refused_on_every_partition(version: int) -> None:
    ctx = context(0, version, storage_refusal=FULL)

    step = await records.produce(ctx, produce_request(ctx.api, ["orders", "audit"]))

    response = answered(ctx.api, step)
    parts = {t.name: t.partition_responses for t in response.responses}
    assert set(parts) == {"orders", "audit"}
    for (part,) in parts.values():
        assert part.error_code == ErrorCode.policy_violation
        if version >= 8:  # the first version with a partition error message
            assert part.error_message == FULL


async def test_produce_over_the_storage_limit_keeps_an_acl_refusal_as_it_is() -> None:
    ctx = context(0, 9, bindings=denying(TOPIC, "secret", Operation.WRITE), storage_refusal=FULL)

    step = await records.produce(ctx, produce_request(ctx.api, ["orders", "secret"]))

    codes = {t.name: t.partition_responses[0].error_code for t in answered(ctx.api, step).responses}
    assert codes == {
        "orders": ErrorCode.policy_violation,
        "secret": ErrorCode.topic_authorization_failed,
    }


async def test_produce_acks_0_over_the_storage_limit_closes_the_connection() -> None:
    ctx = context(0, 9, storage_refusal=FULL)

    with pytest.raises(RefusedRequestError, match="maxStorageBytes"):
        await records.produce(ctx, produce_request(ctx.api, ["orders"], acks=0))


async def test_produce_acks_0_is_forwarded_without_waiting_for_a_response() -> None:
    ctx = context(0, 9)

    step = await records.produce(ctx, produce_request(ctx.api, ["orders"], acks=0))

    assert isinstance(step, Forward)
    assert not step.expects_response
    assert [t.name for t in broker_receives(ctx.api, step).topic_data] == ["acme.orders"]


async def test_produce_drops_broker_answers_about_another_tenants_topic() -> None:
    ctx = context(0, 9)
    step = await records.produce(ctx, produce_request(ctx.api, ["orders"]))

    broker = produce_response(ctx.api, {"acme.orders": (7, None), "globex.orders": (99, None)})
    response = finished(ctx.api, step, broker)

    assert [t.name for t in response.responses] == ["orders"]
    assert response.responses[0].partition_responses[0].base_offset == 7


async def test_produce_error_messages_name_the_topic_as_the_tenant_knows_it() -> None:
    ctx = context(0, 9)
    step = await records.produce(ctx, produce_request(ctx.api, ["orders"]))

    broker = produce_response(
        ctx.api, {"acme.orders": (-1, "Partition acme.orders-0 is being reassigned")}
    )
    response = finished(ctx.api, step, broker)

    (partition,) = response.responses[0].partition_responses
    assert partition.error_message == "Partition orders-0 is being reassigned"


# Fetch


def fetch_request(
    api: ApiSchema,
    topics: Sequence[str | uuid.UUID],
    *,
    max_bytes: int = 50_000,
    partition_max_bytes: Sequence[int] = (2_000,),
    replica_id: int = -1,
    forgotten: Sequence[str | uuid.UUID] = (),
) -> Any:
    key = "topic_id" if api.version >= 13 else "topic"
    replica = (
        {"replica_state": api.make_request("ReplicaState", replica_id=replica_id)}
        if api.version >= 15
        else {"replica_id": replica_id}
    )
    return api.request(
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=max_bytes,
        topics=tuple(
            api.make_request(
                "FetchTopic",
                **{key: topic},
                partitions=tuple(
                    api.make_request(
                        "FetchPartition",
                        partition=index,
                        fetch_offset=0,
                        partition_max_bytes=size,
                    )
                    for index, size in enumerate(partition_max_bytes)
                ),
            )
            for topic in topics
        ),
        forgotten_topics_data=tuple(
            api.make_request("ForgottenTopic", **{key: topic}, partitions=(0,))
            for topic in forgotten
        ),
        **replica,
    )


def fetch_response(api: ApiSchema, topics: Sequence[str | uuid.UUID]) -> Any:
    key = "topic_id" if api.version >= 13 else "topic"
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(
            api.make(
                "FetchableTopicResponse",
                **{key: topic},
                partitions=(
                    api.make(
                        "PartitionData",
                        partition_index=0,
                        error_code=ErrorCode.none,
                        high_watermark=10,
                        aborted_transactions=None,
                        records=None,
                    ),
                ),
            )
            for topic in topics
        ),
    )


@pytest.mark.parametrize("version", [4, 12])
async def test_fetch_by_name_maps_topics_and_refuses_unreadable_ones(version: int) -> None:
    ctx = context(1, version, bindings=denying(TOPIC, "secret", Operation.READ))
    request = fetch_request(ctx.api, ["orders", "secret"])

    step = await records.fetch(ctx, request)

    sent = broker_receives(ctx.api, step)
    assert [t.topic for t in sent.topics] == ["acme.orders"]
    response = finished(ctx.api, step, fetch_response(ctx.api, ["acme.orders"]))
    topics = by_name(response.responses, "topic")
    assert set(topics) == {"orders", "secret"}
    assert topics["orders"].partitions[0].high_watermark == 10
    assert topics["secret"].partitions[0].error_code == ErrorCode.topic_authorization_failed


@pytest.mark.parametrize("version", [12, 13])
async def test_fetch_goes_to_the_broker_in_full_without_a_session(version: int) -> None:
    ctx = context(1, version)
    topic: str | uuid.UUID = ORDERS_ID if version >= 13 else "orders"
    request = replace(
        fetch_request(ctx.api, [topic], forgotten=[topic]), session_id=0, session_epoch=0
    )

    step = await records.fetch(ctx, request)

    sent = broker_receives(ctx.api, step)
    assert (sent.session_id, sent.session_epoch, sent.forgotten_topics_data) == (0, -1, ())
    # Even a broker that opened a session anyway gives the client none.
    broker_answer = replace(fetch_response(ctx.api, [topic]), session_id=777)
    assert finished(ctx.api, step, broker_answer).session_id == 0


async def test_an_incremental_fetch_finds_no_session_at_the_gateway() -> None:
    ctx = context(1, 12)
    request = replace(fetch_request(ctx.api, ["orders"]), session_id=1234, session_epoch=3)

    response = answered(ctx.api, await records.fetch(ctx, request))

    assert response.error_code == ErrorCode.fetch_session_id_not_found
    assert (response.session_id, response.responses) == (0, ())


@pytest.mark.parametrize("version", [13, 16])
async def test_fetch_by_id_forwards_the_tenants_own_id_unchanged(version: int) -> None:
    ctx = context(1, version)

    step = await records.fetch(ctx, fetch_request(ctx.api, [ORDERS_ID]))

    sent = broker_receives(ctx.api, step)
    assert [t.topic_id for t in sent.topics] == [ORDERS_ID]
    response = finished(ctx.api, step, fetch_response(ctx.api, [ORDERS_ID]))
    assert [t.topic_id for t in response.responses] == [ORDERS_ID]
    assert response.responses[0].partitions[0].error_code == ErrorCode.none


@pytest.mark.parametrize("version", [13, 16])
@pytest.mark.parametrize("topic_id", [THEIRS_ID, UNKNOWN_ID], ids=["other-tenant", "unknown"])
async def test_fetch_by_id_answers_unknown_topic_id_for_ids_that_are_not_the_tenants(
    version: int, topic_id: uuid.UUID
) -> None:
    ctx = context(1, version)

    step = await records.fetch(ctx, fetch_request(ctx.api, [ORDERS_ID, topic_id]))

    sent = broker_receives(ctx.api, step)
    assert [t.topic_id for t in sent.topics] == [ORDERS_ID]
    response = finished(ctx.api, step, fetch_response(ctx.api, [ORDERS_ID]))
    codes = {t.topic_id: t.partitions[0].error_code for t in response.responses}
    assert codes == {ORDERS_ID: ErrorCode.none, topic_id: ErrorCode.unknown_topic_id}


@pytest.mark.parametrize("version", [13, 16])
async def test_fetch_by_id_of_only_another_tenants_topic_is_answered_without_the_broker(
    version: int,
) -> None:
    ctx = context(1, version)

    step = await records.fetch(ctx, fetch_request(ctx.api, [THEIRS_ID]))

    response = answered(ctx.api, step)
    assert [(t.topic_id, t.partitions[0].error_code) for t in response.responses] == [
        (THEIRS_ID, ErrorCode.unknown_topic_id)
    ]


async def test_fetch_by_id_of_an_unreadable_own_topic_is_an_authorization_failure() -> None:
    ctx = context(1, 13, bindings=denying(TOPIC, "secret", Operation.READ))

    step = await records.fetch(ctx, fetch_request(ctx.api, [SECRET_ID]))

    response = answered(ctx.api, step)
    assert response.responses[0].partitions[0].error_code == ErrorCode.topic_authorization_failed


@pytest.mark.parametrize("version", [4, 12, 13, 15, 16])
async def test_fetch_from_a_replica_is_refused(version: int) -> None:
    ctx = context(1, version)
    topic: str | uuid.UUID = ORDERS_ID if version >= 13 else "orders"

    with pytest.raises(RefusedRequestError, match="replica"):
        await records.fetch(ctx, fetch_request(ctx.api, [topic], replica_id=1))


@pytest.mark.parametrize("version", [12, 16])
async def test_fetch_cap_limits_the_response_and_partition_sizes(version: int) -> None:
    ctx = context(1, version, fetch_cap=1_000)
    topic: str | uuid.UUID = ORDERS_ID if version >= 13 else "orders"
    request = fetch_request(ctx.api, [topic], max_bytes=50_000, partition_max_bytes=(2_000, 500))

    sent = broker_receives(ctx.api, await records.fetch(ctx, request))

    assert sent.max_bytes == 1_000
    assert [p.partition_max_bytes for p in sent.topics[0].partitions] == [1_000, 500]


async def test_fetch_without_a_cap_keeps_the_clients_sizes() -> None:
    ctx = context(1, 12)
    request = fetch_request(ctx.api, ["orders"], max_bytes=50_000, partition_max_bytes=(2_000,))

    sent = broker_receives(ctx.api, await records.fetch(ctx, request))

    assert sent.max_bytes == 50_000
    assert sent.topics[0].partitions[0].partition_max_bytes == 2_000


# Metadata


def metadata_request(
    api: ApiSchema,
    names: Sequence[str | uuid.UUID] | None,
    *,
    include_ops: bool = False,
    auto_create: bool = True,
) -> Any:
    wanted = None
    if names is not None:
        wanted = tuple(
            api.make_request("MetadataRequestTopic", name=None, topic_id=n)
            if isinstance(n, uuid.UUID)
            else api.make_request("MetadataRequestTopic", name=n, topic_id=None)
            for n in names
        )
    return api.request(
        topics=wanted,
        allow_auto_topic_creation=auto_create,
        include_topic_authorized_operations=include_ops,
        include_cluster_authorized_operations=False,
    )


def metadata_response(
    api: ApiSchema,
    topic_names: Sequence[str],
    *,
    brokers: Sequence[int] = (0, 1),
    internal: Sequence[str] = (),
    ids: Mapping[str, uuid.UUID] | None = None,
) -> Any:
    ids = ids or {v: k for k, v in TOPIC_IDS.items()}
    return api.response(
        throttle_time=NO_THROTTLE,
        brokers=tuple(
            api.make("MetadataResponseBroker", node_id=n, host=f"broker-{n}.internal", port=9092)
            for n in brokers
        ),
        cluster_id="shoal",
        controller_id=0,
        topics=tuple(
            api.make(
                "MetadataResponseTopic",
                error_code=ErrorCode.none,
                name=name,
                topic_id=ids.get(name, ZERO_ID),
                is_internal=name in internal,
                partitions=(
                    api.make(
                        "MetadataResponsePartition",
                        error_code=ErrorCode.none,
                        partition_index=0,
                        leader_id=brokers[0],
                        replica_nodes=tuple(brokers),
                        isr_nodes=tuple(brokers),
                    ),
                ),
            )
            for name in [*topic_names, *internal]
        ),
    )


@pytest.mark.parametrize("version", [1, 9, 12])
async def test_metadata_listing_shows_only_the_tenants_describable_topics(version: int) -> None:
    ctx = context(3, version, bindings=denying(TOPIC, "secret", Operation.DESCRIBE))

    step = await cluster.metadata(ctx, metadata_request(ctx.api, None))

    sent = broker_receives(ctx.api, step)
    assert sent.topics is None
    broker = metadata_response(
        ctx.api,
        ["acme.orders", "acme.secret", "globex.payments", "acmeorders"],
        internal=["__consumer_offsets"],
    )
    response = finished(ctx.api, step, broker)
    assert [t.name for t in response.topics] == ["orders"]
    assert not response.topics[0].is_internal


@pytest.mark.parametrize("version", [1, 9, 12])
async def test_metadata_for_named_topics_refuses_the_undescribable_ones(version: int) -> None:
    ctx = context(3, version, bindings=denying(TOPIC, "secret", Operation.DESCRIBE))

    step = await cluster.metadata(ctx, metadata_request(ctx.api, ["orders", "secret"]))

    sent = broker_receives(ctx.api, step)
    assert [t.name for t in sent.topics] == ["acme.orders"]
    # A broker that says more than it was asked is cut down to what was asked.
    broker = metadata_response(ctx.api, ["acme.orders", "acme.audit", "globex.payments"])
    response = finished(ctx.api, step, broker)
    codes = {t.name: t.error_code for t in response.topics}
    assert codes == {"orders": ErrorCode.none, "secret": ErrorCode.topic_authorization_failed}


async def test_metadata_for_only_refused_topics_still_asks_for_the_brokers() -> None:
    ctx = context(3, 12, bindings=denying(TOPIC, "secret", Operation.DESCRIBE))

    step = await cluster.metadata(ctx, metadata_request(ctx.api, ["secret"]))

    sent = broker_receives(ctx.api, step)
    assert sent.topics == ()
    response = finished(ctx.api, step, metadata_response(ctx.api, []))
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("secret", ErrorCode.topic_authorization_failed)
    ]
    assert [b.port for b in response.brokers] == [9100, 9101]


@pytest.mark.parametrize("topic_id", [THEIRS_ID, UNKNOWN_ID], ids=["other-tenant", "unknown"])
async def test_metadata_by_an_id_that_is_not_the_tenants_is_unknown_topic_id(
    topic_id: uuid.UUID,
) -> None:
    ctx = context(3, 12)

    step = await cluster.metadata(ctx, metadata_request(ctx.api, [topic_id]))

    assert broker_receives(ctx.api, step).topics == ()
    response = finished(ctx.api, step, metadata_response(ctx.api, []))
    (topic,) = response.topics
    assert (topic.name, topic.topic_id, topic.error_code) == (
        None,
        topic_id,
        ErrorCode.unknown_topic_id,
    )


async def test_metadata_by_the_tenants_own_id_asks_by_name() -> None:
    ctx = context(3, 12)

    step = await cluster.metadata(ctx, metadata_request(ctx.api, [ORDERS_ID]))

    sent = broker_receives(ctx.api, step)
    assert [t.name for t in sent.topics] == ["acme.orders"]
    response = finished(ctx.api, step, metadata_response(ctx.api, ["acme.orders"]))
    assert [(t.name, t.topic_id) for t in response.topics] == [("orders", ORDERS_ID)]


@pytest.mark.parametrize("version", [4, 12])
async def test_metadata_never_lets_the_broker_auto_create_topics(version: int) -> None:
    ctx = context(3, version)

    request = metadata_request(ctx.api, ["orders"], auto_create=True)
    sent = broker_receives(ctx.api, await cluster.metadata(ctx, request))

    assert sent.allow_auto_topic_creation is False


@pytest.mark.parametrize("version", [0, 1, 12])
async def test_metadata_replaces_broker_addresses_with_the_gateways(version: int) -> None:
    ctx = context(3, version)
    step = await cluster.metadata(ctx, metadata_request(ctx.api, ["orders"]))

    # Node 5 has no gateway port on this listener: the client is not told of it.
    broker = metadata_response(ctx.api, ["acme.orders"], brokers=(0, 2, 5))
    response = finished(ctx.api, step, broker)

    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [
        (0, "gw", 9100),
        (2, "gw", 9102),
    ]


async def test_metadata_v0_empty_topic_list_asks_the_broker_for_every_topic() -> None:
    ctx = context(3, 0)

    step = await cluster.metadata(ctx, metadata_request(ctx.api, []))

    # v0 has no null array: "every topic" is the empty list, and must stay so.
    assert broker_receives(ctx.api, step).topics == ()


async def test_metadata_v0_empty_topic_list_shows_every_topic_of_the_tenant() -> None:
    ctx = context(3, 0)
    step = await cluster.metadata(ctx, metadata_request(ctx.api, []))

    broker = metadata_response(ctx.api, ["acme.orders", "acme.audit", "globex.payments"])
    response = finished(ctx.api, step, broker)

    assert [t.name for t in response.topics] == ["orders", "audit"]


async def test_metadata_computes_topic_authorized_operations_when_asked() -> None:
    ctx = context(3, 12, bindings=read_only_bindings(TENANT, KEY))

    step = await cluster.metadata(ctx, metadata_request(ctx.api, ["orders"], include_ops=True))

    response = finished(ctx.api, step, metadata_response(ctx.api, ["acme.orders"]))
    expected = (1 << Operation.READ) | (1 << Operation.DESCRIBE) | (1 << Operation.DESCRIBE_CONFIGS)
    assert response.topics[0].topic_authorized_operations == expected


async def test_metadata_leaves_topic_authorized_operations_alone_when_not_asked() -> None:
    ctx = context(3, 12)

    step = await cluster.metadata(ctx, metadata_request(ctx.api, ["orders"]))

    response = finished(ctx.api, step, metadata_response(ctx.api, ["acme.orders"]))
    assert response.topics[0].topic_authorized_operations == NOT_REQUESTED


async def test_metadata_remembers_the_topic_ids_the_broker_reports() -> None:
    lookups = StubLookups(topic_ids={})
    ctx = context(3, 12, lookups=lookups)

    step = await cluster.metadata(ctx, metadata_request(ctx.api, None))
    finished(ctx.api, step, metadata_response(ctx.api, ["acme.orders"]))

    assert lookups.remembered == {ORDERS_ID: "acme.orders"}


# FindCoordinator


def coordinator_response(api: ApiSchema, node: int, code: ErrorCode = ErrorCode.none) -> Any:
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=code,
        error_message=None,
        node_id=node,
        host=f"broker-{node}.internal",
        port=9092,
    )


@pytest.mark.parametrize("version", [0, 3])
async def test_find_coordinator_maps_the_group_and_the_address(version: int) -> None:
    ctx = context(10, version)

    step = await cluster.find_coordinator(ctx, ctx.api.request(key="billing", key_type=0))

    assert broker_receives(ctx.api, step).key == "acme.billing"
    response = finished(ctx.api, step, coordinator_response(ctx.api, 1))
    assert (response.node_id, response.host, response.port) == (1, "gw", 9101)


async def test_find_coordinator_leaves_an_error_answer_as_the_broker_gave_it() -> None:
    ctx = context(10, 3)
    step = await cluster.find_coordinator(ctx, ctx.api.request(key="billing", key_type=0))

    broker = coordinator_response(ctx.api, -1, ErrorCode.coordinator_not_available)
    response = finished(ctx.api, step, broker)

    assert response.error_code == ErrorCode.coordinator_not_available
    assert response.port == 9092


@pytest.mark.parametrize(
    ("key_type", "resource_type", "code"),
    [
        (0, GROUP, ErrorCode.group_authorization_failed),
        (1, TXN, ErrorCode.transactional_id_authorization_failed),
    ],
    ids=["group", "transaction"],
)
async def test_find_coordinator_v3_for_a_denied_key_is_answered_by_the_gateway(
    key_type: int, resource_type: ResourceType, code: ErrorCode
) -> None:
    ctx = context(10, 3, bindings=denying(resource_type, "billing", Operation.DESCRIBE))

    step = await cluster.find_coordinator(ctx, ctx.api.request(key="billing", key_type=key_type))

    response = answered(ctx.api, step)
    assert (response.error_code, response.node_id) == (code, -1)


async def test_find_coordinator_v4_batches_keys_and_refuses_denied_ones() -> None:
    ctx = context(10, 4, bindings=denying(GROUP, "audit", Operation.DESCRIBE))
    request = ctx.api.request(key_type=0, coordinator_keys=("billing", "audit", "reports"))

    step = await cluster.find_coordinator(ctx, request)

    sent = broker_receives(ctx.api, step)
    assert sent.coordinator_keys == ("acme.billing", "acme.reports")
    api = ctx.api
    broker = api.response(
        throttle_time=NO_THROTTLE,
        coordinators=(
            api.make(
                "Coordinator",
                key="acme.billing",
                node_id=2,
                host="broker-2.internal",
                port=9092,
                error_code=ErrorCode.none,
                error_message=None,
            ),
            api.make(
                "Coordinator",
                key="acme.reports",
                node_id=-1,
                host="",
                port=-1,
                error_code=ErrorCode.coordinator_load_in_progress,
                error_message=None,
            ),
            api.make(
                "Coordinator",
                key="globex.billing",
                node_id=0,
                host="broker-0.internal",
                port=9092,
                error_code=ErrorCode.none,
                error_message=None,
            ),
        ),
    )
    response = finished(api, step, broker)
    found = by_name(response.coordinators, "key")
    assert set(found) == {"billing", "reports", "audit"}
    assert (found["billing"].host, found["billing"].port) == ("gw", 9102)
    assert found["reports"].error_code == ErrorCode.coordinator_load_in_progress
    assert (found["audit"].error_code, found["audit"].node_id) == (
        ErrorCode.group_authorization_failed,
        -1,
    )


async def test_find_coordinator_v4_with_every_key_denied_is_answered_by_the_gateway() -> None:
    ctx = context(10, 4, bindings=denying(GROUP, "audit", Operation.DESCRIBE))

    step = await cluster.find_coordinator(
        ctx, ctx.api.request(key_type=0, coordinator_keys=("audit",))
    )

    response = answered(ctx.api, step)
    assert [(c.key, c.error_code) for c in response.coordinators] == [
        ("audit", ErrorCode.group_authorization_failed)
    ]


# Consumer groups


def minimal_request(api: ApiSchema, **values: Any) -> Any:
    return dataclasses.replace(minimal_entity(api.request_class, "x"), **values)


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(11, 2), (11, 5), (11, 9), (12, 0), (12, 4), (13, 0), (13, 5), (14, 0), (14, 5)],
)
async def test_membership_for_a_denied_group_is_group_authorization_failed(
    api_key: int, version: int
) -> None:
    ctx = context(api_key, version, bindings=denying(GROUP, "billing", Operation.READ))

    step = await groups.membership(ctx, minimal_request(ctx.api, group_id="billing"))

    response = answered(ctx.api, step)
    assert response.error_code == ErrorCode.group_authorization_failed


@pytest.mark.parametrize(("api_key", "version"), [(11, 9), (12, 4), (13, 5), (14, 5)])
async def test_membership_maps_the_group_inward(api_key: int, version: int) -> None:
    ctx = context(api_key, version, bindings=read_only_bindings(TENANT, KEY))

    step = await groups.membership(ctx, minimal_request(ctx.api, group_id="billing"))

    assert broker_receives(ctx.api, step).group_id == "acme.billing"


def commit_request(api: ApiSchema, group: str, names: Sequence[str]) -> Any:
    return api.request(
        group_id=group,
        generation_id_or_member_epoch=1,
        member_id="m-1",
        group_instance_id=None,
        topics=tuple(
            api.make_request(
                "OffsetCommitRequestTopic",
                name=name,
                partitions=(
                    api.make_request(
                        "OffsetCommitRequestPartition",
                        partition_index=0,
                        committed_offset=5,
                        committed_metadata=None,
                    ),
                ),
            )
            for name in names
        ),
    )


@pytest.mark.parametrize("version", [2, 8, 9])
async def test_offset_commit_refuses_a_denied_topic_in_its_slot(version: int) -> None:
    ctx = context(8, version, bindings=denying(TOPIC, "secret", Operation.READ))

    step = await groups.offset_commit(ctx, commit_request(ctx.api, "billing", ["orders", "secret"]))

    sent = broker_receives(ctx.api, step)
    assert sent.group_id == "acme.billing"
    assert [t.name for t in sent.topics] == ["acme.orders"]
    api = ctx.api
    broker = api.response(
        throttle_time=NO_THROTTLE,
        topics=(
            api.make(
                "OffsetCommitResponseTopic",
                name="acme.orders",
                partitions=(
                    api.make(
                        "OffsetCommitResponsePartition",
                        partition_index=0,
                        error_code=ErrorCode.none,
                    ),
                ),
            ),
        ),
    )
    response = finished(api, step, broker)
    codes = {t.name: t.partitions[0].error_code for t in response.topics}
    assert codes == {"orders": ErrorCode.none, "secret": ErrorCode.topic_authorization_failed}


async def test_offset_commit_to_a_denied_group_refuses_every_topic() -> None:
    ctx = context(8, 9, bindings=denying(GROUP, "billing", Operation.READ))

    step = await groups.offset_commit(ctx, commit_request(ctx.api, "billing", ["orders", "audit"]))

    response = answered(ctx.api, step)
    codes = {t.name: t.partitions[0].error_code for t in response.topics}
    assert codes == {
        "orders": ErrorCode.group_authorization_failed,
        "audit": ErrorCode.group_authorization_failed,
    }


def offset_fetch_topics(api: ApiSchema, topic_class: str, names: Sequence[str]) -> Any:
    return tuple(
        api.make(
            topic_class,
            name=name,
            partitions=(
                api.make(
                    "OffsetFetchResponsePartitions"
                    if api.version >= 8
                    else "OffsetFetchResponsePartition",
                    partition_index=0,
                    committed_offset=5,
                    committed_leader_epoch=-1,
                    metadata=None,
                    error_code=ErrorCode.none,
                ),
            ),
        )
        for name in names
    )


async def test_offset_fetch_v7_for_every_topic_shows_only_the_tenants_describable_ones() -> None:
    ctx = context(9, 7, bindings=denying(TOPIC, "secret", Operation.DESCRIBE))

    step = await groups.offset_fetch(ctx, ctx.api.request(group_id="billing", topics=None))

    sent = broker_receives(ctx.api, step)
    assert (sent.group_id, sent.topics) == ("acme.billing", None)
    broker = ctx.api.response(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        topics=offset_fetch_topics(
            ctx.api, "OffsetFetchResponseTopic", ["acme.orders", "acme.secret", "globex.payments"]
        ),
    )
    response = finished(ctx.api, step, broker)
    assert [(t.name, t.partitions[0].committed_offset) for t in response.topics] == [("orders", 5)]


async def test_offset_fetch_v7_for_a_denied_group_is_group_authorization_failed() -> None:
    ctx = context(9, 7, bindings=denying(GROUP, "billing", Operation.DESCRIBE))

    step = await groups.offset_fetch(ctx, ctx.api.request(group_id="billing", topics=None))

    response = answered(ctx.api, step)
    assert response.error_code == ErrorCode.group_authorization_failed
    assert response.topics == ()


@pytest.mark.parametrize("version", [8, 9])
async def test_offset_fetch_v8_maps_each_group_and_refuses_denied_groups_and_topics(
    version: int,
) -> None:
    bindings = [
        *denying(GROUP, "audit", Operation.DESCRIBE),
        AclBinding(
            TENANT, KEY, TOPIC, PatternType.LITERAL, "secret", Operation.DESCRIBE, Permission.DENY
        ),
    ]
    ctx = context(9, version, bindings=bindings)
    api = ctx.api

    def group(group_id: str, names: Sequence[str] | None) -> Any:
        wanted = None
        if names is not None:
            wanted = tuple(
                api.make_request("OffsetFetchRequestTopics", name=n, partition_indexes=(0,))
                for n in names
            )
        return api.make_request("OffsetFetchRequestGroup", group_id=group_id, topics=wanted)

    request = api.request(
        groups=(group("billing", ["orders", "secret"]), group("audit", None), group("ops", None))
    )
    step = await groups.offset_fetch(ctx, request)

    sent = broker_receives(api, step)
    asked = {g.group_id: g.topics and [t.name for t in g.topics] for g in sent.groups}
    assert asked == {"acme.billing": ["acme.orders"], "acme.ops": None}
    broker = api.response(
        throttle_time=NO_THROTTLE,
        groups=tuple(
            api.make(
                "OffsetFetchResponseGroup",
                group_id=group_id,
                topics=offset_fetch_topics(api, "OffsetFetchResponseTopics", names),
                error_code=ErrorCode.none,
            )
            for group_id, names in [
                ("acme.billing", ["acme.orders"]),
                ("acme.ops", ["acme.orders", "acme.secret"]),
                ("globex.billing", ["globex.payments"]),
            ]
        ),
    )
    response = finished(api, step, broker)
    seen = {
        g.group_id: (g.error_code, {t.name: t.partitions[0].error_code for t in g.topics})
        for g in response.groups
    }
    assert seen == {
        "billing": (
            ErrorCode.none,
            {"orders": ErrorCode.none, "secret": ErrorCode.topic_authorization_failed},
        ),
        "ops": (ErrorCode.none, {"orders": ErrorCode.none}),
        "audit": (ErrorCode.group_authorization_failed, {}),
    }


@pytest.mark.parametrize("version", [0, 4, 5])
async def test_list_groups_shows_only_the_tenants_describable_groups(version: int) -> None:
    ctx = context(16, version, bindings=denying(GROUP, "audit", Operation.DESCRIBE))
    api = ctx.api

    step = await groups.list_groups(ctx, minimal_request(api))

    broker = api.response(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        groups=tuple(
            api.make(
                "ListedGroup",
                group_id=g,
                protocol_type="consumer",
                group_state="Stable",
                group_type="classic",
            )
            for g in ["acme.billing", "acme.audit", "globex.billing", "connect-cluster", "acme."]
        ),
    )
    response = finished(api, step, broker)
    # "acme." is the tenant's empty group id, which Kafka lists like any other.
    assert [g.group_id for g in response.groups] == ["billing", ""]


def described_group(api: ApiSchema, group_id: str) -> Any:
    return api.make(
        "DescribedGroup",
        error_code=ErrorCode.none,
        group_id=group_id,
        group_state="Stable",
        protocol_type="consumer",
        protocol_data="range",
        members=(),
    )


async def test_describe_groups_maps_names_and_refuses_denied_groups() -> None:
    ctx = context(15, 5, bindings=denying(GROUP, "audit", Operation.DESCRIBE))
    api = ctx.api

    step = await groups.describe_groups(
        ctx, api.request(groups=("billing", "audit"), include_authorized_operations=True)
    )

    assert broker_receives(api, step).groups == ("acme.billing",)
    broker = api.response(
        throttle_time=NO_THROTTLE,
        groups=(described_group(api, "acme.billing"), described_group(api, "globex.billing")),
    )
    response = finished(api, step, broker)
    found = by_name(response.groups, "group_id")
    assert set(found) == {"billing", "audit"}
    assert found["billing"].group_state == "Stable"
    all_group_ops = (1 << Operation.READ) | (1 << Operation.DESCRIBE) | (1 << Operation.DELETE)
    assert found["billing"].authorized_operations == all_group_ops
    assert found["audit"].error_code == ErrorCode.group_authorization_failed


async def test_describe_groups_of_only_denied_groups_is_answered_by_the_gateway() -> None:
    ctx = context(15, 0, bindings=denying(GROUP, "audit", Operation.DESCRIBE))

    step = await groups.describe_groups(ctx, ctx.api.request(groups=("audit",)))

    response = answered(ctx.api, step)
    assert [(g.group_id, g.error_code) for g in response.groups] == [
        ("audit", ErrorCode.group_authorization_failed)
    ]


async def test_delete_groups_maps_names_and_drops_other_tenants_results() -> None:
    ctx = context(42, 2, bindings=denying(GROUP, "audit", Operation.DELETE))
    api = ctx.api

    step = await groups.delete_groups(ctx, api.request(groups_names=("billing", "audit")))

    assert broker_receives(api, step).groups_names == ("acme.billing",)
    broker = api.response(
        throttle_time=NO_THROTTLE,
        results=tuple(
            api.make("DeletableGroupResult", group_id=g, error_code=ErrorCode.none)
            for g in ["acme.billing", "globex.billing"]
        ),
    )
    response = finished(api, step, broker)
    assert {r.group_id: r.error_code for r in response.results} == {
        "billing": ErrorCode.none,
        "audit": ErrorCode.group_authorization_failed,
    }


async def test_delete_groups_by_a_read_only_key_is_refused_without_the_broker() -> None:
    ctx = context(42, 0, bindings=read_only_bindings(TENANT, KEY))

    step = await groups.delete_groups(ctx, ctx.api.request(groups_names=("billing",)))

    response = answered(ctx.api, step)
    assert [(r.group_id, r.error_code) for r in response.results] == [
        ("billing", ErrorCode.group_authorization_failed)
    ]


# Topic administration


def create_request(api: ApiSchema, topics: Mapping[str, int]) -> Any:
    return api.request(
        topics=tuple(
            api.make_request(
                "CreatableTopic",
                name=name,
                num_partitions=count,
                replication_factor=-1,
                assignments=(),
                configs=(),
            )
            for name, count in topics.items()
        ),
        timeout=datetime.timedelta(seconds=30),
        validate_only=False,
    )


def create_response(api: ApiSchema, results: Mapping[str, tuple[ErrorCode, str | None]]) -> Any:
    return api.response(
        throttle_time=NO_THROTTLE,
        topics=tuple(
            api.make(
                "CreatableTopicResult",
                name=name,
                topic_id=ORDERS_ID,
                error_code=code,
                error_message=message,
                configs=None,
            )
            for name, (code, message) in results.items()
        ),
    )


LIMITED = Quotas(max_partitions=10)
HOLDING_SIX = {"acme.a": 4, "acme.b": 2, "globex.big": 100}
"""The tenant holds 6 partitions; another tenant's 100 do not count."""


@pytest.mark.parametrize("version", [2, 7])
async def test_create_topics_that_fit_the_partition_limit_are_forwarded(version: int) -> None:
    lookups = StubLookups(partitions=HOLDING_SIX)
    ctx = context(19, version, quotas=LIMITED, lookups=lookups)

    step = await topics.create_topics(ctx, create_request(ctx.api, {"t1": 3, "t2": 1}))

    sent = broker_receives(ctx.api, step)
    assert [(t.name, t.num_partitions) for t in sent.topics] == [("acme.t1", 3), ("acme.t2", 1)]
    assert lookups.created_asked == [["acme.t1", "acme.t2"]]


async def test_create_topics_over_the_partition_limit_is_a_policy_violation() -> None:
    lookups = StubLookups(partitions=HOLDING_SIX)
    ctx = context(19, 7, quotas=LIMITED, lookups=lookups)

    step = await topics.create_topics(ctx, create_request(ctx.api, {"t1": 3, "t2": 3}))

    sent = broker_receives(ctx.api, step)
    assert [t.name for t in sent.topics] == ["acme.t1"]
    response = finished(
        ctx.api, step, create_response(ctx.api, {"acme.t1": (ErrorCode.none, None)})
    )
    results = by_name(response.topics)
    assert results["t1"].error_code == ErrorCode.none
    assert results["t2"].error_code == ErrorCode.policy_violation
    assert results["t2"].error_message == (
        "the tenant may hold at most 10 partitions; it holds 9 and this would add 3"
    )


async def test_create_topics_counts_the_brokers_default_partition_count() -> None:
    lookups = StubLookups(partitions=HOLDING_SIX, default_partitions=4)
    ctx = context(19, 7, quotas=LIMITED, lookups=lookups)

    step = await topics.create_topics(ctx, create_request(ctx.api, {"t1": -1, "t2": -1}))

    assert [t.name for t in broker_receives(ctx.api, step).topics] == ["acme.t1"]
    assert isinstance(step, Forward)
    refused = by_name(step.finish(create_response(ctx.api, {})).topics)
    assert refused["t2"].error_code == ErrorCode.policy_violation
    assert "holds 10 and this would add 4" in refused["t2"].error_message


async def test_create_topics_without_a_limit_does_not_count_partitions() -> None:
    lookups = StubLookups(partitions=HOLDING_SIX)
    ctx = context(19, 7, lookups=lookups)

    step = await topics.create_topics(ctx, create_request(ctx.api, {"t1": 1000}))

    assert [t.name for t in broker_receives(ctx.api, step).topics] == ["acme.t1"]
    assert lookups.created_asked == []


async def test_create_topics_with_an_empty_name_is_an_invalid_topic() -> None:
    ctx = context(19, 7)

    step = await topics.create_topics(ctx, create_request(ctx.api, {"": 1}))

    response = answered(ctx.api, step)
    (result,) = response.topics
    assert (result.name, result.error_code) == ("", ErrorCode.invalid_topic_exception)


async def test_create_topics_error_messages_name_the_topic_as_the_tenant_knows_it() -> None:
    ctx = context(19, 7)
    step = await topics.create_topics(ctx, create_request(ctx.api, {"orders": 1}))

    broker = create_response(
        ctx.api,
        {"acme.orders": (ErrorCode.topic_already_exists, "Topic 'acme.orders' already exists.")},
    )
    response = finished(ctx.api, step, broker)

    (result,) = response.topics
    assert (result.name, result.error_message) == ("orders", "Topic 'orders' already exists.")


async def test_create_topics_needs_create_on_the_cluster_or_the_topic() -> None:
    ctx = context(19, 7, bindings=read_only_bindings(TENANT, KEY))

    step = await topics.create_topics(ctx, create_request(ctx.api, {"orders": 1}))

    response = answered(ctx.api, step)
    assert response.topics[0].error_code == ErrorCode.topic_authorization_failed


def create_partitions_request(api: ApiSchema, counts: Mapping[str, int]) -> Any:
    return api.request(
        topics=tuple(
            api.make_request("CreatePartitionsTopic", name=name, count=count, assignments=None)
            for name, count in counts.items()
        ),
        timeout=datetime.timedelta(seconds=30),
        validate_only=False,
    )


@pytest.mark.parametrize("version", [0, 3])
async def test_create_partitions_over_the_partition_limit_is_a_policy_violation(
    version: int,
) -> None:
    lookups = StubLookups(partitions={"acme.orders": 4, "acme.audit": 4, "globex.big": 100})
    ctx = context(37, version, quotas=LIMITED, lookups=lookups)

    request = create_partitions_request(ctx.api, {"orders": 6, "audit": 5})
    step = await topics.create_partitions(ctx, request)

    assert [(t.name, t.count) for t in broker_receives(ctx.api, step).topics] == [
        ("acme.orders", 6)
    ]
    broker = ctx.api.response(
        throttle_time=NO_THROTTLE,
        results=(
            ctx.api.make(
                "CreatePartitionsTopicResult",
                name="acme.orders",
                error_code=ErrorCode.none,
                error_message=None,
            ),
        ),
    )
    response = finished(ctx.api, step, broker)
    results = by_name(response.results)
    assert results["orders"].error_code == ErrorCode.none
    assert results["audit"].error_code == ErrorCode.policy_violation
    assert results["audit"].error_message == (
        "the tenant may hold at most 10 partitions; it holds 10 and this would add 1"
    )


async def test_delete_topics_by_another_tenants_id_is_unknown_topic_id() -> None:
    ctx = context(20, 6)
    api = ctx.api
    request = api.request(
        topics=(api.make_request("DeleteTopicState", name=None, topic_id=THEIRS_ID),),
        timeout=datetime.timedelta(seconds=30),
    )

    response = answered(api, await topics.delete_topics(ctx, request))

    (result,) = response.responses
    assert (result.name, result.topic_id, result.error_code) == (
        None,
        THEIRS_ID,
        ErrorCode.unknown_topic_id,
    )


async def test_delete_topics_by_the_tenants_own_id_is_forwarded_by_name() -> None:
    ctx = context(20, 6)
    api = ctx.api
    request = api.request(
        topics=(
            api.make_request("DeleteTopicState", name=None, topic_id=ORDERS_ID),
            api.make_request("DeleteTopicState", name=None, topic_id=UNKNOWN_ID),
        ),
        timeout=datetime.timedelta(seconds=30),
    )

    step = await topics.delete_topics(ctx, request)

    (sent,) = broker_receives(api, step).topics
    assert sent.name == "acme.orders"
    assert sent.topic_id in (None, ZERO_ID)  # by name only: kio reads the zero id as None
    broker = api.response(
        throttle_time=NO_THROTTLE,
        responses=(
            api.make(
                "DeletableTopicResult",
                name="acme.orders",
                topic_id=ORDERS_ID,
                error_code=ErrorCode.none,
                error_message=None,
            ),
        ),
    )
    response = finished(api, step, broker)
    assert {(r.name, r.topic_id): r.error_code for r in response.responses} == {
        ("orders", ORDERS_ID): ErrorCode.none,
        (None, UNKNOWN_ID): ErrorCode.unknown_topic_id,
    }


async def test_delete_topics_by_name_maps_names_and_refuses_denied_ones() -> None:
    ctx = context(20, 1, bindings=denying(TOPIC, "audit", Operation.DELETE))
    api = ctx.api

    step = await topics.delete_topics(
        ctx, api.request(topic_names=("orders", "audit"), timeout=datetime.timedelta(seconds=30))
    )

    assert broker_receives(api, step).topic_names == ("acme.orders",)
    broker = api.response(
        throttle_time=NO_THROTTLE,
        responses=(
            api.make("DeletableTopicResult", name="acme.orders", error_code=ErrorCode.none),
        ),
    )
    response = finished(api, step, broker)
    assert {r.name: r.error_code for r in response.responses} == {
        "orders": ErrorCode.none,
        "audit": ErrorCode.topic_authorization_failed,
    }


# Controller mutation quota (KIP-599)

METERED = Quotas(controller_mutation_rate=2.0)


async def test_create_topics_over_the_mutation_quota_are_refused_at_v6_and_later() -> None:
    mutations = StubMutations(refuse=frozenset({1}), throttle_ms=1500)
    ctx = context(19, 6, quotas=METERED, mutations=mutations)

    step = await topics.create_topics(ctx, create_request(ctx.api, {"t1": 3, "t2": 4}))

    assert mutations.calls == [([3, 4], True)]
    assert [t.name for t in broker_receives(ctx.api, step).topics] == ["acme.t1"]
    assert isinstance(step, Forward)
    assert step.throttle_ms == 1500
    response = finished(
        ctx.api, step, create_response(ctx.api, {"acme.t1": (ErrorCode.none, None)})
    )
    results = by_name(response.topics)
    assert results["t1"].error_code == ErrorCode.none
    assert results["t2"].error_code == ErrorCode.throttling_quota_exceeded
    assert results["t2"].error_message == (
        "the tenant's controller_mutation_rate quota (2 partitions/s) is used up; retry in 1500 ms"
    )


async def test_create_topics_all_over_the_mutation_quota_is_answered_with_the_throttle() -> None:
    mutations = StubMutations(refuse=frozenset({0}), throttle_ms=700)
    ctx = context(19, 7, quotas=METERED, mutations=mutations)

    step = await topics.create_topics(ctx, create_request(ctx.api, {"t1": 1}))

    assert isinstance(step, Answer)
    assert step.throttle_ms == 700
    (result,) = answered(ctx.api, step).topics
    assert (result.name, result.error_code) == ("t1", ErrorCode.throttling_quota_exceeded)


async def test_create_topics_before_v6_are_charged_permissively() -> None:
    mutations = StubMutations(refuse=frozenset({0}), throttle_ms=900)
    ctx = context(
        19, 5, quotas=METERED, mutations=mutations, lookups=StubLookups(default_partitions=3)
    )

    step = await topics.create_topics(ctx, create_request(ctx.api, {"t1": -1}))

    assert mutations.calls == [([3], False)], "the brokers' default partition count is charged"
    assert [t.name for t in broker_receives(ctx.api, step).topics] == ["acme.t1"]
    assert isinstance(step, Forward) and step.throttle_ms == 900


async def test_validate_only_create_topics_are_charged_as_by_kafka() -> None:
    mutations = StubMutations(refuse=frozenset({0}), throttle_ms=700)
    ctx = context(19, 7, quotas=METERED, mutations=mutations)
    request = replace(create_request(ctx.api, {"t1": 3}), validate_only=True)

    step = await topics.create_topics(ctx, request)

    assert mutations.calls == [([3], True)]
    assert isinstance(step, Answer)
    (result,) = answered(ctx.api, step).topics
    assert (result.name, result.error_code) == ("t1", ErrorCode.throttling_quota_exceeded)


async def test_create_topics_without_the_quota_are_not_charged() -> None:
    mutations = StubMutations(refuse=frozenset({0}))
    lookups = StubLookups()
    unmetered = context(19, 7, mutations=mutations, lookups=lookups)
    await topics.create_topics(unmetered, create_request(unmetered.api, {"t1": 3}))
    assert mutations.calls == []
    assert lookups.created_asked == []


async def test_create_topics_refused_by_the_partition_limit_are_not_charged() -> None:
    mutations = StubMutations()
    quotas = Quotas(max_partitions=10, controller_mutation_rate=2.0)
    ctx = context(
        19, 7, quotas=quotas, mutations=mutations, lookups=StubLookups(partitions=HOLDING_SIX)
    )

    await topics.create_topics(ctx, create_request(ctx.api, {"t1": 3, "t2": 3}))

    assert mutations.calls == [([3], True)]


@pytest.mark.parametrize(("version", "strict"), [(2, False), (3, True)])
async def test_create_partitions_charges_the_partitions_added(version: int, strict: bool) -> None:
    mutations = StubMutations(refuse=frozenset({1}), throttle_ms=300)
    lookups = StubLookups(partitions={"acme.orders": 4, "acme.audit": 4})
    ctx = context(37, version, quotas=METERED, lookups=lookups, mutations=mutations)

    request = create_partitions_request(ctx.api, {"orders": 6, "audit": 5, "ghost": 3})
    step = await topics.create_partitions(ctx, request)

    assert mutations.calls == [([2, 1, 0], strict)], "an unknown topic is the brokers' to refuse"
    sent = [t.name for t in broker_receives(ctx.api, step).topics]
    assert isinstance(step, Forward) and step.throttle_ms == 300
    if strict:
        assert sent == ["acme.orders", "acme.ghost"]
        results = by_name(
            step.finish(ctx.api.response(throttle_time=NO_THROTTLE, results=())).results
        )
        assert results["audit"].error_code == ErrorCode.throttling_quota_exceeded
    else:
        assert sent == ["acme.orders", "acme.audit", "acme.ghost"]


@pytest.mark.parametrize(("version", "strict"), [(4, False), (6, True)])
async def test_delete_topics_charges_the_topics_partitions(version: int, strict: bool) -> None:
    mutations = StubMutations(refuse=frozenset({0}), throttle_ms=400)
    lookups = StubLookups(partitions={"acme.orders": 4, "acme.secret": 2})
    ctx = context(20, version, quotas=METERED, lookups=lookups, mutations=mutations)
    api = ctx.api
    if version >= 6:
        request = api.request(
            topics=(
                api.make_request("DeleteTopicState", name=None, topic_id=ORDERS_ID),
                api.make_request("DeleteTopicState", name="secret", topic_id=None),
            ),
            timeout=datetime.timedelta(seconds=30),
        )
    else:
        request = api.request(
            topic_names=("orders", "secret"), timeout=datetime.timedelta(seconds=30)
        )

    step = await topics.delete_topics(ctx, request)

    assert mutations.calls == [([4, 2], strict)]
    assert isinstance(step, Forward) and step.throttle_ms == 400
    if strict:
        assert [t.name for t in broker_receives(api, step).topics] == ["acme.secret"]
        (refused,) = step.finish(api.response(throttle_time=NO_THROTTLE, responses=())).responses
        assert (refused.name, refused.topic_id, refused.error_code) == (
            "orders",
            ORDERS_ID,
            ErrorCode.throttling_quota_exceeded,
        )
    else:
        assert broker_receives(api, step).topic_names == ("acme.orders", "acme.secret")


def describe_configs_request(api: ApiSchema, resources: Sequence[tuple[int, str]]) -> Any:
    return api.request(
        resources=tuple(
            api.make_request(
                "DescribeConfigsResource",
                resource_type=kind,
                resource_name=name,
                configuration_keys=None,
            )
            for kind, name in resources
        ),
        include_synonyms=False,
        include_documentation=False,
    )


@pytest.mark.parametrize("version", [1, 4])
async def test_describe_configs_of_a_broker_needs_describe_configs_on_the_cluster(
    version: int,
) -> None:
    bindings = denying(CLUSTER, CLUSTER_NAME, Operation.DESCRIBE_CONFIGS)
    ctx = context(32, version, bindings=bindings)
    request = describe_configs_request(ctx.api, [(BROKER_RESOURCE, "0")])

    response = answered(ctx.api, await topics.describe_configs(ctx, request))

    (result,) = response.results
    assert (result.resource_type, result.resource_name, result.error_code) == (
        BROKER_RESOURCE,
        "0",
        ErrorCode.cluster_authorization_failed,
    )
    assert result.error_message


async def test_describe_configs_forwards_the_tenants_topics_beside_a_refused_logger() -> None:
    ctx = context(32, 4)
    api = ctx.api
    request = describe_configs_request(
        api, [(TOPIC_RESOURCE, "orders"), (BROKER_LOGGER_RESOURCE, "0")]
    )

    step = await topics.describe_configs(ctx, request)

    sent = broker_receives(api, step)
    assert [(r.resource_type, r.resource_name) for r in sent.resources] == [
        (TOPIC_RESOURCE, "acme.orders")
    ]
    broker = api.response(
        throttle_time=NO_THROTTLE,
        results=tuple(
            api.make(
                "DescribeConfigsResult",
                error_code=ErrorCode.none,
                error_message=None,
                resource_type=TOPIC_RESOURCE,
                resource_name=name,
                configs=(),
            )
            for name in ["acme.orders", "globex.payments"]
        ),
    )
    response = finished(api, step, broker)
    assert {r.resource_name: r.error_code for r in response.results} == {
        "orders": ErrorCode.none,
        "0": ErrorCode.cluster_authorization_failed,
    }


async def test_config_errors_name_the_tenants_topic_not_the_brokers() -> None:
    ctx = context(44, 1)
    api = ctx.api
    request = api.request(
        resources=(
            api.make_request(
                "AlterConfigsResource",
                resource_type=TOPIC_RESOURCE,
                resource_name="secret",
                configs=(),
            ),
        ),
        validate_only=False,
    )
    step = await topics.alter_configs(ctx, request)
    broker = api.response(
        throttle_time=NO_THROTTLE,
        responses=(
            api.make(
                "AlterConfigsResourceResponse",
                error_code=ErrorCode.invalid_config,
                error_message="Invalid value -2 for retention.ms of topic 'acme.secret'",
                resource_type=TOPIC_RESOURCE,
                resource_name="acme.secret",
            ),
        ),
    )
    [result] = finished(api, step, broker).responses
    assert result.resource_name == "secret"
    assert result.error_message == "Invalid value -2 for retention.ms of topic 'secret'"


def broker_config_entry(api: ApiSchema, name: str, value: str, source: int = 4) -> Any:
    return api.make(
        "DescribeConfigsResourceResult",
        name=name,
        value=value,
        read_only=True,
        config_source=source,
        is_sensitive=False,
        synonyms=(api.make("DescribeConfigsSynonym", name=name, value=value, source=source),),
        config_type=3,
        documentation=None,
    )


def broker_configs_response(api: ApiSchema, broker: str, entries: Sequence[Any]) -> Any:
    return api.response(
        throttle_time=NO_THROTTLE,
        results=(
            api.make(
                "DescribeConfigsResult",
                error_code=ErrorCode.none,
                error_message=None,
                resource_type=BROKER_RESOURCE,
                resource_name=broker,
                configs=tuple(entries),
            ),
        ),
    )


@pytest.mark.parametrize("broker", ["", "1"])
async def test_describe_configs_of_a_broker_shows_a_tenant_the_documented_subset(
    broker: str,
) -> None:
    ctx = context(32, 4)
    api = ctx.api
    step = await topics.describe_configs(ctx, describe_configs_request(api, [(4, broker)]))
    sent = broker_receives(api, step)
    assert [(r.resource_type, r.resource_name) for r in sent.resources] == [(4, broker)]
    entries = [
        broker_config_entry(api, "message.max.bytes", "1048588"),
        broker_config_entry(api, "log.retention.ms", "604800000", source=5),
        broker_config_entry(api, "advertised.listeners", "PLAINTEXT://10.0.0.7:9192"),
        broker_config_entry(api, "log.dirs", "/var/lib/shoal"),
    ]

    [result] = finished(api, step, broker_configs_response(api, broker, entries)).results

    assert result.resource_name == broker
    seen = {c.name: c for c in result.configs}
    assert set(seen) == {"message.max.bytes", "log.retention.ms"}
    retention = seen["log.retention.ms"]
    assert (retention.value, retention.config_source, retention.read_only) == ("604800000", 5, True)
    assert [(s.name, s.source) for s in retention.synonyms] == [("log.retention.ms", 5)]


async def test_describe_configs_of_a_broker_is_whole_for_the_platform_admin() -> None:
    ctx = context(32, 4, platform_admin=True)
    api = ctx.api
    step = await topics.describe_configs(ctx, describe_configs_request(api, [(4, "0")]))
    entries = [
        broker_config_entry(api, "message.max.bytes", "1048588"),
        broker_config_entry(api, "log.dirs", "/var/lib/shoal"),
    ]

    [result] = finished(api, step, broker_configs_response(api, "0", entries)).results

    assert [c.name for c in result.configs] == ["message.max.bytes", "log.dirs"]


def test_the_tenant_subset_names_no_address_path_or_secret() -> None:
    for name in broker_configs.TENANT_BROKER_CONFIGS:
        assert not any(
            word in name for word in ("listener", "dir", "password", "ssl", "sasl", "host", "rack")
        ), name


def alter_configs_request(api: ApiSchema, resources: Sequence[tuple[int, str]]) -> Any:
    return api.request(
        resources=tuple(
            api.make_request(
                "AlterConfigsResource",
                resource_type=kind,
                resource_name=name,
                configs=(api.make_request("AlterableConfig", name="retention.ms", value="1000"),),
            )
            for kind, name in resources
        ),
        validate_only=False,
    )


@pytest.mark.parametrize("version", [0, 2])
async def test_alter_configs_maps_topics_inward_and_refuses_brokers_to_a_tenant(
    version: int,
) -> None:
    ctx = context(33, version)
    api = ctx.api
    request = alter_configs_request(api, [(TOPIC_RESOURCE, "orders"), (BROKER_RESOURCE, "0")])

    step = await topics.alter_configs(ctx, request)

    sent = broker_receives(api, step)
    assert [(r.resource_type, r.resource_name) for r in sent.resources] == [
        (TOPIC_RESOURCE, "acme.orders")
    ]
    assert [(c.name, c.value) for c in sent.resources[0].configs] == [("retention.ms", "1000")]
    broker = api.response(
        throttle_time=NO_THROTTLE,
        responses=(
            api.make(
                "AlterConfigsResourceResponse",
                error_code=ErrorCode.invalid_config,
                error_message="Invalid value 1000 for topic 'acme.orders'",
                resource_type=TOPIC_RESOURCE,
                resource_name="acme.orders",
            ),
        ),
    )
    results = {r.resource_name: r for r in finished(api, step, broker).responses}
    assert results["orders"].error_message == "Invalid value 1000 for topic 'orders'"
    assert results["0"].error_code == ErrorCode.cluster_authorization_failed


async def test_alter_configs_of_a_topic_needs_alter_configs_on_it() -> None:
    ctx = context(33, 1, bindings=denying(TOPIC, "orders", Operation.ALTER_CONFIGS))

    response = answered(
        ctx.api, await topics.alter_configs(ctx, alter_configs_request(ctx.api, [(2, "orders")]))
    )

    [result] = response.responses
    assert (result.resource_name, result.error_code) == (
        "orders",
        ErrorCode.topic_authorization_failed,
    )


@pytest.mark.parametrize("api_key", [33, 44])
async def test_broker_configs_reach_the_brokers_for_the_platform_admin_only(api_key: int) -> None:
    ctx = context(api_key, 1, platform_admin=True)
    request = ctx.api.request(
        resources=(
            ctx.api.make_request(
                "AlterConfigsResource", resource_type=BROKER_RESOURCE, resource_name="", configs=()
            ),
        ),
        validate_only=True,
    )

    _, rewrite = REWRITERS[api_key]
    sent = broker_receives(ctx.api, await rewrite(ctx, request))

    assert [(r.resource_type, r.resource_name) for r in sent.resources] == [(BROKER_RESOURCE, "")]


def elect_leaders_request(api: ApiSchema, partitions: Mapping[str, Sequence[int]] | None) -> Any:
    return api.request(
        election_type=0,
        topic_partitions=None
        if partitions is None
        else tuple(
            api.make_request("TopicPartitions", topic=name, partitions=tuple(indexes))
            for name, indexes in partitions.items()
        ),
        timeout=datetime.timedelta(seconds=30),
    )


@pytest.mark.parametrize("version", [0, 2])
async def test_elect_leaders_is_cluster_authorization_failed_for_a_tenant(version: int) -> None:
    # Even a key the tenant gave ALTER on its cluster: leadership is every tenant's.
    alter = AclBinding(
        TENANT, KEY, CLUSTER, PatternType.LITERAL, CLUSTER_NAME, Operation.ALTER, Permission.ALLOW
    )
    ctx = context(43, version, bindings=[*default_bindings(TENANT, KEY), alter])

    step = await elections.elect_leaders(ctx, elect_leaders_request(ctx.api, {"orders": [0, 1]}))

    response = answered(ctx.api, step)
    if version >= 1:
        assert response.error_code == ErrorCode.cluster_authorization_failed
    [topic] = response.replica_election_results
    assert topic.topic == "orders"
    assert [(p.partition_id, p.error_code) for p in topic.partition_result] == [
        (0, ErrorCode.cluster_authorization_failed),
        (1, ErrorCode.cluster_authorization_failed),
    ]


async def test_elect_leaders_of_every_partition_is_refused_with_no_partitions_named() -> None:
    ctx = context(43, 2)

    response = answered(
        ctx.api, await elections.elect_leaders(ctx, elect_leaders_request(ctx.api, None))
    )

    assert response.error_code == ErrorCode.cluster_authorization_failed
    assert response.replica_election_results == ()


async def test_elect_leaders_reaches_the_brokers_unchanged_for_the_platform_admin() -> None:
    ctx = context(43, 2, platform_admin=True)

    sent = broker_receives(
        ctx.api,
        await elections.elect_leaders(ctx, elect_leaders_request(ctx.api, {"globex.pay": [0]})),
    )

    assert [(t.topic, t.partitions) for t in sent.topic_partitions] == [("globex.pay", (0,))]


# Client quotas


def quota_store() -> StubQuotaStore:
    return StubQuotaStore(
        {
            "acme": Quotas(producer_byte_rate=1e6, max_partitions=10),
            "globex": Quotas(consumer_byte_rate=2e6),
            "initech": Quotas(),
        }
    )


def describe_quotas_request(api: ApiSchema, match: str | None = None) -> Any:
    components = (
        ()
        if match is None
        else (api.make_request("ComponentData", entity_type="user", match_type=0, match=match),)
    )
    return api.request(components=components, strict=False)


def alter_quotas_request(
    api: ApiSchema,
    tenant: str,
    ops: Mapping[str, float | None],
    *,
    validate_only: bool = False,
) -> Any:
    return api.request(
        entries=(
            api.make_request(
                "EntryData",
                entity=(api.make_request("EntityData", entity_type="user", entity_name=tenant),),
                ops=tuple(
                    api.make_request("OpData", key=key, value=value or 0.0, remove=value is None)
                    for key, value in ops.items()
                ),
            ),
        ),
        validate_only=validate_only,
    )


def described(response: Any) -> dict[str, dict[str, float]]:
    return {e.entity[0].entity_name: {v.key: v.value for v in e.values} for e in response.entries}


@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize("match", [None, "acme"])
async def test_a_tenants_key_describes_its_own_quotas_only(version: int, match: str | None) -> None:
    # The key's quotas as the gateway enforces them, not another tenant's.
    own = Quotas(producer_byte_rate=1e6, max_storage_bytes=200_000)
    ctx = context(48, version, quotas=own, store=quota_store())

    request = describe_quotas_request(ctx.api, match=match)
    response = answered(ctx.api, await client_quotas.describe_client_quotas(ctx, request))

    assert response.error_code == ErrorCode.none
    assert described(response) == {
        "acme": {"producer_byte_rate": 1e6, "max_storage_bytes": 200_000.0}
    }


@pytest.mark.parametrize("match", ["globex", "nobody"])
async def test_a_tenants_key_finds_nothing_under_another_name(match: str) -> None:
    # An existing tenant and a name that exists nowhere get the same answer.
    ctx = context(48, 1, quotas=Quotas(producer_byte_rate=1e6), store=quota_store())

    request = describe_quotas_request(ctx.api, match=match)
    response = answered(ctx.api, await client_quotas.describe_client_quotas(ctx, request))

    assert (response.error_code, response.entries) == (ErrorCode.none, ())


async def test_a_tenant_without_quotas_describes_an_empty_list() -> None:
    ctx = context(48, 1, store=quota_store())

    response = answered(
        ctx.api, await client_quotas.describe_client_quotas(ctx, describe_quotas_request(ctx.api))
    )

    assert (response.error_code, response.entries) == (ErrorCode.none, ())


async def test_describe_client_quotas_lists_every_tenant_with_quotas() -> None:
    ctx = context(48, 1, platform_admin=True, store=quota_store())

    step = await client_quotas.describe_client_quotas(ctx, describe_quotas_request(ctx.api))

    response = answered(ctx.api, step)
    assert response.error_code == ErrorCode.none
    seen = {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {
            v.key: v.value for v in entry.values
        }
        for entry in response.entries
    }
    assert seen == {
        (("user", "acme"),): {"producer_byte_rate": 1e6, "max_partitions": 10.0},
        (("user", "globex"),): {"consumer_byte_rate": 2e6},
    }


async def test_describe_client_quotas_for_one_tenant() -> None:
    ctx = context(48, 1, platform_admin=True, store=quota_store())

    request = describe_quotas_request(ctx.api, match="globex")
    response = answered(ctx.api, await client_quotas.describe_client_quotas(ctx, request))

    assert [e.entity[0].entity_name for e in response.entries] == ["globex"]


@pytest.mark.parametrize("version", [0, 1])
async def test_alter_client_quotas_is_for_platform_admins_only(version: int) -> None:
    store = quota_store()
    ctx = context(49, version, store=store)

    request = alter_quotas_request(ctx.api, "acme", {"producer_byte_rate": 5e6})
    response = answered(ctx.api, await client_quotas.alter_client_quotas(ctx, request))

    assert [e.error_code for e in response.entries] == [ErrorCode.cluster_authorization_failed]
    assert store.writes == []


async def test_alter_client_quotas_sets_and_removes_values_through_the_store() -> None:
    store = quota_store()
    ctx = context(49, 1, platform_admin=True, store=store)

    request = alter_quotas_request(
        ctx.api,
        "acme",
        {"producer_byte_rate": None, "consumer_byte_rate": 3e6, "max_partitions": 20.0},
    )
    response = answered(ctx.api, await client_quotas.alter_client_quotas(ctx, request))

    assert [(e.error_code, e.entity[0].entity_name) for e in response.entries] == [
        (ErrorCode.none, "acme")
    ]
    assert store.writes == [
        ("acme", Quotas(producer_byte_rate=None, consumer_byte_rate=3e6, max_partitions=20))
    ]
    assert isinstance(store.writes[0][1].max_partitions, int)


async def test_client_quotas_know_kafkas_controller_mutation_rate() -> None:
    store = quota_store()
    ctx = context(49, 1, platform_admin=True, store=store)

    request = alter_quotas_request(ctx.api, "globex", {"controller_mutation_rate": 2.5})
    response = answered(ctx.api, await client_quotas.alter_client_quotas(ctx, request))

    assert [e.error_code for e in response.entries] == [ErrorCode.none]
    assert store.writes == [
        ("globex", Quotas(consumer_byte_rate=2e6, controller_mutation_rate=2.5))
    ]
    described = context(48, 1, platform_admin=True, store=store)
    request = describe_quotas_request(described.api, match="globex")
    (entry,) = answered(
        described.api, await client_quotas.describe_client_quotas(described, request)
    ).entries
    assert {v.key: v.value for v in entry.values} == {
        "consumer_byte_rate": 2e6,
        "controller_mutation_rate": 2.5,
    }


async def test_client_quotas_know_kafkas_request_percentage_above_one_thread() -> None:
    store = quota_store()
    ctx = context(49, 1, platform_admin=True, store=store)

    request = alter_quotas_request(ctx.api, "globex", {"request_percentage": 250.0})
    response = answered(ctx.api, await client_quotas.alter_client_quotas(ctx, request))

    assert [e.error_code for e in response.entries] == [ErrorCode.none]
    assert store.writes == [("globex", Quotas(consumer_byte_rate=2e6, request_percentage=250.0))]
    # The tenant's own key reads it back, as the quota the gateway enforces on it.
    own = context(48, 1, quotas=store.writes[0][1], store=store)
    (entry,) = answered(
        own.api, await client_quotas.describe_client_quotas(own, describe_quotas_request(own.api))
    ).entries
    assert {v.key: v.value for v in entry.values} == {
        "consumer_byte_rate": 2e6,
        "request_percentage": 250.0,
    }


async def test_client_quotas_know_the_storage_limit_in_whole_bytes() -> None:
    store = quota_store()
    ctx = context(49, 1, platform_admin=True, store=store)

    request = alter_quotas_request(ctx.api, "globex", {"max_storage_bytes": 200_000.0})
    response = answered(ctx.api, await client_quotas.alter_client_quotas(ctx, request))

    assert [e.error_code for e in response.entries] == [ErrorCode.none]
    assert store.writes == [("globex", Quotas(consumer_byte_rate=2e6, max_storage_bytes=200_000))]
    assert isinstance(store.writes[0][1].max_storage_bytes, int)


@pytest.mark.parametrize(
    ("tenant", "ops", "message"),
    [
        ("acme", {"no_such_quota": 50.0}, "unknown quota key 'no_such_quota'"),
        ("nobody", {"producer_byte_rate": 1e6}, "tenant 'nobody' does not exist"),
        ("acme", {"producer_byte_rate": 1e6, "consumer_byte_rate": -1.0}, "must be positive"),
    ],
    ids=["unknown-key", "unknown-tenant", "negative"],
)
async def test_alter_client_quotas_refuses_what_it_cannot_apply(
    tenant: str, ops: Mapping[str, float | None], message: str
) -> None:
    store = quota_store()
    ctx = context(49, 1, platform_admin=True, store=store)

    request = alter_quotas_request(ctx.api, tenant, ops)
    response = answered(ctx.api, await client_quotas.alter_client_quotas(ctx, request))

    (entry,) = response.entries
    assert entry.error_code == ErrorCode.invalid_request
    assert message in entry.error_message
    assert store.writes == []


async def test_alter_client_quotas_validate_only_writes_nothing() -> None:
    store = quota_store()
    ctx = context(49, 1, platform_admin=True, store=store)

    request = alter_quotas_request(ctx.api, "acme", {"producer_byte_rate": 5e6}, validate_only=True)
    response = answered(ctx.api, await client_quotas.alter_client_quotas(ctx, request))

    assert [e.error_code for e in response.entries] == [ErrorCode.none]
    assert store.writes == []
    assert store.quotas["acme"].producer_byte_rate == 1e6


# Transactions
#
# A transactional id lives in the tenant's namespace like a topic or a group,
# so another tenant can neither find, fence nor commit it; the broker-internal
# WriteTxnMarkers is never offered; read_committed fetches keep the broker's
# last stable offset and aborted transactions.


def other_tenant_context(api_key: int, version: int) -> RequestContext:
    access = TenantAccess(
        OTHER_TENANT, "key-2", default_bindings(OTHER_TENANT, "key-2"), Quotas(), False
    )
    return RequestContext(
        access, schema(api_key, version), StubLookups(), StubQuotaStore(), acl_store=StubAclStore()
    )


@pytest.mark.parametrize("version", [0, 5])
async def test_init_producer_id_keeps_each_tenants_transactional_ids_apart(version: int) -> None:
    mine, theirs = context(22, version), other_tenant_context(22, version)

    def request(api: ApiSchema, txn: str) -> Any:
        return api.request(transactional_id=txn, transaction_timeout=datetime.timedelta(minutes=1))

    sent_mine = broker_receives(
        mine.api, await transactions.init_producer_id(mine, request(mine.api, "tx"))
    )
    sent_theirs = broker_receives(
        theirs.api, await transactions.init_producer_id(theirs, request(theirs.api, "tx"))
    )
    # Naming the other tenant's id as the brokers know it stays in one's own namespace.
    sent_spoof = broker_receives(
        theirs.api, await transactions.init_producer_id(theirs, request(theirs.api, "acme.tx"))
    )

    assert sent_mine.transactional_id == "acme.tx"
    assert sent_theirs.transactional_id == "globex.tx"
    assert sent_spoof.transactional_id == "globex.acme.tx"


async def test_init_producer_id_for_a_denied_transactional_id_is_refused() -> None:
    ctx = context(22, 4, bindings=denying(TXN, "tx", Operation.WRITE))
    request = ctx.api.request(
        transactional_id="tx", transaction_timeout=datetime.timedelta(minutes=1)
    )

    response = answered(ctx.api, await transactions.init_producer_id(ctx, request))

    assert response.error_code == ErrorCode.transactional_id_authorization_failed
    assert (response.producer_id, response.producer_epoch) == (-1, -1)


@pytest.mark.parametrize("version", [1, 4])
async def test_find_coordinator_for_a_transactional_id_maps_it_inward(version: int) -> None:
    ctx = context(10, version)
    request = (
        ctx.api.request(coordinator_keys=("tx",), key_type=1)
        if version >= 4
        else ctx.api.request(key="tx", key_type=1)
    )

    sent = broker_receives(ctx.api, await cluster.find_coordinator(ctx, request))

    keys = sent.coordinator_keys if version >= 4 else (sent.key,)
    assert (keys, sent.key_type) == (("acme.tx",), 1)


async def test_add_partitions_to_txn_maps_the_id_and_topics_both_ways() -> None:
    ctx = context(24, 3)
    request = ctx.api.request(
        v3_and_below_transactional_id="tx",
        v3_and_below_producer_id=7,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=(
            ctx.api.make_request("AddPartitionsToTxnTopic", name="orders", partitions=(0, 1)),
        ),
    )

    step = await transactions.add_partitions_to_txn(ctx, request)

    sent = broker_receives(ctx.api, step)
    assert sent.v3_and_below_transactional_id == "acme.tx"
    assert [t.name for t in sent.v3_and_below_topics] == ["acme.orders"]
    broker = ctx.api.response(
        throttle_time=NO_THROTTLE,
        results_by_topic_v3_and_below=(
            ctx.api.make(
                "AddPartitionsToTxnTopicResult",
                name="acme.orders",
                results_by_partition=tuple(
                    ctx.api.make(
                        "AddPartitionsToTxnPartitionResult",
                        partition_index=i,
                        partition_error_code=ErrorCode.none,
                    )
                    for i in (0, 1)
                ),
            ),
        ),
    )
    response = finished(ctx.api, step, broker)
    assert [t.name for t in response.results_by_topic_v3_and_below] == ["orders"]


def test_the_broker_batched_add_partitions_to_txn_is_not_offered_to_clients() -> None:
    """v4+ (KIP-890) is brokers verifying transactions among themselves."""
    offered = offered_versions({24: (0, 5), 22: (0, 5)})
    assert offered[24] == (0, 3)
    api = schema(24, 4)
    frame = encode_request(api, 1, "tenant", minimal_entity(api.request_class, "x"))
    with pytest.raises(UnsupportedVersionError):
        decode_request(frame[4:], offered)


@pytest.mark.parametrize("platform_admin", [False, True])
async def test_write_txn_markers_is_answered_cluster_authorization_failed(
    platform_admin: bool,
) -> None:
    """Only brokers write markers (Kafka wants CLUSTER_ACTION on the cluster): the gateway
    offers WriteTxnMarkers, as a Kafka broker does, and answers it itself with Kafka's
    CLUSTER_AUTHORIZATION_FAILED for every partition, whoever asks; nothing reaches a
    broker."""
    offered = offered_versions({26: (0, 3)})
    assert offered[27] == (1, 2), "offered whatever the brokers say"
    ctx = context(27, 1, platform_admin=platform_admin)
    api = ctx.api
    markers = api.request(
        markers=(
            api.make_request(
                "WritableTxnMarker",
                producer_id=7,
                producer_epoch=0,
                transaction_result=False,
                topics=(
                    api.make_request(
                        "WritableTxnMarkerTopic", name="orders", partition_indexes=(0, 2)
                    ),
                ),
                coordinator_epoch=0,
            ),
        )
    )
    response = answered(api, await REWRITERS[27][1](ctx, markers))
    [marker] = response.markers
    [topic] = marker.topics
    assert (marker.producer_id, topic.name) == (7, "orders")
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == [
        (0, ErrorCode.cluster_authorization_failed),
        (2, ErrorCode.cluster_authorization_failed),
    ]


async def test_add_offsets_and_end_txn_map_the_transactional_id_and_group() -> None:
    add = context(25, 3)
    sent = broker_receives(
        add.api,
        await transactions.add_offsets_to_txn(
            add,
            add.api.request(transactional_id="tx", producer_id=7, producer_epoch=0, group_id="g"),
        ),
    )
    assert (sent.transactional_id, sent.group_id) == ("acme.tx", "acme.g")
    end = context(26, 3)
    sent = broker_receives(
        end.api,
        await transactions.end_txn(
            end,
            end.api.request(transactional_id="tx", producer_id=7, producer_epoch=0, committed=True),
        ),
    )
    assert (sent.transactional_id, sent.committed) == ("acme.tx", True)


async def test_end_txn_for_another_tenants_id_as_the_brokers_name_it_stays_in_the_namespace() -> (
    None
):
    ctx = other_tenant_context(26, 3)
    request = ctx.api.request(
        transactional_id="acme.tx", producer_id=7, producer_epoch=0, committed=False
    )

    sent = broker_receives(ctx.api, await transactions.end_txn(ctx, request))

    assert sent.transactional_id == "globex.acme.tx"


def txn_offset_commit_request(api: ApiSchema, names: Sequence[str], **fields: Any) -> Any:
    values: dict[str, Any] = {
        "transactional_id": "tx",
        "group_id": "g",
        "producer_id": 7,
        "producer_epoch": 0,
        "generation_id": 5,
        "member_id": "member-1",
        "group_instance_id": "instance-1",
    }
    values.update(fields)
    return api.request(
        **values,
        topics=tuple(
            api.make_request(
                "TxnOffsetCommitRequestTopic",
                name=name,
                partitions=(
                    api.make_request(
                        "TxnOffsetCommitRequestPartition",
                        partition_index=0,
                        committed_offset=42,
                        committed_metadata=None,
                    ),
                ),
            )
            for name in names
        ),
    )


@pytest.mark.parametrize("version", [0, 3])
async def test_txn_offset_commit_maps_id_group_and_topics_both_ways(version: int) -> None:
    ctx = context(28, version, bindings=denying(TOPIC, "secret", Operation.READ))
    request = txn_offset_commit_request(ctx.api, ["orders", "secret"])

    step = await groups.txn_offset_commit(ctx, request)

    sent = broker_receives(ctx.api, step)
    assert (sent.transactional_id, sent.group_id) == ("acme.tx", "acme.g")
    assert [t.name for t in sent.topics] == ["acme.orders"]
    if version >= 3:
        assert (sent.generation_id, sent.member_id, sent.group_instance_id) == (
            5,
            "member-1",
            "instance-1",
        )
    broker = ctx.api.response(
        throttle_time=NO_THROTTLE,
        topics=(
            ctx.api.make(
                "TxnOffsetCommitResponseTopic",
                name="acme.orders",
                partitions=(
                    ctx.api.make(
                        "TxnOffsetCommitResponsePartition",
                        partition_index=0,
                        error_code=ErrorCode.none,
                    ),
                ),
            ),
        ),
    )
    topics = by_name(finished(ctx.api, step, broker).topics)
    assert set(topics) == {"orders", "secret"}
    assert topics["secret"].partitions[0].error_code == ErrorCode.topic_authorization_failed


async def test_txn_offset_commit_with_a_denied_transactional_id_refuses_every_topic() -> None:
    ctx = context(28, 3, bindings=denying(TXN, "tx", Operation.WRITE))

    response = answered(
        ctx.api, await groups.txn_offset_commit(ctx, txn_offset_commit_request(ctx.api, ["orders"]))
    )

    assert [p.error_code for t in response.topics for p in t.partitions] == [
        ErrorCode.transactional_id_authorization_failed
    ]


@pytest.mark.parametrize("version", [4, 12, 16])
async def test_read_committed_fetch_keeps_the_isolation_level_and_the_brokers_answer(
    version: int,
) -> None:
    topic_ref: str | uuid.UUID = ORDERS_ID if version >= 13 else "orders"
    broker_ref: str | uuid.UUID = ORDERS_ID if version >= 13 else "acme.orders"
    ctx = context(1, version)
    request = replace(fetch_request(ctx.api, [topic_ref]), isolation_level=1)

    step = await records.fetch(ctx, request)

    assert broker_receives(ctx.api, step).isolation_level == 1
    aborted = (
        ctx.api.make("AbortedTransaction", producer_id=4000, first_offset=3),
        ctx.api.make("AbortedTransaction", producer_id=4001, first_offset=8),
    )
    broker = fetch_response(ctx.api, [broker_ref])
    partition = replace(
        broker.responses[0].partitions[0], last_stable_offset=7, aborted_transactions=aborted
    )
    broker = replace(broker, responses=(replace(broker.responses[0], partitions=(partition,)),))
    (got,) = finished(ctx.api, step, broker).responses[0].partitions
    assert got.last_stable_offset == 7
    assert [(a.producer_id, a.first_offset) for a in got.aborted_transactions] == [
        (4000, 3),
        (4001, 8),
    ]


@pytest.mark.parametrize("version", [7, 8])
async def test_offset_fetch_keeps_require_stable(version: int) -> None:
    """KIP-447: a transactional consumer asks for offsets no open transaction may change."""
    ctx = context(9, version)
    api = ctx.api
    if version >= 8:
        wanted = (
            api.make_request("OffsetFetchRequestTopics", name="orders", partition_indexes=(0,)),
        )
        request = api.request(
            groups=(api.make_request("OffsetFetchRequestGroup", group_id="g", topics=wanted),),
            require_stable=True,
        )
    else:
        wanted = (
            api.make_request("OffsetFetchRequestTopic", name="orders", partition_indexes=(0,)),
        )
        request = api.request(group_id="g", topics=wanted, require_stable=True)

    sent = broker_receives(api, await groups.offset_fetch(ctx, request))

    assert sent.require_stable is True


@pytest.mark.parametrize(("isolation", "expected"), [(0, None), (1, ())])
async def test_a_refused_fetch_slot_is_shaped_for_the_isolation_level(
    isolation: int, expected: tuple[Any, ...] | None
) -> None:
    ctx = context(1, 12, bindings=denying(TOPIC, "secret", Operation.READ))
    request = replace(fetch_request(ctx.api, ["orders", "secret"]), isolation_level=isolation)

    step = await records.fetch(ctx, request)

    response = finished(ctx.api, step, fetch_response(ctx.api, ["acme.orders"]))
    (refused,) = by_name(response.responses, "topic")["secret"].partitions
    assert refused.error_code == ErrorCode.topic_authorization_failed
    assert refused.aborted_transactions == expected


@pytest.mark.parametrize("version", [2, 8])
async def test_list_offsets_keeps_the_isolation_level(version: int) -> None:
    ctx = context(2, version)
    request = ctx.api.request(
        replica_id=-1,
        isolation_level=1,
        topics=(
            ctx.api.make_request(
                "ListOffsetsTopic",
                name="orders",
                partitions=(
                    ctx.api.make_request("ListOffsetsPartition", partition_index=0, timestamp=-1),
                ),
            ),
        ),
    )

    sent = broker_receives(ctx.api, await records.list_offsets(ctx, request))

    assert sent.isolation_level == 1
    assert [t.name for t in sent.topics] == ["acme.orders"]


# Every rewriter at both ends of its version range
#
# A generated request fills every field that has no default with a plain
# value: strings are the tenant's name "x" in requests and the broker's
# "acme.x" in responses, arrays hold one element, ids are the tenant's own.
# Whatever a rewriter decides, the result must be deliverable: a forwarded
# request the broker's guard accepts and a response the client can decode.

_GENERATED_ID = ORDERS_ID
_SAFE_FIELDS: Mapping[str, Any] = {
    "acks": -1,  # acks=0 expects no response; covered by the Produce tests
    "replica_id": -1,  # replica requests are refused; covered by the Fetch tests
    "resource_type": TOPIC_RESOURCE,
    "entity_type": "user",
}


def _sample(tp: Any, text: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        (inner, *_) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _sample(inner, text)
    if origin is tuple:
        return (_sample(typing.get_args(tp)[0], text),)
    if dataclasses.is_dataclass(tp):
        return minimal_entity(tp, text)
    assert isinstance(tp, type), tp
    simple: list[tuple[type, Any]] = [
        (enum.Enum, None),
        (bool, False),
        (bytes, b""),
        (str, text),
        (int, 0),
        (float, 1.0),
        (datetime.timedelta, datetime.timedelta(0)),
        (datetime.datetime, None),
        (uuid.UUID, _GENERATED_ID),
    ]
    for base, value in simple:
        if issubclass(tp, base):
            return next(iter(tp)) if base is enum.Enum else value
    raise TypeError(f"no sample value for {tp!r}")


def minimal_entity(cls: type[Any], text: str) -> Any:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in _SAFE_FIELDS:
            values[f.name] = _SAFE_FIELDS[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = _sample(hints[f.name], text)
    return cls(**values)


_KEYS = {
    "full": default_bindings(TENANT, KEY),
    "read-only": read_only_bindings(TENANT, KEY),
    "no-acls": [],
}
_EVERY_END = [
    pytest.param(api_key, version, id=f"{rewriter.__name__}-{api_key}-v{version}")
    for api_key, ((low, high), rewriter) in REWRITERS.items()
    for version in sorted({low, high})
]


@pytest.mark.parametrize("key", list(_KEYS))
@pytest.mark.parametrize(("api_key", "version"), _EVERY_END)
async def test_every_rewriter_result_is_deliverable(api_key: int, version: int, key: str) -> None:
    _, rewriter = REWRITERS[api_key]
    store = StubQuotaStore({"x": Quotas(max_partitions=5)})
    lookups = StubLookups(partitions={"acme.x": 1})
    ctx = context(
        api_key,
        version,
        bindings=_KEYS[key],
        quotas=Quotas(max_partitions=100),
        platform_admin=key == "full",
        lookups=lookups,
        store=store,
        fetch_cap=1_000_000,
    )
    request = minimal_entity(ctx.api.request_class, "x")

    step = await rewriter(ctx, request)

    if isinstance(step, Answer):
        answered(ctx.api, step)
    else:
        broker_receives(ctx.api, step)
        assert step.expects_response
        finished(ctx.api, step, minimal_entity(ctx.api.response_class, "acme.x"))


# DescribeCluster


def describe_cluster_request(api: ApiSchema, include_ops: bool) -> Any:
    return api.request(include_cluster_authorized_operations=include_ops, endpoint_type=1)


def describe_cluster_response(api: ApiSchema) -> Any:
    return api.response(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=1,
        cluster_id="shoal",
        controller_id=0,
        brokers=tuple(
            api.make("DescribeClusterBroker", broker_id=n, host=f"broker-{n}.internal", port=9092)
            for n in (0, 1)
        ),
        cluster_authorized_operations=NOT_REQUESTED,
    )


@pytest.mark.parametrize("bindings", [None, []], ids=["default-bindings", "no-bindings"])
async def test_describe_cluster_answers_every_key_as_kafka_does(
    bindings: list[AclBinding] | None,
) -> None:
    # Kafka's Admin client sends DescribeCluster before describeTopics: a key
    # without Describe on the cluster (a Streams app's) still gets an answer.
    ctx = context(60, 1, bindings=bindings)

    step = await cluster.describe_cluster(ctx, describe_cluster_request(ctx.api, False))

    response = finished(ctx.api, step, describe_cluster_response(ctx.api))
    assert response.error_code == ErrorCode.none
    assert response.cluster_authorized_operations == NOT_REQUESTED
    assert [b.broker_id for b in response.brokers] == [0, 1]
    assert all(b.host != f"broker-{b.broker_id}.internal" for b in response.brokers)


async def test_describe_cluster_authorized_operations_are_none_without_describe() -> None:
    ctx = context(60, 1, bindings=[])

    step = await cluster.describe_cluster(ctx, describe_cluster_request(ctx.api, True))

    response = finished(ctx.api, step, describe_cluster_response(ctx.api))
    assert ctx.access.may_cluster(Operation.DESCRIBE) is False
    assert response.cluster_authorized_operations == 0


async def test_describe_cluster_authorized_operations_are_the_keys_own() -> None:
    ctx = context(60, 1)

    step = await cluster.describe_cluster(ctx, describe_cluster_request(ctx.api, True))

    response = finished(ctx.api, step, describe_cluster_response(ctx.api))
    expected = ctx.access.authorized_operations(ResourceType.CLUSTER, "")
    assert expected & (1 << Operation.DESCRIBE)
    assert response.cluster_authorized_operations == expected


# DeleteRecords


def delete_records_request(api: ApiSchema, names: Sequence[str], offset: int = 5) -> Any:
    return api.request(
        timeout=datetime.timedelta(seconds=30),
        topics=tuple(
            api.make_request(
                "DeleteRecordsTopic",
                name=name,
                partitions=(
                    api.make_request("DeleteRecordsPartition", partition_index=0, offset=offset),
                ),
            )
            for name in names
        ),
    )


def delete_records_response(api: ApiSchema, names: Sequence[str], low: int = 5) -> Any:
    return api.response(
        throttle_time=NO_THROTTLE,
        topics=tuple(
            api.make(
                "DeleteRecordsTopicResult",
                name=name,
                partitions=(
                    api.make(
                        "DeleteRecordsPartitionResult",
                        partition_index=0,
                        low_watermark=low,
                        error_code=ErrorCode.none,
                    ),
                ),
            )
            for name in names
        ),
    )


@pytest.mark.parametrize("version", [0, 1, 2])
async def test_delete_records_forwards_the_tenants_topics_under_the_brokers_names(
    version: int,
) -> None:
    ctx = context(21, version)

    step = await records.delete_records(ctx, delete_records_request(ctx.api, ["orders"], -1))

    sent = broker_receives(ctx.api, step)
    assert [
        (t.name, [(p.partition_index, p.offset) for p in t.partitions]) for t in sent.topics
    ] == [("acme.orders", [(0, -1)])]
    response = finished(ctx.api, step, delete_records_response(ctx.api, ["acme.orders"]))
    assert [(t.name, t.partitions[0].low_watermark) for t in response.topics] == [("orders", 5)]


async def test_delete_records_needs_delete_on_the_topic_and_refuses_in_its_own_slot() -> None:
    ctx = context(21, 2, bindings=denying(TOPIC, "secret", Operation.DELETE))

    step = await records.delete_records(ctx, delete_records_request(ctx.api, ["orders", "secret"]))

    assert [t.name for t in broker_receives(ctx.api, step).topics] == ["acme.orders"]
    response = finished(ctx.api, step, delete_records_response(ctx.api, ["acme.orders"]))
    codes = {
        t.name: (t.partitions[0].error_code, t.partitions[0].low_watermark) for t in response.topics
    }
    assert codes == {
        "orders": (ErrorCode.none, 5),
        "secret": (ErrorCode.topic_authorization_failed, -1),
    }


async def test_delete_records_by_a_read_only_key_is_answered_without_the_broker() -> None:
    ctx = context(21, 2, bindings=read_only_bindings(TENANT, KEY))

    step = await records.delete_records(ctx, delete_records_request(ctx.api, ["orders"]))

    response = answered(ctx.api, step)
    assert [(t.name, t.partitions[0].error_code) for t in response.topics] == [
        ("orders", ErrorCode.topic_authorization_failed)
    ]


async def test_delete_records_never_reaches_another_tenants_topic() -> None:
    ctx = context(21, 2)

    step = await records.delete_records(ctx, delete_records_request(ctx.api, ["globex.payments"]))

    # Spelled the brokers' way, the name is still inside this tenant's namespace.
    assert [t.name for t in broker_receives(ctx.api, step).topics] == ["acme.globex.payments"]
    response = finished(ctx.api, step, delete_records_response(ctx.api, ["globex.payments"]))
    assert response.topics == ()


# Empty group and transactional ids, which Kafka serves like any other


async def test_find_coordinator_v4_answers_an_empty_key_as_the_tenants_own() -> None:
    ctx = context(10, 4)
    api = ctx.api
    step = await cluster.find_coordinator(ctx, api.request(key_type=0, coordinator_keys=("",)))
    assert broker_receives(api, step).coordinator_keys == ("acme.",)
    broker = api.response(
        throttle_time=NO_THROTTLE,
        coordinators=(
            api.make(
                "Coordinator",
                key="acme.",
                node_id=2,
                host="broker-2.internal",
                port=9092,
                error_code=ErrorCode.none,
                error_message=None,
            ),
        ),
    )
    [found] = finished(api, step, broker).coordinators
    assert (found.key, found.error_code, found.host) == ("", ErrorCode.none, "gw")


async def test_offset_fetch_v9_answers_an_empty_group_id_in_its_entry() -> None:
    ctx = context(9, 9)
    api = ctx.api
    request = api.request(
        groups=(api.make_request("OffsetFetchRequestGroup", group_id="", topics=None),),
        require_stable=False,
    )
    step = await groups.offset_fetch(ctx, request)
    assert [g.group_id for g in broker_receives(api, step).groups] == ["acme."]
    broker = api.response(
        throttle_time=NO_THROTTLE,
        groups=(
            api.make(
                "OffsetFetchResponseGroup",
                group_id="acme.",
                topics=(),
                error_code=ErrorCode.coordinator_load_in_progress,
            ),
        ),
    )
    [group] = finished(api, step, broker).groups
    assert (group.group_id, group.error_code) == ("", ErrorCode.coordinator_load_in_progress)


async def test_init_producer_id_refuses_an_empty_transactional_id_as_the_brokers_do() -> None:
    ctx = context(22, 4)
    request = ctx.api.request(
        transactional_id="",
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=-1,
    )
    step = await transactions.init_producer_id(ctx, request)
    assert isinstance(step, Answer)
    assert step.response.error_code == ErrorCode.invalid_request


# ConsumerGroupHeartbeat, ConsumerGroupDescribe (KIP-848)


def heartbeat_request(api: ApiSchema, **values: Any) -> Any:
    fields: dict[str, Any] = {
        "group_id": "billing",
        "member_id": "m-1",
        "member_epoch": 0,
        "rebalance_timeout": datetime.timedelta(seconds=30),
        "subscribed_topic_names": ("orders",),
        "topic_partitions": (),
    }
    fields.update(values)
    return api.request(**fields)


async def test_consumer_group_heartbeat_maps_the_group_and_the_subscribed_topics() -> None:
    ctx = context(68, 1, bindings=read_only_bindings(TENANT, KEY))

    step = await consumer_groups.consumer_group_heartbeat(ctx, heartbeat_request(ctx.api))

    sent = broker_receives(ctx.api, step)
    assert sent.group_id == "acme.billing"
    assert sent.subscribed_topic_names == ("acme.orders",)
    broker = ctx.api.response(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.unknown_member_id,
        error_message="Member m-1 is not a member of group acme.billing.",
        member_id=None,
        member_epoch=0,
        heartbeat_interval=NO_THROTTLE,
        assignment=None,
    )
    answer = finished(ctx.api, step, broker)
    assert answer.error_message == "Member m-1 is not a member of group billing."


async def test_consumer_group_heartbeat_needs_read_on_the_group_and_describe_on_topics() -> None:
    denied_group = context(68, 1, bindings=denying(GROUP, "billing", Operation.READ))
    denied_topic = context(68, 1, bindings=denying(TOPIC, "secret", Operation.DESCRIBE))

    group_step = await consumer_groups.consumer_group_heartbeat(
        denied_group, heartbeat_request(denied_group.api)
    )
    topic_step = await consumer_groups.consumer_group_heartbeat(
        denied_topic,
        heartbeat_request(denied_topic.api, subscribed_topic_names=("orders", "secret")),
    )

    assert answered(denied_group.api, group_step).error_code == (
        ErrorCode.group_authorization_failed
    )
    refused = answered(denied_topic.api, topic_step)
    assert refused.error_code == ErrorCode.topic_authorization_failed
    assert "secret" in (refused.error_message or "")


async def test_a_regex_subscription_is_confined_to_the_tenants_topics() -> None:
    ctx = context(68, 1)

    step = await consumer_groups.consumer_group_heartbeat(
        ctx, heartbeat_request(ctx.api, subscribed_topic_names=None, subscribed_topic_regex="o.*")
    )
    escape = await consumer_groups.consumer_group_heartbeat(
        ctx,
        heartbeat_request(ctx.api, subscribed_topic_names=None, subscribed_topic_regex="x)|(.*"),
    )

    regex = broker_receives(ctx.api, step).subscribed_topic_regex
    assert regex == r"acme\.(?:o.*)"
    assert re.fullmatch(regex, "acme.orders")
    assert not re.fullmatch(regex, "globex.orders")
    assert answered(ctx.api, escape).error_code == ErrorCode.invalid_regular_expression
    assert consumer_groups.regex_outward(ctx.ns, regex) == "o.*"


async def test_a_clients_anchor_is_dropped_so_that_the_tenants_prefix_can_match() -> None:
    ctx = context(68, 1)

    step = await consumer_groups.consumer_group_heartbeat(
        ctx,
        heartbeat_request(
            ctx.api, subscribed_topic_names=None, subscribed_topic_regex="(^o.*)|(^p)|[^q]^"
        ),
    )

    regex = broker_receives(ctx.api, step).subscribed_topic_regex
    assert regex == r"acme\.(?:(o.*)|(p)|[^q]^)"  # as librdkafka wraps and joins them
    assert re.fullmatch(regex, "acme.orders")


def described_consumer_group(api: ApiSchema, group_id: str, topic: str) -> Any:
    assignment = api.make(
        "Assignment",
        topic_partitions=(
            api.make("TopicPartitions", topic_id=ORDERS_ID, topic_name=topic, partitions=(0, 1)),
        ),
    )
    member = api.make(
        "Member",
        member_id="m-1",
        instance_id=None,
        rack_id=None,
        member_epoch=3,
        client_id="c",
        client_host="/127.0.0.1",
        subscribed_topic_names=(topic,),
        subscribed_topic_regex=None,
        assignment=assignment,
        target_assignment=assignment,
        member_type=1,
    )
    return api.make(
        "DescribedGroup",
        error_code=ErrorCode.none,
        error_message=None,
        group_id=group_id,
        group_state="Stable",
        group_epoch=3,
        assignment_epoch=3,
        assignor_name="uniform",
        members=(member,),
        authorized_operations=NOT_REQUESTED,
    )


async def test_consumer_group_describe_maps_groups_and_topics_outward() -> None:
    ctx = context(69, 1, bindings=denying(GROUP, "audit", Operation.DESCRIBE))
    api = ctx.api

    step = await consumer_groups.consumer_group_describe(
        ctx, api.request(group_ids=("billing", "audit"), include_authorized_operations=False)
    )

    assert broker_receives(api, step).group_ids == ("acme.billing",)
    broker = api.response(
        throttle_time=NO_THROTTLE,
        groups=(
            described_consumer_group(api, "acme.billing", "acme.orders"),
            described_consumer_group(api, "globex.billing", "globex.orders"),
        ),
    )
    found = by_name(finished(api, step, broker).groups, "group_id")
    assert set(found) == {"billing", "audit"}
    member = found["billing"].members[0]
    assert member.subscribed_topic_names == ("orders",)
    assert [t.topic_name for t in member.assignment.topic_partitions] == ["orders"]
    assert found["audit"].error_code == ErrorCode.group_authorization_failed


async def test_consumer_group_describe_refuses_a_group_assigned_a_topic_the_key_cannot_see() -> (
    None
):
    ctx = context(69, 1, bindings=denying(TOPIC, "orders", Operation.DESCRIBE))
    api = ctx.api

    step = await consumer_groups.consumer_group_describe(
        ctx, api.request(group_ids=("billing",), include_authorized_operations=False)
    )
    broker = api.response(
        throttle_time=NO_THROTTLE,
        groups=(described_consumer_group(api, "acme.billing", "acme.orders"),),
    )

    group = finished(api, step, broker).groups[0]
    assert group.error_code == ErrorCode.topic_authorization_failed
    assert group.members == ()
