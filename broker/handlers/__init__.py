"""The Kafka APIs the broker serves, with the versions it implements.

:data:`API_VERSIONS` is what ApiVersions advertises; a request outside it
is refused before any handler runs. Minimum versions follow Kafka 4's
baseline (KIP-896): older versions are gone from the clients we support.
"""

from __future__ import annotations

from typing import Final

from shoal.broker.handlers.api_versions import ApiVersionsResponder
from shoal.broker.handlers.base import Handler
from shoal.broker.handlers.configs import (
    handle_describe_configs,
    handle_incremental_alter_configs,
)
from shoal.broker.handlers.coordinator import handle_find_coordinator
from shoal.broker.handlers.fetch import handle_fetch
from shoal.broker.handlers.metadata import MetadataResponder, handle_describe_cluster
from shoal.broker.handlers.offsets import handle_list_offsets, handle_offset_for_leader_epoch
from shoal.broker.handlers.produce import handle_produce
from shoal.broker.handlers.topics import (
    handle_create_partitions,
    handle_create_topics,
    handle_delete_topics,
)

PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
FIND_COORDINATOR: Final = 10
API_VERSIONS_KEY: Final = 18
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
OFFSET_FOR_LEADER_EPOCH: Final = 23
DESCRIBE_CONFIGS: Final = 32
CREATE_PARTITIONS: Final = 37
INCREMENTAL_ALTER_CONFIGS: Final = 44
DESCRIBE_CLUSTER: Final = 60

API_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    PRODUCE: (3, 11),
    FETCH: (4, 16),
    LIST_OFFSETS: (1, 8),
    METADATA: (0, 12),
    FIND_COORDINATOR: (0, 4),
    API_VERSIONS_KEY: (0, 4),
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    DESCRIBE_CONFIGS: (1, 4),
    CREATE_PARTITIONS: (0, 3),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    DESCRIBE_CLUSTER: (0, 1),
}


def build_handlers() -> dict[int, Handler]:
    """A fresh handler per API (some keep per-broker caches)."""
    return {
        PRODUCE: handle_produce,
        FETCH: handle_fetch,
        LIST_OFFSETS: handle_list_offsets,
        METADATA: MetadataResponder().handle,
        FIND_COORDINATOR: handle_find_coordinator,
        API_VERSIONS_KEY: ApiVersionsResponder(API_VERSIONS).handle,
        CREATE_TOPICS: handle_create_topics,
        DELETE_TOPICS: handle_delete_topics,
        OFFSET_FOR_LEADER_EPOCH: handle_offset_for_leader_epoch,
        DESCRIBE_CONFIGS: handle_describe_configs,
        CREATE_PARTITIONS: handle_create_partitions,
        INCREMENTAL_ALTER_CONFIGS: handle_incremental_alter_configs,
        DESCRIBE_CLUSTER: handle_describe_cluster,
    }
