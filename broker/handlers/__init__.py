"""The Kafka APIs the broker serves, with the versions it implements.

:data:`API_VERSIONS` is what ApiVersions advertises; a request outside it
is refused before any handler runs. Minimum versions follow Kafka 4's
baseline (KIP-896): older versions are gone from the clients we support.
"""

from __future__ import annotations

from typing import Final

from shoal.broker.handlers.acls import (
    handle_create_acls,
    handle_delete_acls,
    handle_describe_acls,
)
from shoal.broker.handlers.alter_partition import handle_alter_partition
from shoal.broker.handlers.api_versions import ApiVersionsResponder
from shoal.broker.handlers.base import Handler
from shoal.broker.handlers.configs import (
    handle_alter_configs,
    handle_describe_configs,
    handle_incremental_alter_configs,
)
from shoal.broker.handlers.consumer_groups import (
    handle_consumer_group_describe,
    handle_consumer_group_heartbeat,
)
from shoal.broker.handlers.coordinator import handle_find_coordinator
from shoal.broker.handlers.delete_records import handle_delete_records
from shoal.broker.handlers.describe_producers import handle_describe_producers
from shoal.broker.handlers.elections import handle_elect_leaders
from shoal.broker.handlers.fetch import handle_fetch
from shoal.broker.handlers.group_offsets import (
    handle_offset_commit,
    handle_offset_delete,
    handle_offset_fetch,
    handle_txn_offset_commit,
)
from shoal.broker.handlers.groups import (
    handle_delete_groups,
    handle_describe_groups,
    handle_heartbeat,
    handle_join_group,
    handle_leave_group,
    handle_list_groups,
    handle_sync_group,
)
from shoal.broker.handlers.log_dirs import handle_describe_log_dirs
from shoal.broker.handlers.metadata import MetadataResponder, handle_describe_cluster
from shoal.broker.handlers.offsets import handle_list_offsets, handle_offset_for_leader_epoch
from shoal.broker.handlers.produce import handle_produce
from shoal.broker.handlers.producers import (
    handle_add_offsets_to_txn,
    handle_add_partitions_to_txn,
    handle_end_txn,
    handle_init_producer_id,
)
from shoal.broker.handlers.reassignments import (
    handle_alter_partition_reassignments,
    handle_list_partition_reassignments,
)
from shoal.broker.handlers.topics import (
    handle_create_partitions,
    handle_create_topics,
    handle_delete_topics,
)
from shoal.broker.handlers.transactions import (
    handle_describe_transactions,
    handle_list_transactions,
)
from shoal.broker.handlers.txn_markers import handle_write_txn_markers

PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
JOIN_GROUP: Final = 11
HEARTBEAT: Final = 12
LEAVE_GROUP: Final = 13
SYNC_GROUP: Final = 14
DESCRIBE_GROUPS: Final = 15
LIST_GROUPS: Final = 16
API_VERSIONS_KEY: Final = 18
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
DELETE_RECORDS: Final = 21
INIT_PRODUCER_ID: Final = 22
OFFSET_FOR_LEADER_EPOCH: Final = 23
ADD_PARTITIONS_TO_TXN: Final = 24
ADD_OFFSETS_TO_TXN: Final = 25
END_TXN: Final = 26
WRITE_TXN_MARKERS: Final = 27
TXN_OFFSET_COMMIT: Final = 28
DESCRIBE_ACLS: Final = 29
CREATE_ACLS: Final = 30
DELETE_ACLS: Final = 31
DESCRIBE_CONFIGS: Final = 32
ALTER_CONFIGS: Final = 33
DESCRIBE_LOG_DIRS: Final = 35
CREATE_PARTITIONS: Final = 37
DELETE_GROUPS: Final = 42
ELECT_LEADERS: Final = 43
INCREMENTAL_ALTER_CONFIGS: Final = 44
ALTER_PARTITION_REASSIGNMENTS: Final = 45
LIST_PARTITION_REASSIGNMENTS: Final = 46
OFFSET_DELETE: Final = 47
ALTER_PARTITION: Final = 56
DESCRIBE_CLUSTER: Final = 60
DESCRIBE_PRODUCERS: Final = 61
DESCRIBE_TRANSACTIONS: Final = 65
LIST_TRANSACTIONS: Final = 66
CONSUMER_GROUP_HEARTBEAT: Final = 68
CONSUMER_GROUP_DESCRIBE: Final = 69

