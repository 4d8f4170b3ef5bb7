"""Every Kafka API the gateway understands, with the versions it can rewrite.

An API missing here is refused (the connection is closed), never passed
through blind: the gateway cannot know which names such a request carries.
The versions a client is offered are these ranges intersected with what the
brokers answer (:mod:`shoal.gateway.server`); the APIs in
:data:`GATEWAY_ONLY` are answered by the gateway itself and need no broker.
"""

from __future__ import annotations

from typing import Final

from shoal.gateway.apis import (
    acls,
    client_quotas,
    cluster,
    consumer_groups,
    elections,
    groups,
    records,
    scram_credentials,
    topics,
    transactions,
)
from shoal.gateway.apis.base import Rewriter

API_VERSIONS: Final = 18
SASL_HANDSHAKE: Final = 17
SASL_AUTHENTICATE: Final = 36
DESCRIBE_CLIENT_QUOTAS: Final = 48
ALTER_CLIENT_QUOTAS: Final = 49
WRITE_TXN_MARKERS: Final = 27
DESCRIBE_ACLS: Final = 29
CREATE_ACLS: Final = 30
DELETE_ACLS: Final = 31
DESCRIBE_USER_SCRAM_CREDENTIALS: Final = 50
ALTER_USER_SCRAM_CREDENTIALS: Final = 51

REWRITERS: Final[dict[int, tuple[tuple[int, int], Rewriter]]] = {
    0: ((3, 11), records.produce),
    1: ((4, 16), records.fetch),
    2: ((1, 8), records.list_offsets),
    3: ((0, 12), cluster.metadata),
    8: ((2, 9), groups.offset_commit),
    9: ((1, 9), groups.offset_fetch),
    10: ((0, 4), cluster.find_coordinator),
    11: ((2, 9), groups.membership),
    12: ((0, 4), groups.membership),
    13: ((0, 5), groups.membership),
    14: ((0, 5), groups.membership),
    15: ((0, 5), groups.describe_groups),
    16: ((0, 5), groups.list_groups),
    19: ((2, 7), topics.create_topics),
    20: ((1, 6), topics.delete_topics),
    21: ((0, 2), records.delete_records),
    22: ((0, 5), transactions.init_producer_id),
    23: ((2, 4), records.offset_for_leader_epoch),
    24: ((0, 3), transactions.add_partitions_to_txn),
    25: ((0, 3), transactions.add_offsets_to_txn),
    26: ((0, 3), transactions.end_txn),
    WRITE_TXN_MARKERS: ((1, 2), transactions.write_txn_markers),
    28: ((0, 3), groups.txn_offset_commit),
    DESCRIBE_ACLS: ((1, 3), acls.describe_acls),
    CREATE_ACLS: ((1, 3), acls.create_acls),
    DELETE_ACLS: ((1, 3), acls.delete_acls),
    32: ((1, 4), topics.describe_configs),
    33: ((0, 2), topics.alter_configs),
    37: ((0, 3), topics.create_partitions),
    42: ((0, 2), groups.delete_groups),
    43: ((0, 2), elections.elect_leaders),
    44: ((0, 1), topics.alter_configs),
    47: ((0, 0), groups.offset_delete),
    60: ((0, 1), cluster.describe_cluster),
    61: ((0, 0), transactions.describe_producers),
    65: ((0, 0), transactions.describe_transactions),
    66: ((0, 1), transactions.list_transactions),
    68: ((0, 1), consumer_groups.consumer_group_heartbeat),
    69: ((0, 1), consumer_groups.consumer_group_describe),
    DESCRIBE_CLIENT_QUOTAS: ((0, 1), client_quotas.describe_client_quotas),
    ALTER_CLIENT_QUOTAS: ((0, 1), client_quotas.alter_client_quotas),
    DESCRIBE_USER_SCRAM_CREDENTIALS: ((0, 0), scram_credentials.describe),
    ALTER_USER_SCRAM_CREDENTIALS: ((0, 0), scram_credentials.alter),
}

GATEWAY_ONLY: Final[dict[int, tuple[int, int]]] = {
    API_VERSIONS: (0, 4),
    SASL_HANDSHAKE: (0, 1),
    SASL_AUTHENTICATE: (0, 2),
    DESCRIBE_CLIENT_QUOTAS: (0, 1),
    ALTER_CLIENT_QUOTAS: (0, 1),
    # A tenant's bindings are the gateway's: the brokers hold none (docs/acls.md).
    DESCRIBE_ACLS: (1, 3),
    CREATE_ACLS: (1, 3),
    DELETE_ACLS: (1, 3),
    WRITE_TXN_MARKERS: (1, 2),  # always CLUSTER_AUTHORIZATION_FAILED, as Kafka for a non-broker
    # SCRAM credentials are the API keys' (tenancy records): no broker has any.
    DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
}
"""APIs the gateway answers alone; their versions are not intersected with the brokers'."""

DECODED_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    key: versions for key, (versions, _) in REWRITERS.items()
} | GATEWAY_ONLY
"""Every API version the gateway may decode or encode, from clients or to brokers."""
