"""Kafka's checkpoint files, written atomically.

Both formats are Kafka's, so an operator recognises them::

    recovery-point-offset-checkpoint,      leader-epoch-checkpoint
    replication-offset-checkpoint, ...     (one per partition directory)
        0                                      0
        <entry count>                          <entry count>
        <topic> <partition> <offset>           <epoch> <start offset>

A checkpoint is written to ``<name>.tmp``, fsynced, renamed over the old file
and the directory fsynced: a crash leaves the old file or the new one, never
a mix. A file that does not parse is reported, not guessed at.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

VERSION: Final = "0"


class CheckpointError(ValueError):
    pass


def write_atomically(path: Path, text: str) -> None:
    write_atomically_bytes(path, text.encode())


def write_atomically_bytes(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` whole: a reader sees the old file or the new one.

    Without ``sync`` nothing is fsynced: after a crash the file may be missing,
    empty or torn, so only for files whose reader checks them (a CRC) and has
    another way (a producer state snapshot: an older one and the log); the
    caller fsyncs it later with :func:`fsync_files`.
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def fsync_files(paths: list[Path]) -> None:
    """fsync each file still there, then their directories (a file since removed or
    replaced needs nothing more)."""
    directories = set()
    for path in paths:
        try:
            _fsync_path(path)
        except FileNotFoundError:
            continue
        directories.add(path.parent)
    for directory in directories:
        fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    _fsync_path(directory)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_lines(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    if len(lines) < 2 or lines[0].strip() != VERSION:
        raise CheckpointError(f"{path}: not a version {VERSION} checkpoint")
    try:
        count = int(lines[1])
    except ValueError:
        raise CheckpointError(f"{path}: bad entry count {lines[1]!r}") from None
    entries = [line for line in lines[2:] if line.strip()]
    if len(entries) != count:
        raise CheckpointError(f"{path}: {len(entries)} entries, header says {count}")
    return entries


def write_offsets(path: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    body = "".join(
        f"{topic} {partition} {offset}\n" for (topic, partition), offset in offsets.items()
    )
    write_atomically(path, f"{VERSION}\n{len(offsets)}\n{body}")


def read_offsets(path: Path) -> dict[tuple[str, int], int]:
    """Offsets by (topic, partition); an absent file is an empty checkpoint."""
    if not path.exists():
        return {}
    offsets: dict[tuple[str, int], int] = {}
    for line in _read_lines(path):
        parts = line.split()
        if len(parts) != 3:
            raise CheckpointError(f"{path}: bad line {line!r}")
        topic, partition, offset = parts
        offsets[(topic, _int(path, partition))] = _int(path, offset)
    return offsets


def write_epochs(path: Path, entries: Iterable[tuple[int, int]]) -> None:
    items = list(entries)
    body = "".join(f"{epoch} {offset}\n" for epoch, offset in items)
    write_atomically(path, f"{VERSION}\n{len(items)}\n{body}")


def read_epochs(path: Path) -> list[tuple[int, int]]:
    if not path.exists():
        return []
    entries = []
    for line in _read_lines(path):
        parts = line.split()
        if len(parts) != 2:
            raise CheckpointError(f"{path}: bad line {line!r}")
        entries.append((_int(path, parts[0]), _int(path, parts[1])))
    return entries


def _int(path: Path, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CheckpointError(f"{path}: {text!r} is not a number") from None
