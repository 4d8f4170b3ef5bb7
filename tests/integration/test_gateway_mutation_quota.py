"""A tenant's controller mutation quota (KIP-599 ``controller_mutation_rate``) through the gateway.

Each tenant has a token bucket of partitions: ``rate`` a second, bursting 11
seconds' worth. At CreateTopics v6+, CreatePartitions v3+ and DeleteTopics v5+
a topic that finds the bucket below zero is refused with
THROTTLING_QUOTA_EXCEEDED (89) and the answer's ``throttle_time_ms`` says
when to come back; older versions are let through and throttled (the answer
carries the throttle and the connection is muted that long). Other tenants are
not affected, validate_only requests are charged (as by Kafka 4.3), and each refused topic
is counted in ``shoal_gateway_limit_refusals_total{limit="controller_mutations"}``.
"""

from __future__ import annotations

import datetime
import sys
import time
import uuid
from typing import Any

import httpx
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import GatewayCluster
from gateway_env import TenantKey, limit_refusals
from raw_kafka import RawConnection, request_class
from shoal.tenancy.model import Quotas

THROTTLING_QUOTA_EXCEEDED = 89
TIMEOUT = datetime.timedelta(seconds=30)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topics(
    connection: RawConnection,
    partitions: dict[str, int],
    version: int = 7,
    validate_only: bool = False,
) -> Any:
    create = request_class(19, version)
    module = sys.modules[create.__module__]
    return connection.call(
        create(
            topics=tuple(
                module.CreatableTopic(
                    name=name,
                    num_partitions=count,
                    replication_factor=1,
                    assignments=(),
                    configs=(),
                )
                for name, count in partitions.items()
            ),
            timeout=TIMEOUT,
            validate_only=validate_only,
        )
    )


def create_partitions(connection: RawConnection, name: str, count: int, version: int = 3) -> Any:
    request = request_class(37, version)
    topic = request_class(37, version, "CreatePartitionsTopic")
    return connection.call(
        request(
            topics=(topic(name=name, count=count, assignments=None),),
            timeout=TIMEOUT,
            validate_only=False,
        )
    )


def delete_topics(connection: RawConnection, names: list[str], version: int = 6) -> Any:
    request = request_class(20, version)
    if version >= 6:
        state = request_class(20, version, "DeleteTopicState")
        body = request(topics=tuple(state(name=n, topic_id=None) for n in names), timeout=TIMEOUT)
    else:
        body = request(topic_names=tuple(names), timeout=TIMEOUT)
    return connection.call(body)


def codes(results: Any) -> dict[str, int]:
    return {r.name: int(r.error_code) for r in results}


def throttle_ms(response: Any) -> float:
    return float(response.throttle_time.total_seconds() * 1000)


def refusals(key: TenantKey) -> float:
    return limit_refusals(key, "controller_mutations")


def test_a_creation_storm_is_refused_past_the_burst_and_others_are_unaffected(
    gateway_cluster: GatewayCluster,
) -> None:
    # 2 partitions a second: a burst of 22. Five topics of 5 take the bucket from
    # 22 to -3 (the fifth finds 2 left and may overdraw); the sixth is refused.
    stormy = gateway_cluster.tenant(unique("stormy"), quotas=Quotas(controller_mutation_rate=2))
    calm = gateway_cluster.tenant(unique("calm"))
    neighbour = gateway_cluster.tenant(
        unique("neighbour"), quotas=Quotas(controller_mutation_rate=2)
    )
    names = {f"storm-{i}": 5 for i in range(6)}
    with stormy.raw() as connection, stormy.raw() as second:
        response = create_topics(connection, names)

        results = {r.name: r for r in response.topics}
        assert codes(response.topics) == {
            **dict.fromkeys(list(names)[:5], 0),
            "storm-5": THROTTLING_QUOTA_EXCEEDED,
        }
        message = results["storm-5"].error_message
        assert message is not None and "controller_mutation_rate" in message
        waited = throttle_ms(response)
        assert 1000 < waited <= 1600, "3 partitions owed at 2 a second"
        assert refusals(stormy) == 1

        # The budget is the tenant's, not the connection's.
        again = create_topics(second, {"storm-5": 5})
        assert codes(again.topics) == {"storm-5": THROTTLING_QUOTA_EXCEEDED}
        assert throttle_ms(again) > 0

        # Others have buckets of their own, or none.
        with calm.raw() as other:
            free = create_topics(other, {f"calm-{i}": 10 for i in range(4)})
            assert set(codes(free.topics).values()) == {0}
            assert throttle_ms(free) == 0
        with neighbour.raw() as other:
            own = create_topics(other, {"n-0": 10, "n-1": 10})
            assert set(codes(own.topics).values()) == {0}

        # After the throttle, the tenant may create again.
        time.sleep(throttle_ms(again) / 1000 + 0.1)
        later = create_topics(second, {"storm-5": 1})
        assert codes(later.topics) == {"storm-5": 0}
        assert throttle_ms(later) == 0


def test_a_validate_only_request_is_charged_as_kafka_charges_it(
    gateway_cluster: GatewayCluster,
) -> None:
    # 2 partitions a second: a burst of 22, overdrawn by a dry run of 30.
    tenant = gateway_cluster.tenant(unique("dry"), quotas=Quotas(controller_mutation_rate=2))
    with tenant.raw() as connection:
        dry = create_topics(connection, {"huge": 30}, validate_only=True)
        assert codes(dry.topics) == {"huge": 0}
        assert throttle_ms(dry) == 0, "an accepted overdraw is not throttled (strict)"
        real = create_topics(connection, {"real": 1})
        assert codes(real.topics) == {"real": THROTTLING_QUOTA_EXCEEDED}
        assert throttle_ms(real) > 0


