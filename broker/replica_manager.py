"""Which partitions this broker hosts, and its role in each, kept in step with the image.

On every new image the replica manager creates the logs of partitions newly
assigned here, updates topic configs and partition states, starts or stops
fetching from leaders when this broker's role changes, and deletes the logs
of partitions that are no longer ours (a deleted topic, or a directory left
from an older topic of the same name, recognised by its topic id).

As leader of a partition it also keeps the ISR honest: followers that fetch
their way back to the log end are added, followers that fall behind for
``replica.lag.time.max.ms`` are removed. Both go to the controller as
AlterPartition requests (:mod:`shoal.broker.replication.alter_partition`),
which it checks against the partition's epochs and writes with
compare-and-swap, so they never overwrite an election.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Final

from shoal.broker.cluster.model import ClusterImage, NodeId, PartitionState, TopicImage
from shoal.broker.log.config import LogConfig
from shoal.broker.log.manager import LogManager
from shoal.broker.partition import Partition
from shoal.broker.replication.alter_partition import AlterPartitionSender
from shoal.broker.replication.fetcher import FetcherSettings, ReplicaFetcherManager
from shoal.broker.tasks import cancel_and_wait

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_NO_LEADER: Final = NodeId(-1)


class ReplicaManager:
    def __init__(
        self,
        node_id: NodeId,
        logs: LogManager,
        broker_defaults: Mapping[str, str],
        clock: Callable[[], int],
        fetcher_settings: FetcherSettings | None = None,
        replica_lag_time_max_ms: int = 30000,
        may_lead: Callable[[], bool] = lambda: True,
    ) -> None:
        self.node_id = node_id
        self.may_lead = may_lead
        """Whether this broker's session with the cluster certainly stands (its leaders
        refuse otherwise): :class:`shoal.broker.cluster.session.BrokerSession`."""
        self.logs = logs
        self.broker_defaults = dict(broker_defaults)
        self.clock = clock
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.partitions: dict[TopicPartition, Partition] = {}
        self._hosted: dict[str, set[int]] = {}
        """The indexes of ``partitions`` by topic: what a topic's change may drop."""
        self.image: ClusterImage | None = None
        self.fetchers = ReplicaFetcherManager(
            self._address_of, fetcher_settings or FetcherSettings(node_id), self._follow_log_start
        )
        self.isr_changes = AlterPartitionSender(node_id, lambda: self.image)
        self._shrinker: asyncio.Task[None] | None = None

    def log_config(self, topic: TopicImage | None) -> LogConfig:
        overrides = topic.record.configs if topic is not None else {}
        return LogConfig.from_overrides(overrides, self.broker_defaults)

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def _address_of(self, node: NodeId) -> tuple[str, int] | None:
        broker = self.image.brokers.get(node) if self.image is not None else None
        return None if broker is None else (broker.host, broker.port)

    # -- following the image -----------------------------------------------------

    def apply(self, image: ClusterImage) -> None:
        """Follow ``image``: only what changed since the last one is looked at.

        The store's images keep the same TopicImage, record and state objects
        for what did not change (:class:`shoal.broker.cluster.etcd_store`), so
        a change costs in proportion to its topic, not to every partition here.
        """
        before = self.image.topics if self.image is not None else None
        self.image = image
        for name, topic in image.topics.items():
            previous = before.get(name) if before is not None else None
            if previous is not topic:
                self._apply_topic(name, topic, previous)
        if before is None:
            # The first image: logs found on disk that no partition here wants.
            for tp in [tp for tp in self.logs.logs if tp not in self.partitions]:
                log.info("event=stray_log_removed topic=%s partition=%d", *tp)
                self.logs.delete(*tp)
            return
        for name in before.keys() - image.topics.keys():
            self._drop_topic(name)

    def _apply_topic(self, name: str, topic: TopicImage, previous: TopicImage | None) -> None:
        record = topic.record
        same_record = previous is not None and previous.record is record
        config = None if same_record else self.log_config(topic)
        if not same_record:
            on_disk = self.logs.topic_id_on_disk(name)
            if on_disk is not None and on_disk != record.topic_id:
                log.info("event=stale_topic_logs_removed topic=%s old_topic_id=%s", name, on_disk)
                self._drop_topic(name)
        hosted = self._hosted.setdefault(name, set())
        wanted: set[int] = set()
        for index, replicas in enumerate(record.assignment):
            state = topic.partitions.get(index)
            if self.node_id not in replicas or state is None:
                continue
            wanted.add(index)
            revision = topic.partition_revisions.get(index, 0)
            if (
                previous is not None
                and same_record
                and index in hosted
                and previous.partitions.get(index) is state
                and previous.partition_revisions.get(index, 0) == revision
            ):
                continue  # nothing of this partition changed
            tp: TopicPartition = (name, index)
            partition = self.partitions.get(tp)
            if partition is None:
                plog = self.logs.get_or_create(
                    name, index, record.topic_id, config or self.log_config(topic)
                )
                partition = Partition(
                    name,
                    index,
                    record.topic_id,
                    self.node_id,
                    plog,
                    self.clock,
                    may_lead=self.may_lead,
                )
                self.partitions[tp] = partition
            elif config is not None and partition.log.config != config:
                partition.log.update_config(config)
            if partition.update_state(replicas, state, revision):
                self._role_changed(partition, state)
        for index in hosted - wanted:
            self._drop((name, index))
        if wanted:
            self._hosted[name] = wanted
        else:
            self._hosted.pop(name, None)

    def _role_changed(self, partition: Partition, state: PartitionState) -> None:
        tp = (partition.topic, partition.index)
        if partition.is_leader or state.leader == _NO_LEADER:
            self.fetchers.unfollow(tp)
        else:
            self.fetchers.follow(partition, state.leader)
        log.info(
            "event=partition_role topic=%s partition=%d role=%s leader=%d leader_epoch=%d isr=%s",
            partition.topic,
            partition.index,
            "leader" if partition.is_leader else "follower",
            state.leader,
            state.leader_epoch,
            ",".join(map(str, state.isr)),
        )

    def _drop_topic(self, name: str) -> None:
        for tp in [tp for tp in self.logs.logs if tp[0] == name]:
            self._drop(tp)
        for index in self._hosted.pop(name, set()):
            self._drop((name, index))

    def _drop(self, tp: TopicPartition) -> None:
        self.fetchers.unfollow(tp)
        partition = self.partitions.pop(tp, None)
        if partition is not None:
            partition.wake()
        hosted = self._hosted.get(tp[0])
        if hosted is not None:
            hosted.discard(tp[1])
        self.logs.delete(*tp)

    # -- the ISR, as leader --------------------------------------------------------

    def follower_fetched(
        self, partition: Partition, node: NodeId, fetch_offset: int, log_start_offset: int
    ) -> None:
        """A follower's fetch: note its position and let it rejoin the ISR if it caught up."""
        partition.record_follower_fetch(node, fetch_offset, log_start_offset)
        expanded = partition.isr_expansion()
        if expanded is not None:
            self.isr_changes.submit(partition, expanded, "isr_expand")

    def _follow_log_start(self, partition: Partition, offset: int) -> None:
        """As follower, take the leader's log start: persisted before our next fetch
        reports it, so the leader's DeleteRecords answer means every live replica has
        it on disk."""
        self.logs.advance_log_start(partition.log, offset)

    def shrink_isrs(self) -> None:
        for partition in list(self.partitions.values()):
            shrunk = partition.isr_shrink(self.replica_lag_time_max_ms)
            if shrunk is not None:
                self.isr_changes.submit(partition, shrunk, "isr_shrink")

    def start(self) -> None:
        self._shrinker = asyncio.get_running_loop().create_task(
            self._shrink_forever(), name="isr-shrink"
        )

    async def _shrink_forever(self) -> None:
        while True:
            await asyncio.sleep(self.replica_lag_time_max_ms / 2000)
            self.shrink_isrs()

    async def close(self) -> None:
        await cancel_and_wait(self._shrinker)
        await self.isr_changes.close()
        await self.fetchers.close()
