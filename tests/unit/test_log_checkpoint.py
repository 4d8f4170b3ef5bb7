"""Checkpoint files: Kafka's text format, atomic replacement, and refusing what does not parse."""

from __future__ import annotations

from pathlib import Path

import pytest
from shoal.broker.log.checkpoint import (
    CheckpointError,
    read_epochs,
    read_offsets,
    write_atomically,
    write_epochs,
    write_offsets,
)


def test_offsets_checkpoint_is_kafkas_format(tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    write_offsets(path, {("orders", 0): 42, ("my.topic-x", 11): 0})
    assert path.read_text() == "0\n2\norders 0 42\nmy.topic-x 11 0\n"


def test_offsets_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    offsets = {("a", 0): 1, ("a", 1): 2**40, ("b-c", 3): 0}
    write_offsets(path, offsets)
    assert read_offsets(path) == offsets


def test_empty_offsets_checkpoint_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    write_offsets(path, {})
    assert path.read_text() == "0\n0\n"
    assert read_offsets(path) == {}


def test_absent_checkpoint_reads_as_empty(tmp_path: Path) -> None:
    assert read_offsets(tmp_path / "missing") == {}
    assert read_epochs(tmp_path / "missing") == []


def test_epochs_checkpoint_is_kafkas_format(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    write_epochs(path, [(0, 0), (3, 120), (7, 4000)])
    assert path.read_text() == "0\n3\n0 0\n3 120\n7 4000\n"
    assert read_epochs(path) == [(0, 0), (3, 120), (7, 4000)]


def test_write_replaces_atomically_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    write_offsets(path, {("t", 0): 1})
    write_offsets(path, {("t", 0): 2})
    assert read_offsets(path) == {("t", 0): 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp"]


def test_a_torn_temp_file_from_a_crash_does_not_affect_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    write_offsets(path, {("t", 0): 7})
    # A crash between writing cp.tmp and renaming it leaves a half-written temp file.
    (tmp_path / "cp.tmp").write_text("0\n5\nt 0")
    assert read_offsets(path) == {("t", 0): 7}
    write_atomically(path, "0\n1\nt 0 8\n")
    assert read_offsets(path) == {("t", 0): 8}
    assert not (tmp_path / "cp.tmp").exists()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty file"),
        ("0\n", "no count line"),
        ("1\n1\nt 0 5\n", "unknown version"),
        ("0\ntwo\nt 0 5\n", "count is not a number"),
        ("0\n2\nt 0 5\n", "fewer entries than the count"),
        ("0\n1\nt 0 5\nt 1 6\n", "more entries than the count"),
        ("0\n1\nt 0\n", "missing field"),
        ("0\n1\nt 0 5 9\n", "extra field"),
        ("0\n1\nt zero 5\n", "partition is not a number"),
        ("0\n1\nt 0 five\n", "offset is not a number"),
    ],
)
def test_unparseable_offsets_checkpoint_raises_checkpoint_error(
    tmp_path: Path, text: str, reason: str
) -> None:
    path = tmp_path / "cp"
    path.write_text(text)
    with pytest.raises(CheckpointError):
        read_offsets(path)


@pytest.mark.parametrize(
    "text",
    [
        "0\n1\n5\n",
        "0\n1\n5 10 15\n",
        "0\n1\nfive 10\n",
        "0\n1\n5 ten\n",
        "0\n2\n5 10\n",
        "2\n1\n5 10\n",
    ],
)
def test_unparseable_epochs_checkpoint_raises_checkpoint_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text(text)
    with pytest.raises(CheckpointError):
        read_epochs(path)
