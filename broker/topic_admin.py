"""Creating, growing, reconfiguring and deleting topics: the rules, then the store.

Handlers for CreateTopics, CreatePartitions, IncrementalAlterConfigs and
DeleteTopics translate requests into these calls and :class:`AdminError`\\ s
into per-topic error codes. Every write goes through the metadata store and
then waits for this broker's image to include it, so the client's next
Metadata request already sees the change.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from shoal.broker.cluster.cache import MetadataCache
from shoal.broker.cluster.model import (
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
)
from shoal.broker.cluster.placement import PlacementError, assign_replicas
from shoal.broker.cluster.store import (
    ConflictError,
    MetadataStore,
    StoreUnavailableError,
    TopicExistsError,
    UnknownTopicError,
)
from shoal.broker.log.config import TOPIC_CONFIGS, InvalidConfigError, validate_overrides

log = logging.getLogger(__name__)

MAX_TOPIC_NAME: Final = 249
INTERNAL_TOPICS: Final = frozenset({"__consumer_offsets", "__transaction_state"})
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
_IMAGE_WAIT_S: Final = 10.0


class AdminError(Exception):
    """A refused admin request: ``code`` names a Kafka error, ``message`` goes to the client."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class ConfigOp:
    """One IncrementalAlterConfigs operation: SET 0, DELETE 1, APPEND 2, SUBTRACT 3."""

    name: str
    op: int
    value: str | None


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def validate_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise AdminError("invalid_topic_exception", f"Topic name {name!r} is illegal.")
    if len(name) > MAX_TOPIC_NAME:
        raise AdminError(
            "invalid_topic_exception",
            f"Topic name is longer than the maximum of {MAX_TOPIC_NAME} characters.",
        )
    if not _LEGAL_NAME.match(name):
        raise AdminError(
            "invalid_topic_exception",
            f"Topic name {name!r} is illegal: it may only contain ASCII letters, digits,"
            " '.', '_' and '-'.",
        )


def _collision_key(name: str) -> str:
    return name.replace(".", "_")


def _check_assignment(
    assignment: Sequence[Sequence[int]], live: set[NodeId]
) -> tuple[tuple[NodeId, ...], ...]:
    result = []
    factor = len(assignment[0]) if assignment else 0
    for replicas in assignment:
        if not replicas or len(set(replicas)) != len(replicas):
            raise AdminError("invalid_replica_assignment", "Duplicate or empty replica list.")
        if len(replicas) != factor:
            raise AdminError(
                "invalid_replica_assignment", "All partitions must have the same replica count."
            )
        unknown = [r for r in replicas if r not in live]
        if unknown:
            raise AdminError(
                "invalid_replica_assignment", f"Replica assignment names unknown brokers {unknown}."
            )
        result.append(tuple(NodeId(r) for r in replicas))
    return tuple(result)


def _replication_factor(topic: TopicImage) -> int:
    """Replicas per partition. A partition being moved also lists the replicas leaving
    it (KIP-455), so the first partition's target is what counts."""
    if not topic.record.assignment:
        return 0
    state = topic.partitions.get(0)
    return len(topic.record.assignment[0]) - (len(state.removing) if state is not None else 0)


