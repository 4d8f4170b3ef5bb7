"""A bounds check of request bytes before kio decodes them, and unknown tagged fields removed.

Two things kio 0.6.5's native reader does not do, which a broker facing
untrusted clients needs:

* It reserves memory for an array's claimed length before reading a single
  element. A 15-byte request claiming 2**34 topics makes it reserve 128 GiB,
  and the failed reservation aborts the interpreter: any client could kill
  the broker. Kafka's own parser checks each claimed length against the bytes
  left; :func:`check_request` does the same, walking the request with the
  schema kio describes, so a lie becomes MalformedRequestError.
* It raises on a tagged field it has no schema for, where Kafka's rule is to
  ignore it (tags are how fields are added without a new version). The walk
  notes such fields and :func:`check_request` returns the request without
  them, so kio never sees them.

The walk reads lengths and skips payloads; it never copies record batches.
It compiles one small plan per schema class and caches it.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Final

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

from shoal.wire.varint import VarintError, encode_uvarint, read_uvarint

_FIXED_SIZES: Final = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class GuardError(ValueError):
    """The request's bytes contradict its schema."""


def _read_uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    try:
        return read_uvarint(buf, pos, end)
    except VarintError as exc:
        raise GuardError(str(exc)) from exc


def _need(pos: int, size: int, end: int) -> int:
    if size < 0 or pos + size > end:
        raise GuardError(f"{size} bytes claimed at {pos}, only {end - pos} left")
    return pos + size


class _Walk:
    """State of one request's walk: where unknown tagged fields sit."""

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.removals: list[tuple[int, int, bytes]] = []
        """(start, end, replacement) for tag sections that hold unknown tags."""
        self.tag_depth = 0


# A "reader" walks one value from pos (not past end) and returns the next pos.
Reader = Any


def _string_reader(flexible: bool, legacy_nullable_string: bool = False) -> Reader:
    if flexible and not legacy_nullable_string:

        def read_compact(walk: _Walk, pos: int, end: int) -> int:
            length, pos = _read_uvarint(walk.buf, pos, end)
            return pos if length == 0 else _need(pos, length - 1, end)

        return read_compact

    def read_legacy(walk: _Walk, pos: int, end: int) -> int:
        _need(pos, 2, end)
        (length,) = _INT16.unpack_from(walk.buf, pos)
        return pos + 2 if length == -1 else _need(pos + 2, length, end)

    return read_legacy


def _bytes_reader(flexible: bool) -> Reader:
    if flexible:
        return _string_reader(True)

    def read_legacy(walk: _Walk, pos: int, end: int) -> int:
        _need(pos, 4, end)
        (length,) = _INT32.unpack_from(walk.buf, pos)
        return pos + 4 if length == -1 else _need(pos + 4, length, end)

    return read_legacy


def _fixed_reader(size: int) -> Reader:
    return lambda walk, pos, end: _need(pos, size, end)


def _primitive(kafka_type: str, flexible: bool, legacy_nullable_string: bool) -> tuple[Reader, int]:
    """A reader for one primitive value, and the fewest bytes it can take."""
    if kafka_type in _FIXED_SIZES:
        size = _FIXED_SIZES[kafka_type]
        return _fixed_reader(size), size
    if kafka_type == "string":
        legacy = legacy_nullable_string or not flexible
        return _string_reader(flexible, legacy_nullable_string), 2 if legacy else 1
    if kafka_type in ("bytes", "records"):
        return _bytes_reader(flexible), 1 if flexible else 4
    raise GuardError(f"no guard for kafka type {kafka_type!r}")


def _array_reader(element: Reader, min_size: int, flexible: bool, nullable: bool) -> Reader:
    def read(walk: _Walk, pos: int, end: int) -> int:
        if flexible:
            raw, pos = _read_uvarint(walk.buf, pos, end)
            count = raw - 1
        else:
            _need(pos, 4, end)
            (count,) = _INT32.unpack_from(walk.buf, pos)
            pos += 4
        if count == -1:
            if not nullable:
                # kio would hand handlers None where the schema promises a list.
                raise GuardError("null for an array that may not be null")
            return pos
        if count < 0 or count * max(min_size, 1) > end - pos:
            raise GuardError(f"array of {count} elements claimed with {end - pos} bytes left")
        for _ in range(count):
            pos = element(walk, pos, end)
        return pos

    return read


def _nullable_entity_reader(entity: Reader) -> Reader:
    def read(walk: _Walk, pos: int, end: int) -> int:
        _need(pos, 1, end)
        marker = walk.buf[pos]
        return pos + 1 if marker == 0xFF else entity(walk, pos + 1, end)

    return read


