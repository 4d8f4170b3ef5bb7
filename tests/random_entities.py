"""Random kio entities for the wire tests: every field of every struct, at random values.

Tagged fields keep their default half of the time; nullable fields are None a
quarter of the time; arrays hold up to three elements (none below the third
level of nesting, so a message stays small).
"""

from __future__ import annotations

import random
import uuid
from dataclasses import MISSING, fields
from datetime import UTC, datetime, timedelta
from typing import Any

from kio.schema.errors import ErrorCode
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
from shoal.broker.handlers import API_VERSIONS
from shoal.gateway.apis import DECODED_VERSIONS

from shoal.wire import schema

_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}


def _primitive(rng: random.Random, kafka_type: str) -> Any:
    if kafka_type in _RANGES:
        low, high = _RANGES[kafka_type]
        return rng.choice([0, -1 if low < 0 else 1, low, high, rng.randint(low, high)])
    match kafka_type:
        case "float64":
            return rng.uniform(-1e9, 1e9)
        case "bool":
            return rng.random() < 0.5
        case "string":
            return "".join(rng.choice("abc.-_é€") for _ in range(rng.choice([0, 1, 5, 200])))
        case "bytes" | "records":
            return rng.randbytes(rng.choice([0, 1, 7, 300]))
        case "uuid":
            return uuid.UUID(int=rng.getrandbits(128))
        case "error_code":
            return rng.choice(list(ErrorCode))
        case "timedelta_i32" | "timedelta_i64":
            return timedelta(milliseconds=rng.randint(0, 10**9))
        case "datetime_i64":
            return datetime.fromtimestamp(rng.randint(0, 4 * 10**12) / 1000, tz=UTC)
    raise AssertionError(f"no generator for {kafka_type}")


def random_entity(rng: random.Random, cls: type[Any], depth: int = 0) -> Any:
    values = {}
    for field in fields(cls):
        tag = get_field_tag(field)
        if tag is not None and rng.random() < 0.5 and field.default is not MISSING:
            values[field.name] = field.default
            continue
        optional = is_optional(field) and tag is None
        if optional and rng.random() < 0.25:
            values[field.name] = None
            continue
        match classify_field(field):
            case PrimitiveField():
                value = _primitive(rng, get_schema_field_type(field))
            case PrimitiveTupleField():
                kind = get_schema_field_type(field)
                value = tuple(_primitive(rng, kind) for _ in range(rng.randint(0, 3)))
            case EntityField(field_type):
                value = random_entity(rng, field_type, depth + 1)
            case EntityTupleField(field_type):
                count = rng.randint(0, 3 if depth < 3 else 0)
                value = tuple(random_entity(rng, field_type, depth + 1) for _ in range(count))
        values[field.name] = value
    return cls(**values)


def message_classes() -> list[tuple[str, type[Any]]]:
    """(name, class) of every request, response and header class either server handles."""
    found: dict[type[Any], str] = {}
    for table in (API_VERSIONS, DECODED_VERSIONS):
        for api_key, (low, high) in table.items():
            for version in range(low, high + 1):
                api = schema(api_key, version)
                for cls in (
                    api.request_class,
                    api.response_class,
                    api.request_class.__header_schema__,
                    api.response_class.__header_schema__,
                ):
                    found.setdefault(cls, f"{cls.__name__}-{cls.__module__}")
    return sorted(((name, cls) for cls, name in found.items()), key=lambda item: item[0])
