"""Encoders for kio's message classes, compiled once per class into plain Python.

kio writes an entity field by field through generic writers: a function call,
a ``struct.pack`` with its format looked up, a write to a ``BytesIO`` and a
range-checked ``uvarint`` per value, and a fresh ``BytesIO`` per flexible
struct for its tagged fields, nearly always empty. On a broker answering
small requests that was the largest single cost (the kio writer took a fifth
of the broker's CPU for an empty Fetch answer, 15 us for a one-partition
Produce answer; ``benchmarks/request_cost.py``).

:func:`compiled_writer` reads the same field metadata kio does (its
introspection of each dataclass field: type, nullability, tag) and writes the
same bytes to the same ``BytesIO``: each class becomes one generated
function of straight-line statements, with integers packed by precompiled
``Struct`` objects. Tagged fields take kio's own writer whenever one is set
(rare: most tagged fields stay at their defaults), so only the common case
is ours. ``tests/unit/test_wire_compiled_writer.py`` checks the bytes against
kio's for every message class of every API version either server handles.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from typing import Any, Final

from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial._serialize import get_field_writer
from kio.serial.writers import write_tagged_field
from kio.static.primitive import uvarint

from shoal.wire.varint import encode_uvarint

EntityWriter = Callable[[io.BytesIO, Any], None]

_STRUCTS: Final = {
    "int8": ">b",
    "int16": ">h",
    "int32": ">i",
    "int64": ">q",
    "uint8": ">B",
    "uint16": ">H",
    "uint32": ">I",
    "uint64": ">Q",
    "float64": ">d",
    "bool": ">?",
}
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_NULL_I16: Final = _I16.pack(-1)
_NULL_I32: Final = _I32.pack(-1)
_ZERO_UUID: Final = bytes(16)
_EMPTY_TAGS: Final = b"\x00"


def _uvarint(value: int) -> bytes:
    # Lengths and counts nearly always fit in one byte: those are looked up.
    return _SMALL[value] if value < 0x80 else encode_uvarint(value)


_SMALL: Final = tuple(bytes((i,)) for i in range(0x80))


def _compact_bytes(value: str | bytes) -> bytes:
    if isinstance(value, str):
        value = value.encode()
    return _uvarint(len(value) + 1) + value


def _nullable_compact_bytes(value: str | bytes | None) -> bytes:
    return b"\x00" if value is None else _compact_bytes(value)


def _legacy_string(value: str) -> bytes:
    encoded = value.encode()
    return _I16.pack(len(encoded)) + encoded


def _nullable_legacy_string(value: str | None) -> bytes:
    return _NULL_I16 if value is None else _legacy_string(value)


def _legacy_bytes(value: bytes) -> bytes:
    return _I32.pack(len(value)) + value


def _nullable_legacy_bytes(value: bytes | None) -> bytes:
    return _NULL_I32 if value is None else _legacy_bytes(value)


def _uuid(value: Any) -> bytes:
    return _ZERO_UUID if value is None else bytes(value.bytes)


def _millis_i32(value: Any) -> bytes:
    return _I32.pack(round(value.total_seconds() * 1000))


def _millis_i64(value: Any) -> bytes:
    return _I64.pack(round(value.total_seconds() * 1000))


def _epoch_millis(value: Any) -> bytes:
    return _I64.pack(round(value.timestamp() * 1000))


def _nullable_epoch_millis(value: Any) -> bytes:
    return _I64.pack(-1) if value is None else _epoch_millis(value)


def _error_code(code: Any) -> bytes:
    return _I16.pack(code.value)


_OTHERS: Final[dict[tuple[str, bool], Callable[[Any], bytes]]] = {
    ("uuid", False): _uuid,
    ("uuid", True): _uuid,
    ("error_code", False): _error_code,
    ("timedelta_i32", False): _millis_i32,
    ("timedelta_i64", False): _millis_i64,
    ("datetime_i64", False): _epoch_millis,
    ("datetime_i64", True): _nullable_epoch_millis,
}
"""Writers by (kafka type, nullable) for the types that are neither numbers nor text."""


def _primitive(kafka_type: str, flexible: bool, optional: bool) -> Callable[[Any], bytes]:
    """A function from a value to its bytes, as kio's ``get_writer`` would write them."""
    if kafka_type in _STRUCTS and not optional:
        return struct.Struct(_STRUCTS[kafka_type]).pack
    if kafka_type in ("string", "bytes", "records"):
        if flexible:
            return _nullable_compact_bytes if optional else _compact_bytes
        if kafka_type == "string":
            return _nullable_legacy_string if optional else _legacy_string
        return _nullable_legacy_bytes if optional else _legacy_bytes
    try:
        return _OTHERS[kafka_type, optional]
    except KeyError:
        raise NotImplementedError(
            f"no writer for {kafka_type!r} ({flexible=}, {optional=})"
        ) from None


