"""KIP-890 part 1: brokers ask the transaction coordinator before a transactional batch
or a TxnOffsetCommit opens a transaction in a partition.

The coordinator is the real one over a real log (txn_fixtures); "remote"
coordinators are reached through a fake sender that runs the real
AddPartitionsToTxn handler, so no socket is opened.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from coordinator_fixtures import ELSEWHERE, HERE
from shoal.broker.cluster.model import (
    BrokerRegistration,
    ClusterImage,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
)
from shoal.broker.coordinator.coordinator import OFFSETS_TOPIC
from shoal.broker.handlers.group_offsets import handle_txn_offset_commit
from shoal.broker.handlers.produce import handle_produce
from shoal.broker.handlers.producers import handle_add_partitions_to_txn
from shoal.broker.partition import Partition
from shoal.broker.replication.channel import ChannelError
from shoal.broker.txn.verification import TransactionVerifier
from txn_fixtures import CONFIG, TxnEnv, txn_env, txn_image

from shoal.records import BatchOptions, NewRecord, build_batch
from shoal.wire import ApiSchema, ErrorCode, schema

E = ErrorCode
TOPIC = "t"
OFFSETS_PARTITION = 7
"""Where txn_fixtures' coordinator puts every group's offsets."""
BROKERS = {node: BrokerRegistration(node, "127.0.0.1", 9092 + node) for node in (HERE, ELSEWHERE)}


def data_topic(name: str, partitions: int) -> TopicImage:
    record = TopicRecord(TopicName(name), uuid.uuid4(), tuple((HERE,) for _ in range(partitions)))
    return TopicImage(record, {i: PartitionState(HERE, 1, (HERE,)) for i in range(partitions)}, 1)


def cluster(coordinator: NodeId | None = HERE) -> ClusterImage:
    """__transaction_state led by ``coordinator`` (None: no live leader) and topic ``t``."""
    partitions = CONFIG.transaction_state_log_num_partitions
    leader = ELSEWHERE if coordinator is None else coordinator
    txn = txn_image(partitions, dict.fromkeys(range(partitions), leader)).topics
    brokers = dict(BROKERS)
    if coordinator is None:
        del brokers[ELSEWHERE]
    topics = {**txn, TopicName(TOPIC): data_topic(TOPIC, 2)}
    return ClusterImage.build("test-cluster", 1, brokers, topics)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[TxnEnv]:
    async with txn_env(tmp_path) as env:
        # The coordinator's own image (it leads every state partition) plus a data topic.
        env.replicas.apply(cluster(HERE))
        yield env


@dataclass
class CoordinatorElsewhere:
    """A sender to ``ELSEWHERE`` that runs the real AddPartitionsToTxn handler on
    ``env``'s coordinator; ``gate`` holds answers back, ``failure`` replaces them."""

    env: TxnEnv
    requests: list[Any] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    failure: Exception | None = None
    error_code: ErrorCode = E.none

    def __post_init__(self) -> None:
        self.gate.set()

    async def __call__(self, node: NodeId, api: ApiSchema, request: Any) -> Any:
        assert node == ELSEWHERE
        self.requests.append(request)
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        ctx = SimpleNamespace(api=api, version=api.version)
        services = SimpleNamespace(transactions=self.env.coordinator)
        response = await handle_add_partitions_to_txn(services, ctx, request)  # type: ignore[arg-type]
        api.encode_body(response)  # what a real peer would send must encode
        if self.error_code is not E.none:
            return api.response(
                throttle_time=response.throttle_time,
                error_code=self.error_code,
                results_by_transaction=(),
            )
        return response


def local(env: TxnEnv, image: ClusterImage | None = None) -> TransactionVerifier:
    shown = image or cluster(HERE)
    return TransactionVerifier(HERE, lambda: shown, env.coordinator)


def remote(env: TxnEnv) -> tuple[TransactionVerifier, CoordinatorElsewhere]:
    sender = CoordinatorElsewhere(env)
    shown = cluster(ELSEWHERE)
    return TransactionVerifier(HERE, lambda: shown, env.coordinator, sender), sender


# -- the verifier ------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["local", "remote"])
async def test_a_partition_in_the_ongoing_transaction_is_verified_and_others_are_not(
    env: TxnEnv, where: str
) -> None:
    verifier = local(env) if where == "local" else remote(env)[0]
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    codes = await verifier.verify("tx-a", pid, epoch, [(TOPIC, 0), (TOPIC, 1)], abortable=False)
    assert codes == {(TOPIC, 0): E.none, (TOPIC, 1): E.invalid_txn_state}
    newer = await verifier.verify("tx-a", pid, epoch, [(TOPIC, 1)], abortable=True)
    assert newer == {(TOPIC, 1): E.transaction_abortable}


