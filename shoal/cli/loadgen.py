"""Load generation against any Kafka-compatible cluster: produce, consume, end to end.

The engine behind ``shoal bench`` and the workloads in ``benchmarks/``. It is
a librdkafka (confluent-kafka) client and knows nothing of Shoal's servers, so
the same load measures Shoal and any other Kafka. It has no terminal output:
callers get a :class:`Progress` callback while a run goes and a result
dataclass at the end (``as_dict()`` for JSON).

How it measures, and why:

* **Rate.** ``throughput`` records/s is kept on an absolute schedule (record
  ``i`` is due at ``start + i / throughput``, see :class:`Pacer`), as
  kafka-producer-perf-test's ``--throughput``. Sleeping ``1/rate`` after each
  record would drift by every oversleep and every ``produce()`` call. A late
  record is sent at once and the ones after it catch up, so a stall is
  followed by a burst and the run's average rate is the target. ``None`` is
  flat out. While waiting, the producer's callbacks are served.
* **Values.** One payload of ``os.urandom`` bytes, made once and sent as every
  record's value, with no key (librdkafka's sticky partitioner spreads
  batches over the partitions). Random bytes do not compress, so
  ``compression.type`` shows its CPU cost without a ratio that zeros would
  flatter. Byte counts are value bytes; MB is 10**6 bytes (Kafka's tools
  print MiB).
* **Produce latency** is librdkafka's own ``Message.latency()``: from
  ``produce()`` to the acknowledgement, so it includes linger and queueing.
  A run counts acknowledged records; its seconds run from the first
  ``produce()`` to the last acknowledgement.
* **End-to-end latency.** :func:`end_to_end` runs a producer thread and a
  consumer in this process. Each value starts with a 16-byte stamp: this
  run's random id and ``time.perf_counter_ns()`` at ``produce()``. The
  consumer takes the clock once per fetched batch and subtracts; records
  without this run's id (other writers) are ignored. ``perf_counter`` is
  per machine at best, which is why both ends share a process; on Linux it
  is ``CLOCK_MONOTONIC``, shared by a machine's processes, so
  :func:`read_latencies` and :func:`produce` with a ``run_id`` split the two
  ends over two processes (the benchmark suite does, so that the ends do
  not share one interpreter lock). The stamp is
  the actual send time, not the scheduled one: if the client itself falls
  behind the schedule (a full queue, a busy CPU), that lag is not in the
  latencies but shows as a rate below the target.
* **Percentiles** are nearest-rank (:func:`percentile`) over a sample of at
  most :data:`MAX_SAMPLES` latencies (every k-th record, as
  kafka-producer-perf-test samples); average and maximum cover every record.
* **Stopping.** Every function takes a ``stop`` event (the CLI sets it on
  Ctrl-C) and then returns what it measured so far, with ``interrupted``
  set. Undelivered records get :data:`DRAIN_ON_STOP_S` to be acknowledged,
  then are purged.
* **Errors** that retrying cannot fix (authentication, TLS, an unknown
  topic, librdkafka's fatal errors) raise :class:`LoadError` promptly rather
  than after librdkafka's own timeouts (minutes). Failed deliveries are
  counted in the result, with their messages.
"""

from __future__ import annotations

import functools
import math
import os
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final, ParamSpec, Protocol, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

Config = Mapping[str, Any]
"""librdkafka settings, as confluent-kafka takes them (``bootstrap.servers``, ...)."""

MAX_SAMPLES: Final = 500_000
"""Most latencies kept for percentiles; longer runs keep every k-th."""
STAMP_SIZE: Final = 16
"""Bytes at the start of each end-to-end value: run id (8) and send time in ns (8)."""
DRAIN_ON_STOP_S: Final = 5.0
"""After a stop, how long records already produced may take to be acknowledged."""
METADATA_TIMEOUT_S: Final = 15.0
"""How long the topic's metadata may take to arrive before a run gives up."""
IDLE_TIMEOUT_S: Final = 10.0
"""A consumer that gets nothing for this long stops (kafka-consumer-perf-test's --timeout)."""
PROGRESS_INTERVAL_S: Final = 0.2
"""Least time between two progress callbacks."""
CDF_QUANTILES: Final = (
    *(q / 100 for q in range(0, 91, 5)),
    *(q / 100 for q in range(91, 100)),
    *(q / 1000 for q in range(991, 1000)),
    0.9995,
    0.9999,
)
"""Where :attr:`Latencies.cdf_ms` samples the distribution: dense in the tail, for plotting."""

