"""Followers pull from leaders: one fetcher task per leader broker, as Kafka's.

A partition joins a fetcher when this broker becomes its follower under a
new leader epoch. Before its first fetch it is truncated (OffsetForLeaderEpoch,
see :mod:`shoal.broker.replication.truncation`); then the fetcher long-polls
the leader with Fetch, replica id set, for every partition it follows there,
appends what comes back as it is, and takes the leader's high watermark and
log start offset (DeleteRecords on the leader moves the followers' too; the
leader's answer waits until their fetches report it).

Each fetcher holds a fetch session with its leader (KIP-227,
:mod:`shoal.broker.replication.follower_session`): after the first request,
one names only the partitions whose position changed, and the answer carries
only partitions with records or news, so a follower of many quiet partitions
pays for the busy ones only.

A response is applied only to partitions still followed under the epoch the
request was sent for: a role change while the request was out wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from shoal.broker.cluster.model import NodeId
from shoal.broker.log.log import LogError
from shoal.broker.partition import Partition
from shoal.broker.replication.channel import ChannelError, KafkaChannel, PeerLink
from shoal.broker.replication.follower_session import (
    SESSION_ERRORS,
    FollowerSession,
    PartitionState,
    SessionRequest,
)
from shoal.broker.replication.truncation import truncation_offset
from shoal.broker.tasks import cancel_and_wait

from shoal.wire import ApiSchema, ErrorCode, schema

log = logging.getLogger(__name__)

FETCH_VERSION: Final = 12
"""The last Fetch version that names topics; both ends are ours."""
EPOCH_VERSION: Final = 4
_CONNECT_TIMEOUT_S: Final = 5.0

TopicPartition = tuple[str, int]
AddressOf = Callable[[NodeId], tuple[str, int] | None]
LogStartFollower = Callable[[Partition, int], None]
"""Moves a follower's log start offset to the one given, persisting it first."""


@dataclass(frozen=True, slots=True)
class FetcherSettings:
    node_id: NodeId
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 10 * 1024 * 1024
    partition_max_bytes: int = 1024 * 1024
    backoff_ms: int = 1000
    request_timeout_ms: int = 30000


@dataclass(slots=True)
class _Followed:
    partition: Partition
    epoch: int
    truncated: bool = False
    paused_until: float = 0.0


def _state(followed: _Followed) -> PartitionState:
    plog = followed.partition.log
    return PartitionState(
        plog.log_end_offset, plog.log_start_offset, followed.epoch, plog.epochs.latest_epoch
    )


def _fetch_request(api: ApiSchema, settings: FetcherSettings, session: SessionRequest) -> Any:
    topics: dict[str, list[Any]] = {}
    for (topic, index), state in session.send.items():
        topics.setdefault(topic, []).append(
            api.make_request(
                "FetchPartition",
                partition=index,
                current_leader_epoch=state.current_leader_epoch,
                fetch_offset=state.fetch_offset,
                last_fetched_epoch=state.last_fetched_epoch,
                log_start_offset=state.log_start_offset,
                partition_max_bytes=settings.partition_max_bytes,
            )
        )
    forgotten: dict[str, list[int]] = {}
    for topic, index in session.forgotten:
        forgotten.setdefault(topic, []).append(index)
    return api.request(
        cluster_id=None,
        replica_id=settings.node_id,
        max_wait=timedelta(milliseconds=settings.max_wait_ms),
        min_bytes=settings.min_bytes,
        max_bytes=settings.max_bytes,
        isolation_level=0,
        session_id=session.session_id,
        session_epoch=session.epoch,
        topics=tuple(
            api.make_request("FetchTopic", topic=name, partitions=tuple(parts))
            for name, parts in topics.items()
        ),
        forgotten_topics_data=tuple(
            api.make_request("ForgottenTopic", topic=name, partitions=tuple(parts))
            for name, parts in forgotten.items()
        ),
        rack_id="",
    )


