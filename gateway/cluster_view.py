"""What the gateway knows of the brokers: their addresses, APIs and topic ids.

Learned from the brokers themselves (Metadata, ApiVersions) over one control
connection, and which brokers are alive also over a connection kept to each
(:meth:`ClusterView.refresh_brokers`), so the gateway needs nothing of the
brokers' etcd layout. Topic
ids seen in any Metadata answer are remembered; an id the gateway has never
seen makes it ask the brokers once (at most every ``_ID_REFRESH_S``), so a
guessed id costs a guesser little and the brokers less.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from shoal.gateway.upstream import BrokerConnection, UpstreamError

from shoal.wire import ErrorCode, schema

log = logging.getLogger(__name__)

METADATA_VERSION: Final = 12
API_VERSIONS_VERSION: Final = 3
CREATE_TOPICS_VERSION: Final = 7
_ID_REFRESH_S: Final = 1.0
PROBE_TIMEOUT_S: Final = 1.0
"""How long the frequent question for the live brokers may take, connecting included; a
broker slower than that (frozen, cut off, very busy) is passed over for
:data:`SKIP_S`, and the control connection leaves it for another broker."""
SKIP_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int


class ClusterView:
    def __init__(self, bootstrap: list[tuple[str, int]]) -> None:
        self._bootstrap = bootstrap
        self._control: BrokerConnection | None = None
        self._control_lock = asyncio.Lock()
        self.brokers: dict[int, BrokerAddress] = {}
        self.partition_counts: dict[str, int] = {}
        self._topic_ids: dict[uuid.UUID, str] = {}
        self._last_id_refresh = 0.0
        self._unanswering: tuple[str, int] | None = None
        self._probes: dict[tuple[str, int], BrokerConnection] = {}
        """A connection to each broker for :meth:`refresh_brokers`, which asks them in turn."""
        self._probe_turn = 0
        self._skipped: dict[tuple[str, int], float] = {}
        """Brokers that did not answer the liveness question, and until when they are
        passed over."""
        self.answering: tuple[str, int] | None = None
        """The broker the control connection is on (None: none yet)."""
        self.brokers_changed = asyncio.Event()
        """Set when an answer names a broker the gateway has no port for yet."""

    async def _connection(self) -> BrokerConnection:
        if self._control is not None and not self._control.closed:
            return self._control
        candidates = [(b.host, b.port) for b in self.brokers.values()] + self._bootstrap
        if self._unanswering in candidates:
            candidates.remove(self._unanswering)
            candidates.append(self._unanswering)
        # Brokers that just failed the liveness question go last too (a frozen broker
        # accepts the connection, and the question would wait out its timeout there).
        now = time.monotonic()
        candidates.sort(key=lambda address: self._skipped.get(address, 0.0) > now)
        self.answering = None
        errors = []
        for host, port in candidates:
            try:
                self._control = await BrokerConnection.open(host, port)
                self.answering = (host, port)
                return self._control
            except UpstreamError as exc:
                errors.append(str(exc))
        raise UpstreamError("no broker is reachable: " + "; ".join(errors))

    async def call(self, api_key: int, version: int, timeout_s: float = 10.0, **fields: Any) -> Any:
        api = schema(api_key, version)
        async with self._control_lock:
            connection = await self._connection()
            try:
                return await connection.call(api, api.request(**fields), timeout_s)
            except UpstreamError:
                connection.close()
                # Tried last next time: a frozen broker (SIGSTOP, a stalled disk) still
                # accepts connections, and would be asked again and again.
                host, _, port = connection.address.rpartition(":")
                self._unanswering = (host, int(port))
                raise

    async def refresh(self) -> int | None:
        """Brokers, topic ids and partition counts from one all-topics Metadata; returns
        the node id of the broker that answered (None: not known), as
        :meth:`refresh_brokers` does."""
        response = await self.call(
            3,
            METADATA_VERSION,
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        self._set_brokers(response.brokers)
        self.partition_counts = {
            t.name: len(t.partitions) for t in response.topics if t.error_code == ErrorCode.none
        }
        self.remember_topic_ids({t.topic_id: t.name for t in response.topics if t.topic_id})
        return self._node_at(self.answering)

    async def refresh_brokers(self) -> int | None:
        """The live brokers alone (Metadata for no topic): cheap enough to ask several times
        a second. Returns the node id of the broker that answered (None: not known).

        A broker whose etcd session expired (dead, frozen, cut off) is no longer among them,
        as the other brokers see it. Not always as it sees itself: a broker cut off from
        etcd but not from the gateway keeps its last view, in which it is alive and leads
        what it led. So each question goes to the next known broker in turn, over a
        connection kept for it, and the answer says who gave it (see the gateway's
        ``_close_sessions_of_gone_brokers``)."""
        known = sorted(self.brokers.values(), key=lambda b: b.node_id)
        if not known:
            await self.refresh()
            return None
        now = time.monotonic()
        askable = [b for b in known if self._skipped.get((b.host, b.port), 0.0) <= now]
        broker = (askable or known)[self._probe_turn % len(askable or known)]
        self._probe_turn += 1
        api = schema(3, METADATA_VERSION)
        request = api.request(
            topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
        address = (broker.host, broker.port)
        connection = self._probes.get(address)
        try:
            if connection is None or connection.closed:
                connection = self._probes[address] = await BrokerConnection.open(
                    *address, timeout_s=PROBE_TIMEOUT_S
                )
            response = await connection.call(api, request, PROBE_TIMEOUT_S)
        except UpstreamError:
            if connection is not None:
                connection.close()
            # Not asked again for a while; and if the control connection is on it, that
            # moves on too, or its next question would wait out its 10 s on a frozen broker.
            self._skipped[address] = time.monotonic() + SKIP_S
            control = self._control
            if control is not None and control.address == f"{broker.host}:{broker.port}":
                control.close()
                self._unanswering = address
            raise
        self._skipped.pop(address, None)
        self._set_brokers(response.brokers)
        return broker.node_id

    def _node_at(self, address: tuple[str, int] | None) -> int | None:
        for broker in self.brokers.values():
            if (broker.host, broker.port) == address:
                return broker.node_id
        return None

    def _set_brokers(self, brokers: Any) -> None:
        self.brokers = {b.node_id: BrokerAddress(b.node_id, b.host, b.port) for b in brokers}
        live = {(b.host, b.port) for b in self.brokers.values()}
        for address in [a for a in self._probes if a not in live]:
            self._probes.pop(address).close()

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        response = await self.call(
            18,
            API_VERSIONS_VERSION,
            client_software_name="shoal-gateway",
            client_software_version="1",
        )
        return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}

    def notice_broker(self, node_id: int) -> None:
        if node_id not in self.brokers:
            self.brokers_changed.set()

    def remember_topic_ids(self, ids: Mapping[uuid.UUID, str]) -> None:
        self._topic_ids.update(ids)

    async def topic_name(self, topic_id: uuid.UUID) -> str | None:
        known = self._topic_ids.get(topic_id)
        if known is not None:
            return known
        now = time.monotonic()
        if now - self._last_id_refresh >= _ID_REFRESH_S:
            self._last_id_refresh = now
            await self.refresh()
        return self._topic_ids.get(topic_id)

    async def topic_partitions(self) -> Mapping[str, int]:
        await self.refresh()
        return self.partition_counts

    async def default_partitions(self, broker_names: list[str]) -> Mapping[str, int]:
        """How many partitions the brokers would give these topics with no count."""
        api = schema(19, CREATE_TOPICS_VERSION)
        response = await self.call(
            19,
            CREATE_TOPICS_VERSION,
            topics=tuple(
                api.make_request(
                    "CreatableTopic",
                    name=name,
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments=(),
                    configs=(),
                )
                for name in broker_names
            ),
            timeout=timedelta(seconds=10),
            validate_only=True,
        )
        return {t.name: max(t.num_partitions, 0) for t in response.topics}

    def bootstrap_candidates(self) -> list[BrokerAddress]:
        """Every known broker in random order, to spread bootstrap connections.

        A broker that just died stays known until the brokers' Metadata drops
        it (its lease expires), so a bootstrap connection takes the first one
        that answers rather than only one.
        """
        candidates = list(self.brokers.values())
        random.shuffle(candidates)
        return candidates

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
        for probe in self._probes.values():
            probe.close()
        self._probes.clear()
