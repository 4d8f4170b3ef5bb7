"""Kafka request and response messages, through kio.

kio generates one frozen dataclass per API, version and nested struct from
Kafka's own JSON schemas, and decodes them natively; they are encoded by
writers compiled from the same classes (:mod:`shoal.wire.compiled_writer`),
several times faster than kio's own. This module is the only
place that knows kio: it picks the class for an (api key, version), decodes
a request frame into it, and encodes a response of the same version.

Handlers are written once for every version they serve. They read request
fields that every supported version has, and build responses with
:meth:`ApiSchema.make`, which drops the fields a version does not carry
(``topic_id`` before Metadata v10, say). A field a version requires and the
handler forgot fails loudly at construction, which the tests catch for every
version a client negotiates.

Framing (the int32 size prefix) is not here: see :mod:`shoal.wire.framing`.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any, Final

from kio.index import KioIndexError, load_payload_module
from kio.serial import entity_reader
from kio.serial.errors import SerialError
from kio.static.constants import EntityType

from shoal.wire.compiled_writer import compiled_writer
from shoal.wire.guard import GuardError, check_request
from shoal.wire.splice import Chunk, RecordsSplicer, chunk_size
from shoal.wire.trace_context import split_client_id

log = logging.getLogger(__name__)

_REQUEST_PREFIX = struct.Struct(">hhi")
_INT32 = struct.Struct(">i")
_TAGGED_FIELDS_NONE: Final = b"\x00"
API_VERSIONS_KEY: Final = 18


class WireError(Exception):
    """A request that cannot be decoded; the connection answers by closing."""


class MalformedRequestError(WireError):
    pass


class UnknownApiKeyError(WireError):
    pass


class UnsupportedVersionError(WireError):
    def __init__(self, header: RequestHeader, message: str) -> None:
        super().__init__(message)
        self.header = header


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    traceparent: str | None = None
    """The gateway's W3C trace context for this request (brokers only; see trace_context)."""


class ApiSchema:
    """The request and response classes of one API version, and a builder for them."""

    def __init__(self, api_key: int, version: int) -> None:
        self.api_key = api_key
        self.version = version
        self._request_module = load_payload_module(api_key, version, EntityType.request)
        self._response_module = load_payload_module(api_key, version, EntityType.response)
        self.request_class: type[Any] = _payload_class(self._request_module, EntityType.request)
        self.response_class: type[Any] = _payload_class(self._response_module, EntityType.response)
        self.flexible: bool = self.request_class.__flexible__
        self.name: str = self.request_class.__name__.removesuffix("Request")
        """Kafka's name of the API (``Produce``, ``JoinGroup``)."""
        self._read_request = entity_reader(self.request_class)
        self._write_response = compiled_writer(self.response_class)
        self._request_header_reader = entity_reader(self.request_class.__header_schema__)
        self.write_request = compiled_writer(self.request_class)
        self.read_response = entity_reader(self.response_class)
        self._response_structs: dict[str, tuple[type[Any], frozenset[str]]] = {}
        self._request_structs: dict[str, tuple[type[Any], frozenset[str]]] = {}

    def has_class(self, class_name: str) -> bool:
        """Whether this version's response has the struct (some arrive in later versions)."""
        return isinstance(getattr(self._response_module, class_name, None), type)

    def make(self, class_name: str, /, **values: Any) -> Any:
        """Build a response entity of this version, keeping only the fields it has.

        ``class_name`` is kio's name for the struct (``MetadataResponseTopic``);
        the response itself is its ``response_class`` name.
        """
        return _built(self._response_structs, self._response_module, class_name, values)

    def response(self, **values: Any) -> Any:
        return self.make(self.response_class.__name__, **values)

    def make_request(self, class_name: str, /, **values: Any) -> Any:
        """Build a request entity of this version (the client side: replica fetchers)."""
        return _built(self._request_structs, self._request_module, class_name, values)

    def request(self, **values: Any) -> Any:
        return self.make_request(self.request_class.__name__, **values)

    def decode_body(self, frame: memoryview, offset: int) -> Any:
        body, _ = self._read_request(frame, offset)
        return body

    def encode_body(self, body: Any) -> bytes:
        out = io.BytesIO()
        self._write_response(out, body)
        return out.getvalue()

    def encode_into(self, out: io.BytesIO, body: Any) -> None:
        """Write a response body to ``out``."""
        self._write_response(out, body)

    def read_request_header(self, frame: memoryview) -> tuple[Any, int]:
        header, size = self._request_header_reader(frame, 0)
        return header, size