_POLL_S: Final = 0.1
_CONSUME_BATCH: Final = 10_000
_STAMP: Final = struct.Struct(">8sq")
_PURGED: Final = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
_HOPELESS: Final = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
"""Client errors that retrying does not fix: wrong credentials, a TLS handshake refused."""
_TOPIC_MISSING: Final = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)
_TOPIC_REFUSED: Final = frozenset(
    {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED}
)


class LoadError(Exception):
    """A run cannot go on: its message says why, for a person to read."""


class UnknownTopicError(LoadError):
    """The cluster does not have the topic (or does not show it to these credentials)."""

    def __init__(self, topic: str, reason: str | None = None) -> None:
        super().__init__(f"topic {topic}: {reason}" if reason else f"topic {topic} does not exist")
        self.topic = topic


# -- measurements ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """How far a run is: records and value bytes done, seconds since it started."""

    records: int
    bytes: int
    seconds: float
    total: int | None
    """Records the run aims at; None when it reads until the end of the topic."""


class ProgressCallback(Protocol):
    def __call__(self, progress: Progress, /) -> None: ...


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of ascending ``ordered``, ``0 < q <= 1``.

    The smallest value with at least ``q`` of the values at or below it: of
    1..100, p50 is 50, p99 is 99 and p99.9 is 100. NaN for no values.
    """
    if not ordered:
        return math.nan
    rank = math.ceil(q * len(ordered))
    return ordered[min(max(rank, 1), len(ordered)) - 1]


@dataclass(frozen=True)
class Latencies:
    """Latency summary in milliseconds."""

    count: int
    avg_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p99_9_ms: float
    max_ms: float
    cdf_ms: tuple[float, ...] = ()
    """The latency at each of :data:`CDF_QUANTILES`, then the maximum: a CDF to plot."""


class LatencyRecorder:
    """Collects latencies in seconds: all of them into count, sum and maximum,
    every ``every``-th into the sample that percentiles are read from.

    ``expected`` (records the run will measure) sets ``every`` so that the
    sample stays under ``max_samples``. Not thread-safe: one recorder per thread.
    """

    def __init__(self, expected: int | None, max_samples: int = MAX_SAMPLES) -> None:
        self.every = max(1, (expected or 0) // max_samples)
        self.samples: list[float] = []
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        if self.count % self.every == 0:
            self.samples.append(seconds)
        self.count += 1
        self.total += seconds
        self.max = max(self.max, seconds)

    def summary(self) -> Latencies | None:
        """The summary, or None when nothing was recorded."""
        if not self.count:
            return None
        ordered = sorted(self.samples)
        return Latencies(
            count=self.count,
            avg_ms=self.total / self.count * 1e3,
            p50_ms=percentile(ordered, 0.50) * 1e3,
            p95_ms=percentile(ordered, 0.95) * 1e3,
            p99_ms=percentile(ordered, 0.99) * 1e3,
            p99_9_ms=percentile(ordered, 0.999) * 1e3,
            max_ms=self.max * 1e3,
            cdf_ms=(*(percentile(ordered, q) * 1e3 for q in CDF_QUANTILES), self.max * 1e3),
        )


@dataclass(frozen=True)
class Throughput:
    """Records and value bytes moved in ``seconds``; MB is 10**6 bytes."""

    records: int
    bytes: int
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every field (nested results too) and the rates, for JSON."""
        return {**asdict(self), "records_per_s": self.records_per_s, "mb_per_s": self.mb_per_s}


