"""DescribeClientQuotas and AlterClientQuotas through the gateway, on the wire.

A tenant's key may read its own tenant's quotas (the limits it works within)
and nobody else's: with no filter it sees its own entry only, and asking for
another tenant's name answers an empty list, exactly as a name that exists
nowhere, so the answer does not even tell that the other tenant exists. A
platform admin key sees every tenant. Altering stays the platform admin's.

The Python clients we use lack these APIs (confluent-kafka and kafka-python),
so the protocol checks go through :class:`raw_kafka.RawConnection` after a
real SASL/PLAIN login, and Kafka's own ``kafka-configs --describe
--entity-type users`` (Kafka 4.3.1's ConfigCommand, as ``test_java_clients``
runs it) shows what a tenant's operator sees.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import GatewayCluster
from gateway_env import TenantKey
from raw_kafka import request_class
from shoal.benchmarks.apache_kafka import ApacheKafka, default_kafka_home
from shoal.tenancy.model import Quotas

CLUSTER_AUTHORIZATION_FAILED = 31
MATCH_EXACT, MATCH_ANY = 0, 2
REPO = Path(__file__).resolve().parents[2]
CONFIGS = "kafka.admin.ConfigCommand"
TOOL_TIMEOUT_S = 120


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def describe(key: TenantKey, match: str | None = None, match_type: int = MATCH_EXACT) -> Any:
    request = request_class(48, 1)
    component = request_class(48, 1, "ComponentData")
    components = (
        ()
        if match is None and match_type == MATCH_EXACT
        else (component(entity_type="user", match_type=match_type, match=match),)
    )
    with key.raw() as connection:
        return connection.call(request(components=components, strict=False))


def entries(response: Any) -> dict[str, dict[str, float]]:
    assert response.error_code == 0, response.error_message
    return {
        entry.entity[0].entity_name: {value.key: value.value for value in entry.values}
        for entry in response.entries
    }


def test_a_tenant_describes_its_own_quotas_and_learns_nothing_of_others(
    gateway_cluster: GatewayCluster,
) -> None:
    acme = gateway_cluster.tenant(
        unique("acme"), quotas=Quotas(producer_byte_rate=1_000_000, max_storage_bytes=200_000)
    )
    globex = gateway_cluster.tenant(unique("globex"), quotas=Quotas(max_partitions=7))
    own = {acme.tenant: {"producer_byte_rate": 1e6, "max_storage_bytes": 200_000.0}}

    assert entries(describe(acme)) == own
    assert entries(describe(acme, match_type=MATCH_ANY)) == own
    assert entries(describe(acme, acme.tenant)) == own
    # Another tenant's name and a name that exists nowhere: the same empty answer.
    assert entries(describe(acme, globex.tenant)) == {}
    assert entries(describe(acme, unique("nobody"))) == {}
    assert entries(describe(globex)) == {globex.tenant: {"max_partitions": 7.0}}

    # The platform admin sees both.
    admin = gateway_cluster.tenant(unique("platform"), platform_admin=True)
    everyone = entries(describe(admin))
    assert everyone[acme.tenant] == own[acme.tenant]
    assert everyone[globex.tenant] == {"max_partitions": 7.0}


def test_only_a_platform_admin_alters_quotas(gateway_cluster: GatewayCluster) -> None:
    acme = gateway_cluster.tenant(unique("acme"), quotas=Quotas(max_partitions=3))
    alter = request_class(49, 1)
    entry = request_class(49, 1, "EntryData")
    entity = request_class(49, 1, "EntityData")
    op = request_class(49, 1, "OpData")
    request = alter(
        entries=(
            entry(
                entity=(entity(entity_type="user", entity_name=acme.tenant),),
                ops=(op(key="max_partitions", value=1000.0, remove=False),),
            ),
        ),
        validate_only=False,
    )

    with acme.raw() as connection:
        (refused,) = connection.call(request).entries
    assert refused.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert "platform admin" in refused.error_message
    assert entries(describe(acme)) == {acme.tenant: {"max_partitions": 3.0}}

    admin = gateway_cluster.tenant(unique("platform"), platform_admin=True)
    with admin.raw() as connection:
        (accepted,) = connection.call(request).entries
    assert accepted.error_code == 0, accepted.error_message
    assert entries(describe(admin, acme.tenant)) == {acme.tenant: {"max_partitions": 1000.0}}


@pytest.fixture(scope="module")
def kafka_tools(tmp_path_factory: pytest.TempPathFactory) -> ApacheKafka:
    """Kafka's tools (``make kafka`` installs them once; this cluster never starts)."""
    home = default_kafka_home()
    subprocess.run(["make", "kafka", f"KAFKA_HOME={home}"], cwd=REPO, check=True, timeout=840)
    return ApacheKafka(tmp_path_factory.mktemp("kafka-tools"), home)


def kafka_configs(tools: ApacheKafka, key: TenantKey, *args: str) -> str:
    """``kafka-configs`` with the key over SASL/PLAIN; its stdout, once it exited 0."""
    config = tools.data_dir / f"{key.key_id}.properties"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required"
        f' username="{key.key_id}" password="{key.secret}";\n'
    )
    command = tools.java_command(
        CONFIGS, "--bootstrap-server", key.bootstrap(), "--command-config", str(config), *args
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Exception" not in done.stderr, done.stderr[-3000:]
    return done.stdout


def test_kafka_configs_shows_a_tenant_its_own_quotas_only(
    gateway_cluster: GatewayCluster, kafka_tools: ApacheKafka
) -> None:
    acme = gateway_cluster.tenant(unique("acme"), quotas=Quotas(max_storage_bytes=200_000))
    globex = gateway_cluster.tenant(unique("globex"), quotas=Quotas(max_partitions=7))

    every = kafka_configs(kafka_tools, acme, "--describe", "--entity-type", "users")
    assert f"Quota configs for user-principal '{acme.tenant}' are" in every
    assert "max_storage_bytes=200000.0" in every
    assert globex.tenant not in every and "max_partitions" not in every

    theirs = kafka_configs(
        kafka_tools, acme, "--describe", "--entity-type", "users", "--entity-name", globex.tenant
    )
    assert "Quota configs" not in theirs and "max_partitions" not in theirs