def _payload_class(module: ModuleType, entity_type: EntityType) -> type[Any]:
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and getattr(value, "__type__", None) is entity_type
            and value.__module__ == module.__name__
        ):
            return value
    raise LookupError(f"no {entity_type.name} class in {module.__name__}")


def _built(
    structs: dict[str, tuple[type[Any], frozenset[str]]],
    module: ModuleType,
    class_name: str,
    values: dict[str, Any],
) -> Any:
    """An entity of ``module``'s struct ``class_name`` from the ``values`` it has fields for.

    Every answer builds a few of these, so the class and its field names are kept
    per schema, and the values are filtered only when some are not the struct's.
    """
    found = structs.get(class_name)
    if found is None:
        cls = getattr(module, class_name)
        found = structs[class_name] = (cls, frozenset(f.name for f in dataclasses.fields(cls)))
    cls, names = found
    if names.issuperset(values):
        return cls(**values)
    return cls(**{k: v for k, v in values.items() if k in names})


@cache
def schema(api_key: int, version: int) -> ApiSchema:
    """The schema of an API version; raises LookupError if kio does not know it."""
    try:
        return ApiSchema(api_key, version)
    except KioIndexError as exc:
        raise LookupError(str(exc)) from exc


def load_schemas(versions: Mapping[int, tuple[int, int]]) -> int:
    """Load the schema of every version in ``versions`` (api key: lowest, highest) now; the
    number loaded (versions kio does not know are left out), also logged with the time
    it took (``event=schemas_loaded``).

    A server calls this before it listens. Loaded on first use instead, each (api key,
    version) imports kio's modules for it with the event loop stopped: 4-30 ms each,
    several at once in every broker when a new kind of client connects (traced in the
    noisy-neighbour benchmark while the victim was measured: a consumer group's first
    join). All of the broker's take about 1.2 s of CPU, nearly all of it importing.
    """
    started = time.perf_counter()
    loaded = 0
    for api_key, (low, high) in versions.items():
        for version in range(low, high + 1):
            try:
                schema(api_key, version)
            except LookupError:
                continue
            loaded += 1
    log.info("event=schemas_loaded count=%d seconds=%.2f", loaded, time.perf_counter() - started)
    return loaded


def known_api_keys() -> frozenset[int]:
    from kio.schema.index import api_key_map  # noqa: PLC0415

    return frozenset(api_key_map)


def peek_header(frame: bytes | bytearray | memoryview) -> RequestHeader:
    """The api key, version and correlation id: the first 8 bytes of every request."""
    if len(frame) < _REQUEST_PREFIX.size:
        raise MalformedRequestError(f"request of {len(frame)} bytes has no header")
    api_key, version, correlation_id = _REQUEST_PREFIX.unpack_from(frame)
    return RequestHeader(api_key, version, correlation_id, None)


def decode_request(
    frame: bytes | bytearray | memoryview,
    supported: dict[int, tuple[int, int]],
    *,
    trace_context: bool = False,
) -> tuple[RequestHeader, ApiSchema, Any]:
    """Decode one request frame (without its size prefix).

    ``supported`` maps each API key we serve to its (min, max) versions. A
    request outside it raises UnknownApiKeyError or UnsupportedVersionError
    (ApiVersions answers the latter with an error response; any other API
    closes the connection, as Kafka does). Bytes that do not parse raise
    MalformedRequestError.

    With ``trace_context`` (the broker's decoder), a gateway's trace context is
    taken off the end of ``client_id`` into ``traceparent``
    (:mod:`shoal.wire.trace_context`), so nothing downstream sees it.
    """
    # kio's reader refuses writable buffers, and large frames arrive as the
    # FrameReader's own bytearray; a read-only view of it costs no copy.
    view = memoryview(frame).toreadonly()
    prefix = peek_header(view)
    versions = supported.get(prefix.api_key)
    if versions is None:
        raise UnknownApiKeyError(f"unknown or unsupported API key {prefix.api_key}")
    low, high = versions
    if not low <= prefix.api_version <= high:
        raise UnsupportedVersionError(
            prefix,
            f"API key {prefix.api_key} version {prefix.api_version} is outside {low}-{high}",
        )
    api = schema(prefix.api_key, prefix.api_version)
    try:
        view = check_request(view, api.request_class.__header_schema__, api.request_class)
    except GuardError as exc:
        raise MalformedRequestError(
            f"API key {prefix.api_key} v{prefix.api_version} is malformed: {exc}"
        ) from exc
    # After the guard, kio should not fail; these are kept as a second line.
    try:
        kio_header, header_size = api.read_request_header(view)
        body = api.decode_body(view, header_size)
    except (SerialError, ValueError, OverflowError, IndexError, KeyError, struct.error) as exc:
        raise MalformedRequestError(
            f"API key {prefix.api_key} v{prefix.api_version} does not decode: {exc!r}"
        ) from exc
    client_id, traceparent = (
        split_client_id(kio_header.client_id) if trace_context else (kio_header.client_id, None)
    )
    header = RequestHeader(
        prefix.api_key, prefix.api_version, prefix.correlation_id, client_id, traceparent
    )
    return header, api, body


