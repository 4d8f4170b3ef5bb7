"""The cluster id the Apache Kafka reference formats its storage with."""

import base64
import uuid

import pytest
from shoal.benchmarks import apache_kafka


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 encodes to "-" as the first URL-safe base64 character; kafka-storage
    # would take such an id for an option and refuse to format.
    dashed = uuid.UUID(bytes=bytes([0xF8]) + bytes(15))
    plain = uuid.UUID(bytes=bytes([0x10]) + bytes(15))
    drawn = iter([dashed, dashed, plain])
    monkeypatch.setattr(apache_kafka.uuid, "uuid4", lambda: next(drawn))

    cluster_id = apache_kafka.new_cluster_id()

    assert cluster_id == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")
    assert not cluster_id.startswith("-")