@dataclass(frozen=True)
class ProduceResult(Throughput):
    """Acknowledged records; ``latency`` is produce() to acknowledgement."""

    latency: Latencies | None = None
    failed: int = 0
    """Records the cluster refused or that were not acknowledged in time."""
    errors: dict[str, int] = field(default_factory=dict)
    """Each delivery error's message and how many records got it."""
    interrupted: bool = False


@dataclass(frozen=True)
class ConsumeResult(Throughput):
    """Records read; ``seconds`` run from the partitions' assignment to the last record."""

    join_seconds: float = 0.0
    """From the start until the partitions were assigned (joining the group, if any)."""
    timed_out: bool = False
    """Nothing arrived for the idle timeout before the target was reached."""
    interrupted: bool = False


@dataclass(frozen=True)
class LatencyResult(Throughput):
    """Records consumed back; ``seconds`` from the first produce() to the last one read."""

    latency: Latencies | None = None
    """From produce() to the consumer having the record in hand."""
    produce: ProduceResult | None = None
    missing: int = 0
    """Acknowledged records that the consumer did not see before it stopped."""
    interrupted: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        if self.produce is not None:
            out["produce"] = self.produce.as_dict()
        return out


# -- pacing and payloads --------------------------------------------------------------------


class Pacer:
    """An absolute send schedule: record ``i`` is due ``i / rate`` seconds after ``start``.

    Lateness is not carried forward: a late record is due at once and the
    records after it keep their own times, so the long-run rate is ``rate``
    however long each send or sleep takes. ``rate`` None means never wait.
    """

    def __init__(self, rate: float | None, start: float) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be positive or None, not {rate}")
        self.rate = rate
        self.start = start

    def due(self, index: int) -> float:
        """When record ``index`` (from 0) may be sent, on the clock ``start`` is on."""
        return self.start if self.rate is None else self.start + index / self.rate

    def delay(self, index: int, now: float) -> float:
        """Seconds to wait at ``now`` before sending record ``index``; 0 if it is due."""
        return max(0.0, self.due(index) - now)


def make_payload(size: int) -> bytes:
    """``size`` random bytes: the value of every record of a run (incompressible)."""
    return os.urandom(size)


def stamp(run_id: bytes, sent_ns: int, payload: bytes) -> bytes:
    """An end-to-end value: run id and send time over the payload's first 16 bytes."""
    return _STAMP.pack(run_id, sent_ns) + payload[STAMP_SIZE:]


def read_stamp(value: bytes | None) -> tuple[bytes, int] | None:
    """(run id, send time ns) of a stamped value; None for a value too short to be one."""
    if value is None or len(value) < STAMP_SIZE:
        return None
    run_id, sent_ns = _STAMP.unpack_from(value)
    return run_id, sent_ns


# -- client plumbing ------------------------------------------------------------------------


class _ClientErrors:
    """librdkafka's ``error_cb``: keeps the last error and stops on a hopeless one.

    librdkafka retries everything else (brokers down, timeouts) by itself;
    wrong credentials it would retry until a message times out, minutes later.
    A caller's own ``error_cb`` is still called.
    """

    def __init__(self, chained: Callable[[KafkaError], None] | None) -> None:
        self.chained = chained
        self.last: KafkaError | None = None
        self.hopeless: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        self.last = error
        if self.hopeless is None and (error.fatal() or error.code() in _HOPELESS):
            self.hopeless = error
        if self.chained is not None:
            self.chained(error)

    def check(self) -> None:
        """Raise :class:`LoadError` if a hopeless error has been seen."""
        if self.hopeless is not None:
            raise LoadError(self.hopeless.str())


def _with_errors(
    config: Config, overrides: Mapping[str, Any]
) -> tuple[dict[str, Any], _ClientErrors]:
    merged = {**config, **overrides}
    errors = _ClientErrors(merged.get("error_cb"))
    merged["error_cb"] = errors
    return merged, errors


