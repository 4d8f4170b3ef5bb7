"""Producing and reading records for the HTTP door.

Produce: each request's records (one, a stream, or a batch) are encoded,
given a partition (``partition_id``, else the key's partition by Kafka's
default partitioner, else round robin from a random start), grouped into one
batch per partition in request order, and sent with acks=all, one Produce per
leader. Every record gets its own result, in order: a record that cannot be
encoded or names a partition the topic lacks fails alone, and a batch the
broker finds too large is split in halves and retried until only the
offending records fail, so one oversized record does not fail its neighbours.

Read (a Shoal extension): one Fetch from the partition's leader, starting at
an offset or at the first record at or after a timestamp (ListOffsets). The
batches are decoded here (compressed ones included); records before the asked
offset (a compressed batch starts earlier) and transaction markers are
skipped. Reads are READ_UNCOMMITTED. Decoding and building the answer run in
a worker thread (the codecs release the GIL), so a large read does not stall
other requests, and decompress at most ``read_decode_limit(max_bytes)``
bytes: a batch that would exceed what is left of it ends the answer before
that batch, or, when it is the first batch with records to return, is
refused with BATCH_TOO_LARGE_TO_READ (a decompression bomb produced over the
Kafka door can inflate ~1 MB into gigabytes).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from pydantic import ValidationError
from shoal.gateway.http.encoding import (
    EncodingError,
    ObjectStream,
    ReadFormat,
    StreamError,
    b64,
    decode_data,
    encode_data,
    partition_for_key,
    unb64,
)
from shoal.gateway.http.errors import (
    ApiError,
    ErrorCode,
    kafka_error,
    kafka_error_code,
    kafka_name,
)
from shoal.gateway.http.models import (
    PRODUCE_RESULT,
    DataSize,
    ProduceRecord,
    ProduceResult,
    QuotaRefusal,
    ReadHeader,
    ReadRecord,
    ReadRecords,
    RecordData,
    TimestampKind,
)
from shoal.gateway.tenant_client import (
    EARLIEST,
    LATEST,
    KafkaCallError,
    PartitionProduced,
    QuotaExceededError,
    TenantClient,
    TopicLayout,
)
from shoal.gateway.upstream import UpstreamError

from shoal.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    CompressionError,
    DecompressedTooLargeError,
    InvalidBatchError,
    NewRecord,
    Record,
    TimestampType,
    build_batch,
    iter_records,
    parse_header,
    read_offset_and_length,
)
from shoal.wire import ErrorCode as KafkaCode

OK: Final = 200
MAX_OBJECT_BYTES: Final = 16 * 2**20
"""The longest single record object a streamed body may hold."""
KNOWN_LAYOUT_S: Final = 1.0
"""How long the topic layout a produce request read on arrival may serve its first send."""
READ_DECODE_RATIO: Final = 16
"""A read decompresses at most this many times its max_bytes (at least 1 MiB) ..."""
READ_DECODE_MAX: Final = 128 * 2**20
"""... and never more than this, whatever its max_bytes."""
_TOO_LARGE: Final = frozenset({KafkaCode.message_too_large, KafkaCode.record_list_too_large})


@dataclass(slots=True)
class _Ready:
    """A record encoded and placed, waiting for its batch."""

    index: int
    partition: int
    record: NewRecord
    key: DataSize | None
    value: DataSize | None


def _failure(code: ErrorCode, message: str, kafka: KafkaCode | None = None) -> ProduceResult:
    return ProduceResult(
        error_code=int(code),
        message=message,
        kafka_error=None if kafka is None else kafka_name(kafka),
    )


def _size(data: RecordData | None, raw: bytes | None) -> DataSize | None:
    return None if data is None or raw is None else DataSize(type=data.type, size=len(raw))


class RecordsController:
    """One request's producing or reading; keeps its round-robin position across a stream."""

    def __init__(self, client: TenantClient, cluster_id: str, topic: TopicLayout) -> None:
        self.client = client
        self.cluster_id = cluster_id
        self.topic = topic
        self._partitions = topic.partitions
        self._read_at = time.monotonic()
        self._first_send = True
        self._next = itertools.count(random.randrange(max(1, self._partitions)))  # noqa: S311

    # -- produce -------------------------------------------------------------------

    async def produce(self, items: Sequence[ProduceRecord | ProduceResult]) -> list[ProduceResult]:
        """A result per item, in order; items that are already results (parse errors) stay."""
        results: list[ProduceResult | None] = [
            item if isinstance(item, ProduceResult) else None for item in items
        ]
        groups: dict[int, list[_Ready]] = {}
        now = int(time.time() * 1000)
        for index, item in enumerate(items):
            if isinstance(item, ProduceResult):
                continue
            try:
                ready = self._prepare(index, item, now)
            except EncodingError as exc:
                results[index] = _failure(ErrorCode.INVALID_INPUT, str(exc))
                continue
            if ready.partition >= self._partitions:
                results[index] = _failure(
                    ErrorCode.PARTITION_NOT_FOUND,
                    f"topic {self.topic.name!r} has no partition {ready.partition}",
                    KafkaCode.unknown_topic_or_partition,
                )
                continue
            groups.setdefault(ready.partition, []).append(ready)
        if groups:
            try:
                for ready, result in await self._send(groups):
                    results[ready.index] = result
            except (KafkaCallError, UpstreamError, QuotaExceededError) as exc:
                failed = _call_failure(exc)
                for group in groups.values():
                    for ready in group:
                        results[ready.index] = failed
        return [r if r is not None else _failure(ErrorCode.INTERNAL, "no result") for r in results]

    def _prepare(self, index: int, item: ProduceRecord, now: int) -> _Ready:
        """``item`` encoded and placed; ``now`` is its create time when it gives none."""
        key = None if item.key is None else encode_data(item.key.type, item.key.data)
        value = None if item.value is None else encode_data(item.value.type, item.value.data)
        headers = (
            tuple((h.name, unb64(h.value, f"header {h.name!r}")) for h in item.headers)
            if item.headers
            else ()
        )
        if item.partition_id is not None:
            partition = item.partition_id
        elif key is not None:
            partition = partition_for_key(key, self._partitions)
        else:
            partition = next(self._next) % self._partitions
        timestamp = now if item.timestamp is None else int(item.timestamp.timestamp() * 1000)
        return _Ready(
            index,
            partition,
            NewRecord(key, value, headers, timestamp),
            _size(item.key, key),
            _size(item.value, value),
        )

    async def _send(self, groups: dict[int, list[_Ready]]) -> list[tuple[_Ready, ProduceResult]]:
        batches = {p: build_batch(r.record for r in group) for p, group in groups.items()}
        # The layout the request has just read serves its first send, if that comes
        # soon (not after a long body or a stream's first slow chunk): later sends
        # ask again, as leaders may have moved.
        fresh = self._first_send and time.monotonic() - self._read_at < KNOWN_LAYOUT_S
        self._first_send = False
        known = self.topic if fresh else None
        answers = await self.client.produce(self.topic.name, batches, known)
        out: list[tuple[_Ready, ProduceResult]] = []
        for partition, group in groups.items():
            answer = answers[partition]
            if answer.error in _TOO_LARGE and len(group) > 1:
                half = len(group) // 2
                out += await self._send({partition: group[:half]})
                out += await self._send({partition: group[half:]})
                continue
            out += [(ready, self._result(ready, answer, i)) for i, ready in enumerate(group)]
        return out

    def _result(self, ready: _Ready, answer: PartitionProduced, position: int) -> ProduceResult:
        if answer.error != KafkaCode.none:
            return _failure(
                kafka_error_code(answer.error, partition_scoped=True),
                answer.message or kafka_name(answer.error),
                answer.error,
            )
        timestamp = answer.log_append_time_ms
        if timestamp is None:
            timestamp = ready.record.timestamp
        assert timestamp is not None
        return ProduceResult(
            error_code=OK,
            cluster_id=self.cluster_id,
            topic_name=self.topic.name,
            partition_id=ready.partition,
            offset=answer.base_offset + position,
            timestamp=_datetime(timestamp),
            key=ready.key,
            value=ready.value,
        )

    async def produce_stream(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Results as lines of JSON, one per record, as each chunk's records are stored."""
        stream = ObjectStream(MAX_OBJECT_BYTES)
        try:
            async for chunk in chunks:
                texts = stream.feed(chunk)
                if texts:
                    for result in await self.produce([parse_record(t) for t in texts]):
                        yield _line(result)
            stream.close()
        except StreamError as exc:
            yield _line(_failure(ErrorCode.INVALID_INPUT, f"{exc}; the stream stops here"))

    # -- read ----------------------------------------------------------------------

    async def read(
        self,
        partition: int,
        offset: int | None,
        timestamp: datetime | None,
        max_records: int,
        max_bytes: int,
        fmt: ReadFormat,
    ) -> ReadRecords:
        if partition >= self.topic.partitions:
            raise ApiError(
                ErrorCode.PARTITION_NOT_FOUND,
                f"topic {self.topic.name!r} has no partition {partition}",
            )
        start = offset
        if timestamp is not None:
            found = await self.client.list_offsets(
                self.topic.name, {partition: int(timestamp.timestamp() * 1000)}
            )
            start = found[partition]
            if start < 0:  # nothing at or after it: the end
                start = (await self.client.list_offsets(self.topic.name, {partition: LATEST}))[
                    partition
                ]
        elif start is None:
            start = (await self.client.list_offsets(self.topic.name, {partition: EARLIEST}))[
                partition
            ]
        try:
            data = await self.client.fetch(self.topic.name, partition, start, max_bytes)
        except KafkaCallError as exc:
            raise kafka_error(exc.code, exc.message, partition_scoped=True) from None
        return await asyncio.to_thread(
            self._answer, data.records or b"", partition, start, max_records, max_bytes, fmt
        )

    def _answer(
        self,
        fetched: bytes,
        partition: int,
        start: int,
        max_records: int,
        max_bytes: int,
        fmt: ReadFormat,
    ) -> ReadRecords:
        """The fetched batches decoded into the answer (in a worker thread)."""
        records: list[ReadRecord] = []
        next_offset = start
        limit = read_decode_limit(max_bytes)
        try:
            for record, batch_end in fetched_records(fetched, start, limit):
                if record is None:
                    next_offset = max(next_offset, batch_end)
                    continue
                if len(records) >= max_records:
                    break
                records.append(
                    ReadRecord(
                        partition_id=partition,
                        offset=record.offset,
                        timestamp=_datetime(record.timestamp),
                        timestamp_type=record.timestamp_type,
                        key=decode_data(record.key, fmt, f"the key at offset {record.offset}"),
                        value=decode_data(
                            record.value, fmt, f"the value at offset {record.offset}"
                        ),
                        headers=[ReadHeader(name=n, value=b64(v)) for n, v in record.headers],
                    )
                )
                next_offset = record.offset + 1
        except BatchTooLargeError as exc:
            if not records:  # nothing before it: reading on from next_offset would not help
                raise ApiError(
                    ErrorCode.BATCH_TOO_LARGE_TO_READ,
                    f"the batch at offset {exc.base_offset} decompresses to more than "
                    f"{limit} bytes, the most a read with max_bytes={max_bytes} decodes "
                    f"({READ_DECODE_RATIO} x max_bytes of at least 1 MiB, at most "
                    f"{READ_DECODE_MAX // 2**20} MiB); read it with a larger "
                    "max_bytes or over the Kafka protocol",
                ) from None
            # The answer stops before that batch; next_offset points at it.
        except EncodingError as exc:
            raise ApiError(ErrorCode.UNDECODABLE_RECORD, str(exc)) from None
        except (InvalidBatchError, CompressionError) as exc:
            raise ApiError(
                ErrorCode.KAFKA_ERROR, f"a stored batch does not decode: {exc}"
            ) from None
        return ReadRecords(
            cluster_id=self.cluster_id,
            topic_name=self.topic.name,
            partition_id=partition,
            records=records,
            next_offset=next_offset,
        )


def read_decode_limit(max_bytes: int) -> int:
    """How many bytes of records a read with this max_bytes decompresses at most."""
    return min(READ_DECODE_MAX, READ_DECODE_RATIO * max(max_bytes, 2**20))


class BatchTooLargeError(Exception):
    """A fetched batch decompresses to more than what is left of the read's limit."""

    def __init__(self, base_offset: int, limit: int) -> None:
        super().__init__(f"the batch at offset {base_offset} decompresses to over {limit} bytes")
        self.base_offset = base_offset
        self.limit = limit


@dataclass(frozen=True, slots=True)
class _Decoded:
    offset: int
    timestamp: int
    timestamp_type: TimestampKind
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def fetched_records(
    buf: bytes, start: int, limit: int | None = None
) -> Iterator[tuple[_Decoded | None, int]]:
    """(record, end offset of its batch) from a fetched partition, from ``start``.

    After each whole batch comes (None, its next offset), so a caller that
    takes every record moves past offsets a batch skips (compaction, markers).
    A batch cut off at the end of the response (max_bytes) is left for the next read.
    With ``limit``, the batches decompress to at most that many bytes together:
    the batch that would go over raises BatchTooLargeError before its records.
    """
    view = memoryview(buf)
    pos = 0
    left = limit
    while pos + HEADER_SIZE <= len(view):
        _, length = read_offset_and_length(view, pos)
        end = pos + length + LOG_OVERHEAD
        if end > len(view):
            return
        batch = view[pos:end]
        pos = end
        header = parse_header(batch)
        if not header.is_control:
            kind: TimestampKind = (
                "LOG_APPEND_TIME"
                if header.timestamp_type is TimestampType.LOG_APPEND_TIME
                else "CREATE_TIME"
            )
            try:
                decoded = list(iter_records(batch, left))
            except DecompressedTooLargeError:
                raise BatchTooLargeError(header.base_offset, left or 0) from None
            if left is not None:  # what the batch's records hold, about its decoded size
                left = max(0, left - sum(_record_size(r) for r in decoded))
            for record in decoded:
                if record.offset >= start:
                    yield (
                        _Decoded(
                            record.offset,
                            record.timestamp,
                            kind,
                            record.key,
                            record.value,
                            record.headers,
                        ),
                        header.next_offset,
                    )
        yield None, header.next_offset


def _record_size(record: Record) -> int:
    return (
        len(record.key or b"")
        + len(record.value or b"")
        + sum(len(n) + len(v or b"") for n, v in record.headers)
    )


def parse_record(text: str | bytes) -> ProduceRecord | ProduceResult:
    """One streamed object as a record, or the error result that stands for it."""
    try:
        return ProduceRecord.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}" for e in exc.errors()
        )
        return _failure(ErrorCode.INVALID_INPUT, problems)


def _call_failure(exc: Exception) -> ProduceResult:
    if isinstance(exc, KafkaCallError):
        return _failure(kafka_error_code(exc.code), str(exc), exc.code)
    if isinstance(exc, QuotaExceededError):
        return QuotaRefusal(
            error_code=int(ErrorCode.TOO_MANY_REQUESTS),
            message=str(exc),
            retry_after_ms=exc.retry_after_ms,
        )
    return _failure(ErrorCode.UNAVAILABLE, f"the brokers are unreachable: {exc}")


def _line(result: ProduceResult) -> bytes:
    return PRODUCE_RESULT.dump_json(result) + b"\n"


@functools.lru_cache(maxsize=256)
def _datetime(ms: int) -> datetime:
    # Cached: the records of a request mostly share their millisecond.
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def single_record(body: bytes) -> ProduceRecord | ProduceResult | None:
    """The record when the whole body is one JSON object; None when it is several."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    return parse_record(body)