class TopicAdmin:
    def __init__(
        self,
        store: MetadataStore,
        cache: MetadataCache,
        default_partitions: int,
        default_replication_factor: int,
        max_partitions_per_topic: int,
    ) -> None:
        self.store = store
        self.cache = cache
        self.default_partitions = default_partitions
        self.default_replication_factor = default_replication_factor
        self.max_partitions_per_topic = max_partitions_per_topic

    def _check_partition_count(self, count: int) -> None:
        if count > self.max_partitions_per_topic:
            raise AdminError(
                "policy_violation",
                f"A topic may have at most {self.max_partitions_per_topic} partitions here"
                f" ({count} asked; SHOAL_MAX_PARTITIONS_PER_TOPIC).",
            )

    def _placeable(self) -> frozenset[NodeId]:
        """Brokers new replicas may go to: live and not shutting down."""
        return self.cache.image.eligible_leaders()

    def _racks(self) -> dict[NodeId, str | None]:
        return {n: b.rack for n, b in self.cache.image.brokers.items()}

    def _topic(self, name: str) -> TopicImage:
        topic = self.cache.image.topics.get(TopicName(name))
        if topic is None:
            raise AdminError(
                "unknown_topic_or_partition", f"This server does not host topic '{name}'."
            )
        return topic

    async def _settle(self, revision: int) -> None:
        if not await self.cache.wait_for(revision, _IMAGE_WAIT_S):
            raise AdminError("request_timed_out", "The change was stored but has not propagated.")

    async def create(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        assignment: Mapping[int, Sequence[int]],
        configs: Mapping[str, str | None],
        validate_only: bool,
        internal: bool = False,
    ) -> TopicRecord:
        """Create a topic; ``internal`` is for the broker's own topics, never for clients."""
        validate_topic_name(name)
        if name in INTERNAL_TOPICS and not internal:
            raise AdminError("invalid_request", f"Creation of internal topic {name} is prohibited.")
        image = self.cache.image
        if name in image.topics:
            raise AdminError("topic_already_exists", f"Topic '{name}' already exists.")
        colliding = [t for t in image.topics if _collision_key(t) == _collision_key(name)]
        if colliding:
            raise AdminError(
                "invalid_topic_exception",
                f"Topic '{name}' collides with existing topic '{colliding[0]}':"
                " '.' and '_' are interchangeable in metric names.",
            )
        replicas = self._placement(num_partitions, replication_factor, assignment)
        try:
            overrides = validate_overrides(configs)
        except InvalidConfigError as exc:
            raise AdminError("invalid_config", str(exc)) from exc
        record = TopicRecord(TopicName(name), uuid.uuid4(), replicas, overrides)
        if validate_only:
            return record
        states = [PartitionState(r[0], 0, r) for r in replicas]
        try:
            revision = await self.store.create_topic(record, states)
        except TopicExistsError as exc:
            raise AdminError("topic_already_exists", str(exc)) from exc
        except StoreUnavailableError as exc:
            raise AdminError("request_timed_out", str(exc)) from exc
        await self._settle(revision)
        log.info(
            "event=topic_created topic=%s topic_id=%s partitions=%d replication_factor=%d",
            name,
            record.topic_id,
            record.partition_count,
            record.replication_factor,
        )
        return record

    def _placement(
        self,
        num_partitions: int,
        replication_factor: int,
        assignment: Mapping[int, Sequence[int]],
    ) -> tuple[tuple[NodeId, ...], ...]:
        """Replicas per partition: the request's own assignment, or one we choose."""
        live = set(self.cache.image.brokers)
        if assignment:
            if num_partitions != -1 or replication_factor != -1:
                raise AdminError(
                    "invalid_request",
                    "Both numPartitions or replicationFactor and replicasAssignments were set.",
                )
            self._check_partition_count(len(assignment))
            if sorted(assignment) != list(range(len(assignment))):
                raise AdminError(
                    "invalid_replica_assignment", "Partitions must be numbered from 0 without gaps."
                )
            return _check_assignment([assignment[i] for i in sorted(assignment)], live)
        partitions = self.default_partitions if num_partitions == -1 else num_partitions
        factor = self.default_replication_factor if replication_factor == -1 else replication_factor
        if partitions < 1:
            raise AdminError("invalid_partitions", "Number of partitions must be larger than 0.")
        self._check_partition_count(partitions)
        if factor < 1:
            raise AdminError(
                "invalid_replication_factor", "Replication factor must be larger than 0."
            )
        try:
            return tuple(
                assign_replicas(sorted(self._placeable()), partitions, factor, racks=self._racks())
            )
        except PlacementError as exc:
            raise AdminError("invalid_replication_factor", str(exc)) from exc

    async def delete(self, name: str) -> uuid.UUID:
        topic = self._topic(name)
        if name in INTERNAL_TOPICS:
            raise AdminError("invalid_request", f"Internal topic {name} cannot be deleted.")
        try:
            revision = await self.store.delete_topic(TopicName(name))
        except UnknownTopicError as exc:
            raise AdminError("unknown_topic_or_partition", str(exc)) from exc
        except StoreUnavailableError as exc:
            raise AdminError("request_timed_out", str(exc)) from exc
        await self._settle(revision)
        return topic.record.topic_id

    async def create_partitions(
        self,
        name: str,
        count: int,
        assignment: Sequence[Sequence[int]] | None,
        validate_only: bool,
    ) -> None:
        topic = self._topic(name)
        record = topic.record
        current = record.partition_count
        if count <= current:
            raise AdminError(
                "invalid_partitions",
                f"Topic currently has {current} partitions, which is higher than or equal"
                f" to the requested {count}.",
            )
        self._check_partition_count(count)
        live = set(self.cache.image.brokers)
        added = count - current
        if assignment:
            if len(assignment) != added:
                raise AdminError(
                    "invalid_replica_assignment",
                    f"Increasing the number of partitions by {added} but {len(assignment)}"
                    " assignments provided.",
                )
            new = _check_assignment(assignment, live)
            if len(new[0]) != _replication_factor(topic):
                raise AdminError(
                    "invalid_replica_assignment",
                    "New partitions must have the topic's replication factor.",
                )
        else:
            try:
                new = tuple(
                    assign_replicas(
                        sorted(self._placeable()),
                        added,
                        _replication_factor(topic),
                        current,
                        racks=self._racks(),
                    )
                )
            except PlacementError as exc:
                raise AdminError("invalid_replication_factor", str(exc)) from exc
        if validate_only:
            return
        updated = replace(record, assignment=record.assignment + new)
        states = {current + i: PartitionState(r[0], 0, r) for i, r in enumerate(new)}
        await self._update(updated, topic.revision, states)

    def configs_after(self, name: str, ops: Sequence[ConfigOp]) -> dict[str, str]:
        """The topic's overrides after applying ``ops``, validated; raises AdminError."""
        overrides = dict(self._topic(name).record.configs)
        for op in ops:
            key = TOPIC_CONFIGS.get(op.name)
            if key is None:
                raise AdminError("invalid_config", f"Unknown topic config name: {op.name}")
            if op.op == SET:
                if op.value is None:
                    raise AdminError("invalid_config", f"Null value for {op.name}.")
                overrides[op.name] = op.value
            elif op.op == DELETE:
                overrides.pop(op.name, None)
            elif op.op in (APPEND, SUBTRACT):
                if key.type.name != "LIST":
                    raise AdminError(
                        "invalid_config",
                        f"Config {op.name} is not a list; APPEND and SUBTRACT need a list.",
                    )
                current = [v for v in overrides.get(op.name, key.default).split(",") if v]
                values = [v.strip() for v in (op.value or "").split(",") if v.strip()]
                if op.op == APPEND:
                    current += [v for v in values if v not in current]
                else:
                    current = [v for v in current if v not in values]
                overrides[op.name] = ",".join(current)
            else:
                raise AdminError("invalid_request", f"Unknown config operation {op.op}.")
        try:
            return validate_overrides(overrides)
        except InvalidConfigError as exc:
            raise AdminError("invalid_config", str(exc)) from exc

    async def alter_configs(self, name: str, ops: Sequence[ConfigOp], validate_only: bool) -> None:
        topic = self._topic(name)
        overrides = self.configs_after(name, ops)
        if validate_only or overrides == dict(topic.record.configs):
            return
        await self._update(replace(topic.record, configs=overrides), topic.revision, None)

    async def replace_configs(
        self, name: str, configs: Mapping[str, str | None], validate_only: bool
    ) -> None:
        """Legacy AlterConfigs: the overrides become ``configs``; any not named revert."""
        current = self._topic(name).record.configs
        ops = [ConfigOp(key, DELETE, None) for key in current if key not in configs]
        ops += [ConfigOp(key, SET, value) for key, value in configs.items()]
        await self.alter_configs(name, ops, validate_only)

    async def _update(
        self,
        record: TopicRecord,
        revision: int,
        partitions: Mapping[int, PartitionState] | None,
    ) -> None:
        try:
            new_revision = await self.store.update_topic(record, revision, partitions)
        except ConflictError as exc:
            raise AdminError("invalid_request", str(exc)) from exc
        except StoreUnavailableError as exc:
            raise AdminError("request_timed_out", str(exc)) from exc
        await self._settle(new_revision)
