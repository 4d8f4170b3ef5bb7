"""shoal.wire.load_schemas: what a broker and a gateway load before they serve.

Loaded on first use, a schema imports kio's modules with the event loop
stopped (4-30 ms each); once a server has loaded its table, no request of a
version it serves imports anything.
"""

from __future__ import annotations

import sys

import pytest
from shoal.broker.handlers import API_VERSIONS
from shoal.gateway.apis import DECODED_VERSIONS

from shoal.wire import load_schemas, schema


@pytest.mark.parametrize(
    "versions",
    [API_VERSIONS, DECODED_VERSIONS],
    ids=["broker", "gateway"],
)
def test_every_version_a_server_serves_is_loaded_and_then_imports_nothing(
    versions: dict[int, tuple[int, int]],
) -> None:
    advertised = sum(high - low + 1 for low, high in versions.values())

    # Every version advertised is one kio knows: none is left out.
    assert load_schemas(versions) == advertised
    modules, misses = len(sys.modules), schema.cache_info().misses
    for api_key, (low, high) in versions.items():
        for version in range(low, high + 1):
            schema(api_key, version)
    assert schema.cache_info().misses == misses
    assert len(sys.modules) == modules


def test_versions_kio_does_not_know_are_left_out() -> None:
    assert load_schemas({9_999: (0, 2), 3: (9, 9), 18: (99, 99)}) == 1
