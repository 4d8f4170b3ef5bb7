"""Topic and broker configs through the gateway, with every client a tenant uses.

The legacy AlterConfigs (33), which KafkaJS ``alterConfigs`` and kafka-python
``alter_configs`` send, replaces a topic's overrides: the configs it names are
set and every other override reverts to its default, as Kafka's legacy API
does; ``validate_only`` changes nothing. A tenant needs ALTER_CONFIGS on the
topic and sees error messages in its own names. Broker configs are the
platform's: a tenant's AlterConfigs of a broker gets CLUSTER_AUTHORIZATION_FAILED,
a platform admin's reaches the broker (which has no dynamic configs to set).

DescribeConfigs of a broker (the cluster default ``""`` or any broker id a
tenant sees) shows a tenant, with DESCRIBE_CONFIGS on its cluster, the
documented subset (:data:`~shoal.gateway.apis.broker_configs.TENANT_BROKER_CONFIGS`)
with the values, sources and synonyms the broker reports, and never its
addresses or paths; the platform admin sees everything; broker loggers are
refused.

Clients: confluent-kafka's AdminClient, kafka-python's KafkaAdminClient,
KafkaJS (tests/integration/kafkajs/steps.js, step ``configs``) and Kafka's
``kafka-configs.sh``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from gateway_env import TenantKey
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as KafkaPythonConfigResource
from kafka.admin import ConfigResourceType
from shoal.benchmarks.apache_kafka import ApacheKafka
from shoal.gateway.apis.broker_configs import TENANT_BROKER_CONFIGS
from shoal.tenancy.acl import CLUSTER_NAME, default_bindings
from shoal.tenancy.model import AclBinding, Operation, PatternType, Permission, ResourceType
from test_java_clients import Java, failed, flags, kafka_home  # noqa: F401
from test_kafkajs import KafkaJs, node_modules  # noqa: F401

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    # The legacy API is what these tests are about.
    pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning"),
]

TIMEOUT_S = 30
KEY = "KEY"
"""make_tenant gives bindings with this principal to the key it makes."""
CLUSTER_AUTHORIZATION_FAILED = 31
TOPIC_AUTHORIZATION_FAILED = 29
INVALID_REQUEST = 42
INVALID_CONFIG = 40
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
HIDDEN = ("log.dirs", "advertised.listeners", "node.id", "socket.request.max.bytes")
"""Broker configs the brokers report that a tenant must never see."""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(key: TenantKey, configs: dict[str, str]) -> str:
    name = unique("cfg")
    admin = AdminClient(key.librdkafka())
    admin.create_topics([NewTopic(name, 1, config=configs)])[name].result(TIMEOUT_S)
    return name


def error_code(future: Any) -> int:
    with pytest.raises(KafkaException) as raised:
        future.result(TIMEOUT_S)
    return int(raised.value.args[0].code())


def topic_configs(admin: AdminClient, topic: str) -> dict[str, Any]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries: dict[str, Any] = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    return entries


def broker_configs(admin: AdminClient, broker: str) -> dict[str, Any]:
    resource = ConfigResource(ConfigResource.Type.BROKER, broker)
    entries: dict[str, Any] = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    return entries


def without_cluster_describe_configs(tenant: str) -> list[AclBinding]:
    deny = AclBinding(
        tenant,
        KEY,
        ResourceType.CLUSTER,
        PatternType.LITERAL,
        CLUSTER_NAME,
        Operation.DESCRIBE_CONFIGS,
        Permission.DENY,
    )
    return [*default_bindings(tenant, KEY), deny]


# -- confluent-kafka -------------------------------------------------------------------


def test_confluent_alter_configs_replaces_the_topics_overrides(gateway_cluster: Any) -> None:
    key = gateway_cluster.tenant(unique("cfg-ck"))
    topic = create_topic(key, {"retention.ms": "3600000", "cleanup.policy": "compact"})
    admin = AdminClient(key.librdkafka())
    resource = ConfigResource(
        ConfigResource.Type.TOPIC, topic, set_config={"retention.ms": "7200000"}
    )

    admin.alter_configs([resource], validate_only=True)[resource].result(TIMEOUT_S)
    unchanged = topic_configs(admin, topic)
    assert unchanged["retention.ms"].value == "3600000"
    assert unchanged["cleanup.policy"].value == "compact"

    admin.alter_configs([resource])[resource].result(TIMEOUT_S)
    after = topic_configs(admin, topic)
    assert after["retention.ms"].value == "7200000"
    assert after["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    # Not named, so back to its default: the legacy API replaces the whole set.
    assert after["cleanup.policy"].value == "delete"
    assert after["cleanup.policy"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value

    bad = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"retention.ms": "-7"})
    with pytest.raises(KafkaException) as raised:
        admin.alter_configs([bad])[bad].result(TIMEOUT_S)
    error = raised.value.args[0]
    assert error.code() == INVALID_CONFIG
    assert key.tenant not in error.str(), "the message names the tenant's topic, not the brokers'"
    assert topic_configs(admin, topic)["retention.ms"].value == "7200000"


def test_confluent_alter_configs_needs_alter_configs_on_the_topic(gateway_cluster: Any) -> None:
    tenant = unique("cfg-acl")
    owner = gateway_cluster.tenant(tenant)
    topic = create_topic(owner, {})
    deny = AclBinding(
        tenant,
        KEY,
        ResourceType.TOPIC,
        PatternType.LITERAL,
        topic,
        Operation.ALTER_CONFIGS,
        Permission.DENY,
    )
    denied = gateway_cluster.tenant(tenant, bindings=[*default_bindings(tenant, KEY), deny])
    admin = AdminClient(denied.librdkafka())
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"retention.ms": "1"})

    assert error_code(admin.alter_configs([resource])[resource]) == TOPIC_AUTHORIZATION_FAILED


def test_confluent_alter_configs_of_a_broker_is_the_platform_admins(gateway_cluster: Any) -> None:
    tenant_admin = AdminClient(gateway_cluster.tenant(unique("cfg-tenant")).librdkafka())
    nothing = ConfigResource(ConfigResource.Type.BROKER, "0", set_config={})
    assert error_code(tenant_admin.alter_configs([nothing])[nothing]) == (
        CLUSTER_AUTHORIZATION_FAILED
    )

    platform = gateway_cluster.tenant(unique("cfg-platform"), platform_admin=True)
    admin = AdminClient(platform.librdkafka())
    # Replacing a broker's dynamic configs with none: it has none, so that is a no-op.
    admin.alter_configs([nothing])[nothing].result(TIMEOUT_S)
    one = ConfigResource(ConfigResource.Type.BROKER, "0", set_config={"message.max.bytes": "1"})
    assert error_code(admin.alter_configs([one], validate_only=True)[one]) == INVALID_REQUEST


def test_confluent_describe_configs_of_brokers_shows_a_tenant_the_subset(
    gateway_cluster: Any,
) -> None:
    key = gateway_cluster.tenant(unique("cfg-desc"))
    admin = AdminClient(key.librdkafka())
    direct = AdminClient({"bootstrap.servers": gateway_cluster.internal_bootstrap})
    broker_ids = sorted(admin.list_topics(timeout=TIMEOUT_S).brokers)
    assert broker_ids == [0, 1, 2]

    # librdkafka names brokers by id only; the cluster default ("") is kafka-configs.sh's.
    for broker in map(str, broker_ids):
        seen = broker_configs(admin, broker)
        assert set(seen) == TENANT_BROKER_CONFIGS, broker
        truth = broker_configs(direct, broker)
        for name, entry in seen.items():
            expected = truth[name]
            assert (entry.value, entry.source, entry.is_read_only) == (
                expected.value,
                expected.source,
                expected.is_read_only,
            ), name
            assert [(s.name, s.value, s.source) for s in entry.synonyms.values()] == [
                (s.name, s.value, s.source) for s in expected.synonyms.values()
            ]
        assert not set(HIDDEN) & set(seen)


def test_describe_configs_of_a_broker_needs_describe_configs_on_the_cluster(
    gateway_cluster: Any,
) -> None:
    tenant = unique("cfg-nocluster")
    key = gateway_cluster.tenant(tenant, bindings=without_cluster_describe_configs(tenant))
    admin = AdminClient(key.librdkafka())
    resource = ConfigResource(ConfigResource.Type.BROKER, "1")

    assert error_code(admin.describe_configs([resource])[resource]) == (
        CLUSTER_AUTHORIZATION_FAILED
    )


def test_the_platform_admin_sees_a_brokers_configs_whole(gateway_cluster: Any) -> None:
    platform = gateway_cluster.tenant(unique("cfg-platform"), platform_admin=True)

    seen = broker_configs(AdminClient(platform.librdkafka()), "2")

    assert set(HIDDEN) <= set(seen)
    assert seen["node.id"].value == "2"


# -- kafka-python ----------------------------------------------------------------------


def test_kafka_python_alter_configs_and_describe_configs(gateway_cluster: Any) -> None:
    key = gateway_cluster.tenant(unique("cfg-kp"))
    topic = create_topic(key, {"retention.ms": "3600000", "cleanup.policy": "compact"})
    admin = KafkaAdminClient(**key.python_client(), request_timeout_ms=TIMEOUT_S * 1000)

    def configs(kind: ConfigResourceType, name: str) -> dict[str, Any]:
        resource = KafkaPythonConfigResource(kind, name)
        described = admin.describe_configs([resource], include_synonyms=True, config_filter="all")
        entries: dict[str, Any] = described[kind.name.lower()][name]
        return entries

    try:
        # incremental=False: the legacy AlterConfigs, to which kafka-python adds the
        # topic's other overrides itself, since the API resets what it does not name.
        altered = admin.alter_configs(
            [KafkaPythonConfigResource(ConfigResourceType.TOPIC, topic, {"retention.ms": "60000"})],
            incremental=False,
        )
        assert altered == {"topic": {topic: "OK"}}
        values = {k: v["value"] for k, v in configs(ConfigResourceType.TOPIC, topic).items()}
        assert (values["retention.ms"], values["cleanup.policy"]) == ("60000", "compact")

        # A partial reset sends every override but the one reset: that one reverts.
        reset = admin.reset_configs(
            [KafkaPythonConfigResource(ConfigResourceType.TOPIC, topic, ["retention.ms"])],
            incremental=False,
        )
        assert reset == {"topic": {topic: "OK"}}
        values = {k: v["value"] for k, v in configs(ConfigResourceType.TOPIC, topic).items()}
        assert (values["retention.ms"], values["cleanup.policy"]) == ("604800000", "compact")

        # A null cannot mean "revert" (leaving the config out does): Kafka refuses it too.
        null = admin.alter_configs(
            [KafkaPythonConfigResource(ConfigResourceType.TOPIC, topic, {"retention.ms": None})],
            incremental=False,
        )
        assert "InvalidRequestError" in null["topic"][topic], null

        broker = configs(ConfigResourceType.BROKER, "1")
        assert set(broker) == TENANT_BROKER_CONFIGS
        assert broker["num.partitions"]["config_source"] == "STATIC_BROKER_CONFIG"

        refused = admin.alter_configs(
            [KafkaPythonConfigResource(ConfigResourceType.BROKER, "1", {"num.partitions": "3"})],
            incremental=False,
            raise_on_unknown=False,
        )
        assert "ClusterAuthorizationFailedError" in refused["broker"]["1"], refused
    finally:
        admin.close()


# -- KafkaJS ---------------------------------------------------------------------------


def test_kafkajs_alter_configs_and_describe_configs_of_a_broker(
    gateway_cluster: Any,
    node_modules: Path,  # noqa: F811
) -> None:
    key = gateway_cluster.tenant(unique("cfg-js"))
    topic = create_topic(key, {"retention.ms": "3600000", "cleanup.policy": "compact"})
    kafkajs = KafkaJs("gateway", node_modules, key.bootstrap(), key)

    (done,) = kafkajs.run(
        {
            "kind": "configs",
            "topic": topic,
            "alter": [{"name": "retention.ms", "value": "120000"}],
            "broker": "1",
        }
    )

    [altered] = done["altered"]["resources"]
    assert (altered["errorCode"], altered["resourceName"]) == (0, topic), done
    [described] = done["topic"]["resources"]
    values = {e["configName"]: e["configValue"] for e in described["configEntries"]}
    assert values["retention.ms"] == "120000"
    assert values["cleanup.policy"] == "delete"
    [broker] = done["broker"]["resources"]
    assert broker["errorCode"] == 0, done
    entries = {e["configName"]: e for e in broker["configEntries"]}
    assert set(entries) == TENANT_BROKER_CONFIGS
    assert entries["num.partitions"]["configSource"] == STATIC_BROKER_CONFIG
    assert entries["num.partitions"]["readOnly"] is True
    # KafkaJS throws for a resource error; its type names Kafka's code.
    assert done["alteredBroker"]["error"]["type"] == "CLUSTER_AUTHORIZATION_FAILED", done


# -- kafka-configs.sh ------------------------------------------------------------------

CONFIGS = "kafka.admin.ConfigCommand"


@pytest.fixture(scope="module")
def tools(
    kafka_home: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ApacheKafka]:
    yield ApacheKafka(tmp_path_factory.mktemp("config-tools"), kafka_home)


def test_kafka_configs_alters_and_describes_with_a_tenants_key(
    gateway_cluster: Any, tools: ApacheKafka, tmp_path: Path
) -> None:
    key = gateway_cluster.tenant(unique("cfg-cli"))
    topic = create_topic(key, {})
    java = Java(tools, key, tmp_path)
    admin = java.admin()

    java.ok(
        CONFIGS,
        *admin,
        *flags(f"--alter --entity-type topics --entity-name {topic}"),
        *flags("--add-config retention.ms=90000"),
    )
    described = java.ok(
        CONFIGS, *admin, *flags(f"--describe --entity-type topics --entity-name {topic}")
    )
    assert "retention.ms=90000" in described
    assert key.tenant not in described

    for broker in ("--entity-default", "--entity-name 1"):
        shown = java.ok(CONFIGS, *admin, *flags(f"--describe --all --entity-type brokers {broker}"))
        assert "message.max.bytes=" in shown, shown
        assert "num.partitions=" in shown
        for hidden in HIDDEN:
            assert f"{hidden}=" not in shown, (hidden, shown)

    refused = java.run(
        CONFIGS,
        *admin,
        *flags("--alter --entity-type brokers --entity-name 1 --add-config num.partitions=3"),
    )
    assert "ClusterAuthorization" in failed(refused), failed(refused)
