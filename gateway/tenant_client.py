"""A Kafka client inside the gateway that acts as one tenant: the HTTP door's way in.

The HTTP routes never talk to a broker on their own. They build the same kio
request a Kafka client would send and hand it to :meth:`TenantClient.send`,
which runs it through the Kafka door's rewriter for that API
(:data:`shoal.gateway.apis.REWRITERS`) with the caller's
:class:`~shoal.gateway.access.TenantAccess`, forwards what the rewriter lets
through, and maps the answer back with the rewriter's ``finish``. ACLs,
namespaces and the partition limit are therefore enforced by one piece of
code for both doors, and an HTTP caller sees exactly what a Kafka client with
the same key would see: its own names, its own topics, the same error codes.

Routing, as a Kafka client routes:

* admin and metadata requests go to any broker: the tenant's home broker
  (:class:`HomeBrokers`) while it answers, so a read sees the caller's last write;
* Produce, Fetch and ListOffsets go to the partition's leader, learned from
  Metadata (node ids are the brokers' own; the address is looked up in
  ``services.cluster.brokers``, never taken from the rewritten answer, which
  names the gateway's ports);
* group requests go to the group's coordinator (FindCoordinator).

A produce that meets NOT_LEADER_OR_FOLLOWER (or a connection lost to the old
leader) asks Metadata again and retries once, as a Kafka producer does after a
leader change.

Quotas (the HTTP half of KIP-13/219, see ``docs/http-api.md``): produced
record bytes and fetched record bytes count against the tenant's byte rates
(this gateway's share, as for a Kafka connection) and into the usage ledger.
A request that arrives while the tenant is already over its rate is refused
with :class:`QuotaExceededError` (HTTP 429 with Retry-After) before anything
is sent; a request that is served and pushes the tenant over is answered only
after the throttle it earned has passed, as the Kafka door mutes a connection.
A sequential caller so never sees a 429 and simply runs at its rate; many
parallel callers are held to it by the 429s.

The request quota (``request_percentage``, :mod:`shoal.gateway.request_quota`)
charges the time :meth:`TenantClient.send` spends running (rewriting, encoding
and decoding the Kafka request and its answer; not the broker's time, nor the
HTTP framework's) to the same budget as the tenant's Kafka connections. A call
while the tenant owes more than a window is refused with a 429; a call that
ran the tenant into debt is answered after the throttle it earned.

Connections: :class:`BrokerPool` keeps a few connections per broker for the
whole gateway. :meth:`BrokerConnection.call` serializes on its connection, so
the pool hands each call a connection of its own and concurrent HTTP requests
overlap up to the pool size per broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from shoal.gateway.access import TenantAccess
from shoal.gateway.admission import QuotaWaitError, charge_request, mutation_charger
from shoal.gateway.apis import REWRITERS
from shoal.gateway.apis.base import Answer, Lookups, RequestContext
from shoal.gateway.cluster_view import BrokerAddress
from shoal.gateway.request_quota import Stopwatch, timed
from shoal.gateway.storage_limit import storage_check
from shoal.gateway.tracing import current_traceparent
from shoal.gateway.upstream import CLIENT_ID, BrokerConnection, UpstreamError

from shoal.wire import ApiSchema, schema
from shoal.wire import ErrorCode as KafkaCode
from shoal.wire.trace_context import forwarded_client_id

if TYPE_CHECKING:
    from shoal.gateway.server import GatewayServices

PRODUCE: Final = (0, 9)
FETCH: Final = (1, 12)
LIST_OFFSETS: Final = (2, 7)
METADATA: Final = (3, 12)
FIND_COORDINATOR: Final = (10, 4)
DESCRIBE_GROUPS: Final = (15, 5)
LIST_GROUPS: Final = (16, 4)
OFFSET_FETCH: Final = (9, 8)
CREATE_TOPICS: Final = (19, 7)
DELETE_TOPICS: Final = (20, 5)
CREATE_PARTITIONS: Final = (37, 3)
DESCRIBE_CONFIGS: Final = (32, 4)
INCREMENTAL_ALTER_CONFIGS: Final = (44, 1)

TOPIC_RESOURCE: Final = 2
GROUP_KEY: Final = 0
ACKS_ALL: Final = -1
READ_UNCOMMITTED: Final = 0
EARLIEST: Final = -2
LATEST: Final = -1
ADMIN_TIMEOUT: Final = timedelta(seconds=30)
PRODUCE_TIMEOUT: Final = timedelta(seconds=30)
_CALL_TIMEOUT_S: Final = 40.0
"""Longer than any timeout a request carries, so the broker answers first."""
CONNECTIONS_PER_BROKER: Final = 4

_STALE_LEADER: Final = frozenset(
    {
        KafkaCode.not_leader_or_follower,
        KafkaCode.leader_not_available,
        KafkaCode.fenced_leader_epoch,
        KafkaCode.network_exception,
    }
)


class KafkaCallError(Exception):
    """A Kafka error for the whole call (the topic, the group, the cluster)."""

    def __init__(self, code: KafkaCode, message: str | None = None) -> None:
        super().__init__(message or code.name.upper())
        self.code = code
        self.message = message


class QuotaExceededError(Exception):
    """The tenant is over a quota (its byte rate, its request time); try again after
    ``retry_after_ms``."""

    def __init__(self, retry_after_ms: int, quota: str = "byte-rate quota") -> None:
        super().__init__(f"over the {quota}; retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


@dataclass(frozen=True, slots=True)
class PartitionProduced:
    """One partition's answer to a produce: an error, or where the batch landed."""

    error: KafkaCode
    message: str | None = None
    base_offset: int = -1
    log_append_time_ms: int | None = None


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """What Metadata says of one topic: partition -> leader and replicas."""

    name: str
    leaders: Mapping[int, int]
    replicas: Mapping[int, tuple[int, ...]]
    isr: Mapping[int, tuple[int, ...]]

    @property
    def partitions(self) -> int:
        return len(self.leaders)

    @property
    def replication_factor(self) -> int:
        return len(self.replicas.get(0, ()))


