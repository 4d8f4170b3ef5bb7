"""LeaderEpochCache: assigning epochs, OffsetForLeaderEpoch answers, truncation, persistence."""

from __future__ import annotations

from pathlib import Path

import pytest
from shoal.broker.log.checkpoint import CheckpointError
from shoal.broker.log.epochs import FILE_NAME, UNDEFINED, LeaderEpochCache


@pytest.fixture
def cache(tmp_path: Path) -> LeaderEpochCache:
    cache = LeaderEpochCache(tmp_path)
    for epoch, start in ((1, 0), (3, 100), (5, 250)):
        cache.assign(epoch, start)
    return cache


def test_empty_cache(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    assert cache.entries == []
    assert cache.latest_epoch == UNDEFINED
    assert cache.epoch_for_offset(0) == UNDEFINED
    assert cache.end_offset_for(0, 10) == (UNDEFINED, UNDEFINED)
    assert not (tmp_path / FILE_NAME).exists()


def test_assign_appends_newer_epochs_only(cache: LeaderEpochCache) -> None:
    assert cache.entries == [(1, 0), (3, 100), (5, 250)]
    assert cache.latest_epoch == 5
    cache.assign(5, 300)  # the current epoch keeps its start
    cache.assign(4, 300)  # an older epoch is ignored
    cache.assign(-1, 300)
    assert cache.entries == [(1, 0), (3, 100), (5, 250)]


def test_assign_of_a_new_epoch_drops_entries_at_or_after_its_start(cache) -> None:
    cache.assign(7, 100)
    assert cache.entries == [(1, 0), (7, 100)]


def test_epoch_for_offset(cache: LeaderEpochCache) -> None:
    assert cache.epoch_for_offset(0) == 1
    assert cache.epoch_for_offset(99) == 1
    assert cache.epoch_for_offset(100) == 3
    assert cache.epoch_for_offset(10**9) == 5


def test_end_offset_for_the_latest_epoch_is_the_log_end(cache: LeaderEpochCache) -> None:
    assert cache.end_offset_for(5, 400) == (5, 400)


def test_end_offset_for_an_older_epoch_is_the_next_epochs_start(cache) -> None:
    assert cache.end_offset_for(1, 400) == (1, 100)
    assert cache.end_offset_for(3, 400) == (3, 250)


def test_end_offset_for_an_unknown_epoch_between_two_is_the_one_below(cache) -> None:
    assert cache.end_offset_for(2, 400) == (1, 100)
    assert cache.end_offset_for(4, 400) == (3, 250)


def test_end_offset_for_an_epoch_below_the_first_is_where_the_first_starts(tmp_path: Path):
    # Kafka's LeaderEpochFileCache.endOffsetFor answers (requested epoch, first
    # start offset) here, so a follower replicates from the leader's log start.
    cache = LeaderEpochCache(tmp_path)
    cache.assign(3, 100)
    cache.assign(5, 250)
    assert cache.end_offset_for(1, 400) == (1, 100)


def test_end_offset_for_undefined_or_a_newer_epoch_is_undefined(cache) -> None:
    assert cache.end_offset_for(UNDEFINED, 400) == (UNDEFINED, UNDEFINED)
    assert cache.end_offset_for(6, 400) == (UNDEFINED, UNDEFINED)


def test_truncate_from_end_forgets_epochs_starting_at_or_after(cache) -> None:
    cache.truncate_from_end(251)
    assert cache.entries == [(1, 0), (3, 100), (5, 250)]
    cache.truncate_from_end(250)
    assert cache.entries == [(1, 0), (3, 100)]
    cache.truncate_from_end(0)
    assert cache.entries == []


def test_truncate_from_start_moves_the_covering_epochs_start(cache) -> None:
    cache.truncate_from_start(150)
    assert cache.entries == [(3, 150), (5, 250)]
    cache.truncate_from_start(250)
    assert cache.entries == [(5, 250)]
    cache.truncate_from_start(10)
    assert cache.entries == [(5, 250)]


def test_truncate_from_start_before_the_first_entry_keeps_everything(cache) -> None:
    cache.truncate_from_start(0)
    assert cache.entries == [(1, 0), (3, 100), (5, 250)]


def test_every_change_is_persisted_in_kafkas_checkpoint_format(cache, tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    assert path.read_text() == "0\n3\n1 0\n3 100\n5 250\n"
    cache.truncate_from_start(120)
    assert path.read_text() == "0\n2\n3 120\n5 250\n"
    assert LeaderEpochCache(tmp_path).entries == cache.entries
    cache.truncate_from_end(250)
    assert LeaderEpochCache(tmp_path).entries == [(3, 120)]
    cache.assign(9, 300)
    assert LeaderEpochCache(tmp_path).entries == [(3, 120), (9, 300)]


def test_unparseable_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text("0\n1\n3 x\n")
    with pytest.raises(CheckpointError):
        LeaderEpochCache(tmp_path)


def test_epochs_survive_a_log_reopen(open_log, helpers) -> None:
    log = open_log()
    log.append_as_leader(helpers.make_batch(2), 2)
    log.append_as_leader(helpers.make_batch(2), 6)
    log.close()
    log = open_log(recovery_point=4)
    assert log.epochs.entries == [(2, 0), (6, 2)]
    assert log.epochs.end_offset_for(2, log.log_end_offset) == (2, 2)
    assert log.epochs.end_offset_for(6, log.log_end_offset) == (6, 4)


def test_epochs_beyond_the_recovered_log_end_are_dropped_on_open(open_log, helpers, log_dir):
    log = open_log()
    log.append_as_leader(helpers.make_batch(2), 2)
    log.close()
    # A checkpoint that ran ahead of the data (the data was lost in a crash).
    (log_dir / FILE_NAME).write_text("0\n2\n2 0\n7 2\n")
    log = open_log(clean_shutdown=False)
    assert log.epochs.entries == [(2, 0)]