def test_create_partitions_and_delete_topics_count(
    gateway_cluster: GatewayCluster,
) -> None:
    # 4 partitions a second: a burst of 44.
    tenant = gateway_cluster.tenant(unique("grower"), quotas=Quotas(controller_mutation_rate=4))
    with tenant.raw() as connection, tenant.raw() as other:
        # 40 + 2 partitions fit in the burst.
        made = create_topics(connection, {"g": 40, "d": 2})
        assert codes(made.topics) == {"g": 0, "d": 0}

        # A few left: adding 20 partitions overdraws to about -15; the next are refused.
        grown = create_partitions(connection, "g", 60)
        assert codes(grown.results) == {"g": 0}
        assert throttle_ms(grown) == 0, "an accepted overdraw is not throttled (strict)"
        refused = create_partitions(connection, "g", 61)
        assert codes(refused.results) == {"g": THROTTLING_QUOTA_EXCEEDED}
        assert "controller_mutation_rate" in refused.results[0].error_message
        assert throttle_ms(refused) > 0
        # That connection is now muted until the throttle has passed; another is not,
        # but the tenant's budget is the same.
        deleted = delete_topics(other, ["d"])
        assert codes(deleted.responses) == {"d": THROTTLING_QUOTA_EXCEEDED}
        assert throttle_ms(deleted) > 0

        # Deleting g costs its 60 partitions: accepted (the bucket is not below zero),
        # and then deleting d is refused until those are paid for.
        both = delete_topics(connection, ["g", "d"])
        assert codes(both.responses) == {"g": 0, "d": THROTTLING_QUOTA_EXCEEDED}
        assert throttle_ms(both) > 10_000, "60 partitions owed at 4 a second"
    assert refusals(tenant) == 3


def test_older_api_versions_are_accepted_and_the_connection_is_throttled(
    gateway_cluster: GatewayCluster,
) -> None:
    tenant = gateway_cluster.tenant(unique("legacy"), quotas=Quotas(controller_mutation_rate=2))
    with tenant.raw() as connection:
        # CreateTopics v5 knows no THROTTLING_QUOTA_EXCEEDED: 30 partitions are
        # created and the answer says 8 are owed (4 s at 2 a second).
        response = create_topics(connection, {"old-0": 15, "old-1": 15}, version=5)
        assert codes(response.topics) == {"old-0": 0, "old-1": 0}
        owed = throttle_ms(response)
        assert 3500 < owed <= 4000

        # The gateway does not read the connection again until the throttle has passed.
        started = time.monotonic()
        deleted = delete_topics(connection, ["old-0"], version=4)
        assert time.monotonic() - started > owed / 1000 - 0.5
        assert codes(deleted.responses) == {"old-0": 0}
        assert throttle_ms(deleted) > 0, "DeleteTopics v4 is throttled, not refused"
    assert refusals(tenant) == 0


def test_librdkafka_admin_client_is_throttled_not_refused(gateway_cluster: GatewayCluster) -> None:
    """librdkafka (2.x) sends CreateTopics v4, before THROTTLING_QUOTA_EXCEEDED: its
    topics are created, the answer carries the throttle, and the next request waits."""
    tenant = gateway_cluster.tenant(unique("rdkafka"), quotas=Quotas(controller_mutation_rate=2))
    throttles: list[int] = []
    admin = AdminClient(
        tenant.librdkafka(throttle_cb=lambda event: throttles.append(event.throttle_time))
    )
    # 24 partitions against a burst of 22: 2 owed, a second at 2 a second.
    first = admin.create_topics([NewTopic(f"rd-{i}", 6, 1) for i in range(4)])
    for future in first.values():
        future.result(30)
    started = time.monotonic()
    second = admin.create_topics([NewTopic("rd-late", 1, 1)])
    second["rd-late"].result(30)
    assert time.monotonic() - started > 0.5, "the connection was muted"
    admin.poll(1)
    assert throttles and max(throttles) >= 0.5, "ThrottleEvent.throttle_time is in seconds"


def test_the_http_door_draws_on_the_same_budget(gateway_cluster: GatewayCluster) -> None:
    tenant = gateway_cluster.tenant(unique("http"), quotas=Quotas(controller_mutation_rate=2))
    with httpx.Client(
        base_url=gateway_cluster.gateway.http_url, auth=(tenant.key_id, tenant.secret), timeout=60
    ) as http:
        cluster_id = http.get("/v3/clusters").json()["data"][0]["cluster_id"]
        topics = f"/v3/clusters/{cluster_id}/topics"
        # 24 partitions against a burst of 22: accepted, overdrawn.
        created = http.post(topics, json={"topic_name": "first", "partitions_count": 24})
        assert created.status_code == 201, created.text
        with tenant.raw() as connection:
            refused = create_topics(connection, {"kafka-side": 1})
            assert codes(refused.topics) == {"kafka-side": THROTTLING_QUOTA_EXCEEDED}
        again = http.post(topics, json={"topic_name": "second", "partitions_count": 1})
        assert again.status_code == 429, again.text
        assert "controller_mutation_rate" in again.json()["message"]