@pytest.mark.parametrize("where", ["local", "remote"])
async def test_a_producer_id_or_epoch_not_the_transactional_ids_is_refused(
    env: TxnEnv, where: str
) -> None:
    verifier = local(env) if where == "local" else remote(env)[0]
    owner_pid, owner_epoch = await env.begin("tenant-a", (OFFSETS_TOPIC, OFFSETS_PARTITION))
    await env.begin("tenant-b", (TOPIC, 0))
    tp = (OFFSETS_TOPIC, OFFSETS_PARTITION)
    borrowed = await verifier.verify("tenant-b", owner_pid, owner_epoch + 1, [tp], abortable=False)
    assert borrowed == {tp: E.invalid_producer_id_mapping}
    # The owner's own id with another epoch: fenced, in the code producers expect here.
    assert await verifier.verify("tenant-a", owner_pid, owner_epoch + 1, [tp], False) == {
        tp: E.invalid_producer_epoch
    }
    assert await verifier.verify("tenant-a", owner_pid, owner_epoch, [tp], False) == {tp: E.none}


async def test_without_a_live_coordinator_the_answer_is_coordinator_not_available(
    env: TxnEnv,
) -> None:
    verifier = local(env, cluster(None))
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    codes = await verifier.verify("tx-a", pid, epoch, [(TOPIC, 0)], abortable=False)
    assert codes == {(TOPIC, 0): E.coordinator_not_available}


async def test_concurrent_verifications_for_one_coordinator_go_in_one_request(
    env: TxnEnv,
) -> None:
    verifier, sender = remote(env)
    a = await env.begin("tx-a", (TOPIC, 0), (TOPIC, 1))
    b = await env.begin("tx-b", (TOPIC, 1))
    results = await asyncio.gather(
        verifier.verify("tx-a", *a, [(TOPIC, 0)], abortable=False),
        verifier.verify("tx-a", *a, [(TOPIC, 1)], abortable=False),
        verifier.verify("tx-b", *b, [(TOPIC, 0), (TOPIC, 1)], abortable=False),
    )
    assert results == [
        {(TOPIC, 0): E.none},
        {(TOPIC, 1): E.none},
        {(TOPIC, 0): E.invalid_txn_state, (TOPIC, 1): E.none},
    ]
    assert len(sender.requests) == 1
    sent = {t.transactional_id: t for t in sender.requests[0].transactions}
    assert sorted(sent) == ["tx-a", "tx-b"]
    assert all(t.verify_only for t in sent.values())
    assert [(t.name, tuple(t.partitions)) for t in sent["tx-a"].topics] == [(TOPIC, (0, 1))]


async def test_one_transactional_id_with_two_epochs_goes_in_two_requests(env: TxnEnv) -> None:
    verifier, sender = remote(env)
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    sender.gate.clear()
    first = asyncio.ensure_future(verifier.verify("tx-a", pid, epoch, [(TOPIC, 0)], False))
    await asyncio.sleep(0)
    # Both wait for the request in flight; then they need one request each.
    stale = asyncio.ensure_future(verifier.verify("tx-a", pid, epoch - 1, [(TOPIC, 0)], False))
    current = asyncio.ensure_future(verifier.verify("tx-a", pid, epoch, [(TOPIC, 0)], False))
    await asyncio.sleep(0)
    sender.gate.set()
    assert await first == {(TOPIC, 0): E.none}
    assert await stale == {(TOPIC, 0): E.invalid_producer_epoch}
    assert await current == {(TOPIC, 0): E.none}
    assert [len(r.transactions) for r in sender.requests] == [1, 1, 1]


async def test_an_unreachable_coordinator_is_a_network_exception(env: TxnEnv) -> None:
    verifier, sender = remote(env)
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    sender.failure = ChannelError("connection refused")
    codes = await verifier.verify("tx-a", pid, epoch, [(TOPIC, 0)], abortable=False)
    assert codes == {(TOPIC, 0): E.network_exception}


@pytest.mark.parametrize(
    ("top_level", "answered"),
    [
        (E.cluster_authorization_failed, E.invalid_txn_state),
        (E.coordinator_not_available, E.coordinator_not_available),
    ],
)
async def test_a_request_level_error_answers_every_partition(
    env: TxnEnv, top_level: ErrorCode, answered: ErrorCode
) -> None:
    verifier, sender = remote(env)
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    sender.error_code = top_level
    codes = await verifier.verify("tx-a", pid, epoch, [(TOPIC, 0), (TOPIC, 1)], False)
    assert codes == {(TOPIC, 0): answered, (TOPIC, 1): answered}


