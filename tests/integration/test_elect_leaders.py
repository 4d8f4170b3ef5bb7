"""ElectLeaders (43) through the gateway: the platform admin's, refused to tenants.

Three brokers with the automatic preferred-leader rebalance off, so only an
admin's election brings leadership back. A partition prefers broker 0;
broker 0 restarts, leadership moves to broker 1 and stays there after 0 is
back in the ISR; the platform admin's preferred election (confluent-kafka's
``elect_leaders`` and Kafka's ``kafka-leader-election.sh``) moves it back,
and asking again is ELECTION_NOT_NEEDED, as Kafka answers it. A tenant's
key, whatever its ACLs, gets CLUSTER_AUTHORIZATION_FAILED, as Kafka answers a
principal without ALTER on the cluster. The platform admin names partitions
in the brokers' names (an election is a cluster operation).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import GatewayCluster, module_gateway_cluster
from gateway_env import TenantKey
from harness import EtcdServer, wait_until
from shoal.benchmarks.apache_kafka import ApacheKafka
from test_java_clients import Java, failed, flags, kafka_home  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TIMEOUT_S = 30
CLUSTER_AUTHORIZATION_FAILED = 31
ELECTION_NOT_NEEDED = 84
UNKNOWN_TOPIC_OR_PARTITION = 3
ELECTIONS = "org.apache.kafka.tools.LeaderElectionCommand"
BROKER_ENV = {
    "SHOAL_AUTO_LEADER_REBALANCE_ENABLE": "false",
    "SHOAL_BROKER_SESSION_TIMEOUT_MS": "3000",
    "SHOAL_REPLICA_LAG_TIME_MAX_MS": "4000",
}


@pytest.fixture(scope="module")
def cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "elections", BROKER_ENV)


@pytest.fixture(scope="module")
def platform(cluster: GatewayCluster) -> TenantKey:
    key: TenantKey = cluster.tenant(f"platform-{uuid.uuid4().hex[:6]}", platform_admin=True)
    return key


@pytest.fixture(scope="module")
def tools(
    kafka_home: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ApacheKafka]:
    yield ApacheKafka(tmp_path_factory.mktemp("election-tools"), kafka_home)


def direct(cluster: GatewayCluster) -> AdminClient:
    live = [b.bootstrap for b in cluster.brokers if b.running]
    return AdminClient({"bootstrap.servers": ",".join(live)})


def partition(cluster: GatewayCluster, topic: str) -> tuple[int, tuple[int, ...]]:
    """Partition 0's leader and ISR, as the brokers report them."""
    metadata = direct(cluster).list_topics(topic, timeout=10)
    view = metadata.topics[topic].partitions[0]
    return view.leader, tuple(sorted(view.isrs))


def preferring(cluster: GatewayCluster, replicas: list[int]) -> str:
    """A topic (brokers' name) whose partition 0 has ``replicas``, all in sync."""
    topic = f"elect-{uuid.uuid4().hex[:8]}"
    admin = direct(cluster)
    new = NewTopic(topic, 1, replica_assignment=[replicas])
    admin.create_topics([new])[topic].result(TIMEOUT_S)
    wait_until(
        lambda: partition(cluster, topic) == (replicas[0], tuple(sorted(replicas))),
        TIMEOUT_S,
        f"{topic} led by {replicas[0]} with every replica in sync",
    )
    return topic


def elect(key: TenantKey, kind: ElectionType, topic: str) -> dict[Any, Any]:
    admin = AdminClient(key.librdkafka())
    result: dict[Any, Any] = admin.elect_leaders(kind, [TopicPartition(topic, 0)]).result(TIMEOUT_S)
    return result


def code(error: Any) -> int:
    """A partition's error from confluent-kafka's ElectLeaders result (0: none)."""
    if error is None:
        return 0
    inner = error.args[0] if isinstance(error, KafkaException) else error
    return int(inner.code())


def test_preferred_election_moves_leadership_back_after_a_restart(
    cluster: GatewayCluster, platform: TenantKey
) -> None:
    topic = preferring(cluster, [0, 1, 2])
    broker = cluster.brokers[0]

    broker.stop()
    wait_until(lambda: partition(cluster, topic)[0] == 1, TIMEOUT_S, "broker 1 to lead")
    broker.start()
    wait_until(
        lambda: partition(cluster, topic) == (1, (0, 1, 2)),
        60,
        "broker 0 back in the ISR, broker 1 still leading",
    )

    [(tp, error)] = elect(platform, ElectionType.PREFERRED, topic).items()
    assert (tp.topic, tp.partition, code(error)) == (topic, 0, 0)
    assert partition(cluster, topic)[0] == 0

    [(_, again)] = elect(platform, ElectionType.PREFERRED, topic).items()
    assert code(again) == ELECTION_NOT_NEEDED
    [(_, unclean)] = elect(platform, ElectionType.UNCLEAN, topic).items()
    assert code(unclean) == ELECTION_NOT_NEEDED, "a partition with a leader needs none"


def test_election_of_an_unknown_partition_is_unknown_topic_or_partition(
    platform: TenantKey,
) -> None:
    [(_, error)] = elect(platform, ElectionType.PREFERRED, "no-such-topic").items()

    assert code(error) == UNKNOWN_TOPIC_OR_PARTITION


def test_a_tenant_may_not_elect_leaders(cluster: GatewayCluster) -> None:
    key = cluster.tenant(f"t-{uuid.uuid4().hex[:6]}")
    admin = AdminClient(key.librdkafka())

    future = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("orders", 0)])

    with pytest.raises(KafkaException) as raised:
        future.result(TIMEOUT_S)
    assert raised.value.args[0].code() == CLUSTER_AUTHORIZATION_FAILED


def leader_election(java: Java, *args: str) -> str:
    """kafka-leader-election.sh with the key's client config; what it printed."""
    return failed(java.run(ELECTIONS, *java.admin(), *args))


def test_kafka_leader_election_with_the_platform_admins_key_and_a_tenants(
    cluster: GatewayCluster, platform: TenantKey, tools: ApacheKafka, tmp_path: Path
) -> None:
    topic = preferring(cluster, [2, 0, 1])
    election = flags(f"--election-type PREFERRED --topic {topic} --partition 0")

    printed = leader_election(Java(tools, platform, tmp_path), *election)

    assert f"Valid replica already elected for partitions {topic}-0" in printed, printed

    (tmp_path / "tenant").mkdir()
    tenant = Java(tools, cluster.tenant(f"t-{uuid.uuid4().hex[:6]}"), tmp_path / "tenant")
    refused = leader_election(tenant, *election)
    # The tool's words for CLUSTER_AUTHORIZATION_FAILED.
    assert "Not authorized to perform leader election" in refused, refused
