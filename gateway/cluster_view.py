"""What the gateway knows of the brokers: their addresses, APIs and topic ids.

Learned from the brokers themselves over one control connection (Metadata,
ApiVersions), so the gateway needs nothing of the brokers' etcd layout. Topic
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
"""How long the frequent question for the live brokers may take; a broker slower than
that (frozen, or very busy) is asked last next time, and the question goes elsewhere."""


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
        self.brokers_changed = asyncio.Event()
        """Set when an answer names a broker the gateway has no port for yet."""

    async def _connection(self) -> BrokerConnection:
        if self._control is not None and not self._control.closed:
            return self._control
        candidates = [(b.host, b.port) for b in self.brokers.values()] + self._bootstrap
        if self._unanswering in candidates:
            candidates.remove(self._unanswering)
            candidates.append(self._unanswering)
        errors = []
        for host, port in candidates:
            try:
                self._control = await BrokerConnection.open(host, port)
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

    async def refresh(self) -> None:
        """Brokers, topic ids and partition counts from one all-topics Metadata."""
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

    async def refresh_brokers(self) -> None:
        """The live brokers alone (Metadata for no topic): cheap enough to ask several times
        a second.
        A broker whose etcd session expired (dead, frozen, cut off) is no longer among them."""
        response = await self.call(
            3,
            METADATA_VERSION,
            PROBE_TIMEOUT_S,
            topics=(),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        self._set_brokers(response.brokers)

    def _set_brokers(self, brokers: Any) -> None:
        self.brokers = {b.node_id: BrokerAddress(b.node_id, b.host, b.port) for b in brokers}

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