async def test_closing_answers_verifications_still_waiting(env: TxnEnv) -> None:
    verifier, sender = remote(env)
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    sender.gate.clear()
    waiting = asyncio.ensure_future(verifier.verify("tx-a", pid, epoch, [(TOPIC, 0)], False))
    await asyncio.sleep(0.01)
    await verifier.close()
    assert await asyncio.wait_for(waiting, 1) == {(TOPIC, 0): E.network_exception}


# -- Produce -----------------------------------------------------------------------------


@dataclass
class CountingVerifier:
    """The real verifier, counting the partitions it is asked about."""

    inner: TransactionVerifier
    asked: list[tuple[str, int]] = field(default_factory=list)

    async def verify(self, *args: Any, **kwargs: Any) -> dict[tuple[str, int], ErrorCode]:
        self.asked.extend(sorted(args[3]))
        return await self.inner.verify(*args, **kwargs)


def produce_services(env: TxnEnv, verifier: TransactionVerifier) -> Any:
    def partition(topic: str, index: int) -> Partition:
        found = env.replicas.get(topic, index)
        assert found is not None
        return found

    return SimpleNamespace(partition=partition, verifier=CountingVerifier(verifier))


def batch(pid: int, epoch: int, sequence: int = 0, transactional: bool = True) -> bytes:
    return build_batch(
        [NewRecord(None, b"v")],
        options=BatchOptions(
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
            transactional=transactional,
        ),
    )


async def produce(
    services: Any,
    batches: dict[int, bytes],
    transactional_id: str | None = "tx-a",
    version: int = 9,
) -> dict[int, ErrorCode]:
    api = schema(0, version)
    ctx = SimpleNamespace(api=api, version=version)
    request = api.request(
        transactional_id=transactional_id,
        acks=1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            api.make_request(
                "TopicProduceData",
                name=TOPIC,
                partition_data=tuple(
                    api.make_request("PartitionProduceData", index=i, records=records)
                    for i, records in batches.items()
                ),
            ),
        ),
    )
    response = await handle_produce(services, ctx, request)  # type: ignore[arg-type]
    api.encode_body(response)
    return {p.index: p.error_code for t in response.responses for p in t.partition_responses}


def log_end(env: TxnEnv, index: int) -> int:
    partition = env.replicas.get(TOPIC, index)
    assert partition is not None
    return partition.log.log_end_offset


@pytest.mark.parametrize(
    ("version", "code"), [(9, E.invalid_txn_state), (11, E.transaction_abortable)]
)
async def test_a_transactional_batch_for_a_partition_not_in_the_transaction_is_refused(
    env: TxnEnv, version: int, code: ErrorCode
) -> None:
    services = produce_services(env, local(env))
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    assert await produce(services, {1: batch(pid, epoch)}, version=version) == {1: code}
    assert log_end(env, 1) == 0, "nothing may be appended, no transaction opened"


async def test_the_first_batch_is_verified_and_the_ones_after_it_are_not(env: TxnEnv) -> None:
    services = produce_services(env, local(env))
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    assert await produce(services, {0: batch(pid, epoch, 0)}) == {0: E.none}
    assert await produce(services, {0: batch(pid, epoch, 1)}) == {0: E.none}
    assert services.verifier.asked == [(TOPIC, 0)]
    assert log_end(env, 0) == 2


async def test_a_borrowed_producer_id_with_a_newer_epoch_is_checked_even_mid_transaction(
    env: TxnEnv,
) -> None:
    services = produce_services(env, local(env))
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    await env.begin("tx-b", (TOPIC, 0))
    assert await produce(services, {0: batch(pid, epoch, 0)}) == {0: E.none}
    refused = await produce(services, {0: batch(pid, epoch + 1, 0)}, transactional_id="tx-b")
    assert refused == {0: E.invalid_producer_id_mapping}
    assert log_end(env, 0) == 1


async def test_an_unreachable_coordinator_is_not_enough_replicas(env: TxnEnv) -> None:
    verifier, sender = remote(env)
    services = produce_services(env, verifier)
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    sender.failure = ChannelError("connection refused")
    assert await produce(services, {0: batch(pid, epoch)}) == {0: E.not_enough_replicas}
    sender.failure = None
    assert await produce(services, {0: batch(pid, epoch)}) == {0: E.none}


async def test_transactional_batches_need_the_requests_transactional_id(env: TxnEnv) -> None:
    services = produce_services(env, local(env))
    pid, epoch = await env.begin("tx-a", (TOPIC, 0))
    codes = await produce(services, {0: batch(pid, epoch)}, transactional_id=None)
    assert codes == {0: E.transactional_id_authorization_failed}


