"""What every request handler gets: the request's context and the broker's services.

A handler is ``async def handle(services, ctx, request) -> response``: the
request is kio's dataclass for the negotiated version, the response is built
with ``ctx.api.make(...)`` so that one handler serves every version (see
:mod:`shoal.wire.codec`). A handler returns None when no response is owed
(acks=0), a :class:`Spliced` response whose records stay in files, an
:class:`Encoded` body it encoded (and cached) itself, or a :class:`Later` when
all that is left is a wait.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from shoal.broker.cluster.cache import MetadataCache
from shoal.broker.cluster.model import ClusterImage, NodeId, TopicImage, TopicName
from shoal.broker.config import BrokerConfig
from shoal.broker.controller.controller import Controller
from shoal.broker.controller.forwarding import ControllerForwarder
from shoal.broker.coordinator.coordinator import GroupCoordinator
from shoal.broker.fetch_sessions import FetchSessionCache
from shoal.broker.partition import NotLeaderError, Partition, UnknownPartitionError
from shoal.broker.producer_ids import ProducerIdManager
from shoal.broker.replica_manager import ReplicaManager
from shoal.broker.server.connection import ConnectionInfo
from shoal.broker.topic_admin import TopicAdmin
from shoal.broker.txn.coordinator import TransactionCoordinator
from shoal.broker.txn.verification import TransactionVerifier

from shoal.wire import ApiSchema, ErrorCode, RecordsSplicer, RequestHeader

NO_THROTTLE: Final = timedelta(0)
E = ErrorCode


@dataclass(frozen=True, slots=True)
class RequestContext:
    header: RequestHeader
    api: ApiSchema
    connection: ConnectionInfo

    @property
    def version(self) -> int:
        return self.header.api_version


class Encoded(bytes):
    """A response body already encoded (a cached Metadata answer, say)."""


@dataclass(frozen=True, slots=True)
class Spliced:
    """A response whose ``records`` fields hold placeholders from ``splicer``."""

    body: Any
    splicer: RecordsSplicer


@dataclass(frozen=True, slots=True)
class Later:
    """An answer still to come: the request's work in order is done, only a wait is left
    (acks=all's, for the followers). ``answer`` awaits it and gives the response; the
    connection may handle the next produce meanwhile (see
    :mod:`shoal.broker.server.connection`)."""

    answer: Awaitable[Any]


@dataclass(frozen=True, slots=True)
class BrokerServices:
    node_id: NodeId
    config: BrokerConfig
    cache: MetadataCache
    replicas: ReplicaManager
    admin: TopicAdmin
    groups: GroupCoordinator
    transactions: TransactionCoordinator
    producer_ids: ProducerIdManager
    clock: Callable[[], int]
    controller: Controller
    forwarder: ControllerForwarder
    verifier: TransactionVerifier
    fetch_sessions: FetchSessionCache

    @property
    def image(self) -> ClusterImage:
        return self.cache.image

    def topic(self, name: str) -> TopicImage | None:
        return self.cache.image.topics.get(TopicName(name))

    def partition(self, topic: str, index: int) -> Partition:
        """The hosted partition; UnknownPartitionError or NotLeaderError when there is none."""
        partition = self.replicas.get(topic, index)
        if partition is not None:
            return partition
        known = self.topic(topic)
        if known is None or not 0 <= index < known.record.partition_count:
            raise UnknownPartitionError(f"unknown partition {topic}-{index}")
        raise NotLeaderError(f"broker {self.node_id} does not host {topic}-{index}")


Handler = Callable[[BrokerServices, RequestContext, Any], Awaitable[Any]]


def error(name: str) -> ErrorCode:
    """A kio ErrorCode by its snake_case name (``not_leader_or_follower``)."""
    return ErrorCode[name]
