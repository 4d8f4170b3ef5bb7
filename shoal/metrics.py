"""Prometheus building blocks shared by the broker and the gateway.

Every component keeps its own :class:`prometheus_client.CollectorRegistry`
(made where the component is assembled, never a module global), so two
gateways in one test process do not count into each other, and a scrape
shows exactly one component.

Counting on the hot path does not go through prometheus_client's metric
objects: their ``labels()`` lookup takes a lock per call, and both processes
serve from one event loop, where no lock is needed. Instead the hot path adds
to plain dicts (:class:`LabeledCounter`, :class:`LabeledHistogram`), and a
custom collector turns them into metric families at scrape time. Scrapes are
answered on the same event loop, so a collector reads state that no other
thread is changing.

Kafka responses carry their errors in ``error_code`` fields at any depth (the
top level, per topic, per partition, per resource). :func:`error_codes`
walks only the fields that can hold one: a plan per response class, made
once from the schema, lists them, so a fetch response's records, or a
produce response's offsets, are never looked at.

Serving (:func:`serve_metrics`): a small HTTP server on the component's own
event loop rather than prometheus_client's ``start_http_server``, whose
thread would run the collectors while the event loop changes what they read
(the broker's partition map, the gateway's sessions: "dictionary changed size
during iteration"). Scrapes are tiny and rare, so sharing the loop costs
nothing measurable. It listens on a port of its own (``--metrics-listen``),
never on a tenant-facing one: the gateway's series name every tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import types
import typing
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Request latency buckets: sub-millisecond produce on loopback up to long-polled fetches."""

Labels = tuple[str, ...]


class LabeledCounter:
    """A counter per label values; event-loop only (no lock)."""

    def __init__(self, name: str, documentation: str, labelnames: Labels) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels, amount: float = 1) -> None:
        self.values[labels] = self.values.get(labels, 0) + amount

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in self.values.items():
            family.add_metric(labels, value)
        return family


class LabeledHistogram:
    """A histogram per label values, with fixed buckets; event-loop only (no lock)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Labels,
        buckets: tuple[float, ...] = LATENCY_BUCKETS_S,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.buckets = buckets
        # Per label values: a count per bucket (the last is +Inf) and the sum.
        self._counts: dict[Labels, list[int]] = {}
        self._sums: dict[Labels, float] = {}

    def observe(self, labels: Labels, value: float) -> None:
        counts = self._counts.get(labels)
        if counts is None:
            counts = self._counts[labels] = [0] * (len(self.buckets) + 1)
            self._sums[labels] = 0.0
        # Buckets are "less than or equal": bisect_left puts a value equal to a
        # bound into that bound's bucket.
        counts[bisect_left(self.buckets, value)] += 1
        self._sums[labels] += value

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        bounds = [*(repr(float(b)) for b in self.buckets), "+Inf"]
        for labels, counts in self._counts.items():
            cumulative = []
            total = 0
            for bound, count in zip(bounds, counts, strict=True):
                total += count
                cumulative.append((bound, float(total)))
            family.add_metric(labels, cumulative, self._sums[labels])
        return family


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition of a registry, and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


# -- serving --------------------------------------------------------------------------

_HEADER_LIMIT: Final = 16384
_READ_TIMEOUT_S: Final = 10.0


def http_answer(request_line: bytes, registry: CollectorRegistry) -> bytes:
    """The whole HTTP/1.1 answer to one request line (the connection then closes)."""
    parts = request_line.split()
    if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD"):
        return _response(b"405 Method Not Allowed", b"text/plain", b"GET /metrics\n")
    if parts[1].split(b"?", 1)[0] != b"/metrics":
        return _response(b"404 Not Found", b"text/plain", b"see /metrics\n")
    body, content_type = exposition(registry)
    return _response(b"200 OK", content_type.encode(), b"" if parts[0] == b"HEAD" else body)


def _response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
    return head % (status, content_type, len(body)) + body


async def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> asyncio.Server:
    """Answer ``GET /metrics`` on HOST:PORT, one request per connection."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            writer.write(http_answer(head.split(b"\r\n", 1)[0], registry))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(answer, host, port, limit=_HEADER_LIMIT, reuse_address=True)
    log.info("event=metrics_listening address=%s:%d", host, server.sockets[0].getsockname()[1])
    return server


# -- error codes in responses ---------------------------------------------------------

_ERROR_CODE_TYPE: Final = "error_code"


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """Where a struct keeps error codes: its own fields, and children that have some."""

    codes: tuple[str, ...]
    children: tuple[tuple[str, bool, _Plan], ...]
    """(field name, whether it is an array, the child's plan)."""


_PLANS: dict[type[Any], _Plan | None] = {}


def _struct_of(annotation: Any) -> tuple[type[Any] | None, bool]:
    """The struct class a field holds, and whether it holds an array of them."""
    many = False
    if typing.get_origin(annotation) is tuple:
        annotation = typing.get_args(annotation)[0]
        many = True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        structs = [a for a in typing.get_args(annotation) if dataclasses.is_dataclass(a)]
        annotation = structs[0] if structs else None
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return annotation, many
    return None, False


def _plan(cls: type[Any]) -> _Plan | None:
    if cls in _PLANS:
        return _PLANS[cls]
    if not dataclasses.is_dataclass(cls):
        _PLANS[cls] = None
        return None
    hints = typing.get_type_hints(cls)
    codes: list[str] = []
    children: list[tuple[str, bool, _Plan]] = []
    for field in dataclasses.fields(cls):
        if field.metadata.get("kafka_type") == _ERROR_CODE_TYPE:
            codes.append(field.name)
            continue
        struct, many = _struct_of(hints[field.name])
        if struct is not None and struct is not cls:
            child = _plan(struct)
            if child is not None:
                children.append((field.name, many, child))
    plan = _Plan(tuple(codes), tuple(children)) if codes or children else None
    _PLANS[cls] = plan
    return plan


def _walk(entity: Any, plan: _Plan) -> Iterator[enum.IntEnum]:
    for name in plan.codes:
        code = getattr(entity, name)
        if code:
            yield code
    for name, many, child in plan.children:
        value = getattr(entity, name)
        if value is None:
            continue
        if many:
            for item in value:
                yield from _walk(item, child)
        else:
            yield from _walk(value, child)


def error_codes(response: Any) -> Iterator[enum.IntEnum]:
    """Every non-zero error code in a Kafka response, top level and nested, in order."""
    plan = _plan(type(response))
    if plan is not None:
        yield from _walk(response, plan)


def error_name(code: enum.IntEnum) -> str:
    """Kafka's name of an error code, as the Java client spells it (TOPIC_AUTHORIZATION_FAILED)."""
    return code.name.upper()


def api_name(response_class: type[Any]) -> str:
    """Kafka's name of an API (Produce, Fetch, ...) from its response class."""
    return response_class.__name__.removesuffix("Response")


def families(*metrics: LabeledCounter | LabeledHistogram) -> Iterable[Any]:
    return [metric.family() for metric in metrics]
