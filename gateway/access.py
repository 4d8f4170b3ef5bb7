"""One authenticated principal's rights, as every API rewriter asks for them.

Built per request from the latest tenancy snapshot, so an ACL added or
removed applies to the next request of an open connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from shoal.gateway.namespace import Namespace
from shoal.tenancy.acl import CLUSTER_NAME, authorize
from shoal.tenancy.model import AclBinding, Operation, Quotas, ResourceType

SUPPORTED_OPERATIONS: Final = {
    ResourceType.TOPIC: (
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DESCRIBE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (
        Operation.CREATE,
        Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
        Operation.ALTER,
        Operation.DESCRIBE,
    ),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
}
"""What each resource type can be asked for (Kafka's ``AclEntry.supportedOperations``):
the bits of "authorized operations" answers, and what ALL stands for."""


@dataclass(frozen=True, slots=True)
class TenantAccess:
    """What one key of one tenant may do; names are the tenant's own."""

    tenant: str
    key_id: str
    bindings: Sequence[AclBinding]
    quotas: Quotas
    platform_admin: bool = False

    @property
    def namespace(self) -> Namespace:
        return Namespace(self.tenant)

    def allowed(self, resource_type: ResourceType, name: str, operation: Operation) -> bool:
        return authorize(self.bindings, self.tenant, self.key_id, resource_type, name, operation)

    def may_topic(self, name: str, operation: Operation) -> bool:
        return self.allowed(ResourceType.TOPIC, name, operation)

    def may_group(self, name: str, operation: Operation) -> bool:
        return self.allowed(ResourceType.GROUP, name, operation)

    def may_transaction(self, name: str, operation: Operation) -> bool:
        return self.allowed(ResourceType.TRANSACTIONAL_ID, name, operation)

    def may_cluster(self, operation: Operation) -> bool:
        return self.allowed(ResourceType.CLUSTER, CLUSTER_NAME, operation)

    def authorized_operations(self, resource_type: ResourceType, name: str) -> int:
        """Kafka's bit field of the operations this principal may do on the resource."""
        bits = 0
        for operation in SUPPORTED_OPERATIONS[resource_type]:
            if self.allowed(resource_type, name, operation):
                bits |= 1 << operation
        return bits