async def test_two_transactional_producers_in_one_request_are_refused(env: TxnEnv) -> None:
    services = produce_services(env, local(env))
    a = await env.begin("tx-a", (TOPIC, 0), (TOPIC, 1))
    b = await env.begin("tx-b", (TOPIC, 1))
    codes = await produce(services, {0: batch(*a), 1: batch(*b)})
    assert codes == {0: E.invalid_producer_id_mapping, 1: E.invalid_producer_id_mapping}
    assert services.verifier.asked == []


async def test_idempotent_batches_are_not_verified(env: TxnEnv) -> None:
    services = produce_services(env, local(env))
    assert await produce(services, {0: batch(55, 0, transactional=False)}, None) == {0: E.none}
    assert services.verifier.asked == []


# -- TxnOffsetCommit -----------------------------------------------------------------------


@dataclass
class FakeGroups:
    """The group coordinator as the handler sees it: it records what it was asked to write."""

    owner: ErrorCode | None = None
    commits: list[tuple[Any, ...]] = field(default_factory=list)

    def owner_error(self, group_id: str) -> ErrorCode | None:
        return self.owner

    def partition_of(self, group_id: str) -> int:
        return OFFSETS_PARTITION

    async def commit_transactional_offsets(
        self, group_id: str, producer_id: int, producer_epoch: int, *rest: Any
    ) -> dict[tuple[str, int], ErrorCode]:
        self.commits.append((group_id, producer_id, producer_epoch))
        return dict.fromkeys(rest[-1], self.owner or E.none)


async def txn_offset_commit(
    verifier: Any, groups: FakeGroups, transactional_id: str, pid: int, epoch: int
) -> set[ErrorCode]:
    api = schema(28, 3)
    ctx = SimpleNamespace(api=api, version=3)
    request = api.request(
        transactional_id=transactional_id,
        group_id="g",
        producer_id=pid,
        producer_epoch=epoch,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=(
            api.make_request(
                "TxnOffsetCommitRequestTopic",
                name=TOPIC,
                partitions=(
                    api.make_request(
                        "TxnOffsetCommitRequestPartition",
                        partition_index=0,
                        committed_offset=10,
                        committed_leader_epoch=-1,
                        committed_metadata="",
                    ),
                ),
            ),
        ),
    )
    services = SimpleNamespace(groups=groups, verifier=verifier, clock=lambda: 0)
    response = await handle_txn_offset_commit(services, ctx, request)  # type: ignore[arg-type]
    api.encode_body(response)
    return {p.error_code for t in response.topics for p in t.partitions}


async def test_txn_offset_commit_with_another_tenants_producer_id_writes_nothing(
    env: TxnEnv,
) -> None:
    groups = FakeGroups()
    owner_pid, owner_epoch = await env.init("tenant-a")
    await env.coordinator.add_offsets("tenant-a", owner_pid, owner_epoch, "g")
    await env.init("tenant-b")
    codes = await txn_offset_commit(local(env), groups, "tenant-b", owner_pid, owner_epoch + 1)
    assert codes == {E.invalid_producer_id_mapping}
    assert groups.commits == []


async def test_txn_offset_commit_after_add_offsets_to_txn_is_written(env: TxnEnv) -> None:
    groups = FakeGroups()
    pid, epoch = await env.init("tx-a")
    assert await txn_offset_commit(local(env), groups, "tx-a", pid, epoch) == {E.invalid_txn_state}
    assert groups.commits == []
    await env.coordinator.add_offsets("tx-a", pid, epoch, "g")
    assert await txn_offset_commit(local(env), groups, "tx-a", pid, epoch) == {E.none}
    assert groups.commits == [("g", pid, epoch)]


async def test_txn_offset_commit_to_a_broker_not_coordinating_the_group_asks_nobody(
    env: TxnEnv,
) -> None:
    groups = FakeGroups(owner=E.not_coordinator)
    verifier = CountingVerifier(local(env))
    assert await txn_offset_commit(verifier, groups, "tx-a", 1, 0) == {E.not_coordinator}
    assert verifier.asked == []


async def test_txn_offset_commit_with_an_unreachable_coordinator_is_retried_by_the_client(
    env: TxnEnv,
) -> None:
    verifier, sender = remote(env)
    groups = FakeGroups()
    pid, epoch = await env.init("tx-a")
    await env.coordinator.add_offsets("tx-a", pid, epoch, "g")
    sender.failure = ChannelError("connection refused")
    codes = await txn_offset_commit(verifier, groups, "tx-a", pid, epoch)
    assert codes == {E.coordinator_load_in_progress}
    assert groups.commits == []
