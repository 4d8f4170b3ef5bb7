"""Record keys and values as JSON carries them, key partitioning, and streamed bodies.

Pure functions, no I/O: the routes and the records controller use them, and
the unit tests check them against other implementations.

* **Partitioning** is Kafka's default for a keyed record: murmur2 of the key
  bytes, made positive by masking the sign bit, modulo the partition count
  (Java's ``BuiltInPartitioner.partitionForKey``, librdkafka's
  ``murmur2_random``), so a key lands in the same partition whichever door
  produced it.
* **Data types** follow Confluent REST v3: ``BINARY`` data is base64 text,
  ``STRING`` is text stored as UTF-8, ``JSON`` is any JSON value stored in
  its compact serialization. Reading picks a *format* for the bytes back:
  ``binary`` (base64), ``string`` (UTF-8 text) or ``json`` (parsed).
* **Streamed produce bodies** are JSON objects one after another (concatenated
  or newline-delimited, as Confluent accepts them); :class:`ObjectStream`
  cuts them out of arbitrary chunks as they arrive.
"""

from __future__ import annotations

import binascii
import enum
import json
import re
from typing import Any, Final

# SIMD base64: a fifth of the standard library's time on a 1 KiB value, which was
# the largest single cost of an HTTP record (benchmarks/profiles/README.md).
import pybase64

_M: Final = 0x5BD1E995
_SEED: Final = 0x9747B28C
_MASK32: Final = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``Utils.murmur2``) of ``data``, as a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    full = length & ~3
    for i in range(0, full, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = length & 3
    if tail == 3:
        h ^= data[full + 2] << 16
    if tail >= 2:
        h ^= data[full + 1] << 8
    if tail >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``."""
    if partitions <= 0:
        raise ValueError("a topic has at least one partition")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class DataType(enum.StrEnum):
    """How a produced key or value is given in JSON (Confluent REST v3's embedded types)."""

    BINARY = "BINARY"
    JSON = "JSON"
    STRING = "STRING"


class ReadFormat(enum.StrEnum):
    """How read keys and values are shown."""

    BINARY = "binary"
    STRING = "string"
    JSON = "json"


class EncodingError(ValueError):
    """Data that does not fit its declared type or asked format; the message says why."""


def encode_data(data_type: DataType, data: Any) -> bytes:
    """The bytes stored for one key or value."""
    if data_type is DataType.BINARY:
        if not isinstance(data, str):
            raise EncodingError("BINARY data must be a base64 string")
        try:
            return _unb64_strict(data)
        except (binascii.Error, ValueError):
            raise EncodingError(f"BINARY data is not valid base64 ({_BASE64})") from None
    if data_type is DataType.STRING:
        if not isinstance(data, str):
            raise EncodingError("STRING data must be a JSON string")
        return data.encode("utf-8", errors="surrogatepass")
    try:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise EncodingError("JSON data may not hold NaN or Infinity") from None
    return text.encode()


def decode_data(raw: bytes | None, fmt: ReadFormat, what: str) -> Any:
    """One stored key or value as the caller asked to see it; None stays None."""
    if raw is None:
        return None
    if fmt is ReadFormat.BINARY:
        return pybase64.b64encode(raw).decode("ascii")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise EncodingError(f"{what} is not UTF-8 text; read it with format=binary") from None
    if fmt is ReadFormat.STRING:
        return text
    try:
        return json.loads(text)
    except ValueError:
        raise EncodingError(f"{what} is not JSON; read it with format=string or binary") from None


_BASE64: Final = "A-Z, a-z, 0-9, + and /, padded with = to a multiple of 4 characters"


def _unb64_strict(text: str) -> bytes:
    # Padded base64 only, as b64decode(validate=True) takes it, except that padding
    # after a whole quantum ("AAAA=") is refused, as Java's decoder (Confluent's) does.
    return pybase64.b64decode(text, validate=True)


def b64(raw: bytes | None) -> str | None:
    return None if raw is None else pybase64.b64encode(raw).decode("ascii")


def unb64(text: str | None, what: str) -> bytes | None:
    if text is None:
        return None
    try:
        return _unb64_strict(text)
    except (binascii.Error, ValueError):
        raise EncodingError(f"{what} is not valid base64 ({_BASE64})") from None


_INTERESTING: Final = re.compile(r'[{}"\\]')
_SPACE: Final = frozenset(" \t\r\n")


class StreamError(ValueError):
    """The body is not a sequence of JSON objects; nothing after this point is read."""


class ObjectStream:
    """Cuts a body of concatenated JSON objects into one text per object, chunk by chunk.

    Only braces, quotes and backslashes are looked at (a regex jumps between
    them), so an object is found without parsing it; each text is then parsed
    on its own, and one malformed record fails alone. Between objects only
    whitespace is allowed. ``max_object_bytes`` bounds what one object may
    buffer, so a body without a closing brace cannot grow without limit.
    """

    def __init__(self, max_object_bytes: int) -> None:
        self._max = max_object_bytes
        self._buffer = ""
        self._pending = b""
        self._scanned = 0
        self._depth = 0
        self._in_string = False

    def feed(self, chunk: bytes) -> list[str]:
        data = self._pending + chunk
        # A chunk may end inside a multi-byte character: keep its start for the next one.
        cut = _complete_utf8(data)
        self._pending = data[cut:]
        try:
            self._buffer += data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            raise StreamError("the body is not UTF-8") from None
        return self._objects()

    def close(self) -> None:
        """The body ended: anything left over is a truncated object."""
        if self._pending or self._buffer.strip():
            raise StreamError("the body ends inside a JSON object")

    def _objects(self) -> list[str]:
        found: list[str] = []
        buffer = self._buffer
        pos = self._scanned
        start = 0
        while True:
            if self._depth == 0:
                while pos < len(buffer) and buffer[pos] in _SPACE:
                    pos += 1
                start = pos
                if pos >= len(buffer):
                    break
                if buffer[pos] != "{":
                    raise StreamError(f"expected a JSON object, found {buffer[pos]!r}")
            pos, more = self._step(buffer, pos)
            if self._depth == 0:
                found.append(buffer[start:pos])
                start = pos
            if not more:
                break
        self._buffer = buffer[start:]
        self._scanned = pos - start
        if len(self._buffer) > self._max:
            raise StreamError(f"one JSON object is longer than {self._max} bytes")
        return found

    def _step(self, buffer: str, pos: int) -> tuple[int, bool]:
        """Past the next brace, quote or escape: (position, whether to go on scanning)."""
        match = _INTERESTING.search(buffer, pos)
        if match is None:
            return len(buffer), False
        char = match.group()
        pos = match.end()
        if self._in_string:
            if char == "\\":
                if pos >= len(buffer):
                    # The escaped character has not arrived: look at the backslash again.
                    return pos - 1, False
                return pos + 1, True
            if char == '"':
                self._in_string = False
        elif char == '"':
            self._in_string = True
        elif char == "{":
            self._depth += 1
        elif char == "}":
            self._depth -= 1
        # A backslash outside a string is malformed JSON; json.loads will say so.
        return pos, True


def _complete_utf8(data: bytes) -> int:
    """The length of ``data`` without a trailing, incomplete UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII)
            needed = (
                1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            )
            return len(data) - back if needed > back else len(data)
    return len(data)
