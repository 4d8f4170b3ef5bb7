"""A cleaned __consumer_offsets partition loads the same groups as the full history.

The coordinator replays its partition batch by batch; after a clean the log
has gaps and may hold empty batches, and it must come back with the same
committed offsets from far fewer records.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from coordinator_fixtures import OFFSETS_TOPIC, CoordinatorEnv, coordinator_env, offset
from shoal.broker.log.cleaner.cleanable import log_to_clean
from shoal.broker.log.cleaner.cleaner import Cleaner
from shoal.broker.log.log import Log

from shoal.records import iter_batches, iter_records


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[CoordinatorEnv]:
    async with coordinator_env(tmp_path / "data") as built:
        yield built


def _record_count(log: Log) -> int:
    count = 0
    for segment in log.segments:
        data = os.pread(segment.fd, segment.size, 0)
        for position, header in iter_batches(data):
            count += len(list(iter_records(data[position : position + header.size])))
    return count


async def test_a_cleaned_offsets_partition_loads_the_same_offsets(env: CoordinatorEnv) -> None:
    for n in range(50):
        await env.commit("simple", {("t", 0): offset(n), ("t", 1): offset(100 + n)})
        await env.commit("other", {("u", 0): offset(n)})
    await env.coordinator.delete_offsets("other", [("u", 0)])
    before = env.coordinator.fetch_offsets("simple", None)
    partition = env.replicas.get(OFFSETS_TOPIC, 0)
    assert partition is not None
    log = partition.log
    history = _record_count(log)
    log.roll()
    target = log_to_clean(log, None, log.clock())
    await Cleaner(max_map_entries=1000).clean(log, target)
    assert _record_count(log) < history / 10
    reloaded = await env.reload()
    assert reloaded.fetch_offsets("simple", None) == before
    assert reloaded.fetch_offsets("other", None)[1] == {}