class ReplicaFetcher:
    """Fetches every partition this broker follows on one leader."""

    def __init__(
        self,
        leader: NodeId,
        address_of: AddressOf,
        settings: FetcherSettings,
        follow_log_start: LogStartFollower,
    ) -> None:
        self.leader = leader
        self.address_of = address_of
        self.settings = settings
        self.follow_log_start = follow_log_start
        self.followed: dict[TopicPartition, _Followed] = {}
        self._changed = asyncio.Event()
        self._link = PeerLink(f"shoal-replica-{settings.node_id}")
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._session = FollowerSession()

    def add(self, partition: Partition) -> None:
        tp = (partition.topic, partition.index)
        self.followed[tp] = _Followed(partition, partition.leader_epoch)
        self._changed.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"replica-fetcher-{self.leader}"
            )

    def remove(self, tp: TopicPartition) -> None:
        self.followed.pop(tp, None)

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait(self._task)
        self._task = None
        await self._link.close()

    # -- the loop --------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self.settings.backoff_ms / 1000
        # The flag as well as the cancel: a stop must hold even if a
        # cancellation is lost somewhere below.
        while not self._closed:
            if not self.followed:
                self._changed.clear()
                await self._changed.wait()
                continue
            try:
                channel = await self._connect()
                await self._truncate(channel)
                await self._fetch(channel)
            except ChannelError as exc:
                log.warning("event=replica_fetch_failed leader=%d error=%s", self.leader, exc)
                await asyncio.sleep(backoff)
            except Exception:
                log.exception("event=replica_fetcher_error leader=%d", self.leader)
                await asyncio.sleep(backoff)

    async def _connect(self) -> KafkaChannel:
        address = self.address_of(self.leader)
        if address is None:
            raise ChannelError(f"leader {self.leader} is not registered")
        return await self._link.to(*address, _CONNECT_TIMEOUT_S)

    def _due(self) -> dict[TopicPartition, _Followed]:
        now = asyncio.get_running_loop().time()
        return {tp: f for tp, f in self.followed.items() if f.paused_until <= now}

    def _current(self, tp: TopicPartition, sent: _Followed) -> bool:
        """Whether ``sent`` is still how we follow ``tp`` (no role change since)."""
        return self.followed.get(tp) is sent

    def _pause(self, followed: _Followed) -> None:
        loop = asyncio.get_running_loop()
        followed.paused_until = loop.time() + self.settings.backoff_ms / 1000

    # -- truncation --------------------------------------------------------------

    async def _truncate(self, channel: KafkaChannel) -> None:
        pending = {tp: f for tp, f in self._due().items() if not f.truncated}
        if not pending:
            return
        api = schema(23, EPOCH_VERSION)
        topics: dict[str, list[Any]] = {}
        for (topic, index), followed in pending.items():
            topics.setdefault(topic, []).append(
                api.make_request(
                    "OffsetForLeaderPartition",
                    partition=index,
                    current_leader_epoch=followed.epoch,
                    leader_epoch=followed.partition.log.epochs.latest_epoch,
                )
            )
        request = api.request(
            replica_id=self.settings.node_id,
            topics=tuple(
                api.make_request("OffsetForLeaderTopic", topic=name, partitions=tuple(parts))
                for name, parts in topics.items()
            ),
        )
        response = await channel.call(api, request, self.settings.request_timeout_ms / 1000)
        for topic_result in response.topics:
            for result in topic_result.partitions:
                tp = (topic_result.topic, result.partition)
                asked = pending.get(tp)
                if asked is None or not self._current(tp, asked):
                    continue
                if result.error_code is not ErrorCode.none:
                    log.info(
                        "event=truncation_deferred topic=%s partition=%d leader=%d error=%s",
                        *tp,
                        self.leader,
                        result.error_code.name,
                    )
                    self._pause(asked)
                    continue
                self._apply_truncation(asked, result.leader_epoch, result.end_offset)

    @staticmethod
    def _apply_truncation(followed: _Followed, leader_epoch: int, end_offset: int) -> None:
        plog = followed.partition.log
        before = plog.log_end_offset
        target, complete = truncation_offset(
            plog.epochs, before, plog.high_watermark, leader_epoch, end_offset
        )
        if target < before:
            plog.truncate_to(target)
            log.warning(
                "event=log_truncated topic=%s partition=%d from=%d to=%d leader_epoch=%d",
                followed.partition.topic,
                followed.partition.index,
                before,
                plog.log_end_offset,
                followed.epoch,
            )
        # Not complete: ask again with the epoch the cut left as our latest (KIP-279).
        followed.truncated = complete

    # -- fetching ----------------------------------------------------------------

    async def _fetch(self, channel: KafkaChannel) -> None:
        sent = {tp: f for tp, f in self._due().items() if f.truncated}
        if not sent:
            # Everything is paused or still truncating: wait for either.
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.backoff_ms / 1000):
                    await self._changed.wait()
            return
        api = schema(1, FETCH_VERSION)
        settings = self.settings
        session = self._session.next_request({tp: _state(f) for tp, f in sent.items()})
        timeout = (settings.request_timeout_ms + settings.max_wait_ms) / 1000
        try:
            response = await channel.call(api, _fetch_request(api, settings, session), timeout)
        except BaseException:
            self._session.failed()
            raise
        code = response.error_code
        if code in SESSION_ERRORS:
            # The leader lost our session (restarted, evicted it): fetch in full at once.
            log.info("event=fetch_session_reset leader=%d error=%s", self.leader, code.name)
            self._session.failed()
            return
        if code is not ErrorCode.none:
            self._session.failed()
            raise ChannelError(f"fetch refused: {code.name}")
        if not self._session.answered(response.session_id):
            log.info("event=fetch_session_reset leader=%d error=another_session", self.leader)
            return
        # The leader now takes everything in this answer as told: a partition not
        # applied (a role change meanwhile, a failure) puts the session out of step,
        # and only a full fetch would tell it again.
        in_step = False
        try:
            in_step = self._apply_answer(response, sent)
        finally:
            if not in_step:
                self._session.failed()

    def _apply_answer(self, response: Any, sent: dict[TopicPartition, _Followed]) -> bool:
        """Apply each partition still followed as it was sent; False if any was not."""
        applied_all = True
        for topic_result in response.responses:
            for data in topic_result.partitions:
                tp = (topic_result.topic, data.partition_index)
                fetched = sent.get(tp)
                if fetched is not None and self._current(tp, fetched):
                    self._apply_fetched(fetched, data)
                else:
                    applied_all = False
        return applied_all

    def _apply_fetched(self, followed: _Followed, data: Any) -> None:
        partition = followed.partition
        code = data.error_code
        if code is ErrorCode.none:
            try:
                partition.append_as_follower(data.records or b"", data.high_watermark)
                target = partition.follower_log_start_target(data.log_start_offset)
                if target is not None:
                    self.follow_log_start(partition, target)
            except LogError as exc:
                log.error(  # noqa: TRY400 - the message says it all; no traceback
                    "event=replica_append_failed topic=%s partition=%d error=%s",
                    partition.topic,
                    partition.index,
                    exc,
                )
                followed.truncated = False
                self._pause(followed)
            return
        if code is ErrorCode.offset_out_of_range:
            if partition.log.log_end_offset < data.log_start_offset:
                log.warning(
                    "event=replica_restarted_at_leader_log_start topic=%s partition=%d offset=%d",
                    partition.topic,
                    partition.index,
                    data.log_start_offset,
                )
                partition.log.truncate_fully_and_start_at(data.log_start_offset)
            else:
                followed.truncated = False
            return
        log.info(
            "event=replica_fetch_partition_error topic=%s partition=%d leader=%d error=%s",
            partition.topic,
            partition.index,
            self.leader,
            code.name,
        )
        self._pause(followed)


