"""What the admin commands (``shoal topic``, ``shoal group``) share.

One way to make an AdminClient, to wait for its answers and to fail: a
Kafka error or a cluster that does not answer in time ends the command
with one ``error:`` line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Final

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, OffsetSpec

from shoal.cli.client import client_config, fail

TIMEOUT_S: Final = 30


def admin_client(
    bootstrap: str | None, config_file: Path | None, properties: list[str] | None
) -> AdminClient:
    return AdminClient(client_config(bootstrap, config_file, properties))


def wait(future: Future[Any]) -> Any:
    """The future's result, or a clean exit on a Kafka error or after TIMEOUT_S."""
    try:
        return future.result(timeout=TIMEOUT_S)
    except KafkaException as exc:
        raise fail(exc) from exc
    except FutureTimeout as exc:
        raise fail(RuntimeError(f"no answer from the cluster within {TIMEOUT_S} s")) from exc


def cluster_metadata(admin: AdminClient, topic: str | None = None) -> ClusterMetadata:
    try:
        return admin.list_topics(topic=topic, timeout=TIMEOUT_S)
    except KafkaException as exc:
        raise fail(exc) from exc


def list_offsets(
    admin: AdminClient, partitions: Iterable[tuple[str, int]], spec: OffsetSpec
) -> dict[tuple[str, int], int]:
    """ListOffsets for each (topic, partition) with one spec: earliest, latest or a time."""
    futures = admin.list_offsets({TopicPartition(t, p): spec for t, p in partitions})
    return {(tp.topic, tp.partition): wait(f).offset for tp, f in futures.items()}