class BrokerPool:
    """A few connections to each broker, shared by every HTTP request of the gateway."""

    def __init__(self, per_broker: int = CONNECTIONS_PER_BROKER) -> None:
        self._per_broker = per_broker
        self._slots: dict[tuple[str, int], asyncio.Queue[BrokerConnection | None]] = {}
        self.cluster_id: str | None = None
        """The brokers' cluster id, learned from the first Metadata answer."""

    async def call(self, broker: BrokerAddress, api: ApiSchema, body: Any) -> Any:
        address = (broker.host, broker.port)
        slots = self._slots.get(address)
        if slots is None:
            slots = self._slots[address] = asyncio.Queue()
            for _ in range(self._per_broker):
                slots.put_nowait(None)
        connection = await slots.get()
        try:
            if connection is None or connection.closed:
                connection = await BrokerConnection.open(broker.host, broker.port)
            # The HTTP request's span (if traced) is the broker span's parent.
            client_id = forwarded_client_id(CLIENT_ID, current_traceparent())
            return await connection.call(api, body, _CALL_TIMEOUT_S, client_id)
        except UpstreamError:
            if connection is not None:
                connection.close()
            connection = None
            raise
        finally:
            slots.put_nowait(connection)

    def close(self) -> None:
        for slots in self._slots.values():
            while not slots.empty():
                connection = slots.get_nowait()
                if connection is not None:
                    connection.close()


class HomeBrokers:
    """Which broker each tenant's admin and metadata calls go to: the last one that answered.

    A broker answers an admin write once its own image shows the change; the
    other brokers see it a moment later, when their etcd watch delivers it.
    An HTTP caller who sets a config and then reads it back must see the new
    value, so a tenant's calls stay on one broker while it answers, and move
    only when it fails. Per tenant rather than one for the gateway, so the
    load still spreads over the brokers.
    """

    def __init__(self) -> None:
        self._home: dict[str, int] = {}

    def order(self, tenant: str, brokers: list[BrokerAddress]) -> list[BrokerAddress]:
        """``brokers`` with the tenant's home first, the rest as given."""
        home = self._home.get(tenant)
        return sorted(brokers, key=lambda broker: broker.node_id != home)

    def answered(self, tenant: str, node_id: int) -> None:
        self._home[tenant] = node_id


