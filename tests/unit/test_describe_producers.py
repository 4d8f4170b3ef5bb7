"""DescribeProducers (61) on the broker: each hosted replica's producer state per
partition, a follower's too (``find-hanging --broker-id`` asks every replica), and
Kafka's errors where this broker cannot answer for a partition."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from shoal.broker.handlers import API_VERSIONS, DESCRIBE_PRODUCERS, build_handlers
from shoal.broker.handlers.describe_producers import handle_describe_producers
from shoal.broker.log.producer_state import BatchMetadata, ProducerEntry, ProducerStateManager
from shoal.broker.partition import NotLeaderError, UnknownPartitionError

from shoal.wire import ErrorCode, schema

E = ErrorCode


class FakePartition:
    def __init__(self, state: ProducerStateManager) -> None:
        self.log = SimpleNamespace(producer_state=state)


def services(
    partitions: dict[tuple[str, int], FakePartition], elsewhere: frozenset[tuple[str, int]]
) -> Any:
    """BrokerServices.partition: a hosted replica (leader or follower), NotLeaderError
    for a partition of the cluster with no replica here, UnknownPartitionError else."""

    def partition(topic: str, index: int) -> FakePartition:
        if (topic, index) in elsewhere:
            raise NotLeaderError(f"no replica of {topic}-{index} here")
        if (topic, index) not in partitions:
            raise UnknownPartitionError(f"unknown partition {topic}-{index}")
        return partitions[topic, index]

    return SimpleNamespace(partition=partition)


def producer_state(tmp_path: Path) -> ProducerStateManager:
    state = ProducerStateManager(tmp_path)
    state.producers[9] = ProducerEntry(
        9, 3, deque([BatchMetadata(0, 4, 10, 14, 1_700_000_000_000)]), 1_700_000_000_000, 2, 10
    )
    state.producers[4] = ProducerEntry(4, 0, last_timestamp=5)
    return state


def test_describe_producers_is_registered() -> None:
    assert API_VERSIONS[DESCRIBE_PRODUCERS] == (0, 0)
    assert build_handlers()[DESCRIBE_PRODUCERS] is handle_describe_producers


async def test_describe_producers_answers_each_hosted_replicas_producer_state(
    tmp_path: Path,
) -> None:
    api = schema(DESCRIBE_PRODUCERS, 0)
    request = api.request(
        topics=(api.make_request("TopicRequest", name="t", partition_indexes=(0, 1, 5)),)
    )
    fake = services(
        {("t", 0): FakePartition(producer_state(tmp_path))}, elsewhere=frozenset({("t", 1)})
    )

    response = await handle_describe_producers(fake, SimpleNamespace(api=api), request)

    body, _ = api.read_response(memoryview(api.encode_body(response)), 0)
    (topic,) = body.topics
    hosted, elsewhere, unknown = topic.partitions
    assert hosted.error_code == E.none
    assert [
        (
            p.producer_id,
            p.producer_epoch,
            p.last_sequence,
            p.last_timestamp,
            p.coordinator_epoch,
            p.current_txn_start_offset,
        )
        for p in hosted.active_producers
    ] == [(4, 0, -1, 5, -1, -1), (9, 3, 4, 1_700_000_000_000, 2, 10)]
    assert (elsewhere.partition_index, elsewhere.error_code) == (1, E.not_leader_or_follower)
    assert (unknown.partition_index, unknown.error_code) == (5, E.unknown_topic_or_partition)
    assert elsewhere.active_producers == unknown.active_producers == ()
