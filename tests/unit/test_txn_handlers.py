"""The transaction APIs' handlers: what they check themselves, and that every answer
encodes in the versions advertised. The coordinator is a fake here (see
test_txn_coordinator.py for the real one)."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from shoal.broker.cluster.model import (
    BrokerRegistration,
    ClusterImage,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
)
from shoal.broker.config import BrokerConfig
from shoal.broker.handlers import API_VERSIONS
from shoal.broker.handlers.coordinator import TRANSACTION, handle_find_coordinator
from shoal.broker.handlers.producers import (
    handle_add_offsets_to_txn,
    handle_add_partitions_to_txn,
    handle_end_txn,
    handle_init_producer_id,
)
from shoal.broker.handlers.transactions import (
    handle_describe_transactions,
    handle_list_transactions,
)
from shoal.broker.txn.config import TransactionConfig
from shoal.broker.txn.coordinator import TXN_TOPIC, InitResult
from shoal.broker.txn.metadata import TransactionMetadata, TxnState

from shoal.wire import ErrorCode, schema

E = ErrorCode
NODE = NodeId(0)


def topic_image(name: str, partitions: int) -> TopicImage:
    record = TopicRecord(TopicName(name), uuid.uuid4(), tuple((NODE,) for _ in range(partitions)))
    states = {i: PartitionState(NODE, 0, (NODE,)) for i in range(partitions)}
    return TopicImage(record, states, 1)


@dataclass
class FakeTransactions:
    config: TransactionConfig = field(
        default_factory=lambda: TransactionConfig(transaction_state_log_num_partitions=3)
    )
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    metadata: TransactionMetadata | None = None

    def partition_of(self, transactional_id: str) -> int:
        return 1

    async def init_producer_id(self, *args: Any) -> InitResult:
        self.calls.append(("init", *args))
        return InitResult(E.none, 5, 2)

    async def add_partitions(self, *args: Any) -> ErrorCode:
        self.calls.append(("add", *args))
        return E.none

    def verify_partitions(self, *args: Any) -> dict[tuple[str, int], ErrorCode]:
        self.calls.append(("verify", *args))
        return {tp: E.transaction_abortable for tp in args[-1]}

    async def add_offsets(self, *args: Any) -> ErrorCode:
        self.calls.append(("offsets", *args))
        return E.none

    async def end_txn(self, *args: Any) -> ErrorCode:
        self.calls.append(("end", *args))
        return E.concurrent_transactions

    def describe(self, transactional_id: str) -> tuple[ErrorCode, TransactionMetadata | None]:
        if self.metadata is None or transactional_id != self.metadata.transactional_id:
            return E.transactional_id_not_found, None
        return E.none, self.metadata

    def list_transactions(
        self, states: set[TxnState], producer_ids: set[int], duration: int
    ) -> tuple[ErrorCode, list[TransactionMetadata]]:
        self.calls.append(("list", states, producer_ids, duration))
        return E.none, [] if self.metadata is None else [self.metadata]


def services(transactions: FakeTransactions, topics: dict[str, int] | None = None) -> Any:
    images = {TopicName(n): topic_image(n, c) for n, c in (topics or {"t": 2}).items()}
    image = ClusterImage.build("c", 1, {NODE: BrokerRegistration(NODE, "127.0.0.1", 9092)}, images)
    return SimpleNamespace(
        transactions=transactions,
        image=image,
        topic=lambda name: image.topics.get(TopicName(name)),
    )


def context(api_key: int, version: int) -> Any:
    return SimpleNamespace(api=schema(api_key, version), version=version)


def encode(ctx: Any, response: Any) -> bytes:
    return bytes(ctx.api.encode_body(response))


@pytest.mark.parametrize("version", range(API_VERSIONS[22][0], API_VERSIONS[22][1] + 1))
async def test_init_producer_id_passes_the_timeout_and_the_known_producer(version: int) -> None:
    fake = FakeTransactions()
    ctx = context(22, version)
    request = ctx.api.request(
        transactional_id="tx",
        transaction_timeout=datetime.timedelta(seconds=30),
        producer_id=7,
        producer_epoch=1,
    )
    response = await handle_init_producer_id(services(fake), ctx, request)
    encode(ctx, response)
    assert (response.error_code, response.producer_id, response.producer_epoch) == (E.none, 5, 2)
    expected = (7, 1) if version >= 3 else None
    assert fake.calls == [("init", "tx", 30_000, expected)]


async def test_init_producer_id_with_half_a_producer_is_an_invalid_request() -> None:
    fake = FakeTransactions()
    ctx = context(22, 4)
    request = ctx.api.request(
        transactional_id="tx",
        transaction_timeout=datetime.timedelta(seconds=30),
        producer_id=7,
        producer_epoch=-1,
    )
    response = await handle_init_producer_id(services(fake), ctx, request)
    assert response.error_code is E.invalid_request
    assert fake.calls == []


def add_request(ctx: Any, *topics: tuple[str, tuple[int, ...]]) -> Any:
    return ctx.api.request(
        v3_and_below_transactional_id="tx",
        v3_and_below_producer_id=5,
        v3_and_below_producer_epoch=2,
        v3_and_below_topics=tuple(
            ctx.api.make_request("AddPartitionsToTxnTopic", name=name, partitions=parts)
            for name, parts in topics
        ),
    )


def partition_codes(response: Any) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t.name, p.partition_index): p.partition_error_code
        for t in response.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


@pytest.mark.parametrize("version", range(0, 4))
async def test_add_partitions_goes_to_the_coordinator(version: int) -> None:
    fake = FakeTransactions()
    ctx = context(24, version)
    response = await handle_add_partitions_to_txn(
        services(fake), ctx, add_request(ctx, ("t", (0, 1)))
    )
    encode(ctx, response)
    assert partition_codes(response) == {("t", 0): E.none, ("t", 1): E.none}
    assert fake.calls == [("add", "tx", 5, 2, [("t", 0), ("t", 1)])]


async def test_add_partitions_with_an_unknown_one_adds_nothing() -> None:
    fake = FakeTransactions()
    ctx = context(24, 3)
    request = add_request(ctx, ("t", (0, 2)), ("nope", (0,)))
    response = await handle_add_partitions_to_txn(services(fake), ctx, request)
    assert partition_codes(response) == {
        ("t", 0): E.operation_not_attempted,
        ("t", 2): E.unknown_topic_or_partition,
        ("nope", 0): E.unknown_topic_or_partition,
    }
    assert fake.calls == []


@pytest.mark.parametrize("version", [4, 5])
async def test_brokers_add_or_verify_a_batch_of_transactions(version: int) -> None:
    fake = FakeTransactions()
    ctx = context(24, version)

    def transaction(transactional_id: str, verify_only: bool) -> Any:
        return ctx.api.make_request(
            "AddPartitionsToTxnTransaction",
            transactional_id=transactional_id,
            producer_id=5,
            producer_epoch=2,
            verify_only=verify_only,
            topics=(ctx.api.make_request("AddPartitionsToTxnTopic", name="t", partitions=(1,)),),
        )

    request = ctx.api.request(transactions=(transaction("a", True), transaction("b", False)))
    response = await handle_add_partitions_to_txn(services(fake), ctx, request)
    encode(ctx, response)
    codes = {
        r.transactional_id: [
            p.partition_error_code for t in r.topic_results for p in t.results_by_partition
        ]
        for r in response.results_by_transaction
    }
    assert codes == {"a": [E.transaction_abortable], "b": [E.none]}
    assert fake.calls == [("verify", "a", 5, 2, [("t", 1)]), ("add", "b", 5, 2, [("t", 1)])]


async def test_add_offsets_and_end_txn_answer_the_coordinators_code() -> None:
    fake = FakeTransactions()
    ctx = context(25, 3)
    request = ctx.api.request(transactional_id="tx", producer_id=5, producer_epoch=2, group_id="g")
    response = await handle_add_offsets_to_txn(services(fake), ctx, request)
    encode(ctx, response)
    assert response.error_code is E.none
    ctx = context(26, 3)
    request = ctx.api.request(
        transactional_id="tx", producer_id=5, producer_epoch=2, committed=True
    )
    response = await handle_end_txn(services(fake), ctx, request)
    encode(ctx, response)
    assert response.error_code is E.concurrent_transactions
    assert fake.calls == [("offsets", "tx", 5, 2, "g"), ("end", "tx", 5, 2, True)]


async def test_find_coordinator_of_a_transactional_id_is_its_partitions_leader() -> None:
    fake = FakeTransactions()
    ctx = context(10, 3)
    request = ctx.api.request(key="tx", key_type=TRANSACTION)
    response = await handle_find_coordinator(services(fake, {"t": 1, TXN_TOPIC: 3}), ctx, request)
    encode(ctx, response)
    assert (response.error_code, response.node_id, response.port) == (E.none, 0, 9092)


async def test_an_empty_transactional_id_has_a_coordinator_as_in_kafka() -> None:
    # Kafka 4.3 answers FindCoordinator for "" with a coordinator; InitProducerId
    # then refuses the empty id (test_txn_coordinator).
    ctx = context(10, 4)
    request = ctx.api.request(key_type=TRANSACTION, coordinator_keys=("",))
    fake = FakeTransactions()
    response = await handle_find_coordinator(services(fake, {"t": 1, TXN_TOPIC: 3}), ctx, request)
    encode(ctx, response)
    assert (response.coordinators[0].error_code, response.coordinators[0].node_id) == (E.none, 0)


async def test_describe_transactions_answers_per_id() -> None:
    fake = FakeTransactions()
    fake.metadata = TransactionMetadata(
        "tx",
        5,
        2,
        timeout_ms=30_000,
        state=TxnState.ONGOING,
        partitions={("t", 1), ("t", 0)},
        start_timestamp=1_700_000_000_000,
    )
    ctx = context(65, 0)
    request = ctx.api.request(transactional_ids=("tx", "other"))
    response = await handle_describe_transactions(services(fake), ctx, request)
    encode(ctx, response)
    found, missing = response.transaction_states
    assert (found.error_code, found.transaction_state, found.producer_id) == (E.none, "Ongoing", 5)
    assert [(t.topic, t.partitions) for t in found.topics] == [("t", (0, 1))]
    assert missing.error_code is E.transactional_id_not_found


@pytest.mark.parametrize("version", [0, 1])
async def test_list_transactions_filters_and_reports_unknown_states(version: int) -> None:
    fake = FakeTransactions()
    fake.metadata = TransactionMetadata("tx", 5, 2, state=TxnState.COMPLETE_COMMIT)
    ctx = context(66, version)
    request = ctx.api.request(
        state_filters=("CompleteCommit", "Bogus"), producer_id_filters=(5,), duration_filter=-1
    )
    response = await handle_list_transactions(services(fake), ctx, request)
    encode(ctx, response)
    assert response.unknown_state_filters == ("Bogus",)
    assert [s.transactional_id for s in response.transaction_states] == ["tx"]
    assert fake.calls == [("list", {TxnState.COMPLETE_COMMIT}, {5}, -1)]


def test_transaction_settings_come_from_shoal_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_TRANSACTION_MAX_TIMEOUT_MS", "1000")
    monkeypatch.setenv("SHOAL_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS", "50")
    monkeypatch.setenv("SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
    config = BrokerConfig().transaction_config()
    assert config.transaction_max_timeout_ms == 1000
    assert config.transaction_abort_timed_out_transaction_cleanup_interval_ms == 50
    assert config.transaction_state_log_num_partitions == 50
    # Unset, the state topic is replicated like the offsets topic.
    assert config.transaction_state_log_replication_factor == 1
    monkeypatch.setenv("SHOAL_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "2")
    assert BrokerConfig().transaction_config().transaction_state_log_replication_factor == 2