class TenantClient:
    """One HTTP request's Kafka client, with the caller's rights."""

    def __init__(
        self,
        services: GatewayServices,
        access: TenantAccess,
        lookups: Lookups,
        pool: BrokerPool,
        homes: HomeBrokers,
    ) -> None:
        self.services = services
        self.access = access
        self._lookups = lookups
        self._pool = pool
        self._homes = homes

    # -- the one way to a broker ---------------------------------------------------

    async def send(
        self,
        api: tuple[int, int],
        node_id: int | None,
        fetch_cap: int | None = None,
        **fields: Any,
    ) -> Any:
        """Rewrite a request as the Kafka door would, forward it, map the answer back.

        ``node_id`` None sends it to any broker; ``fetch_cap`` bounds a fetch
        by its quota reservation. Its running time is charged to the tenant's
        request quota.
        """
        services, access = self.services, self.access
        with _come_back_later():
            try:
                services.admission.try_request(access.tenant, access.quotas.request_percentage)
            except QuotaWaitError:
                services.metrics.limit_refused(access.tenant, "request_rate")
                raise
        watch = Stopwatch()
        try:
            response = await timed(self._send(api, node_id, fetch_cap, fields), watch)
        finally:
            throttle_ms = charge_request(services, access, watch.take())
        await _wait_out(throttle_ms)
        return response

    async def _send(
        self, api: tuple[int, int], node_id: int | None, fetch_cap: int | None, fields: Any
    ) -> Any:
        api_key, version = api
        entity = schema(api_key, version)
        ctx = RequestContext(
            access=self.access,
            api=entity,
            lookups=self._lookups,
            quota_store=self.services.quota_store,
            acl_store=self.services.acl_store,
            fetch_cap=fetch_cap,
            charge_mutations=mutation_charger(self.services, self.access),
            storage_refusal=storage_check(self.services, self.access),
        )
        _, rewrite = REWRITERS[api_key]
        step = await rewrite(ctx, entity.request(**fields))
        if isinstance(step, Answer):
            return step.response
        if node_id is None:
            response = await self._call_any(entity, step.request)
        else:
            response = await self._pool.call(await self._broker(node_id), entity, step.request)
        return step.finish(response)

    async def _call_any(self, api: ApiSchema, body: Any) -> Any:
        candidates = self.services.cluster.bootstrap_candidates()
        if not candidates:
            await self.services.cluster.refresh()
            candidates = self.services.cluster.bootstrap_candidates()
        failures = []
        tenant = self.access.tenant
        for broker in self._homes.order(tenant, candidates):
            try:
                response = await self._pool.call(broker, api, body)
            except UpstreamError as exc:
                failures.append(str(exc))
                continue
            self._homes.answered(tenant, broker.node_id)
            return response
        raise UpstreamError("no broker answered: " + "; ".join(failures))

    async def _broker(self, node_id: int) -> BrokerAddress:
        cluster = self.services.cluster
        broker = cluster.brokers.get(node_id)
        if broker is None:
            await cluster.refresh()
            broker = cluster.brokers.get(node_id)
        if broker is None:
            raise KafkaCallError(KafkaCode.leader_not_available, f"broker {node_id} is not known")
        return broker

    async def send_each(
        self, api: tuple[int, int], node_ids: Iterable[int], **fields: Any
    ) -> list[Any]:
        """The same request to each of several brokers (ListGroups asks every coordinator)."""
        return list(
            await asyncio.gather(*(self.send(api, node_id, **fields) for node_id in node_ids))
        )

    # -- cluster and topics -------------------------------------------------------

    async def metadata(self, topics: Iterable[str] | None, node_id: int | None = None) -> Any:
        api = schema(*METADATA)
        response = await self.send(
            METADATA,
            node_id,
            topics=None
            if topics is None
            else tuple(
                api.make_request("MetadataRequestTopic", name=t, topic_id=None) for t in topics
            ),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        if response.cluster_id and self._pool.cluster_id is None:
            self._pool.cluster_id = response.cluster_id
        return response

    async def cluster_id(self) -> str:
        if self._pool.cluster_id is None:
            await self.metadata(())
        if self._pool.cluster_id is None:
            raise KafkaCallError(KafkaCode.broker_not_available, "the brokers named no cluster id")
        return self._pool.cluster_id

    async def topic(self, name: str, node_id: int | None = None) -> TopicLayout:
        """One topic's layout (as ``node_id`` knows it, or any broker); KafkaCallError
        if it is not there or not the caller's."""
        response = await self.metadata([name], node_id)
        for topic in response.topics:
            if topic.name == name:
                if topic.error_code != KafkaCode.none:
                    raise KafkaCallError(topic.error_code)
                return layout(topic)
        raise KafkaCallError(KafkaCode.unknown_topic_or_partition)

    async def topics(self) -> list[TopicLayout]:
        response = await self.metadata(None)
        return sorted(
            (layout(t) for t in response.topics if t.error_code == KafkaCode.none and t.name),
            key=lambda t: t.name,
        )

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str | None],
    ) -> Any:
        api = schema(*CREATE_TOPICS)
        response = await self.send(
            CREATE_TOPICS,
            None,
            topics=(
                api.make_request(
                    "CreatableTopic",
                    name=name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    assignments=(),
                    configs=tuple(
                        api.make_request("CreatableTopicConfig", name=k, value=v)
                        for k, v in configs.items()
                    ),
                ),
            ),
            timeout=ADMIN_TIMEOUT,
            validate_only=False,
        )
        return _only(response.topics, name)

    async def delete_topic(self, name: str) -> None:
        response = await self.send(DELETE_TOPICS, None, topic_names=(name,), timeout=ADMIN_TIMEOUT)
        _only(response.responses, name)

    async def create_partitions(self, name: str, count: int) -> None:
        api = schema(*CREATE_PARTITIONS)
        response = await self.send(
            CREATE_PARTITIONS,
            None,
            topics=(
                api.make_request("CreatePartitionsTopic", name=name, count=count, assignments=None),
            ),
            timeout=ADMIN_TIMEOUT,
            validate_only=False,
        )
        _only(response.results, name)

    async def describe_configs(self, topic: str, names: Iterable[str] | None) -> Any:
        api = schema(*DESCRIBE_CONFIGS)
        response = await self.send(
            DESCRIBE_CONFIGS,
            None,
            resources=(
                api.make_request(
                    "DescribeConfigsResource",
                    resource_type=TOPIC_RESOURCE,
                    resource_name=topic,
                    configuration_keys=None if names is None else tuple(names),
                ),
            ),
            include_synonyms=False,
            include_documentation=False,
        )
        result = response.results[0]
        if result.error_code != KafkaCode.none:
            raise KafkaCallError(result.error_code, result.error_message)
        return result.configs

    async def alter_configs(
        self, topic: str, changes: Iterable[tuple[str, int, str | None]]
    ) -> None:
        """IncrementalAlterConfigs: (name, operation 0=SET 1=DELETE, value) per config."""
        api = schema(*INCREMENTAL_ALTER_CONFIGS)
        response = await self.send(
            INCREMENTAL_ALTER_CONFIGS,
            None,
            resources=(
                api.make_request(
                    "AlterConfigsResource",
                    resource_type=TOPIC_RESOURCE,
                    resource_name=topic,
                    configs=tuple(
                        api.make_request(
                            "AlterableConfig", name=name, config_operation=op, value=value
                        )
                        for name, op, value in changes
                    ),
                ),
            ),
            validate_only=False,
        )
        result = response.responses[0]
        if result.error_code != KafkaCode.none:
            raise KafkaCallError(result.error_code, result.error_message)

    # -- records -----------------------------------------------------------------

    async def produce(
        self, topic: str, batches: Mapping[int, bytes], known: TopicLayout | None = None
    ) -> dict[int, PartitionProduced]:
        """One batch per partition, each to its leader, acks=all; an answer per partition.

        ``known`` is a layout the caller has just read, sent to without asking
        again. Partitions whose leader moved are retried once with fresh metadata.
        """
        tenant = self.access.tenant
        quota = self.access.quotas.producer_byte_rate
        nbytes = sum(len(batch) for batch in batches.values())
        with _come_back_later():
            throttle_ms = self.services.admission.try_produce(tenant, nbytes, quota)
        results: dict[int, PartitionProduced] = {}
        pending = dict(batches)
        for attempt in range(2):
            layout_ = known if attempt == 0 and known is not None else await self.topic(topic)
            by_leader: dict[int, dict[int, bytes]] = {}
            for partition, batch in pending.items():
                leader = layout_.leaders.get(partition)
                if leader is None:
                    results[partition] = PartitionProduced(KafkaCode.unknown_topic_or_partition)
                elif leader < 0:
                    results[partition] = PartitionProduced(KafkaCode.leader_not_available)
                else:
                    by_leader.setdefault(leader, {})[partition] = batch
            answers = await asyncio.gather(
                *(self._produce_to(leader, topic, parts) for leader, parts in by_leader.items())
            )
            for answer in answers:
                results.update(answer)
            pending = {
                p: batches[p] for p in pending if attempt == 0 and results[p].error in _STALE_LEADER
            }
            if not pending:
                break
        self.services.usage.produced(self.access.tenant, nbytes, throttle_ms)
        await _wait_out(throttle_ms)
        return results

    async def _produce_to(
        self, leader: int, topic: str, batches: Mapping[int, bytes]
    ) -> dict[int, PartitionProduced]:
        api = schema(*PRODUCE)
        try:
            response = await self.send(
                PRODUCE,
                leader,
                transactional_id=None,
                acks=ACKS_ALL,
                timeout=PRODUCE_TIMEOUT,
                topic_data=(
                    api.make_request(
                        "TopicProduceData",
                        name=topic,
                        partition_data=tuple(
                            api.make_request("PartitionProduceData", index=p, records=batch)
                            for p, batch in batches.items()
                        ),
                    ),
                ),
            )
        except UpstreamError as exc:
            return {p: PartitionProduced(KafkaCode.network_exception, str(exc)) for p in batches}
        except KafkaCallError as exc:  # a leader the gateway no longer knows: retried
            return {p: PartitionProduced(exc.code, str(exc)) for p in batches}
        out: dict[int, PartitionProduced] = {}
        for topic_response in response.responses:
            for part in topic_response.partition_responses:
                append_time = part.log_append_time
                out[part.index] = PartitionProduced(
                    KafkaCode(part.error_code),
                    part.error_message,
                    part.base_offset,
                    None if append_time is None else int(append_time.timestamp() * 1000),
                )
        for partition in batches:
            out.setdefault(partition, PartitionProduced(KafkaCode.unknown_server_error))
        return out

    async def list_offsets(self, topic: str, wanted: Mapping[int, int]) -> dict[int, int]:
        """Partition -> offset for each (partition, timestamp); -1 where none is found.

        Timestamps are ms, or :data:`EARLIEST`/:data:`LATEST`. Asked of each leader.
        """
        layout_ = await self.topic(topic)
        by_leader: dict[int, dict[int, int]] = {}
        for partition, timestamp in wanted.items():
            leader = layout_.leaders.get(partition)
            if leader is None:
                raise KafkaCallError(KafkaCode.unknown_topic_or_partition)
            by_leader.setdefault(leader, {})[partition] = timestamp
        api = schema(*LIST_OFFSETS)
        responses = await asyncio.gather(
            *(
                self.send(
                    LIST_OFFSETS,
                    leader,
                    replica_id=-1,
                    isolation_level=READ_UNCOMMITTED,
                    topics=(
                        api.make_request(
                            "ListOffsetsTopic",
                            name=topic,
                            partitions=tuple(
                                api.make_request(
                                    "ListOffsetsPartition",
                                    partition_index=p,
                                    current_leader_epoch=-1,
                                    timestamp=ts,
                                )
                                for p, ts in parts.items()
                            ),
                        ),
                    ),
                )
                for leader, parts in by_leader.items()
            )
        )
        offsets: dict[int, int] = {}
        for response in responses:
            for topic_response in response.topics:
                for part in topic_response.partitions:
                    if part.error_code != KafkaCode.none:
                        raise KafkaCallError(part.error_code)
                    offsets[part.partition_index] = part.offset
        return offsets

    async def fetch(self, topic: str, partition: int, offset: int, max_bytes: int) -> Any:
        """One partition's Fetch answer (records as the broker stored them), from its leader."""
        tenant = self.access.tenant
        quota = self.access.quotas.consumer_byte_rate
        with _come_back_later():
            ticket = self.services.admission.try_fetch(tenant, quota)
        try:
            data = await self._fetch_from_leader(
                topic, partition, offset, max_bytes, None if ticket is None else ticket.reserved
            )
        except BaseException:
            self.services.admission.fetched(ticket, 0)
            raise
        nbytes = len(data.records or b"")
        throttle_ms = self.services.admission.fetched(ticket, nbytes)
        self.services.usage.fetched(self.access.tenant, nbytes, throttle_ms)
        await _wait_out(throttle_ms)
        return data

    async def _fetch_from_leader(
        self, topic: str, partition: int, offset: int, max_bytes: int, cap: int | None
    ) -> Any:
        layout_ = await self.topic(topic)
        leader = layout_.leaders.get(partition)
        if leader is None:
            raise KafkaCallError(KafkaCode.unknown_topic_or_partition)
        api = schema(*FETCH)
        response = await self.send(
            FETCH,
            leader,
            fetch_cap=cap,
            cluster_id=None,
            replica_id=-1,
            max_wait=timedelta(0),
            min_bytes=0,
            max_bytes=max_bytes,
            isolation_level=READ_UNCOMMITTED,
            session_id=0,
            session_epoch=-1,
            topics=(
                api.make_request(
                    "FetchTopic",
                    topic=topic,
                    partitions=(
                        api.make_request(
                            "FetchPartition",
                            partition=partition,
                            current_leader_epoch=-1,
                            fetch_offset=offset,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=max_bytes,
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(),
            rack_id="",
        )
        data = response.responses[0].partitions[0]
        if data.error_code != KafkaCode.none:
            raise KafkaCallError(data.error_code)
        return data

    # -- groups ------------------------------------------------------------------

    async def coordinator(self, group: str) -> int:
        response = await self.send(
            FIND_COORDINATOR, None, key_type=GROUP_KEY, coordinator_keys=(group,)
        )
        found = _only(response.coordinators, group, name_field="key")
        return int(found.node_id)

    async def list_groups(self) -> list[Any]:
        """Every broker lists the groups it coordinates; the caller's, merged by id."""
        brokers = list(self.services.cluster.brokers)
        if not brokers:
            await self.services.cluster.refresh()
            brokers = list(self.services.cluster.brokers)
        responses = await self.send_each(LIST_GROUPS, brokers, states_filter=())
        groups: dict[str, Any] = {}
        for response in responses:
            if response.error_code != KafkaCode.none:
                raise KafkaCallError(response.error_code)
            for group in response.groups:
                groups.setdefault(group.group_id, group)
        return [groups[g] for g in sorted(groups)]

    async def describe_group(self, group: str) -> tuple[int, Any]:
        """(coordinator node id, DescribeGroups' answer for the group)."""
        node_id = await self.coordinator(group)
        response = await self.send(
            DESCRIBE_GROUPS, node_id, groups=(group,), include_authorized_operations=False
        )
        described = _only(response.groups, group, name_field="group_id")
        return node_id, described

    async def committed_offsets(self, group: str, node_id: int) -> dict[tuple[str, int], int]:
        """(topic, partition) -> committed offset, for every topic the group committed to."""
        api = schema(*OFFSET_FETCH)
        response = await self.send(
            OFFSET_FETCH,
            node_id,
            groups=(api.make_request("OffsetFetchRequestGroup", group_id=group, topics=None),),
            require_stable=False,
        )
        found = _only(response.groups, group, name_field="group_id")
        offsets: dict[tuple[str, int], int] = {}
        for topic in found.topics:
            for part in topic.partitions:
                if part.error_code == KafkaCode.none and part.committed_offset >= 0:
                    offsets[topic.name, part.partition_index] = part.committed_offset
        return offsets


def layout(topic: Any) -> TopicLayout:
    partitions = sorted(topic.partitions, key=lambda p: p.partition_index)
    return TopicLayout(
        name=topic.name,
        leaders={p.partition_index: p.leader_id for p in partitions},
        replicas={p.partition_index: tuple(p.replica_nodes) for p in partitions},
        isr={p.partition_index: tuple(p.isr_nodes) for p in partitions},
    )


def _only(results: Iterable[Any], name: str, name_field: str = "name") -> Any:
    """The result for ``name`` among a response's results; its error raised."""
    for result in results:
        if getattr(result, name_field) == name:
            if result.error_code != KafkaCode.none:
                raise KafkaCallError(
                    KafkaCode(result.error_code), getattr(result, "error_message", None)
                )
            return result
    raise KafkaCallError(KafkaCode.unknown_server_error, f"the broker did not answer for {name!r}")


@contextlib.contextmanager
def _come_back_later() -> Iterator[None]:
    """HTTP clients are told to come back (429, Retry-After) rather than held while their
    tenant's budget refills: a held HTTP request would tie up a connection and a worker."""
    try:
        yield
    except QuotaWaitError as exc:
        raise QuotaExceededError(math.ceil(exc.wait_s * 1000), exc.quota) from None


async def _wait_out(throttle_ms: int) -> None:
    if throttle_ms > 0:
        await asyncio.sleep(throttle_ms / 1000)
