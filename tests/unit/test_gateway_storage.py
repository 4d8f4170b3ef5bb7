"""A tenant's storage from a survey of the brokers, and how often the brokers are asked."""

from __future__ import annotations

import asyncio

from kio.schema.describe_log_dirs.v4 import response as v4
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64
from shoal.gateway.namespace import Namespace
from shoal.gateway.storage import (
    StorageSurveyor,
    Survey,
    TopicStorage,
    log_dir_sizes,
    tenant_storage,
)

SURVEY = Survey(
    taken_at=0.0,
    leaders={
        ("acme.orders", 0): 1,
        ("acme.orders", 1): 2,
        ("acme.empty", 0): 1,
        ("globex.orders", 0): 1,
    },
    sizes={
        1: {("acme.orders", 0): 100, ("acme.orders", 1): 70, ("globex.orders", 0): 999},
        2: {("acme.orders", 0): 90, ("acme.orders", 1): 80},
    },
    complete=True,
)


def test_leader_bytes_count_each_partitions_leader_and_replica_bytes_count_all() -> None:
    storage = tenant_storage(SURVEY, Namespace("acme"))
    assert storage.topics == {
        "empty": TopicStorage(0, 0),
        "orders": TopicStorage(leader_bytes=100 + 80, replica_bytes=100 + 90 + 70 + 80),
    }
    assert (storage.leader_bytes, storage.replica_bytes) == (180, 340)


def test_other_tenants_topics_never_count() -> None:
    assert tenant_storage(SURVEY, Namespace("globex")).topics == {"orders": TopicStorage(999, 999)}
    assert tenant_storage(SURVEY, Namespace("initech")).topics == {}


def _partition(index: int, size: int, future: bool = False) -> v4.DescribeLogDirsPartition:
    return v4.DescribeLogDirsPartition(
        partition_index=i32(index),
        partition_size=i64(size),
        offset_lag=i64(0),
        is_future_key=future,
    )


def test_a_log_dirs_answer_skips_failed_dirs_and_future_logs() -> None:
    topic = v4.DescribeLogDirsTopic(
        name="acme.orders", partitions=(_partition(0, 10), _partition(1, 5, True))
    )
    good = v4.DescribeLogDirsResult(error_code=ErrorCode.none, log_dir="/a", topics=(topic,))
    bad = v4.DescribeLogDirsResult(
        error_code=ErrorCode.kafka_storage_error, log_dir="/b", topics=(topic,)
    )
    response = v4.DescribeLogDirsResponse(
        throttle_time=0, error_code=ErrorCode.none, results=(good, bad)
    )
    assert log_dir_sizes(response) == {("acme.orders", 0): 10}


class _CountingSurveyor(StorageSurveyor):
    def __init__(self, clock: list[float]) -> None:
        super().__init__(cluster=None, ttl_s=5.0, clock=lambda: clock[0])  # type: ignore[arg-type]
        self.taken = 0

    async def _take(self) -> Survey:
        self.taken += 1
        await asyncio.sleep(0)
        return SURVEY


def test_surveys_are_shared_by_concurrent_askers_and_kept_for_the_ttl() -> None:
    now = [100.0]
    surveyor = _CountingSurveyor(now)

    async def go() -> None:
        await asyncio.gather(*(surveyor.survey() for _ in range(10)))
        assert surveyor.taken == 1
        now[0] += 4.9
        await surveyor.survey()
        assert surveyor.taken == 1
        now[0] += 0.2
        await surveyor.survey()
        assert surveyor.taken == 2

    asyncio.run(go())
