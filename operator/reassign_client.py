"""AlterPartitionReassignments and ListPartitionReassignments from the operator (KIP-455).

librdkafka does not send these APIs, so the operator speaks them itself:
kio's schemas through :mod:`shoal.wire`, over the gateway's one-request
broker connection (:class:`shoal.gateway.upstream.BrokerConnection`), to the
brokers' internal listener. Any broker answers: one that is not the
controller forwards the request there. Names are broker-side
(``acme.orders``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from shoal.gateway.upstream import BrokerConnection, UpstreamError

from shoal.wire import ErrorCode, schema

ALTER_PARTITION_REASSIGNMENTS: Final = 45
LIST_PARTITION_REASSIGNMENTS: Final = 46
CLIENT_ID: Final = "shoal-operator"
_NOT_CONTROLLER_RETRIES: Final = 5
_RETRY_S: Final = 1.0

PartitionKey = tuple[str, int]


class ReassignmentRequestError(Exception):
    """The brokers refused a reassignment request or could not be reached."""


@dataclass(frozen=True, slots=True)
class OngoingReassignment:
    """A partition being moved: every replica it has now, and which come and go."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]

    @property
    def target(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing)


def _addresses(bootstrap: str) -> list[tuple[str, int]]:
    found = []
    for entry in bootstrap.split(","):
        host, _, port = entry.strip().rpartition(":")
        found.append((host, int(port)))
    return found


async def _call(bootstrap: str, api_key: int, body: Any, timeout_s: float) -> Any:
    """The first answer from a broker of ``bootstrap``, trying each in turn."""
    api = schema(api_key, 0)
    failures = []
    for host, port in _addresses(bootstrap):
        try:
            connection = await BrokerConnection.open(host, port, timeout_s)
        except UpstreamError as exc:
            failures.append(str(exc))
            continue
        try:
            return await connection.call(api, body, timeout_s, CLIENT_ID)
        except UpstreamError as exc:
            failures.append(str(exc))
        finally:
            connection.close()
    raise ReassignmentRequestError(f"no broker of {bootstrap} answered: {'; '.join(failures)}")


async def alter_reassignments(
    bootstrap: str, moves: Mapping[PartitionKey, Sequence[int] | None], timeout_s: float = 15.0
) -> None:
    """Start (a replica list) or cancel (None) the reassignment of each partition.

    Raises ReassignmentRequestError naming every partition the cluster refused, with
    Kafka's error; partitions not named in it were accepted.
    """
    if not moves:
        return
    api = schema(ALTER_PARTITION_REASSIGNMENTS, 0)
    topics: dict[str, list[Any]] = {}
    for (topic, index), replicas in sorted(moves.items()):
        topics.setdefault(topic, []).append(
            api.make_request(
                "ReassignablePartition",
                partition_index=index,
                replicas=None if replicas is None else tuple(replicas),
            )
        )
    body = api.request(
        topics=tuple(
            api.make_request("ReassignableTopic", name=name, partitions=tuple(parts))
            for name, parts in topics.items()
        )
    )
    for _ in range(_NOT_CONTROLLER_RETRIES):
        response = await _call(bootstrap, ALTER_PARTITION_REASSIGNMENTS, body, timeout_s)
        if response.error_code is not ErrorCode.not_controller:
            break
        # A controller election is under way; the next one answers.
        await asyncio.sleep(_RETRY_S)
    if response.error_code is not ErrorCode.none:
        raise ReassignmentRequestError(
            f"reassignment refused: {response.error_code.name} {response.error_message or ''}"
        )
    refused = [
        f"{topic.name}-{p.partition_index}: {p.error_code.name} {p.error_message or ''}".strip()
        for topic in response.responses
        for p in topic.partitions
        if p.error_code is not ErrorCode.none
    ]
    if refused:
        raise ReassignmentRequestError("reassignment refused for " + "; ".join(refused))


async def list_reassignments(
    bootstrap: str, timeout_s: float = 15.0
) -> dict[PartitionKey, OngoingReassignment]:
    """Every partition whose reassignment is under way."""
    api = schema(LIST_PARTITION_REASSIGNMENTS, 0)
    response = await _call(
        bootstrap, LIST_PARTITION_REASSIGNMENTS, api.request(topics=None), timeout_s
    )
    if response.error_code is not ErrorCode.none:
        raise ReassignmentRequestError(
            f"listing reassignments failed: {response.error_code.name}"
            f" {response.error_message or ''}"
        )
    return {
        (topic.name, p.partition_index): OngoingReassignment(
            tuple(p.replicas), tuple(p.adding_replicas), tuple(p.removing_replicas)
        )
        for topic in response.topics
        for p in topic.partitions
    }
