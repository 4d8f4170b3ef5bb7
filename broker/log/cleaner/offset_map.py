"""The key -> last offset map over a log's dirty part (Kafka's OffsetMap).

Kafka stores an MD5 of each key in a fixed buffer (``log.cleaner.dedupe.buffer.size``)
and ignores collisions; here the keys themselves are the map's keys, so a
collision cannot drop a live record, and the buffer size only bounds how many
keys one clean maps (24 bytes an entry at Kafka's 0.9 load factor, as Kafka
counts). When the map is full, it ends at a batch boundary: the clean then
covers the log only up to there and the next clean continues from it.

Markers and the records of aborted transactions are never mapped (see
:mod:`.transactions`): an aborted record must not hide a committed one.

Runs in a cleaner worker thread, on :class:`~.source.SegmentSource` objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from shoal.broker.log.cleaner.batches import scan_records
from shoal.broker.log.cleaner.source import SegmentSource
from shoal.broker.log.cleaner.transactions import TransactionPass

ENTRY_BYTES: Final = 24
LOAD_FACTOR: Final = 0.9


def max_entries(dedupe_buffer_bytes: int, threads: int) -> int:
    """Keys one clean may map, from Kafka's settings: the buffer is shared by the threads."""
    return max(1, int(dedupe_buffer_bytes / max(threads, 1) / ENTRY_BYTES * LOAD_FACTOR))


@dataclass(slots=True)
class OffsetMap:
    offsets: dict[bytes, int]
    end_offset: int
    """One past the last offset the map covers: records from here on are kept unread."""
    bytes_read: int = 0
    records_read: int = 0


def build_offset_map(
    sources: Sequence[SegmentSource],
    start: int,
    end: int,
    limit: int,
    throttle: Callable[[int], None] | None = None,
    check_done: Callable[[], None] | None = None,
    max_record_bytes: int | None = None,
    aborted: TransactionPass | None = None,
) -> OffsetMap:
    """Map each key in [start, end) to its last offset, in at most ``limit`` keys."""
    result = OffsetMap({}, start)
    offsets = result.offsets
    for source in sources:
        for header, data in source.batches(throttle):
            if check_done is not None:
                check_done()
            skip = aborted is not None and aborted.is_aborted(header)
            if header.next_offset <= start:
                continue
            if header.base_offset >= end:
                return result
            if offsets and len(offsets) + header.records_count > limit:
                return result
            result.bytes_read += header.size
            if not header.is_control and not skip:
                for record in scan_records(data, header, max_record_bytes):
                    result.records_read += 1
                    if record.key is not None and start <= record.offset < end:
                        offsets[record.key] = record.offset
            result.end_offset = min(header.next_offset, end)
    return result