API_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    PRODUCE: (3, 11),
    FETCH: (4, 16),
    LIST_OFFSETS: (1, 8),
    METADATA: (0, 12),
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 9),
    FIND_COORDINATOR: (0, 4),
    JOIN_GROUP: (2, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 5),
    LIST_GROUPS: (0, 5),
    API_VERSIONS_KEY: (0, 4),
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    DELETE_RECORDS: (0, 2),
    INIT_PRODUCER_ID: (0, 5),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    ADD_PARTITIONS_TO_TXN: (0, 5),
    ADD_OFFSETS_TO_TXN: (0, 3),
    END_TXN: (0, 3),
    WRITE_TXN_MARKERS: (1, 2),
    TXN_OFFSET_COMMIT: (0, 3),
    DESCRIBE_ACLS: (1, 3),
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
    DESCRIBE_CONFIGS: (1, 4),
    ALTER_CONFIGS: (0, 2),
    DESCRIBE_LOG_DIRS: (1, 5),
    CREATE_PARTITIONS: (0, 3),
    DELETE_GROUPS: (0, 2),
    ELECT_LEADERS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    LIST_PARTITION_REASSIGNMENTS: (0, 0),
    OFFSET_DELETE: (0, 0),
    ALTER_PARTITION: (2, 3),
    DESCRIBE_CLUSTER: (0, 1),
    DESCRIBE_PRODUCERS: (0, 0),
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 1),
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    CONSUMER_GROUP_DESCRIBE: (0, 1),
}


def build_handlers() -> dict[int, Handler]:
    """A fresh handler per API (some keep per-broker caches)."""
    return {
        PRODUCE: handle_produce,
        FETCH: handle_fetch,
        LIST_OFFSETS: handle_list_offsets,
        METADATA: MetadataResponder().handle,
        OFFSET_COMMIT: handle_offset_commit,
        OFFSET_FETCH: handle_offset_fetch,
        FIND_COORDINATOR: handle_find_coordinator,
        JOIN_GROUP: handle_join_group,
        HEARTBEAT: handle_heartbeat,
        LEAVE_GROUP: handle_leave_group,
        SYNC_GROUP: handle_sync_group,
        DESCRIBE_GROUPS: handle_describe_groups,
        LIST_GROUPS: handle_list_groups,
        API_VERSIONS_KEY: ApiVersionsResponder(API_VERSIONS).handle,
        CREATE_TOPICS: handle_create_topics,
        DELETE_TOPICS: handle_delete_topics,
        DELETE_RECORDS: handle_delete_records,
        INIT_PRODUCER_ID: handle_init_producer_id,
        OFFSET_FOR_LEADER_EPOCH: handle_offset_for_leader_epoch,
        ADD_PARTITIONS_TO_TXN: handle_add_partitions_to_txn,
        ADD_OFFSETS_TO_TXN: handle_add_offsets_to_txn,
        END_TXN: handle_end_txn,
        WRITE_TXN_MARKERS: handle_write_txn_markers,
        TXN_OFFSET_COMMIT: handle_txn_offset_commit,
        DESCRIBE_ACLS: handle_describe_acls,
        CREATE_ACLS: handle_create_acls,
        DELETE_ACLS: handle_delete_acls,
        DESCRIBE_CONFIGS: handle_describe_configs,
        ALTER_CONFIGS: handle_alter_configs,
        DESCRIBE_LOG_DIRS: handle_describe_log_dirs,
        CREATE_PARTITIONS: handle_create_partitions,
        DELETE_GROUPS: handle_delete_groups,
        ELECT_LEADERS: handle_elect_leaders,
        INCREMENTAL_ALTER_CONFIGS: handle_incremental_alter_configs,
        ALTER_PARTITION_REASSIGNMENTS: handle_alter_partition_reassignments,
        LIST_PARTITION_REASSIGNMENTS: handle_list_partition_reassignments,
        OFFSET_DELETE: handle_offset_delete,
        ALTER_PARTITION: handle_alter_partition,
        DESCRIBE_CLUSTER: handle_describe_cluster,
        DESCRIBE_PRODUCERS: handle_describe_producers,
        DESCRIBE_TRANSACTIONS: handle_describe_transactions,
        LIST_TRANSACTIONS: handle_list_transactions,
        CONSUMER_GROUP_HEARTBEAT: handle_consumer_group_heartbeat,
        CONSUMER_GROUP_DESCRIBE: handle_consumer_group_describe,
    }
