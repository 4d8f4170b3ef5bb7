"""What a history is made of: one event per client action, one JSON object per line.

A history records what clients saw, never what the servers say about
themselves, so the checker judges a cluster as its users do. Values are
unique per send (``<producer>-<sequence>``), which is what lets the checker
tell a lost write from a duplicate and a phantom read from a moved record.

Kinds of event:

- ``send``: a producer handed a value to its client (``producer``, ``seq``,
  ``value``, ``partition``).
- ``ack``: the delivery report for a value: ``partition``/``offset``/``epoch``
  (the leader epoch the broker wrote it in) when acknowledged, or ``error``
  (a Kafka error name) when the client gave up on it.
- ``poll``: a group member read ``value`` at ``partition``/``offset``.
- ``commit``: a group member's commit of ``offset`` for ``partition``
  succeeded (``group`` names the group).
- ``final``: the closing read of every partition from its start to its end,
  after the faults stopped: the log as it stands.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any


class Kind(StrEnum):
    SEND = "send"
    ACK = "ack"
    POLL = "poll"
    COMMIT = "commit"
    FINAL = "final"


@dataclass(frozen=True, slots=True)
class Event:
    kind: Kind
    time: float
    """Seconds since the run began (monotonic clock)."""
    client: str = ""
    """The producer or consumer that saw the event."""
    value: str = ""
    partition: int = -1
    offset: int = -1
    seq: int = -1
    """A send's place in its producer's order."""
    epoch: int = -1
    """The leader epoch of an acknowledged write, when the client reports it."""
    error: str = ""
    group: str = ""

    def to_json(self) -> str:
        defaults = Event(self.kind, 0.0)
        # Fields left at their defaults are left out: histories run to millions of lines.
        fields: dict[str, Any] = {
            name: value
            for name, value in asdict(self).items()
            if name == "time" or value != getattr(defaults, name)
        }
        fields["kind"] = self.kind.value
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Event:
        fields = json.loads(line)
        return cls(kind=Kind(fields.pop("kind")), **fields)


def write_history(path: Path, events: Iterable[Event]) -> None:
    with path.open("w") as out:
        for event in events:
            out.write(event.to_json() + "\n")


def read_history(path: Path) -> Iterator[Event]:
    with path.open() as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    yield Event.from_json(line)
                except (ValueError, TypeError, KeyError) as exc:
                    raise ValueError(f"{path}:{number}: not a history event: {exc}") from exc
