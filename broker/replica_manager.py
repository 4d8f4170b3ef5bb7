"""Which partitions this broker hosts, kept in step with the cluster image.

On every new image the replica manager creates the logs of partitions newly
assigned here, updates leader state and topic configs, and deletes the logs
of partitions that are no longer ours (a deleted topic, or a directory left
from an older topic of the same name, recognised by its topic id).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from shoal.broker.cluster.model import ClusterImage, NodeId, TopicImage
from shoal.broker.log.config import LogConfig
from shoal.broker.log.manager import LogManager
from shoal.broker.partition import Partition

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class ReplicaManager:
    def __init__(
        self, node_id: NodeId, logs: LogManager, broker_defaults: Mapping[str, str]
    ) -> None:
        self.node_id = node_id
        self.logs = logs
        self.broker_defaults = dict(broker_defaults)
        self.partitions: dict[TopicPartition, Partition] = {}

    def log_config(self, topic: TopicImage | None) -> LogConfig:
        overrides = topic.record.configs if topic is not None else {}
        return LogConfig.from_overrides(overrides, self.broker_defaults)

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def apply(self, image: ClusterImage) -> None:
        wanted: set[TopicPartition] = set()
        for name, topic in image.topics.items():
            record = topic.record
            config = self.log_config(topic)
            on_disk = self.logs.topic_id_on_disk(name)
            if on_disk is not None and on_disk != record.topic_id:
                log.info("event=stale_topic_logs_removed topic=%s old_topic_id=%s", name, on_disk)
                self._drop_topic(name)
            for index, replicas in enumerate(record.assignment):
                state = topic.partitions.get(index)
                if self.node_id not in replicas or state is None:
                    continue
                tp: TopicPartition = (name, index)
                wanted.add(tp)
                partition = self.partitions.get(tp)
                if partition is None:
                    plog = self.logs.get_or_create(name, index, record.topic_id, config)
                    partition = Partition(
                        name, index, record.topic_id, self.node_id, plog, replicas, state
                    )
                    self.partitions[tp] = partition
                    partition.maybe_advance_high_watermark()
                else:
                    if partition.log.config != config:
                        partition.log.update_config(config)
                    partition.update_state(replicas, state)
        for tp in [tp for tp in self.partitions if tp not in wanted]:
            self._drop(tp)
        for tp in [tp for tp in self.logs.logs if tp not in wanted]:
            log.info("event=stray_log_removed topic=%s partition=%d", *tp)
            self.logs.delete(*tp)

    def _drop_topic(self, name: str) -> None:
        for tp in [tp for tp in self.logs.logs if tp[0] == name]:
            self._drop(tp)
            self.logs.delete(*tp)

    def _drop(self, tp: TopicPartition) -> None:
        partition = self.partitions.pop(tp, None)
        if partition is not None:
            partition.wake()
        self.logs.delete(*tp)
