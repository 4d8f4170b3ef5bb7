"""The coordination interface: what brokers need from the store that etcd implements.

Kept narrow on purpose: brokers register, one of them campaigns to be
controller, topics are read and written, partition states are changed by
compare-and-swap, and every broker follows the changes.
Every write returns the store revision it landed at, so the writer can wait
until its own image has caught up (:meth:`MetadataCache.wait_for`) before it
answers a client: a topic created through a broker is then visible in that
broker's next Metadata response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from shoal.broker.cluster.model import (
    BrokerRegistration,
    ClusterImage,
    ControllerLease,
    NodeId,
    PartitionState,
    TopicName,
    TopicRecord,
)


class StoreError(Exception):
    """The store could not do what was asked."""


class StoreUnavailableError(StoreError):
    """The store did not answer (etcd down or unreachable)."""


class TopicExistsError(StoreError):
    pass


class UnknownTopicError(StoreError):
    pass


class ConflictError(StoreError):
    """A compare-and-swap lost: someone else changed the record first."""


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """A new state for one partition, valid only over the state at ``expected_revision``."""

    topic: TopicName
    index: int
    state: PartitionState
    expected_revision: int


@dataclass(frozen=True, slots=True)
class AssignmentChange:
    """A topic's new replica assignment with its partitions' new states, valid only over
    the record at ``expected_revision`` and each state at its own expected revision."""

    record: TopicRecord
    expected_revision: int
    partitions: tuple[PartitionChange, ...]


class MetadataStore(Protocol):
    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def ensure_cluster_id(self) -> str:
        """The cluster's id, created by the first broker that asks."""
        ...

    async def register_broker(
        self,
        registration: BrokerRegistration,
        ttl_s: int,
        heartbeat_s: float | None = None,
        stall_timeout_s: float = ...,
    ) -> int:
        """Announce a live broker; the registration vanishes ``ttl_s`` after we stop renewing
        (renewed every ``heartbeat_s``, or every third of ``ttl_s`` if that is sooner, while
        the event loop has run within ``stall_timeout_s``)."""
        ...

    async def deregister_broker(self) -> None: ...

    async def update_registration(self, registration: BrokerRegistration) -> int: ...

    async def registration_lease(self, node_id: NodeId) -> tuple[int, str, int] | None:
        """The lease id, host and port of ``node_id``'s registration, if it is registered."""
        ...

    async def fence_broker(self, node_id: NodeId, lease_id: int) -> bool:
        """End a dead broker's registration at once (revoke its lease); False if gone."""
        ...

    async def campaign(self, node_id: NodeId) -> bool:
        """Become controller if nobody is; True if we won."""
        ...

    async def resign(self, lease: ControllerLease) -> None: ...

    async def update_partitions(
        self, changes: Sequence[PartitionChange], controller: ControllerLease | None = None
    ) -> int:
        """Compare-and-swap partition states; ConflictError if one changed meanwhile."""
        ...

    async def create_topic(self, record: TopicRecord, states: Sequence[PartitionState]) -> int:
        """Create a topic and its partitions' state in one transaction.

        Raises TopicExistsError if the name is taken.
        """
        ...

    async def delete_topic(self, name: TopicName) -> int: ...

    async def update_topic(
        self,
        record: TopicRecord,
        expected_revision: int,
        new_partitions: Mapping[int, PartitionState] | None = None,
    ) -> int:
        """Replace a topic record if it is still at ``expected_revision``; ConflictError if not."""
        ...

    async def update_assignment(
        self, change: AssignmentChange, controller: ControllerLease | None = None
    ) -> int:
        """Compare-and-swap a topic record and partition states together (reassignment);
        ConflictError if any of them changed meanwhile."""
        ...

    async def allocate_producer_ids(self, count: int) -> int:
        """Reserve ``count`` producer ids for this broker; returns the first (cluster-unique)."""
        ...

    def images(self) -> AsyncIterator[ClusterImage]:
        """The current image, then a new one after every change, until closed."""
        ...