def response_header(header: RequestHeader, api: ApiSchema) -> bytes:
    """Response header v0 (correlation id) or v1 (plus empty tagged fields).

    ApiVersions always answers with v0, so that a client can read the answer
    whatever version it asked for. Written by hand: five bytes, no schema.
    """
    correlation = _INT32.pack(header.correlation_id)
    if api.flexible and header.api_key != API_VERSIONS_KEY:
        return correlation + _TAGGED_FIELDS_NONE
    return correlation


def encode_request(api: ApiSchema, correlation_id: int, client_id: str, body: Any) -> bytes:
    """A whole request frame: size prefix, request header, body."""
    header_class = api.request_class.__header_schema__
    header = header_class(
        request_api_key=api.api_key,
        request_api_version=api.version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    compiled_writer(header_class)(out, header)
    api.write_request(out, body)
    # The size is written over the placeholder and the value taken whole: copying a
    # view of the buffer out (bytes(getbuffer())) took 590 us for a 500 kB produce
    # request the gateway relays, this 50 us.
    size = out.tell() - _INT32.size
    out.seek(0)
    out.write(_INT32.pack(size))
    return out.getvalue()


def decode_response(api: ApiSchema, frame: bytes | bytearray | memoryview) -> tuple[int, Any]:
    """(correlation id, body) of one response frame without its size prefix.

    Raises MalformedRequestError (the peer sent bytes that do not parse).
    """
    view = memoryview(frame).toreadonly()
    try:
        (correlation_id,) = _INT32.unpack_from(view)
        offset = _INT32.size
        if api.flexible and api.api_key != API_VERSIONS_KEY:
            # Response header v1: tagged fields; only the empty set is ever sent.
            offset += 1
        body, _ = api.read_response(view, offset)
    except (SerialError, ValueError, OverflowError, IndexError, KeyError, struct.error) as exc:
        raise MalformedRequestError(
            f"API key {api.api_key} v{api.version} response does not decode: {exc!r}"
        ) from exc
    return correlation_id, body


def encode_response(
    header: RequestHeader, api: ApiSchema, body: Any, splicer: RecordsSplicer | None = None
) -> list[Chunk]:
    """The whole response frame: size prefix, header, body (with records spliced in).

    ``body`` is a response entity, or bytes a caller encoded (and cached) already.
    """
    head = response_header(header, api)
    if splicer is None and not isinstance(body, bytes):
        # Encoded behind a placeholder size, as encode_request does: a relayed fetch
        # response's records are not copied once more to put the size in front.
        out = io.BytesIO()
        out.write(b"\0\0\0\0")
        out.write(head)
        api.encode_into(out, body)
        size = out.tell() - _INT32.size
        out.seek(0)
        out.write(_INT32.pack(size))
        return [out.getvalue()]
    encoded = body if isinstance(body, bytes) else api.encode_body(body)
    if splicer is None:
        return [_INT32.pack(len(head) + len(encoded)) + head + encoded]
    chunks = splicer.splice(encoded, api.flexible)
    size = len(head) + sum(chunk_size(c) for c in chunks)
    chunks[0] = _INT32.pack(size) + head + chunks[0]  # type: ignore[operator]
    return chunks