_WRITERS: Final[dict[type[Any], EntityWriter]] = {}


def compiled_writer(entity_type: type[Any]) -> EntityWriter:
    """A function writing an entity of ``entity_type`` to a BytesIO, byte for byte
    as kio's ``entity_writer`` writes it. Compiled on first use, then kept."""
    found = _WRITERS.get(entity_type)
    if found is None:
        found = _WRITERS[entity_type] = _compile(entity_type)
    return found


def _compile(entity_type: type[Any]) -> EntityWriter:
    flexible: bool = entity_type.__flexible__
    # Kafka writes a request header's client id as a legacy string in every version.
    legacy_client_id = entity_type.__name__ == "RequestHeader"
    names: dict[str, Any] = {}
    lines = ["def write(out, e):", "    w = out.write"]

    def bind(value: Any) -> str:
        name = f"_{len(names)}"
        names[name] = value
        return name

    tagged: list[tuple[int, Field[Any], Any, Any]] = []
    for field in fields(entity_type):
        tag = get_field_tag(field)
        if tag is not None:
            writer = get_field_writer(field, flexible, legacy_client_id, is_tag=True)
            tagged.append((tag, field, writer, get_tagged_field_default(field)))
            continue
        if legacy_client_id and field.name == "client_id":
            lines.append(f"    w({bind(_nullable_legacy_string)}(e.client_id))")
        else:
            lines += _field_lines(field, flexible, bind)
    if flexible:
        if tagged:
            tags = bind(tuple(sorted(tagged, key=lambda t: t[0])))
            lines.append(f"    _tagged_fields(out, e, {tags})")
        else:
            lines.append("    w(_EMPTY)")
    names["_tagged_fields"] = _tagged_fields
    names["_uvarint"] = _uvarint
    names["_EMPTY"] = _EMPTY_TAGS
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), names, namespace)  # noqa: S102 - source built above from kio's schema
    write: EntityWriter = namespace["write"]
    write.__qualname__ = f"write_{entity_type.__name__}"
    return write


def _field_lines(field: Field[Any], flexible: bool, bind: Callable[[Any], str]) -> list[str]:
    value = f"e.{field.name}"
    optional = is_optional(field)
    match classify_field(field):
        case PrimitiveField() if get_schema_field_type(field) in ("bytes", "records"):
            # The length and the bytes are written apart: joined, a relayed fetch
            # answer's megabytes of records would be copied once more.
            null, length = _null_and_length(flexible, bind)
            lines = [f"    v = {value}"]
            if optional:
                lines += ["    if v is None:", f"        w({null})", "    else:"]
            indent = "    " * (2 if optional else 1)
            return [*lines, f"{indent}w({length})", f"{indent}w(v)"]
        case PrimitiveField():
            pack = bind(_primitive(get_schema_field_type(field), flexible, optional))
            return [f"    w({pack}({value}))"]
        case EntityField(field_type):
            write = bind(compiled_writer(field_type))
            if not optional:
                return [f"    {write}(out, {value})"]
            return [
                f"    v = {value}",
                "    if v is None:",
                "        w(b'\\xff')",  # kio's null marker, an int8 of -1
                "    else:",
                "        w(b'\\x01')",
                f"        {write}(out, v)",
            ]
        case PrimitiveTupleField():
            pack = bind(_primitive(get_schema_field_type(field), flexible, False))
            item = f"w({pack}(item))"
        case EntityTupleField(field_type):
            item = f"{bind(compiled_writer(field_type))}(out, item)"
    null, length = _null_and_length(flexible, bind)
    return [
        f"    v = {value}",
        "    if v is None:",
        f"        w({null})",
        "    else:",
        f"        w({length})",
        "        for item in v:",
        f"            {item}",
    ]


def _null_and_length(flexible: bool, bind: Callable[[Any], str]) -> tuple[str, str]:
    """Source for a null, and for the length of ``v``, of an array or bytes field: a
    varint of length + 1 (0 for null) when flexible, else an int32 (-1 for null)."""
    if flexible:
        return "b'\\x00'", "_uvarint(len(v) + 1)"
    return "b'\\xff\\xff\\xff\\xff'", f"{bind(_I32.pack)}(len(v))"


def _tagged_fields(
    out: io.BytesIO, entity: Any, tagged: tuple[tuple[int, Field[Any], Any, Any], ...]
) -> None:
    """The tagged-field section, as kio writes it: fields at their default are left out."""
    written = []
    for tag, field, writer, implicit_default in tagged:
        value = getattr(entity, field.name)
        default = field.default
        # Most are at their default, which is one shared instance: identity first.
        if (
            value is default
            or value == default
            or (default is MISSING and value == implicit_default)
        ):
            continue
        written.append((tag, writer, value))
    out.write(_uvarint(len(written)))
    for tag, writer, value in written:
        write_tagged_field(out, uvarint(tag), writer, value)
