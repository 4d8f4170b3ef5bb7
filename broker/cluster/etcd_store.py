"""The metadata store on etcd v3, through aetcd.

Key layout under the chroot (``/shoal`` unless the etcd URL names another,
as ZooKeeper's chroot did for Kafka)::

    <root>/cluster/id                   the cluster id, created once
    <root>/brokers/<node id>            BrokerRegistration JSON, under a lease
    <root>/controller                   the elected controller's node id, under its lease
    <root>/topics/<name>                TopicRecord JSON
    <root>/partitions/<name>/<index>    PartitionState JSON
    <root>/topic-writes/<name>          a token: a write of the topic in several transactions

A topic and its partition states change together in one transaction, or,
beyond 100 partitions, states first and the record last under the topic's
write marker (:meth:`EtcdMetadataStore._write_in_chunks`); a
topic update compares the record's mod revision, so concurrent writers
cannot both win. Partition states are changed the same way, each compared
with its own mod revision, and a controller's changes also compare the
controller key's create revision (its epoch): a controller that lost the
election while it was deciding writes nothing. A broker's registration lives under a lease that it
renews from a thread of its own (:mod:`shoal.broker.cluster.heartbeat`); if
the broker falls silent, etcd drops the key after the lease's TTL, which is
how the cluster learns that a broker is gone, and if its process is gone a
peer that finds its port closed revokes the lease at once
(:mod:`shoal.broker.cluster.liveness`).

The image stream reads everything once, then follows a watch from the next
revision. Events of one etcd transaction arrive in one watch response and
are applied before the next image is built, so no image shows half a topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

import aetcd
import aetcd.exceptions
from shoal.broker.cluster.heartbeat import LeaseHeartbeat, retry_window
from shoal.broker.cluster.model import (
    BrokerRegistration,
    ClusterImage,
    ControllerLease,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
    uuid_text,
)
from shoal.broker.cluster.session import BrokerSession
from shoal.broker.cluster.store import (
    AssignmentChange,
    ConflictError,
    PartitionChange,
    StoreError,
    StoreUnavailableError,
    TopicExistsError,
    UnknownTopicError,
)

from shoal.etcd_address import EtcdAddress
from shoal.etcd_client import EtcdClient

log = logging.getLogger(__name__)

_RETRY_S: Final = 1.0
_CAS_ATTEMPTS: Final = 20
_TXN_OPS: Final = 100
"""Partition changes per etcd transaction; etcd refuses more than 128 operations in one."""
_TOPIC_WRITE_LEASE_S: Final = 30
"""The lease of a topic's write marker: renewed before every chunk, so only a writer that
stopped (died, or lost etcd for this long) lets go of it."""


def _keepalive_interval(ttl_s: int, heartbeat_s: float | None = None) -> float:
    """Every ``heartbeat_s``, but at least three renewals per TTL."""
    third = ttl_s / 3
    return max(min(third, heartbeat_s if heartbeat_s is not None else third), 0.1)


class EtcdMetadataStore:
    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.address = EtcdAddress.parse(url)
        self._timeout_s = timeout_s
        self._root = self.address.root.encode()
        self._client = EtcdClient(self.address, timeout_s)
        self._registration: BrokerRegistration | None = None
        self._heartbeat: LeaseHeartbeat | None = None
        self._closed = asyncio.Event()
        self.session = BrokerSession(retry_window_s=math.inf)
        """Whether this broker may act as a leader (set up by register_broker)."""

    # -- keys ------------------------------------------------------------------

    def _key(self, *parts: str | int) -> bytes:
        return b"/".join([self._root, *(str(p).encode() for p in parts)])

    def _topic_key(self, name: str) -> bytes:
        return self._key("topics", name)

    def _partition_key(self, name: str, index: int) -> bytes:
        return self._key("partitions", name, index)

    # -- connection ------------------------------------------------------------

    async def connect(self) -> None:
        try:
            await self._client.connect()
            await self._client.status()
        except aetcd.exceptions.ClientError as exc:
            raise StoreUnavailableError(f"etcd at {self.address} is unreachable: {exc}") from exc

    async def close(self) -> None:
        self._closed.set()
        await self._stop_keepalive()
        await self._client.close()

    async def _stop_keepalive(self) -> None:
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            await heartbeat.stop()

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except aetcd.exceptions.ClientError as exc:
            raise StoreUnavailableError(f"etcd request failed: {exc}") from exc

    # -- cluster id and brokers -----------------------------------------------

    async def ensure_cluster_id(self) -> str:
        key = self._key("cluster", "id")
        candidate = uuid_text(uuid.uuid4())
        t = self._client.transactions
        ok, responses = await self._call(
            self._client.transaction(
                compare=[t.version(key) == 0],
                success=[t.put(key, candidate.encode())],
                failure=[t.get(key)],
            )
        )
        if ok:
            return candidate
        value, _ = responses[0][0]
        return bytes(value).decode()

    async def register_broker(
        self,
        registration: BrokerRegistration,
        ttl_s: int,
        heartbeat_s: float | None = None,
        stall_timeout_s: float = math.inf,
    ) -> int:
        """Register under a fresh lease, replacing an earlier registration of the same broker.

        The same node id under another broker's live lease is refused: two
        brokers must never share an id. A broker restarted after a crash
        carries the same ``node_id`` and data directory, so the old
        registration is its own and is replaced. The lease is renewed from a
        thread of its own (:mod:`shoal.broker.cluster.heartbeat`) while this
        event loop has run within ``stall_timeout_s``.
        """
        key = self._key("brokers", registration.node_id)
        existing = await self._call(self._client.get(key))
        if existing is not None:
            current = BrokerRegistration.from_json(existing.value)
            if (current.host, current.port) != (registration.host, registration.port):
                raise StoreError(
                    f"node id {registration.node_id} is registered by a live broker at"
                    f" {current.host}:{current.port}"
                )
        interval = _keepalive_interval(ttl_s, heartbeat_s)
        self.session.retry_window_s = retry_window(interval, ttl_s)
        asked = time.monotonic()
        lease = await self._call(self._client.lease(ttl_s))
        self.session.renewed(asked, ttl_s)
        put = await self._call(self._client.put(key, registration.to_json(), lease=lease.id))
        self._registration = registration
        if self._heartbeat is None:
            self._heartbeat = LeaseHeartbeat(
                self.address,
                self._timeout_s,
                self.session,
                key,
                self._registration_json,
                ttl_s,
                interval,
                stall_timeout_s,
            )
            self._heartbeat.start(int(lease.id))
        else:
            self._heartbeat.lease_id = int(lease.id)
        return int(put.header.revision)

    def _registration_json(self) -> bytes:
        assert self._registration is not None
        return self._registration.to_json()

    @property
    def _lease(self) -> int | None:
        """The lease this broker's registration lives under, if registered."""
        return self._heartbeat.lease_id if self._heartbeat is not None else None

    async def deregister_broker(self) -> None:
        # The heartbeat stops first: a renewal after the revoke would find no lease.
        lease = self._lease
        await self._stop_keepalive()
        if lease is not None:
            with contextlib.suppress(aetcd.exceptions.ClientError):
                await self._client.revoke_lease(lease)

    async def update_registration(self, registration: BrokerRegistration) -> int:
        """Rewrite this broker's registration under its lease (controlled shutdown)."""
        put = await self._call(
            self._client.put(
                self._key("brokers", registration.node_id),
                registration.to_json(),
                lease=self._lease,
            )
        )
        self._registration = registration
        return int(put.header.revision)

    async def registration_lease(self, node_id: NodeId) -> tuple[int, str, int] | None:
        """The lease id, host and port of ``node_id``'s registration, if it is registered."""
        found = await self._call(self._client.get(self._key("brokers", node_id)))
        if found is None or not found.lease:
            return None
        registration = BrokerRegistration.from_json(found.value)
        return int(found.lease), registration.host, registration.port

    async def fence_broker(self, node_id: NodeId, lease_id: int) -> bool:
        """End a dead broker's registration now: revoke its lease (which also drops the
        controller key if it held it). False if that lease was already gone."""
        try:
            await self._client.revoke_lease(lease_id)
        except aetcd.exceptions.ClientError as exc:
            if "not found" in str(exc):
                return False
            raise StoreUnavailableError(f"etcd request failed: {exc}") from exc
        return True

    # -- controller ------------------------------------------------------------

    async def campaign(self, node_id: NodeId) -> bool:
        """Try to become controller: the key is created only if absent, under our lease.

        The key goes when our lease ends (crash, partition from etcd), and
        every broker watching the image campaigns again.
        """
        if self._lease is None:
            return False
        key = self._key("controller")
        t = self._client.transactions
        ok, _ = await self._call(
            self._client.transaction(
                compare=[t.version(key) == 0],
                success=[t.put(key, json.dumps({"node_id": node_id}).encode(), lease=self._lease)],
                failure=[],
            )
        )
        return bool(ok)

    async def resign(self, lease: ControllerLease) -> None:
        """Give up the controller key if it is still ours, so another broker takes over now."""
        key = self._key("controller")
        t = self._client.transactions
        with contextlib.suppress(StoreError):
            await self._call(
                self._client.transaction(
                    compare=[t.create(key) == lease.epoch], success=[t.delete(key)], failure=[]
                )
            )

    async def update_partitions(
        self, changes: Sequence[PartitionChange], controller: ControllerLease | None = None
    ) -> int:
        """Write partition states, each only if unchanged since ``expected_revision``.

        With ``controller``, only while that controller still holds office.
        Changes go in transactions of at most :data:`_TXN_OPS`; ConflictError
        if any transaction lost (the ones before it stand: each change is
        independently valid).
        """
        t = self._client.transactions
        revision = 0
        for start in range(0, len(changes), _TXN_OPS):
            chunk = changes[start : start + _TXN_OPS]
            compare = [
                t.mod(self._partition_key(c.topic, c.index)) == c.expected_revision for c in chunk
            ]
            if controller is not None:
                compare.append(t.create(self._key("controller")) == controller.epoch)
            puts = [t.put(self._partition_key(c.topic, c.index), c.state.to_json()) for c in chunk]
            ok, responses = await self._call(
                self._client.transaction(compare=compare, success=puts, failure=[])
            )
            if not ok:
                raise ConflictError("partition state changed concurrently")
            revision = int(responses[0].response_put.header.revision)
        return revision

    # -- topics ----------------------------------------------------------------

    async def create_topic(self, record: TopicRecord, states: Sequence[PartitionState]) -> int:
        """Store a new topic: its partition states and its record, which makes it exist.

        One transaction when they fit in etcd's limit (128 operations by default);
        beyond :data:`_TXN_OPS` partitions, :meth:`_write_in_chunks`: images show no
        partition whose topic has no record, so the topic appears whole or not at
        all. TopicExistsError if the topic exists or appears meanwhile;
        StoreUnavailableError (REQUEST_TIMED_OUT, which clients retry) while
        another request is writing it.
        """
        t = self._client.transactions
        key = self._topic_key(record.name)
        absent = [t.version(key) == 0, t.version(self._topic_write_key(record.name)) == 0]
        puts = [
            t.put(self._partition_key(record.name, i), state.to_json())
            for i, state in enumerate(states)
        ]
        try:
            if len(puts) < _TXN_OPS:
                return await self._topic_transaction(
                    record, absent, [t.put(key, record.to_json()), *puts], TopicExistsError
                )
            return await self._write_in_chunks(
                record, [t.version(key) == 0], puts, TopicExistsError
            )
        except TopicExistsError:
            if await self._call(self._client.get(key)) is None:
                # Not there: another request is writing it, or this one lost its marker.
                raise StoreUnavailableError(
                    f"Topic '{record.name}' is being written by another request; retry."
                ) from None
            raise

    def _topic_write_key(self, name: str) -> bytes:
        return self._key("topic-writes", name)

    async def _write_in_chunks(
        self, record: TopicRecord, guard: list[Any], puts: list[Any], lost: type[StoreError]
    ) -> int:
        """Write partition states (``puts``) in transactions of :data:`_TXN_OPS`, then the
        topic's record, each only while ``guard`` holds.

        Two requests writing one topic at once (brokers create topics themselves
        when the controller cannot be reached, and auto-create) would mix their
        partition states before either record won; so the first transaction takes
        the topic's write marker (``topic-writes/<name>``, a token of this write,
        on a lease of its own: a writer that dies lets go of it), every later one
        requires it still ours, and the record's drops it. A creation also clears
        states an interrupted one left, and a failed one clears its own. ``lost``
        (TopicExistsError or ConflictError) if a guard fails or the marker is taken.
        """
        t = self._client.transactions
        marker = self._topic_write_key(record.name)
        token = uuid.uuid4().hex.encode()
        creating = lost is TopicExistsError
        prefix = self._key("partitions", record.name) + b"/"
        cleared = [t.delete(prefix, range_end=_prefix_end(prefix))] if creating else []
        lease = await self._call(self._client.lease(_TOPIC_WRITE_LEASE_S))
        ours = [*guard, t.value(marker) == token]
        try:
            await self._topic_transaction(
                record,
                [*guard, t.version(marker) == 0],
                [t.put(marker, token, lease=lease), *cleared],
                lost,
            )
            try:
                for chunk in _chunks(puts, _TXN_OPS):
                    renewed = await self._call(lease.refresh())
                    if renewed is None or renewed.TTL <= 0:
                        raise StoreUnavailableError(
                            f"writing topic '{record.name}' took longer than its marker's lease"
                        )
                    await self._topic_transaction(record, ours, chunk, lost)
                return await self._topic_transaction(
                    record,
                    ours,
                    [t.put(self._topic_key(record.name), record.to_json()), t.delete(marker)],
                    lost,
                )
            except BaseException:
                if creating:
                    with contextlib.suppress(StoreError):
                        await self._call(
                            self._client.transaction(compare=ours, success=cleared, failure=[])
                        )
                raise
        finally:
            with contextlib.suppress(StoreError):
                await self._call(lease.revoke())

    async def _topic_transaction(
        self, record: TopicRecord, compare: list[Any], success: list[Any], lost: type[StoreError]
    ) -> int:
        """Run one transaction of a topic's change; ``lost`` if a comparison fails."""
        ok, responses = await self._call(
            self._client.transaction(compare=compare, success=success, failure=[])
        )
        if not ok:
            if lost is TopicExistsError:
                raise TopicExistsError(f"Topic '{record.name}' already exists.")
            raise lost(f"Topic '{record.name}' changed concurrently; retry.")
        response = responses[0]
        kind = response.WhichOneof("response")
        return int(getattr(response, kind).header.revision)

    async def delete_topic(self, name: TopicName) -> int:
        t = self._client.transactions
        key = self._topic_key(name)
        prefix = self._key("partitions", name) + b"/"
        ok, responses = await self._call(
            self._client.transaction(
                compare=[t.version(key) > 0],
                success=[t.delete(key), t.delete(prefix, range_end=_prefix_end(prefix))],
                failure=[],
            )
        )
        if not ok:
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        return int(responses[0].response_delete_range.header.revision)

    async def update_topic(
        self,
        record: TopicRecord,
        expected_revision: int,
        new_partitions: Mapping[int, PartitionState] | None = None,
    ) -> int:
        """Replace the topic's record if still at ``expected_revision``, with the states of
        the partitions it adds. Beyond :data:`_TXN_OPS` new partitions,
        :meth:`_write_in_chunks`: images show no partition beyond the record's count, so
        the new partitions appear with it. ConflictError if the record changed meanwhile,
        or another request is writing the topic."""
        t = self._client.transactions
        key = self._topic_key(record.name)
        unchanged = [t.mod(key) == expected_revision]
        puts = [
            t.put(self._partition_key(record.name, i), state.to_json())
            for i, state in (new_partitions or {}).items()
        ]
        if len(puts) < _TXN_OPS:
            return await self._topic_transaction(
                record,
                [*unchanged, t.version(self._topic_write_key(record.name)) == 0],
                [t.put(key, record.to_json()), *puts],
                ConflictError,
            )
        return await self._write_in_chunks(record, unchanged, puts, ConflictError)

    async def update_assignment(
        self, change: AssignmentChange, controller: ControllerLease | None = None
    ) -> int:
        """One transaction: the record if still at its revision, each partition state if
        still at its own, and (with ``controller``) only while that controller holds office."""
        t = self._client.transactions
        key = self._topic_key(change.record.name)
        compare = [t.mod(key) == change.expected_revision] + [
            t.mod(self._partition_key(c.topic, c.index)) == c.expected_revision
            for c in change.partitions
        ]
        if controller is not None:
            compare.append(t.create(self._key("controller")) == controller.epoch)
        puts = [t.put(key, change.record.to_json())] + [
            t.put(self._partition_key(c.topic, c.index), c.state.to_json())
            for c in change.partitions
        ]
        ok, responses = await self._call(
            self._client.transaction(compare=compare, success=puts, failure=[])
        )
        if not ok:
            raise ConflictError(f"Topic '{change.record.name}' changed concurrently; retry.")
        return int(responses[0].response_put.header.revision)

    # -- producer ids ----------------------------------------------------------

    async def allocate_producer_ids(self, count: int) -> int:
        """Take the next block of ids by compare-and-swap on one counter, as Kafka's controller
        hands out blocks (AllocateProducerIds): ids never repeat across brokers or restarts."""
        key = self._key("producer-ids", "next")
        t = self._client.transactions
        for _ in range(_CAS_ATTEMPTS):
            current = await self._call(self._client.get(key))
            start = int(current.value) if current is not None else 0
            guard = t.version(key) == 0 if current is None else t.mod(key) == current.mod_revision
            ok, _ = await self._call(
                self._client.transaction(
                    compare=[guard], success=[t.put(key, str(start + count).encode())], failure=[]
                )
            )
            if ok:
                return start
        raise ConflictError("producer id allocation kept losing compare-and-swap; retry")

    # -- images ----------------------------------------------------------------

    async def images(self) -> AsyncIterator[ClusterImage]:
        """Yield the whole image after loading, then after each watched change.

        If etcd goes away the stream waits and reloads; it ends on close().
        """
        while not self._closed.is_set():
            try:
                async for image in self._follow():
                    yield image
            except (aetcd.exceptions.ClientError, StoreUnavailableError) as exc:
                log.warning("event=metadata_watch_lost error=%s retry_s=%s", exc, _RETRY_S)
                await asyncio.sleep(_RETRY_S)

    async def _follow(self) -> AsyncIterator[ClusterImage]:
        root = self._root + b"/"
        snapshot = await self._client.get_prefix(root)
        state = ImageBuilder(self._root)
        for kv in snapshot:
            state.put(kv.key, kv.value, kv.mod_revision, kv.create_revision)
        revision = snapshot.header.revision
        self.session.image_at(revision)
        yield state.image(revision)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        watch = await self._client.watch_prefix(root, start_revision=revision + 1)

        async def pump() -> None:
            try:
                async for event in watch:
                    queue.put_nowait(event)
            except aetcd.exceptions.ClientError as exc:
                queue.put_nowait(exc)
            queue.put_nowait(None)

        pumping = asyncio.create_task(pump(), name="etcd-watch")
        try:
            while True:
                events = [await queue.get()]
                while not queue.empty():
                    events.append(queue.get_nowait())
                for event in events:
                    if event is None:
                        return
                    if isinstance(event, Exception):
                        raise event
                    if event.kind == aetcd.rtypes.EventKind.PUT:
                        state.put(
                            event.kv.key,
                            event.kv.value,
                            event.kv.mod_revision,
                            event.kv.create_revision,
                        )
                    else:
                        state.delete(event.kv.key)
                    revision = max(revision, event.kv.mod_revision)
                self.session.image_at(revision)
                yield state.image(revision)
        finally:
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError, aetcd.exceptions.ClientError):
                await watch.cancel()


