"""A process killed at every step of a clean restarts with a correct log.

For each seed, a random keyed workload (updates, tombstones, every codec,
idempotent batches, small segments) is written and cleaned once, then
written to again, so that the log has a clean part with delete horizons and
a dirty part. Then, for every step of :data:`~shoal.broker.log.cleaner.faults.STEPS`
(and the second hit of each step a clean repeats per group), a child process
opens a copy of that log and cleans it with ``SHOAL_CLEANER_FAULT`` set to
die there (``os._exit``: nothing flushed, no handler run). The log is then
reopened, as a restarted broker would, and checked against a reference
model of what was written:

* the log end offset is unchanged and offsets increase;
* every record read back is one that was written, at its original offset,
  with its key, value and timestamp;
* every key whose latest record is a value is there with that value, at its
  offset, and for every key present the last record is the latest written
  (nothing lost that was live, nothing older resurrected);
* a clean after the restart leaves at most one record per key in the part
  it cleaned.

``SHOAL_CLEANER_CRASH_SEEDS`` raises the number of seeds (default 4).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from shoal.broker.log.cleaner.cleanable import log_to_clean
from shoal.broker.log.cleaner.cleaner import Cleaner
from shoal.broker.log.cleaner.faults import ENV_VAR, EXIT_CODE, STEPS
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import Log

from shoal.records import (
    BatchOptions,
    Compression,
    NewRecord,
    build_batch,
    iter_batches,
    iter_records,
)

CHILD = Path(__file__).with_name("log_cleaner_crash_child.py")
NOW = 1_700_000_000_000
SEEDS = int(os.environ.get("SHOAL_CLEANER_CRASH_SEEDS", "4"))
REPEATED_STEPS = [s for s in STEPS if s not in ("map_built", "checkpoint_written")]

Written = dict[int, tuple[bytes, bytes | None, int]]
"""offset -> (key, value, timestamp) of every record ever appended."""


@dataclass
class Scenario:
    config: LogConfig
    written: Written
    log_end_offset: int
    checkpoint: int
    now: int


def _workload(rng: random.Random, log: Log, written: Written, batches: int, now: int) -> None:
    keys = [f"key-{i}".encode() for i in range(rng.randint(3, 12))]
    state = log.producer_state.producers.get(11)
    sequence = state.last_sequence + 1 if state is not None else 0
    for _ in range(batches):
        count = rng.randint(1, 4)
        records = []
        for _ in range(count):
            value = None if rng.random() < 0.15 else f"v{rng.random():.6f}".encode()
            records.append(NewRecord(rng.choice(keys), value, timestamp=now - rng.randint(0, 50)))
        codec = rng.choice(list(Compression))
        options = BatchOptions(compression=codec)
        if rng.random() < 0.3:
            options = dataclasses.replace(
                options, producer_id=11, producer_epoch=0, base_sequence=sequence
            )
            sequence += count
        info = log.append_as_leader(build_batch(records, 0, options), 0)
        for i, record in enumerate(records):
            assert record.key is not None and record.timestamp is not None
            written[info.first_offset + i] = (record.key, record.value, record.timestamp)
    log.roll()
    log.high_watermark = log.log_end_offset


def _scenario(seed: int, directory: Path) -> Scenario:
    rng = random.Random(seed)
    config = LogConfig(
        segment_bytes=rng.randint(250, 900),
        index_interval_bytes=rng.choice([1, 100, 4096]),
        cleanup_policy=("compact",),
        delete_retention_ms=1000,
        file_delete_delay_ms=0,
    )
    written: Written = {}
    log = Log(directory, config, 0, True, lambda: NOW)
    _workload(rng, log, written, rng.randint(15, 40), NOW)
    first = asyncio.run(_clean(log, None))
    later = NOW + rng.choice([500, 1500])
    log.clock = lambda: later
    _workload(rng, log, written, rng.randint(10, 30), later)
    end = log.log_end_offset
    log.close()
    return Scenario(config, written, end, first, later)


async def _clean(log: Log, checkpoint: int | None) -> int:
    log.high_watermark = log.log_end_offset
    target = log_to_clean(log, checkpoint, log.clock())
    return (await Cleaner(max_map_entries=1 << 20).clean(log, target)).end_offset


def _config_json(config: LogConfig) -> str:
    return json.dumps(dataclasses.asdict(config))


def _check(log: Log, scenario: Scenario, what: str) -> None:
    written = scenario.written
    assert log.log_end_offset == scenario.log_end_offset, what
    records = _read_all(log)
    offsets = [r[0] for r in records]
    assert offsets == sorted(set(offsets)), what
    last_by_key: dict[bytes, int] = {}
    for offset, key, value, timestamp in records:
        assert written[offset] == (key, value, timestamp), f"{what}: offset {offset} changed"
        last_by_key[key] = offset
    latest: dict[bytes, int] = {}
    for offset, (key, _, _) in sorted(written.items()):
        latest[key] = offset
    for key, offset in latest.items():
        if written[offset][1] is not None:
            assert last_by_key.get(key) == offset, f"{what}: live {key!r}@{offset} lost"
    for key, offset in last_by_key.items():
        assert offset == latest[key], f"{what}: {key!r} ends at {offset}, not {latest[key]}"


def _read_all(log: Log) -> list[tuple[int, bytes, bytes | None, int]]:
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fs = log.read(offset, 1 << 30, log.log_end_offset, min_one=True)
        if fs is None:
            break
        data = os.pread(fs.file.fileno(), fs.size, fs.position)
        for position, header in iter_batches(data):
            for r in iter_records(data[position : position + header.size]):
                assert r.key is not None
                out.append((r.offset, r.key, r.value, r.timestamp))
            offset = header.next_offset
    return out


def _crash_cases() -> list[tuple[int, str, int]]:
    cases = [(seed, step, 0) for seed in range(SEEDS) for step in STEPS]
    cases += [(seed, step, 1) for seed in range(SEEDS) for step in REPEATED_STEPS]
    return cases


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Scenario, Path]]:
    built = {}
    for seed in range(SEEDS):
        directory = tmp_path_factory.mktemp(f"seed{seed}") / "orders-0"
        built[seed] = (_scenario(seed, directory), directory)
    return built


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "step", "skip"), _crash_cases())
def test_a_clean_killed_at_any_step_recovers_to_a_correct_log(
    scenarios, tmp_path: Path, seed: int, step: str, skip: int
) -> None:
    scenario, original = scenarios[seed]
    directory = tmp_path / "orders-0"
    shutil.copytree(original, directory)
    env = {**os.environ, ENV_VAR: f"{step}:{skip}"}
    child = subprocess.run(
        [
            sys.executable,
            str(CHILD),
            str(directory),
            _config_json(scenario.config),
            str(scenario.now),
            str(scenario.checkpoint),
        ],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert child.returncode in (0, EXIT_CODE), child.stderr.decode()[-2000:]
    if skip == 0:
        assert child.returncode == EXIT_CODE, f"the clean never reached {step}"
    what = f"seed {seed}, killed at {step}:{skip} (exit {child.returncode})"
    log = Log(directory, scenario.config, 0, False, lambda: scenario.now)
    try:
        _check(log, scenario, what)
        end = asyncio.run(_clean(log, scenario.checkpoint))
        _check(log, scenario, what + ", cleaned again")
        keys = [key for offset, key, _, _ in _read_all(log) if offset < end]
        assert len(keys) == len(set(keys)), f"{what}: a key twice in the cleaned part"
    finally:
        log.close()
    leftovers = [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap"))]
    assert not leftovers, what
