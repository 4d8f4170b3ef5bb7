"""What the cluster agrees on: brokers, topics, partition state.

These records are what the coordination store (etcd) holds, as JSON, and
what every broker keeps an in-memory image of. The image is immutable: a
change builds a new :class:`ClusterImage`, so a handler that took one sees a
consistent cluster for the whole request.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NewType

NodeId = NewType("NodeId", int)
TopicName = NewType("TopicName", str)
NO_LEADER = NodeId(-1)


def uuid_text(value: uuid.UUID) -> str:
    """Kafka prints its UUIDs (topic ids, cluster ids) as URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    node_id: NodeId
    host: str
    port: int
    rack: str | None = None
    shutting_down: bool = False
    """Set by a broker on SIGTERM: the controller moves leadership off it (controlled shutdown)."""

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "node_id": self.node_id,
                "host": self.host,
                "port": self.port,
                "rack": self.rack,
                "shutting_down": self.shutting_down,
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> BrokerRegistration:
        data = json.loads(raw)
        return cls(
            NodeId(data["node_id"]),
            data["host"],
            data["port"],
            data.get("rack"),
            bool(data.get("shutting_down", False)),
        )


@dataclass(frozen=True, slots=True)
class ControllerLease:
    """Who won the controller election, and when.

    ``epoch`` is the etcd create revision of the controller key: it grows with
    every election, so a write guarded by it fails once another broker has won.
    """

    node_id: NodeId
    epoch: int


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Leader, ISR and epochs of one partition, changed only by compare-and-swap.

    While a reassignment (KIP-455) is under way the topic's assignment lists
    the target replicas first, then those leaving; ``adding`` names the
    target replicas that were not replicas before, ``removing`` the replicas
    that are not in the target. Both are empty otherwise.
    """

    leader: NodeId
    leader_epoch: int
    isr: tuple[NodeId, ...]
    partition_epoch: int = 0
    adding: tuple[NodeId, ...] = ()
    removing: tuple[NodeId, ...] = ()

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    def to_json(self) -> bytes:
        data: dict[str, Any] = {
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "isr": list(self.isr),
            "partition_epoch": self.partition_epoch,
        }
        if self.reassigning:
            data["adding"] = list(self.adding)
            data["removing"] = list(self.removing)
        return json.dumps(data).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> PartitionState:
        data = json.loads(raw)
        return cls(
            NodeId(data["leader"]),
            data["leader_epoch"],
            tuple(NodeId(n) for n in data["isr"]),
            data.get("partition_epoch", 0),
            tuple(NodeId(n) for n in data.get("adding", ())),
            tuple(NodeId(n) for n in data.get("removing", ())),
        )


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic's identity, replica assignment and config overrides."""

    name: TopicName
    topic_id: uuid.UUID
    assignment: tuple[tuple[NodeId, ...], ...]
    """Replicas of each partition, by partition index; the first is the preferred leader."""
    configs: Mapping[str, str] = field(default_factory=dict)

    @property
    def partition_count(self) -> int:
        return len(self.assignment)

    @property
    def replication_factor(self) -> int:
        return len(self.assignment[0]) if self.assignment else 0

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "name": self.name,
                "topic_id": str(self.topic_id),
                "assignment": [list(r) for r in self.assignment],
                "configs": dict(self.configs),
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> TopicRecord:
        data: dict[str, Any] = json.loads(raw)
        return cls(
            TopicName(data["name"]),
            uuid.UUID(data["topic_id"]),
            tuple(tuple(NodeId(n) for n in replicas) for replicas in data["assignment"]),
            dict(data.get("configs", {})),
        )


@dataclass(frozen=True, slots=True)
class TopicImage:
    record: TopicRecord
    partitions: Mapping[int, PartitionState]
    revision: int
    """The store revision of the topic record, for compare-and-swap."""
    partition_revisions: Mapping[int, int] = field(default_factory=dict)
    """The store revision of each partition's state, for compare-and-swap."""


@dataclass(frozen=True, slots=True)
class ClusterImage:
    """Everything a broker knows of the cluster at one store revision."""

    cluster_id: str
    revision: int
    brokers: Mapping[NodeId, BrokerRegistration]
    topics: Mapping[TopicName, TopicImage]
    topic_ids: Mapping[uuid.UUID, TopicName]
    controller: ControllerLease | None = None

    @classmethod
    def build(
        cls,
        cluster_id: str,
        revision: int,
        brokers: Mapping[NodeId, BrokerRegistration],
        topics: Mapping[TopicName, TopicImage],
        controller: ControllerLease | None = None,
    ) -> ClusterImage:
        ids = {t.record.topic_id: name for name, t in topics.items()}
        return cls(cluster_id, revision, brokers, topics, ids, controller)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicImage | None:
        name = self.topic_ids.get(topic_id)
        return None if name is None else self.topics.get(name)

    @property
    def controller_id(self) -> NodeId:
        """The elected controller; between elections, the lowest live node id.

        Clients send admin requests to the controller, and every broker
        serves them, so any live broker is a correct answer while a new
        election is under way.
        """
        if self.controller is not None and self.controller.node_id in self.brokers:
            return self.controller.node_id
        return min(self.brokers) if self.brokers else NO_LEADER

    def eligible_leaders(self) -> frozenset[NodeId]:
        """Brokers that may lead partitions: registered and not shutting down."""
        return frozenset(n for n, b in self.brokers.items() if not b.shutting_down)
