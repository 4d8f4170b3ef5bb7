"""The controller mutation quota answers as Apache Kafka 4.3.1 answers (KIP-599).

The same scenario runs against Kafka (a ``controller_mutation_rate`` of 2 set
for its user with kafka-configs) and against a Shoal tenant with that quota,
over raw connections, and what a client sees is compared: which topics are
refused with THROTTLING_QUOTA_EXCEEDED, whether ``throttle_time_ms`` is set
and about how long, whether the connection is muted, and that old API
versions are throttled rather than refused.

validate_only CreateTopics are charged as if they created their partitions,
by Kafka 4.3.1 (KRaft) and so by Shoal.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import GatewayCluster
from raw_kafka import RawConnection
from shoal.benchmarks.apache_kafka import SHORT_RUN_JVM_OPTS, ApacheKafka, default_kafka_home
from shoal.tenancy.model import Quotas
from test_gateway_mutation_quota import (
    THROTTLING_QUOTA_EXCEEDED,
    codes,
    create_partitions,
    create_topics,
    delete_topics,
    throttle_ms,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
RATE = 2
Connect = Callable[[], RawConnection]


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=840)
    cluster = ApacheKafka(
        tmp_path_factory.mktemp("apache-kafka-mutations"), home, jvm_opts=SHORT_RUN_JVM_OPTS
    )
    with cluster:
        yield cluster


def kafka_user_quota(kafka: ApacheKafka, rate: float) -> Connect:
    """Set the quota of Kafka's PLAINTEXT user (ANONYMOUS); connections to a broker."""
    done = subprocess.run(
        kafka.java_command(
            "kafka.admin.ConfigCommand",
            "--bootstrap-server", kafka.bootstrap,
            "--alter", "--add-config", f"controller_mutation_rate={rate}",
            "--entity-type", "users", "--entity-name", "ANONYMOUS",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    time.sleep(2)  # the brokers and the controller learn it from the metadata log
    broker = kafka.bootstrap.split(",")[0]
    return lambda: RawConnection(broker, timeout=60)


def scenario(connect: Connect) -> dict[str, Any]:
    """What a client observes; throttles as rough classes so the two can be compared."""
    seen: dict[str, Any] = {}
    with connect() as first, connect() as second, connect() as third:
        # A burst of 22: 5 topics of 5 fit (the fifth overdraws), the sixth does not.
        storm = create_topics(first, {f"storm-{i}": 5 for i in range(6)})
        seen["storm"] = codes(storm.topics)
        # 3 partitions owed at 2 a second; less if creating the topics took a while.
        seen["storm_throttle_about_1.5_s"] = 0 < throttle_ms(storm) <= 2000
        other = create_topics(second, {"storm-5": 5})
        seen["other_connection"] = codes(other.topics)
        started = time.monotonic()
        create_topics(first, {"after-mute": 1})
        seen["first_connection_muted"] = time.monotonic() - started > 0.3

        time.sleep(12)  # the bucket is full again
        old = create_topics(third, {"old-0": 15, "old-1": 15}, version=5)
        seen["v5"] = codes(old.topics)
        # 8 owed at 2 a second, less what the creation's own time refilled.
        seen["v5_throttle_about_4_s"] = 2000 < throttle_ms(old) <= 4100
        started = time.monotonic()
        create_topics(third, {"old-2": 1}, version=5)
        seen["v5_connection_muted"] = time.monotonic() - started > 1.5

        time.sleep(12)
        grown = create_partitions(second, "old-0", 40)
        seen["overdraw"] = (codes(grown.results), throttle_ms(grown))
        refused = create_partitions(second, "old-1", 16)
        seen["after_overdraw"] = (codes(refused.results), throttle_ms(refused) > 0)
        deleted = delete_topics(first, ["old-2"])
        seen["delete"] = (codes(deleted.responses), throttle_ms(deleted) > 0)
    return seen


EXPECTED = {
    "storm": {**{f"storm-{i}": 0 for i in range(5)}, "storm-5": THROTTLING_QUOTA_EXCEEDED},
    "storm_throttle_about_1.5_s": True,
    "other_connection": {"storm-5": THROTTLING_QUOTA_EXCEEDED},
    "first_connection_muted": True,
    "v5": {"old-0": 0, "old-1": 0},
    "v5_throttle_about_4_s": True,
    "v5_connection_muted": True,
    "overdraw": ({"old-0": 0}, 0),
    "after_overdraw": ({"old-1": THROTTLING_QUOTA_EXCEEDED}, True),
    "delete": ({"old-2": THROTTLING_QUOTA_EXCEEDED}, True),
}


def test_kafka_and_shoal_answer_a_mutation_storm_alike(
    kafka: ApacheKafka, gateway_cluster: GatewayCluster
) -> None:
    tenant = gateway_cluster.tenant(
        f"ref-{uuid.uuid4().hex[:8]}", quotas=Quotas(controller_mutation_rate=RATE)
    )
    # Side by side: each waits for its buckets to refill, so the two take the time of one.
    with ThreadPoolExecutor(max_workers=2) as pool:
        on_kafka = pool.submit(scenario, kafka_user_quota(kafka, RATE))
        on_shoal = pool.submit(scenario, tenant.raw)
        reference, shoal = on_kafka.result(), on_shoal.result()

    assert reference == EXPECTED
    assert shoal == reference


def test_validate_only_is_charged_as_by_kafka(
    kafka: ApacheKafka, gateway_cluster: GatewayCluster
) -> None:
    def dry_run_then_create(connect: Connect) -> tuple[int, bool]:
        with connect() as connection:
            dry = create_topics(connection, {"dry": 200}, validate_only=True)
            assert codes(dry.topics) == {"dry": 0}
            real = create_topics(connection, {"real": 1})
            return codes(real.topics)["real"], throttle_ms(real) > 0

    # Refill Kafka's bucket after the other test: a large rate for one request, then 2
    # again (the bucket is clamped to the new burst of 22).
    with kafka_user_quota(kafka, 1000)() as connection:
        assert codes(create_topics(connection, {"primer": 1}).topics) == {"primer": 0}
    kafka_connect = kafka_user_quota(kafka, RATE)
    # 200 partitions charged: 178 owed, about 89 s at 2 a second.
    assert dry_run_then_create(kafka_connect) == (THROTTLING_QUOTA_EXCEEDED, True)
    tenant = gateway_cluster.tenant(
        f"dry-{uuid.uuid4().hex[:8]}", quotas=Quotas(controller_mutation_rate=RATE)
    )
    assert dry_run_then_create(tenant.raw) == (THROTTLING_QUOTA_EXCEEDED, True)