def _reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _kafka_errors_as_load_errors(function: Callable[_P, _T]) -> Callable[_P, _T]:
    """librdkafka's exceptions (a bad setting, a record over message.max.bytes, a
    timeout) leave a run as :class:`LoadError`, the one error callers handle."""

    @functools.wraps(function)
    def translated(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return function(*args, **kwargs)
        except KafkaException as exc:
            raise LoadError(_reason(exc)) from exc

    return translated


def _topic_partitions(
    client: Producer | Consumer,
    topic: str,
    errors: _ClientErrors,
    stop: threading.Event,
    timeout_s: float = METADATA_TIMEOUT_S,
) -> list[int]:
    """The topic's partition ids, asked of the cluster until it answers.

    Asks once a second, serving callbacks in between, so that wrong
    credentials end it at once rather than at ``timeout_s``. Raises
    :class:`UnknownTopicError` or :class:`LoadError`; [] if ``stop`` is set first.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while not stop.is_set():
        try:
            metadata = client.list_topics(topic, timeout=1.0)
        except KafkaException as exc:
            metadata, last = None, _reason(exc)
        client.poll(0)
        errors.check()
        if metadata is not None:
            described = metadata.topics.get(topic)
            if described is None:
                raise UnknownTopicError(topic)
            if described.error is None:
                return sorted(described.partitions)
            code = described.error.code()
            if code in _TOPIC_MISSING:
                raise UnknownTopicError(topic)
            if code in _TOPIC_REFUSED:
                raise UnknownTopicError(topic, described.error.str())
            last = described.error.str()  # LEADER_NOT_AVAILABLE while being created
        if time.monotonic() > deadline:
            detail = errors.last.str() if errors.last is not None else last
            raise LoadError(f"no metadata for {topic} in {timeout_s:.0f} s: {detail}")
    return []


class _Reporter:
    """Calls a progress callback at most once per interval, and once at the end."""

    def __init__(self, callback: ProgressCallback | None, total: int | None, start: float) -> None:
        self.callback = callback
        self.total = total
        self.start = start
        self.next = start

    def maybe(self, records: int, size: int, now: float) -> None:
        if self.callback is not None and now >= self.next:
            self.next = now + PROGRESS_INTERVAL_S
            self.callback(Progress(records, size, now - self.start, self.total))

    def final(self, records: int, size: int, now: float) -> None:
        if self.callback is not None:
            self.callback(Progress(records, size, now - self.start, self.total))


# -- produce --------------------------------------------------------------------------------


class _Deliveries:
    """The producer's delivery reports: acknowledged, failed, purged, and latencies."""

    def __init__(self, expected: int) -> None:
        self.reset(expected)

    def reset(self, expected: int) -> None:
        """Count from zero: the measured run starts after the warm-up's reports."""
        self.acked = 0
        self.failed = 0
        self.purged = 0
        self.errors: Counter[str] = Counter()
        self.latencies = LatencyRecorder(expected)

    def __call__(self, error: KafkaError | None, message: Any) -> None:
        if error is None:
            self.acked += 1
            latency = message.latency()
            if latency is not None:
                self.latencies.add(latency)
        elif error.code() in _PURGED:
            self.purged += 1
        else:
            self.failed += 1
            self.errors[error.str()] += 1


def produce(
    config: Config,
    topic: str,
    records: int,
    record_size: int,
    throughput: float | None = None,
    progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    run_id: bytes | None = None,
    warmup_records: int = 0,
) -> ProduceResult:
    """Produce ``records`` values of ``record_size`` bytes, at ``throughput``
    records/s or flat out (None), and wait for every acknowledgement.

    With ``run_id`` (8 bytes), every value is stamped with it and its send
    time, for :func:`read_latencies` in another process to measure.
    ``warmup_records`` are produced first by the same client, acknowledged,
    and left out of the result (kafka-producer-perf-test's
    ``--warmup-records``): a new client's first requests wait for
    connections, metadata and, for an idempotent producer, its producer id,
    which librdkafka asks for on a timer (about half a second).
    """
    if run_id is not None and record_size < STAMP_SIZE:
        raise ValueError(f"stamped records need at least {STAMP_SIZE} bytes")
    return _produce(
        config, topic, records, record_size, throughput, progress, stop, run_id, warmup_records
    )


@_kafka_errors_as_load_errors
def _produce(
    config: Config,
    topic: str,
    records: int,
    record_size: int,
    throughput: float | None,
    progress: ProgressCallback | None,
    stop: threading.Event | None,
    run_id: bytes | None,
    warmup_records: int = 0,
) -> ProduceResult:
    """:func:`produce`; with ``run_id``, every value is stamped for the latency readers."""
    stop = stop or threading.Event()
    deliveries = _Deliveries(warmup_records)
    settings, errors = _with_errors(config, {"on_delivery": deliveries})
    producer = Producer(settings)
    try:
        _topic_partitions(producer, topic, errors, stop)
        payload = make_payload(record_size)
        if warmup_records:
            _warm_up(producer, topic, warmup_records, payload, throughput, stop, errors, deliveries)
        deliveries.reset(records)
        start = time.perf_counter()
        reporter = _Reporter(progress, records, start)
        pacer = Pacer(throughput, start)
        _send(producer, topic, records, payload, pacer, stop, errors, reporter, deliveries, run_id)
        _drain(producer, stop, errors, reporter, deliveries, record_size)
        end = time.perf_counter()
        reporter.final(deliveries.acked, deliveries.acked * record_size, end)
        return ProduceResult(
            records=deliveries.acked,
            bytes=deliveries.acked * record_size,
            seconds=end - start,
            latency=deliveries.latencies.summary(),
            failed=deliveries.failed,
            errors=dict(deliveries.errors.most_common()),
            interrupted=stop.is_set(),
        )
    finally:
        if len(producer):
            producer.purge()
            producer.flush(1)


def _warm_up(
    producer: Producer,
    topic: str,
    records: int,
    payload: bytes,
    throughput: float | None,
    stop: threading.Event,
    errors: _ClientErrors,
    deliveries: _Deliveries,
) -> None:
    """Unstamped, unmeasured records at the run's rate, all acknowledged before it starts."""
    reporter = _Reporter(None, records, time.perf_counter())
    pacer = Pacer(throughput, time.perf_counter())
    _send(producer, topic, records, payload, pacer, stop, errors, reporter, deliveries, None)
    _drain(producer, stop, errors, reporter, deliveries, len(payload))
    if deliveries.failed:
        reason = deliveries.errors.most_common(1)[0][0]
        raise LoadError(f"{deliveries.failed} of {records} warm-up records failed: {reason}")


def _send(
    producer: Producer,
    topic: str,
    records: int,
    payload: bytes,
    pacer: Pacer,
    stop: threading.Event,
    errors: _ClientErrors,
    reporter: _Reporter,
    deliveries: _Deliveries,
    run_id: bytes | None,
) -> None:
    """The produce loop: ``records`` records handed to librdkafka, unless stopped."""
    size = len(payload)
    index = 0
    while index < records and not stop.is_set():
        errors.check()
        now = time.perf_counter()
        reporter.maybe(deliveries.acked, deliveries.acked * size, now)
        wait = pacer.delay(index, now)
        if wait > 0:
            _wait(producer, min(wait, _POLL_S))
            continue
        value = payload if run_id is None else stamp(run_id, time.perf_counter_ns(), payload)
        try:
            producer.produce(topic, value)
        except BufferError:
            # librdkafka's queue is full: serve delivery reports until it has room.
            producer.poll(_POLL_S)
            continue
        producer.poll(0)
        index += 1


def _wait(producer: Producer, seconds: float) -> None:
    """Wait, serving delivery reports; librdkafka counts milliseconds, so shorter is a sleep."""
    if seconds >= 0.001:
        producer.poll(seconds)
    else:
        time.sleep(seconds)


def _drain(
    producer: Producer,
    stop: threading.Event,
    errors: _ClientErrors,
    reporter: _Reporter,
    deliveries: _Deliveries,
    record_size: int,
) -> None:
    """Wait for every outstanding acknowledgement; after a stop, for DRAIN_ON_STOP_S at most."""
    deadline = math.inf
    while len(producer):
        errors.check()
        now = time.perf_counter()
        if deadline == math.inf and stop.is_set():
            deadline = now + DRAIN_ON_STOP_S
        if now > deadline:
            producer.purge()
            producer.flush(1)
            return
        # flush(), unlike poll(), sends what is lingering at once.
        producer.flush(_POLL_S)
        reporter.maybe(deliveries.acked, deliveries.acked * record_size, now)


# -- consume --------------------------------------------------------------------------------


def _consumer_config(
    config: Config, group: str | None, until_end: bool
) -> tuple[dict[str, Any], _ClientErrors]:
    overrides: dict[str, Any] = {"enable.partition.eof": until_end}
    settings: dict[str, Any] = dict(config)
    if group is None:
        # librdkafka insists on a group id even for assign(); nothing is committed.
        overrides.update(
            {"group.id": f"shoal-bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
        )
    else:
        overrides["group.id"] = group
        settings.setdefault("auto.offset.reset", "earliest")
    return _with_errors(settings, overrides)


@_kafka_errors_as_load_errors
def consume(
    config: Config,
    topic: str,
    records: int | None = None,
    group: str | None = None,
    progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
) -> ConsumeResult:
    """Read ``records`` records, or with None until the end of every partition.

    With ``group``, as a member of that group (subscribe, offsets committed
    as librdkafka does by default, from the earliest offset when the group has
    none); without, every partition is assigned from the beginning and
    nothing is committed. Stops early after ``idle_timeout_s`` without a
    record (``timed_out``).
    """
    stop = stop or threading.Event()
    settings, errors = _consumer_config(config, group, records is None)
    assigned = threading.Event()
    consumer = Consumer(settings)
    try:
        partitions = _topic_partitions(consumer, topic, errors, stop)
        start = time.perf_counter()
        if group is None:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
            assigned.set()
        else:
            consumer.subscribe([topic], on_assign=lambda *_: assigned.set())
        result = _read(consumer, records, assigned, start, progress, stop, errors, idle_timeout_s)
        if result.timed_out and not assigned.is_set():
            raise LoadError(
                f"group {group} was given no partition of {topic} in {idle_timeout_s:g} s"
                " (joining can take longer; members beyond the partition count get none)"
            )
        return result
    finally:
        consumer.close()


def _read(
    consumer: Consumer,
    records: int | None,
    assigned: threading.Event,
    start: float,
    progress: ProgressCallback | None,
    stop: threading.Event,
    errors: _ClientErrors,
    idle_timeout_s: float,
) -> ConsumeResult:
    """The consume loop. The idle clock runs from the start (joining counts, as in
    kafka-consumer-perf-test); a run that times out ends at its last record."""
    count = size = 0
    at_end: set[int] = set()
    assigned_at: float | None = start if assigned.is_set() else None
    reporter = _Reporter(progress, records, start)
    last_activity = now = end = start
    timed_out = False
    while not stop.is_set() and (records is None or count < records):
        wanted = _CONSUME_BATCH if records is None else min(_CONSUME_BATCH, records - count)
        messages = _fetch(consumer, wanted)
        now = end = time.perf_counter()
        errors.check()
        if assigned_at is None and assigned.is_set():
            assigned_at = last_activity = reporter.start = now
        for message in messages:
            error = message.error()
            if error is None:
                count += 1
                size += len(message)
                at_end.discard(message.partition())
            elif error.code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
            else:
                _check_message_error(error, message)
        if messages:
            last_activity = now
        if records is None and at_end and _all_at_end(consumer, at_end):
            break
        if now - last_activity > idle_timeout_s:
            timed_out, end = True, last_activity
            break
        reporter.maybe(count, size, now)
    reporter.final(count, size, end)
    began = assigned_at if assigned_at is not None else end
    return ConsumeResult(
        records=count,
        bytes=size,
        seconds=end - began,
        join_seconds=began - start,
        timed_out=timed_out,
        interrupted=stop.is_set(),
    )


def _fetch(consumer: Consumer, wanted: int) -> list[Any]:
    """Up to ``wanted`` messages: waits for the first, then takes what is already there.

    ``consume(n, timeout)`` alone would hold a batch until it has ``n``
    messages or the timeout passes, adding that wait to every latency.
    """
    first = consumer.poll(_POLL_S)
    if first is None:
        return []
    return [first, *consumer.consume(wanted - 1, 0)] if wanted > 1 else [first]


def _all_at_end(consumer: Consumer, at_end: set[int]) -> bool:
    mine = {tp.partition for tp in consumer.assignment()}
    return bool(mine) and mine <= at_end


def _check_message_error(error: KafkaError, message: Any) -> None:
    """Raise for a consumer error that will not go away; librdkafka retries the rest."""
    code = error.code()
    if code in _TOPIC_MISSING:
        raise UnknownTopicError(message.topic() or "topic", error.str())
    if error.fatal() or code in _TOPIC_REFUSED or code in _HOPELESS:
        raise LoadError(error.str())


# -- end to end -----------------------------------------------------------------------------


class _ProducerThread(threading.Thread):
    """Runs the stamped produce loop; keeps its result or its exception for the caller."""

    def __init__(self, produce_run: Callable[[], ProduceResult]) -> None:
        super().__init__(name="shoal-loadgen-producer", daemon=True)
        self.produce_run = produce_run
        self.result: ProduceResult | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.produce_run()
        except BaseException as exc:  # noqa: BLE001 - the consumer's thread raises it
            self.error = exc


@dataclass
class _Received:
    """What the end-to-end consumer got of this run's records."""

    latencies: LatencyRecorder
    records: int = 0
    end: float = 0.0


@_kafka_errors_as_load_errors
def end_to_end(
    config: Config,
    topic: str,
    records: int,
    record_size: int,
    throughput: float | None = None,
    progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    producer_config: Config | None = None,
    consumer_config: Config | None = None,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
) -> LatencyResult:
    """Produce ``records`` stamped values from a thread and read them back here.

    The consumer starts at every partition's end before the first record is
    sent, so the topic's older records are skipped; it stops when it has all
    of this run's records, on ``stop``, or ``idle_timeout_s`` after the
    producer finished with nothing more arriving. ``producer_config`` and
    ``consumer_config`` go over ``config`` for one side each.
    """
    if record_size < STAMP_SIZE:
        raise ValueError(f"end-to-end records need at least {STAMP_SIZE} bytes")
    stop = stop or threading.Event()
    halt = threading.Event()
    consumer, errors = _stamp_reader({**config, **(consumer_config or {})})
    try:
        _assign_ends(consumer, topic, errors, stop)
        run_id = os.urandom(8)
        producer_settings = {**config, **(producer_config or {})}
        producer = _ProducerThread(
            lambda: _produce(
                producer_settings, topic, records, record_size, throughput, None, halt, run_id
            )
        )
        start = time.perf_counter()
        producer.start()
        received = _Received(LatencyRecorder(records), end=start)
        try:
            _read_stamped(
                consumer,
                run_id,
                records,
                record_size,
                _Producing(producer.is_alive, lambda: producer.error is not None),
                received,
                _Reporter(progress, records, start),
                stop,
                errors,
                idle_timeout_s,
            )
        finally:
            if received.records < records:
                halt.set()  # stopped or failed: the producer stops too
            producer.join()
        if producer.error is not None:
            raise producer.error
    finally:
        consumer.close()
    produced = producer.result
    return LatencyResult(
        records=received.records,
        bytes=received.records * record_size,
        seconds=received.end - start,
        latency=received.latencies.summary(),
        produce=produced,
        missing=max(0, produced.records - received.records) if produced else 0,
        interrupted=stop.is_set(),
    )


@_kafka_errors_as_load_errors
def read_latencies(
    config: Config,
    topic: str,
    run_id: bytes,
    records: int,
    record_size: int,
    progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    on_ready: Callable[[], None] | None = None,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
) -> LatencyResult:
    """:func:`end_to_end`'s consumer alone, for a producer in another process.

    Reads, from every partition's end as it is when this starts, the
    ``records`` values that :func:`produce` stamped with ``run_id``, and
    measures each from its ``produce()`` to here. ``on_ready`` is called
    once the consumer is at the ends: start the producer after that. The
    stamps are ``time.perf_counter_ns()``, which on Linux is
    ``CLOCK_MONOTONIC``, one clock for every process of the machine (not
    of two machines). Stops with all of them, on ``stop``, or after
    ``idle_timeout_s`` without a record.
    """
    stop = stop or threading.Event()
    consumer, errors = _stamp_reader(config)
    try:
        _assign_ends(consumer, topic, errors, stop)
        if on_ready is not None:
            on_ready()
        start = time.perf_counter()
        received = _Received(LatencyRecorder(records), end=start)
        _read_stamped(
            consumer,
            run_id,
            records,
            record_size,
            _Producing(lambda: False, lambda: False),
            received,
            _Reporter(progress, records, start),
            stop,
            errors,
            idle_timeout_s,
        )
    finally:
        consumer.close()
    return LatencyResult(
        records=received.records,
        bytes=received.records * record_size,
        seconds=received.end - start,
        latency=received.latencies.summary(),
        missing=records - received.records,
        interrupted=stop.is_set(),
    )


@dataclass(frozen=True)
class _Producing:
    """What the stamped reader knows of its producer: still sending, or failed."""

    alive: Callable[[], bool]
    failed: Callable[[], bool]


def _stamp_reader(config: Config) -> tuple[Consumer, _ClientErrors]:
    """The latency readers' consumer: a throwaway group id that commits nothing."""
    group = f"shoal-bench-{uuid.uuid4().hex[:8]}"
    settings, errors = _with_errors(config, {"group.id": group, "enable.auto.commit": False})
    return Consumer(settings), errors


def _assign_ends(
    consumer: Consumer, topic: str, errors: _ClientErrors, stop: threading.Event
) -> None:
    """Assign every partition of ``topic`` at its current end."""
    partitions = _topic_partitions(consumer, topic, errors, stop)
    consumer.assign(_ends(consumer, topic, partitions))


def _ends(consumer: Consumer, topic: str, partitions: list[int]) -> list[TopicPartition]:
    """Each partition at its high watermark: where this run's first record will land."""
    ends = []
    for p in partitions:
        _, high = consumer.get_watermark_offsets(
            TopicPartition(topic, p), timeout=METADATA_TIMEOUT_S
        )
        ends.append(TopicPartition(topic, p, high))
    return ends


def _read_stamped(
    consumer: Consumer,
    run_id: bytes,
    records: int,
    record_size: int,
    producer: _Producing,
    received: _Received,
    reporter: _Reporter,
    stop: threading.Event,
    errors: _ClientErrors,
    idle_timeout_s: float,
) -> None:
    """Consume until this run's ``records`` are in, the producer failed, or ``stop``.

    The clock is read once per fetched batch: the records of a batch reach
    the application together, and reading it per record would charge the
    later ones for this loop's own time.
    """
    last_activity = received.end
    while received.records < records and not stop.is_set() and not producer.failed():
        messages = _fetch(consumer, min(_CONSUME_BATCH, records - received.records))
        received_ns = time.perf_counter_ns()
        now = received.end = time.perf_counter()
        errors.check()
        for message in messages:
            error = message.error()
            if error is not None:
                _check_message_error(error, message)
                continue
            stamped = read_stamp(message.value())
            if stamped is not None and stamped[0] == run_id:
                received.latencies.add((received_ns - stamped[1]) / 1e9)
                received.records += 1
        if messages or producer.alive():
            last_activity = now
        elif now - last_activity > idle_timeout_s:
            received.end = last_activity
            break
        reporter.maybe(received.records, received.records * record_size, now)
    reporter.final(received.records, received.records * record_size, received.end)
