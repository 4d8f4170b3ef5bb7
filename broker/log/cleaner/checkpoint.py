"""``cleaner-offset-checkpoint``: each compacted log's first dirty offset, per log dir.

Kafka's file and format (see :mod:`shoal.broker.log.checkpoint`), one line
per partition: ``<topic> <partition> <first dirty offset>``. Written after
every clean, atomically; a log without an entry starts dirty at its log
start offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from shoal.broker.log.checkpoint import read_offsets, write_offsets

CLEANER_CHECKPOINT: Final = "cleaner-offset-checkpoint"

TopicPartition = tuple[str, int]


def checkpoint_path(data_dir: Path) -> Path:
    return data_dir / CLEANER_CHECKPOINT


def read_cleaner_checkpoint(data_dir: Path) -> dict[TopicPartition, int]:
    return read_offsets(checkpoint_path(data_dir))


def write_cleaner_checkpoint(data_dir: Path, offsets: Mapping[TopicPartition, int]) -> None:
    write_offsets(checkpoint_path(data_dir), offsets)