class ReplicaFetcherManager:
    """The fetchers of this broker, one per leader it follows."""

    def __init__(
        self,
        address_of: AddressOf,
        settings: FetcherSettings,
        follow_log_start: LogStartFollower,
    ) -> None:
        self.address_of = address_of
        self.settings = settings
        self.follow_log_start = follow_log_start
        self.fetchers: dict[NodeId, ReplicaFetcher] = {}
        self._leader_of: dict[TopicPartition, NodeId] = {}

    def follow(self, partition: Partition, leader: NodeId) -> None:
        """Fetch ``partition`` from ``leader`` (truncating first), instead of any earlier leader."""
        tp = (partition.topic, partition.index)
        self.unfollow(tp)
        fetcher = self.fetchers.get(leader)
        if fetcher is None:
            fetcher = self.fetchers[leader] = ReplicaFetcher(
                leader, self.address_of, self.settings, self.follow_log_start
            )
        fetcher.add(partition)
        self._leader_of[tp] = leader

    def unfollow(self, tp: TopicPartition) -> None:
        leader = self._leader_of.pop(tp, None)
        if leader is not None:
            self.fetchers[leader].remove(tp)

    async def close(self) -> None:
        for fetcher in self.fetchers.values():
            await fetcher.close()
        self.fetchers.clear()