class ImageBuilder:
    """Decoded records by key, from which images are built.

    An image reuses the previous one's TopicImage (the same object) for every
    topic no key of which changed since, and each record and state object
    lives until its key is written again: a listener finds what changed by
    identity, in time proportional to the change rather than to the cluster
    (an ISR change among 10,000 partitions must not walk them all).
    """

    def __init__(self, root: bytes) -> None:
        self._root = root
        self.cluster_id = ""
        self.brokers: dict[NodeId, BrokerRegistration] = {}
        self.controller: ControllerLease | None = None
        self.topics: dict[TopicName, tuple[TopicRecord, int]] = {}
        self.partitions: dict[TopicName, dict[int, tuple[PartitionState, int]]] = {}
        self._built: dict[TopicName, TopicImage] = {}
        self._changed: set[TopicName] = set()

    def _parts(self, key: bytes) -> list[str]:
        return key[len(self._root) + 1 :].decode().split("/")

    def put(self, key: bytes, value: bytes, mod_revision: int, create_revision: int) -> None:
        parts = self._parts(key)
        try:
            match parts:
                case ["cluster", "id"]:
                    self.cluster_id = value.decode()
                case ["brokers", node]:
                    self.brokers[NodeId(int(node))] = BrokerRegistration.from_json(value)
                case ["controller"]:
                    node_id = NodeId(int(json.loads(value)["node_id"]))
                    self.controller = ControllerLease(node_id, create_revision)
                case ["topics", name]:
                    self.topics[TopicName(name)] = (TopicRecord.from_json(value), mod_revision)
                    self._changed.add(TopicName(name))
                case ["partitions", name, index]:
                    states = self.partitions.setdefault(TopicName(name), {})
                    states[int(index)] = (PartitionState.from_json(value), mod_revision)
                    self._changed.add(TopicName(name))
        except (ValueError, KeyError):
            log.exception("event=metadata_record_unreadable key=%s", key)

    def delete(self, key: bytes) -> None:
        match self._parts(key):
            case ["brokers", node]:
                self.brokers.pop(NodeId(int(node)), None)
            case ["controller"]:
                self.controller = None
            case ["topics", name]:
                self.topics.pop(TopicName(name), None)
                self._changed.add(TopicName(name))
            case ["partitions", name, index]:
                states = self.partitions.get(TopicName(name), {})
                states.pop(int(index), None)
                if not states:
                    self.partitions.pop(TopicName(name), None)
                self._changed.add(TopicName(name))

    def image(self, revision: int) -> ClusterImage:
        for name in self._changed:
            built = self._topic_image(name)
            if built is None:
                self._built.pop(name, None)
            else:
                self._built[name] = built
        self._changed.clear()
        return ClusterImage.build(
            self.cluster_id, revision, dict(self.brokers), dict(self._built), self.controller
        )

    def _topic_image(self, name: TopicName) -> TopicImage | None:
        """The topic as images show it: None without its record."""
        found = self.topics.get(name)
        if found is None:
            return None
        record, mod_revision = found
        # States past the record's count are a CreatePartitions that has not (or
        # never) stored its record: not partitions yet (EtcdMetadataStore.update_topic).
        states = {
            i: stored
            for i, stored in self.partitions.get(name, {}).items()
            if i < record.partition_count
        }
        return TopicImage(
            record,
            {i: state for i, (state, _) in states.items()},
            mod_revision,
            {i: rev for i, (_, rev) in states.items()},
        )


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[at : at + size] for at in range(0, len(items), size)]


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])
