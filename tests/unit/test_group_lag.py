"""The gateway's group lag reader: the brokers' answers turned into committed and end
offsets (errors left out), and a round against fake brokers of which one lists no
groups, one is frozen and one is gone, which must end on time with what the others said."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from shoal.gateway.cluster_view import BrokerAddress
from shoal.gateway.group_lag import (
    GroupLag,
    LagReader,
    committed_offsets,
    coordinated_groups,
    end_offsets,
    partition_leaders,
    summarize,
)

from shoal.wire import ErrorCode, decode_request, encode_response, schema

E = ErrorCode
LIST_GROUPS = schema(16, 4)
OFFSET_FETCH = schema(9, 8)
METADATA = schema(3, 12)
LIST_OFFSETS = schema(2, 7)
NO_THROTTLE = timedelta(0)
SUPPORTED = {16: (4, 4), 9: (8, 8), 3: (12, 12), 2: (7, 7)}


def listed(*groups: str, error: ErrorCode = E.none) -> Any:
    return LIST_GROUPS.response(
        throttle_time=NO_THROTTLE,
        error_code=error,
        groups=tuple(
            LIST_GROUPS.make("ListedGroup", group_id=g, protocol_type="consumer", group_state="")
            for g in groups
        ),
    )


def fetched(groups: dict[str, ErrorCode | dict[tuple[str, int], tuple[int, ErrorCode]]]) -> Any:
    """OffsetFetch v8: per group an error, or (topic, partition) -> (offset, error)."""
    answers = []
    for group_id, found in groups.items():
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), (offset, code) in ({} if isinstance(found, E) else found).items():
            by_topic.setdefault(topic, []).append(
                OFFSET_FETCH.make(
                    "OffsetFetchResponsePartitions",
                    partition_index=partition,
                    committed_offset=offset,
                    committed_leader_epoch=-1,
                    metadata="",
                    error_code=code,
                )
            )
        answers.append(
            OFFSET_FETCH.make(
                "OffsetFetchResponseGroup",
                group_id=group_id,
                topics=tuple(
                    OFFSET_FETCH.make("OffsetFetchResponseTopics", name=t, partitions=tuple(p))
                    for t, p in by_topic.items()
                ),
                error_code=found if isinstance(found, E) else E.none,
            )
        )
    return OFFSET_FETCH.response(throttle_time=NO_THROTTLE, groups=tuple(answers))


def metadata(
    topics: dict[str, ErrorCode | dict[int, int]], brokers: dict[int, int] | None = None
) -> Any:
    """Metadata v12: per topic an error, or partition -> leader; brokers: node -> port."""
    return METADATA.response(
        throttle_time=NO_THROTTLE,
        brokers=tuple(
            METADATA.make("MetadataResponseBroker", node_id=n, host="127.0.0.1", port=p, rack=None)
            for n, p in (brokers or {}).items()
        ),
        cluster_id="c",
        controller_id=1,
        topics=tuple(
            METADATA.make(
                "MetadataResponseTopic",
                error_code=layout if isinstance(layout, E) else E.none,
                name=name,
                topic_id=None,
                is_internal=False,
                partitions=tuple(
                    METADATA.make(
                        "MetadataResponsePartition",
                        error_code=E.none if leader >= 0 else E.leader_not_available,
                        partition_index=p,
                        leader_id=leader,
                        leader_epoch=0,
                        replica_nodes=(),
                        isr_nodes=(),
                        offline_replicas=(),
                    )
                    for p, leader in ({} if isinstance(layout, E) else layout).items()
                ),
                topic_authorized_operations=0,
            )
            for name, layout in topics.items()
        ),
    )


def latest(ends: dict[tuple[str, int], tuple[int, ErrorCode]]) -> Any:
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), (offset, code) in ends.items():
        by_topic.setdefault(topic, []).append(
            LIST_OFFSETS.make(
                "ListOffsetsPartitionResponse",
                partition_index=partition,
                error_code=code,
                timestamp=-1,
                offset=offset,
                leader_epoch=0,
            )
        )
    return LIST_OFFSETS.response(
        throttle_time=NO_THROTTLE,
        topics=tuple(
            LIST_OFFSETS.make("ListOffsetsTopicResponse", name=t, partitions=tuple(p))
            for t, p in by_topic.items()
        ),
    )


# -- the answers --------------------------------------------------------------------


def test_each_group_is_asked_of_the_broker_that_lists_it_and_erring_lists_are_skipped() -> None:
    groups = coordinated_groups(
        {
            2: listed("acme.moving", "acme.b"),
            1: listed("acme.a", "acme.moving"),
            3: listed("acme.c", error=E.coordinator_load_in_progress),
        }
    )
    assert groups == {1: ["acme.a", "acme.moving"], 2: ["acme.b"]}


def test_groups_answered_with_an_error_and_partitions_without_an_offset_are_left_out() -> None:
    answer = fetched(
        {
            "acme.a": {
                ("acme.t", 0): (5, E.none),
                ("acme.t", 1): (-1, E.none),
                ("acme.t", 2): (7, E.unstable_offset_commit),
            },
            "acme.gone": E.not_coordinator,
            "acme.loading": E.coordinator_load_in_progress,
            "acme.idle": {},
        }
    )
    assert committed_offsets(answer, 1) == {"acme.a": {("acme.t", 0): 5}, "acme.idle": {}}


def test_leaders_are_read_for_the_wanted_partitions_that_have_one() -> None:
    answer = metadata(
        {
            "acme.t": {0: 1, 1: 2, 2: -1, 3: 1},
            "acme.deleted": E.unknown_topic_or_partition,
        }
    )
    wanted = [("acme.t", 0), ("acme.t", 1), ("acme.t", 2), ("acme.deleted", 0)]
    assert partition_leaders(answer, wanted) == {1: [("acme.t", 0)], 2: [("acme.t", 1)]}


def test_end_offsets_with_an_error_are_left_out() -> None:
    answer = latest({("acme.t", 0): (12, E.none), ("acme.t", 1): (-1, E.not_leader_or_follower)})
    assert end_offsets(answer, 1) == {("acme.t", 0): 12}


# -- a round against fake brokers ---------------------------------------------------

Handler = Callable[[int, Any], Any]
"""(api key, request) -> the answer, or None to never answer (a frozen broker)."""


class Connections:
    """The connections a fake broker has open; a test waits for them to close."""

    def __init__(self) -> None:
        self.open: set[asyncio.StreamWriter] = set()
        self._changed = asyncio.Condition()

    async def changed(self, writer: asyncio.StreamWriter, is_open: bool) -> None:
        async with self._changed:
            (self.open.add if is_open else self.open.discard)(writer)
            self._changed.notify_all()

    async def all_closed(self) -> None:
        async with asyncio.timeout(2), self._changed:
            await self._changed.wait_for(lambda: not self.open)


@asynccontextmanager
async def fake_broker(handler: Handler) -> Any:
    """A broker on 127.0.0.1; yields its port and its connections."""
    connections = Connections()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await connections.changed(writer, is_open=True)
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                header, api, body = decode_request(await reader.readexactly(size), SUPPORTED)
                answer = handler(header.api_key, body)
                if answer is None:
                    continue
                for chunk in encode_response(header, api, answer):
                    assert isinstance(chunk, bytes)
                    writer.write(chunk)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            await connections.changed(writer, is_open=False)
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], connections
    finally:
        server.close()


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_round_skips_a_loading_a_frozen_and_a_dead_broker_and_ends_on_time() -> None:
    ports: dict[int, int] = {}

    def coordinator(api_key: int, request: Any) -> Any:
        if api_key == 16:
            return listed("acme.a", "acme.moved")
        if api_key == 9:
            assert [g.group_id for g in request.groups] == ["acme.a", "acme.moved"]
            return fetched(
                {
                    "acme.a": {("acme.t", 0): (5, E.none), ("acme.t", 1): (3, E.none)},
                    "acme.moved": E.not_coordinator,
                }
            )
        if api_key == 3:
            return metadata({"acme.t": {0: 1, 1: 2}}, ports)
        assert api_key == 2
        assert request.isolation_level == 0
        assert [p.timestamp for t in request.topics for p in t.partitions] == [-1]
        return latest({("acme.t", 0): (12, E.none)})

    def loading(api_key: int, request: Any) -> Any:
        if api_key == 16:
            return listed("acme.b", error=E.coordinator_load_in_progress)
        assert api_key == 2
        return latest({("acme.t", 1): (-1, E.not_leader_or_follower)})

    def frozen(api_key: int, request: Any) -> Any:
        return None

    async with (
        fake_broker(coordinator) as (port1, open1),
        fake_broker(loading) as (port2, _),
        fake_broker(frozen) as (port3, open3),
    ):
        ports.update({1: port1, 2: port2, 3: port3})
        brokers = {n: BrokerAddress(n, "127.0.0.1", p) for n, p in ports.items()}
        brokers[4] = BrokerAddress(4, "127.0.0.1", unused_port())
        reader = LagReader(timeout_s=0.3)
        started = time.monotonic()
        async with asyncio.timeout(5):
            measured = await reader.read(brokers)
        assert time.monotonic() - started < 2
        assert measured is not None
        committed, ends = measured
        assert committed == {"acme.a": {("acme.t", 0): 5, ("acme.t", 1): 3}}
        assert ends == {("acme.t", 0): 12}
        snapshot = summarize(committed, ends, ["acme"], max_groups=10)
        assert snapshot.lags == (GroupLag("acme", "a", "t", 7),)
        # The frozen broker's connection was closed when its call ran out of time.
        await open3.all_closed()
        assert open1.open
        reader.close()
        await open1.all_closed()


async def test_a_round_where_no_broker_lists_its_groups_measures_nothing() -> None:
    def loading(api_key: int, request: Any) -> Any:
        return listed(error=E.coordinator_load_in_progress)

    async with fake_broker(loading) as (port, _):
        reader = LagReader(timeout_s=0.3)
        brokers = {
            1: BrokerAddress(1, "127.0.0.1", port),
            2: BrokerAddress(2, "127.0.0.1", unused_port()),
        }
        assert await reader.read(brokers) is None
        assert await reader.read({}) is None
        reader.close()
