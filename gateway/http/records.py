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
skipped. Reads are READ_UNCOMMITTED.
"""

from __future__ import annotations

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
    DataSize,
    ProduceRecord,
    ProduceResult,
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
    InvalidBatchError,
    NewRecord,
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
_TOO_LARGE: Final = frozenset({KafkaCode.message_too_large, KafkaCode.record_list_too_large})


@dataclass(frozen=True, slots=True)
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
        self._next = itertools.count(random.randrange(max(1, topic.partitions)))  # noqa: S311

    # -- produce -------------------------------------------------------------------

    async def produce(self, items: Sequence[ProduceRecord | ProduceResult]) -> list[ProduceResult]:
        """A result per item, in order; items that are already results (parse errors) stay."""
        results: list[ProduceResult | None] = [
            item if isinstance(item, ProduceResult) else None for item in items
        ]
        groups: dict[int, list[_Ready]] = {}
        for index, item in enumerate(items):
            if isinstance(item, ProduceResult):
                continue
            try:
                ready = self._prepare(index, item)
            except EncodingError as exc:
                results[index] = _failure(ErrorCode.INVALID_INPUT, str(exc))
                continue
            if ready.partition >= self.topic.partitions:
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

    def _prepare(self, index: int, item: ProduceRecord) -> _Ready:
        key = None if item.key is None else encode_data(item.key.type, item.key.data)
        value = None if item.value is None else encode_data(item.value.type, item.value.data)
        headers = tuple((h.name, unb64(h.value, f"header {h.name!r}")) for h in item.headers)
        if item.partition_id is not None:
            partition = item.partition_id
        elif key is not None:
            partition = partition_for_key(key, self.topic.partitions)
        else:
            partition = next(self._next) % self.topic.partitions
        timestamp = (
            int(time.time() * 1000)
            if item.timestamp is None
            else int(item.timestamp.timestamp() * 1000)
        )
        return _Ready(
            index,
            partition,
            NewRecord(key, value, headers, timestamp),
            _size(item.key, key),
            _size(item.value, value),
        )

    async def _send(self, groups: dict[int, list[_Ready]]) -> list[tuple[_Ready, ProduceResult]]:
        batches = {p: build_batch(r.record for r in group) for p, group in groups.items()}
        answers = await self.client.produce(self.topic.name, batches)
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
        records: list[ReadRecord] = []
        next_offset = start
        try:
            for record, batch_end in fetched_records(data.records or b"", start):
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


@dataclass(frozen=True, slots=True)
class _Decoded:
    offset: int
    timestamp: int
    timestamp_type: TimestampKind
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def fetched_records(buf: bytes, start: int) -> Iterator[tuple[_Decoded | None, int]]:
    """(record, end offset of its batch) from a fetched partition, from ``start``.

    After each whole batch comes (None, its next offset), so a caller that
    takes every record moves past offsets a batch skips (compaction, markers).
    A batch cut off at the end of the response (max_bytes) is left for the next read.
    """
    view = memoryview(buf)
    pos = 0
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
            for record in iter_records(batch):
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
        return _failure(ErrorCode.TOO_MANY_REQUESTS, str(exc))
    return _failure(ErrorCode.UNAVAILABLE, f"the brokers are unreachable: {exc}")


def _line(result: ProduceResult) -> bytes:
    return result.model_dump_json(exclude_none=False).encode() + b"\n"


def _datetime(ms: int) -> datetime:
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
