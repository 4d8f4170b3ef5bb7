"""The request guard over random requests of every version a server decodes.

Every whole request passes the guard unchanged, and every shorter prefix of
it is refused: the walk checks each length and each fixed-size run of fields
against the bytes left, so no truncation reaches kio's reader.
"""

from __future__ import annotations

import random
from io import BytesIO
from typing import Any

import pytest
from kio.serial import entity_writer
from random_entities import message_classes, random_entity

from shoal.wire.guard import GuardError, check_request

SAMPLES = 4
REQUESTS = [(name, cls) for name, cls in message_classes() if name.endswith(".request")]


@pytest.mark.parametrize(("name", "cls"), REQUESTS, ids=[name for name, _ in REQUESTS])
def test_a_whole_request_passes_and_every_prefix_is_refused(name: str, cls: type[Any]) -> None:
    rng = random.Random(name)
    header_class = cls.__header_schema__
    for _ in range(SAMPLES):
        out = BytesIO()
        entity_writer(header_class)(out, random_entity(rng, header_class))
        entity_writer(cls)(out, random_entity(rng, cls))
        frame = out.getvalue()
        assert bytes(check_request(memoryview(frame), header_class, cls)) == frame
        for size in sorted({*rng.sample(range(len(frame)), min(len(frame), 40)), len(frame) - 1}):
            with pytest.raises(GuardError):
                check_request(memoryview(frame[:size]), header_class, cls)