_PLANS: dict[type, tuple[Reader, int]] = {}


def _plan(cls: type[Any]) -> tuple[Reader, int]:
    """A reader for one ``cls`` entity, and the fewest bytes one can take (cached)."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _compile(cls)
    return plan


def _compile(cls: type[Any]) -> tuple[Reader, int]:
    flexible: bool = cls.__flexible__
    is_header = cls.__name__ == "RequestHeader"
    fields: list[Reader] = []
    tagged: dict[int, Reader] = {}
    min_size = 1 if flexible else 0
    # A run of fixed-size fields is one bounds check: most of a request's fields
    # are integers, and a call per field was most of the walk's cost.
    fixed_run = 0
    for field in dataclasses.fields(cls):
        tag = get_field_tag(field)
        if tag is None and (size := _fixed_size(field)) is not None:
            fixed_run += size
            min_size += size
            continue
        reader, field_min = _field_reader(field, flexible, is_header, tag is not None)
        if tag is None:
            if fixed_run:
                fields.append(_fixed_reader(fixed_run))
                fixed_run = 0
            fields.append(reader)
            min_size += field_min
        else:
            tagged[int(tag)] = reader
    if fixed_run:
        fields.append(_fixed_reader(fixed_run))

    def read(walk: _Walk, pos: int, end: int) -> int:
        for field_reader in fields:
            pos = field_reader(walk, pos, end)
        if flexible:
            pos = _tagged_section(walk, pos, end, tagged)
        return pos

    return read, min_size


def _fixed_size(field: dataclasses.Field[Any]) -> int | None:
    """Bytes a field always takes, if it is a single value of fixed size."""
    if not isinstance(classify_field(field), PrimitiveField):
        return None
    return _FIXED_SIZES.get(get_schema_field_type(field))


def _field_reader(
    field: dataclasses.Field[Any], flexible: bool, is_header: bool, is_tag: bool
) -> tuple[Reader, int]:
    kind = classify_field(field)
    legacy_string = is_header and field.name == "client_id"
    optional = not is_tag and is_optional(field)
    match kind:
        case PrimitiveField():
            return _primitive(get_schema_field_type(field), flexible, legacy_string)
        case PrimitiveTupleField():
            element, element_min = _primitive(get_schema_field_type(field), flexible, False)
            return _array_reader(element, element_min, flexible, optional), 1 if flexible else 4
        case EntityField(entity_type):
            entity, entity_min = _plan(entity_type)
            if optional:
                return _nullable_entity_reader(entity), 1
            return entity, entity_min
        case EntityTupleField(entity_type):
            entity, entity_min = _plan(entity_type)
            return _array_reader(entity, entity_min, flexible, optional), 1 if flexible else 4
    raise GuardError(f"unclassified field {field.name}")


def _tagged_section(walk: _Walk, pos: int, end: int, known: dict[int, Reader]) -> int:
    start = pos
    count, pos = _read_uvarint(walk.buf, pos, end)
    if count > end - pos:
        raise GuardError(f"{count} tagged fields claimed with {end - pos} bytes left")
    kept: list[tuple[int, int]] = []
    for _ in range(count):
        entry = pos
        tag, pos = _read_uvarint(walk.buf, pos, end)
        size, pos = _read_uvarint(walk.buf, pos, end)
        field_end = _need(pos, size, end)
        reader = known.get(tag)
        if reader is not None:
            walk.tag_depth += 1
            try:
                reader(walk, pos, field_end)
            finally:
                walk.tag_depth -= 1
            kept.append((entry, field_end))
        elif walk.tag_depth:
            raise GuardError(f"unknown tagged field {tag} inside a tagged field")
        pos = field_end
    if len(kept) != count:
        replacement = encode_uvarint(len(kept)) + b"".join(bytes(walk.buf[a:b]) for a, b in kept)
        walk.removals.append((start, pos, replacement))
    return pos


def check_request(frame: memoryview, header_class: type[Any], body_class: type[Any]) -> memoryview:
    """Walk header and body; return the frame, without unknown tagged fields if it had any.

    Raises GuardError when a length or count claims more bytes than the frame
    holds, or the frame ends early.
    """
    walk = _Walk(frame)
    end = len(frame)
    header_reader, _ = _plan(header_class)
    body_reader, _ = _plan(body_class)
    pos = header_reader(walk, 0, end)
    body_reader(walk, pos, end)
    if not walk.removals:
        return frame
    out = bytearray()
    last = 0
    for start, stop, replacement in sorted(walk.removals):
        out += frame[last:start]
        out += replacement
        last = stop
    out += frame[last:]
    return memoryview(bytes(out))
