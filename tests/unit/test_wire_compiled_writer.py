"""shoal.wire.compiled_writer writes what kio writes, for every message a server handles.

Random entities of every request and response class (and every struct inside
them) of every API version the broker serves or the gateway decodes are
encoded by kio's own writer and by the compiled one; the bytes must be the
same. Tagged fields are set half of the time, so both the common path (none
set) and kio's path for set ones are taken.
"""

from __future__ import annotations

import random
from dataclasses import fields
from io import BytesIO
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from random_entities import message_classes, random_entity

from shoal.wire import schema
from shoal.wire.compiled_writer import compiled_writer

SAMPLES = 12


def _kio_bytes(cls: type[Any], entity: Any) -> bytes:
    out = BytesIO()
    entity_writer(cls)(out, entity)
    return out.getvalue()


MESSAGES = message_classes()


@pytest.mark.parametrize(("name", "cls"), MESSAGES, ids=[name for name, _ in MESSAGES])
def test_compiled_writer_writes_kio_bytes(name: str, cls: type[Any]) -> None:
    rng = random.Random(name)
    write = compiled_writer(cls)
    for _ in range(SAMPLES):
        entity = random_entity(rng, cls)
        out = BytesIO()
        write(out, entity)
        assert out.getvalue() == _kio_bytes(cls, entity)


def test_a_set_tagged_field_is_written_as_kio_writes_it() -> None:
    # Fetch v12's partition answer carries the diverging epoch as tagged field 0.
    api = schema(1, 12)
    epoch = api.make("EpochEndOffset", epoch=3, end_offset=42)
    partition = api.make(
        "PartitionData",
        partition_index=0,
        error_code=ErrorCode.none,
        high_watermark=1,
        last_stable_offset=1,
        log_start_offset=0,
        diverging_epoch=epoch,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=b"",
    )
    out = BytesIO()
    compiled_writer(type(partition))(out, partition)
    assert out.getvalue() == _kio_bytes(type(partition), partition)
    assert out.getvalue() != _kio_bytes(
        type(partition),
        api.make(
            "PartitionData",
            **{
                f.name: getattr(partition, f.name)
                for f in fields(partition)
                if f.name != "diverging_epoch"
            },
        ),
    )
