"""Kafka's ACL admin APIs (DescribeAcls, CreateAcls, DeleteAcls) with the clients people use.

Through the gateway, a tenant's key that holds ALTER on its cluster creates,
describes and deletes the tenant's bindings with confluent-kafka's
``AdminClient``, kafka-python's ``KafkaAdminClient``, KafkaJS's admin and
Kafka's own ``kafka-acls.sh`` (``AclCommand``); names are the tenant's,
principals ``User:<key id>``. Straight on the brokers' listener the same calls
get SECURITY_DISABLED, as from Apache Kafka without an authorizer.

One cluster (three brokers and the gateway) serves the module; every test
makes its own tenant. Isolation between tenants is in test_gateway_isolation.py.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from gateway_env import TenantKey
from kafka import KafkaAdminClient
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KafkaPythonResourceType
from kafka.errors import ClusterAuthorizationFailedError, NoError, SecurityDisabledError
from raw_kafka import RawConnection, request_class
from shoal.benchmarks.apache_kafka import ApacheKafka
from shoal.tenancy import model
from shoal.tenancy.acl import CLUSTER_NAME, default_bindings
from shoal.tenancy.store import MAX_TXN_OPS
from test_java_clients import Java, failed, flags, kafka_home  # noqa: F401
from test_kafkajs import KafkaJs, node_modules  # noqa: F401
from test_operator_tenants import client_config, reconcile, stored
from test_operator_tenants import tenant as tenant_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TIMEOUT_S = 30
KEY = "KEY"
"""make_tenant gives bindings with this principal to the key it makes."""
SECURITY_DISABLED = 54
CLUSTER_AUTHORIZATION_FAILED = 31


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def acl_admin_bindings(tenant: str) -> list[model.AclBinding]:
    """A default key's bindings plus ALTER on the tenant's cluster: may manage ACLs."""
    alter = model.AclBinding(
        tenant,
        KEY,
        model.ResourceType.CLUSTER,
        model.PatternType.LITERAL,
        CLUSTER_NAME,
        model.Operation.ALTER,
    )
    return [*default_bindings(tenant, KEY), alter]


def acl_admin(gateway_cluster: Any, tenant: str) -> TenantKey:
    key: TenantKey = gateway_cluster.tenant(tenant, bindings=acl_admin_bindings(tenant))
    return key


# -- confluent-kafka -----------------------------------------------------------------------


def topic_acl(
    name: str,
    principal: str,
    operation: AclOperation = AclOperation.READ,
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, pattern, principal, "*", operation, permission)


EVERY_TOPIC_ACL = AclBindingFilter(
    ResourceType.TOPIC,
    None,
    ResourcePatternType.ANY,
    None,
    None,
    AclOperation.ANY,
    AclPermissionType.ANY,
)


def described(admin: AdminClient, selection: AclBindingFilter = EVERY_TOPIC_ACL) -> set[Any]:
    found = admin.describe_acls(selection, request_timeout=TIMEOUT_S).result(TIMEOUT_S)
    return {
        (b.name, b.resource_pattern_type, b.principal, b.operation, b.permission_type)
        for b in found
    }


def as_tuple(binding: AclBinding) -> tuple[Any, ...]:
    return (
        binding.name,
        binding.resource_pattern_type,
        binding.principal,
        binding.operation,
        binding.permission_type,
    )


def test_confluent_admin_creates_describes_and_deletes_the_tenants_acls(
    gateway_cluster: Any,
) -> None:
    tenant = unique("acl-ck")
    admin_key = acl_admin(gateway_cluster, tenant)
    other = gateway_cluster.tenant(tenant)
    admin = AdminClient(admin_key.librdkafka())
    made = [
        topic_acl("orders", f"User:{other.key_id}"),
        topic_acl(
            "audit.",
            "User:*",
            AclOperation.WRITE,
            ResourcePatternType.PREFIXED,
            AclPermissionType.DENY,
        ),
    ]
    for future in admin.create_acls(made, request_timeout=TIMEOUT_S).values():
        assert future.result(TIMEOUT_S) is None

    listed = described(admin)
    assert {as_tuple(b) for b in made} <= listed
    # The keys' own role bindings are declared ones: listed too, under the tenant's names.
    assert (
        "*",
        ResourcePatternType.LITERAL,
        f"User:{other.key_id}",
        AclOperation.ALL,
        AclPermissionType.ALLOW,
    ) in listed
    assert not [name for name, *_ in listed if name.startswith(f"{tenant}.")]

    deleted = admin.delete_acls([EVERY_TOPIC_ACL], request_timeout=TIMEOUT_S)
    [matched] = [future.result(TIMEOUT_S) for future in deleted.values()]
    assert {as_tuple(b) for b in matched} == {as_tuple(b) for b in made}
    # What stays is declared (the keys' roles): only the operator changes it.
    assert described(admin) == {
        (
            "*",
            ResourcePatternType.LITERAL,
            f"User:{key_id}",
            AclOperation.ALL,
            AclPermissionType.ALLOW,
        )
        for key_id in (admin_key.key_id, other.key_id)
    }


def test_more_bindings_than_one_etcd_transaction_holds_are_made_and_deleted(
    gateway_cluster: Any,
) -> None:
    admin = AdminClient(acl_admin(gateway_cluster, unique("acl-many")).librdkafka())
    many = [topic_acl(f"t{i}", "User:*") for i in range(MAX_TXN_OPS + 22)]
    for future in admin.create_acls(many, request_timeout=TIMEOUT_S).values():
        future.result(TIMEOUT_S)
    assert {as_tuple(b) for b in many} <= described(admin)

    deleted = admin.delete_acls([EVERY_TOPIC_ACL], request_timeout=TIMEOUT_S)
    [matched] = [future.result(TIMEOUT_S) for future in deleted.values()]
    assert len(matched) == len(many)
    assert not {as_tuple(b) for b in many} & described(admin)


def test_confluent_admin_is_refused_what_its_key_may_not_do(gateway_cluster: Any) -> None:
    tenant = unique("acl-ck-refused")
    plain = AdminClient(gateway_cluster.tenant(tenant).librdkafka())
    future = plain.create_acls([topic_acl("orders", "User:*")], request_timeout=TIMEOUT_S)
    with pytest.raises(KafkaException) as raised:
        next(iter(future.values())).result(TIMEOUT_S)
    assert raised.value.args[0].code() == CLUSTER_AUTHORIZATION_FAILED
    # A default key may look (DESCRIBE on its cluster) but not change.
    assert described(plain) != set()

    admin = AdminClient(acl_admin(gateway_cluster, tenant).librdkafka())
    alter = AclBinding(
        ResourceType.BROKER,
        CLUSTER_NAME,
        ResourcePatternType.LITERAL,
        "User:*",
        "*",
        AclOperation.CLUSTER_ACTION,
        AclPermissionType.ALLOW,
    )
    future = admin.create_acls([alter], request_timeout=TIMEOUT_S)
    with pytest.raises(KafkaException) as raised:
        next(iter(future.values())).result(TIMEOUT_S)
    assert raised.value.args[0].code() == CLUSTER_AUTHORIZATION_FAILED
    assert "CLUSTER_ACTION" in raised.value.args[0].str()


@pytest.mark.parametrize("version", [1, 3])
def test_the_brokers_answer_security_disabled_as_kafka_without_an_authorizer(
    gateway_cluster: Any, version: int
) -> None:
    address = gateway_cluster.brokers[0].bootstrap
    describe = request_class(29, version)
    with RawConnection(address) as conn:
        answer = conn.call(
            describe(
                resource_type_filter=1,
                resource_name_filter=None,
                pattern_type_filter=1,
                principal_filter=None,
                host_filter=None,
                operation=1,
                permission_type=1,
            )
        )
    assert (answer.error_code, answer.error_message, answer.resources) == (
        SECURITY_DISABLED,
        "No Authorizer is configured on the broker",
        (),
    )

    brokers = AdminClient({"bootstrap.servers": gateway_cluster.internal_bootstrap})
    # librdkafka reads DescribeAcls' top-level error and drops it (from Apache Kafka
    # without an authorizer too): confluent-kafka lists nothing.
    assert brokers.describe_acls(EVERY_TOPIC_ACL, request_timeout=TIMEOUT_S).result(TIMEOUT_S) == []
    created = brokers.create_acls([topic_acl("orders", "User:*")], request_timeout=TIMEOUT_S)
    deleted = brokers.delete_acls([EVERY_TOPIC_ACL], request_timeout=TIMEOUT_S)
    for future in [*created.values(), *deleted.values()]:
        with pytest.raises(KafkaException) as raised:
            future.result(TIMEOUT_S)
        assert raised.value.args[0].code() == SECURITY_DISABLED
        assert raised.value.args[0].str() == "No Authorizer is configured."


def test_the_operator_keeps_the_bindings_a_tenant_made_through_the_api(
    gateway_cluster: Any,
) -> None:
    name = unique("acl-op")
    alter = {"key": "admin", "resourceType": "CLUSTER", "resourceName": CLUSTER_NAME}
    spec = tenant_spec(
        name,
        keys=[{"name": "admin"}, {"name": "app"}],
        acls=[{**alter, "operation": "ALTER"}],
    )
    outcome = reconcile(gateway_cluster, spec, {})
    known = stored(outcome)
    admin = AdminClient(client_config(outcome, "admin"))
    app = f"User:{known['app'].key_id}"
    # For principals the operator manages (the app key and "*"), one a twin of a declared
    # binding (the app's role gives it Topic * ALL).
    made = [
        topic_acl("ledger", app, AclOperation.WRITE, permission=AclPermissionType.DENY),
        topic_acl("audit", "User:*"),
        topic_acl("*", app, AclOperation.ALL),
    ]
    for future in admin.create_acls(made, request_timeout=TIMEOUT_S).values():
        future.result(TIMEOUT_S)

    # The app key becomes read-only: the operator replaces its declared bindings.
    read_only = tenant_spec(
        name,
        keys=[{"name": "admin"}, {"name": "app", "role": "read-only"}],
        acls=[{**alter, "operation": "ALTER"}],
    )
    reconcile(gateway_cluster, read_only, known)
    listed = described(admin)
    assert {as_tuple(b) for b in made} <= listed
    # The declared READ the new role gives is there beside the API-made twin of ALL.
    assert ("*", ResourcePatternType.LITERAL, app, AclOperation.READ, AclPermissionType.ALLOW) in (
        listed
    )


# -- kafka-python ----------------------------------------------------------------------


def test_kafka_python_admin_creates_describes_and_deletes_acls(gateway_cluster: Any) -> None:
    tenant = unique("acl-kp")
    key = acl_admin(gateway_cluster, tenant)
    admin = KafkaAdminClient(**key.python_client(), request_timeout_ms=TIMEOUT_S * 1000)
    try:
        acl = ACL(
            principal="User:*",
            host="*",
            operation=ACLOperation.READ,
            permission_type=ACLPermissionType.ALLOW,
            resource_pattern=ResourcePattern(
                KafkaPythonResourceType.GROUP, "billing", ACLResourcePatternType.PREFIXED
            ),
        )
        created = admin.create_acls([acl])
        assert created == {"succeeded": [acl], "failed": []}

        groups = ACLFilter(
            principal=None,
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(
                KafkaPythonResourceType.GROUP, "billing-eu", ACLResourcePatternType.MATCH
            ),
        )
        acls, error = admin.describe_acls(groups)
        assert error is NoError
        assert {(a.principal, a.resource_pattern.resource_name) for a in acls} == {
            ("User:*", "billing"),
            (f"User:{key.key_id}", "*"),
        }

        [(_, matched, error)] = admin.delete_acls([groups])
        assert error is NoError
        assert [(a.principal, a.resource_pattern.resource_name) for a in matched] == [
            ("User:*", "billing")
        ]
    finally:
        admin.close()

    reader = KafkaAdminClient(
        **gateway_cluster.tenant(tenant).python_client(), request_timeout_ms=TIMEOUT_S * 1000
    )
    try:
        refused = reader.create_acls([acl])
        assert refused["succeeded"] == []
        assert refused["failed"] == [ClusterAuthorizationFailedError]
    finally:
        reader.close()


def test_kafka_python_on_the_brokers_gets_security_disabled(gateway_cluster: Any) -> None:
    admin = KafkaAdminClient(
        bootstrap_servers=gateway_cluster.internal_bootstrap, request_timeout_ms=TIMEOUT_S * 1000
    )
    try:
        everything = ACLFilter(
            principal=None,
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(
                KafkaPythonResourceType.ANY, None, ACLResourcePatternType.ANY
            ),
        )
        with pytest.raises(SecurityDisabledError):
            admin.describe_acls(everything)
    finally:
        admin.close()


# -- KafkaJS ---------------------------------------------------------------------------


def test_kafkajs_admin_creates_describes_and_deletes_acls(
    gateway_cluster: Any,
    node_modules: Path,  # noqa: F811
) -> None:
    tenant = unique("acl-js")
    key = acl_admin(gateway_cluster, tenant)
    kafkajs = KafkaJs("gateway", node_modules, key.bootstrap(), key)
    acl = {
        "resourceType": 2,
        "resourceName": "payments",
        "resourcePatternType": 3,
        "principal": "User:*",
        "host": "*",
        "operation": 4,
        "permissionType": 2,
    }
    payments = {
        "resourceType": 2,
        "resourceName": "payments",
        "resourcePatternType": 3,
        "operation": 1,
        "permissionType": 1,
    }
    (done,) = kafkajs.run(
        {"kind": "acls", "create": [acl], "describe": payments, "delete": [payments]}
    )
    assert done["created"] is True, done
    [resource] = done["described"]["resources"]
    assert (resource["resourceName"], resource["resourcePatternType"]) == ("payments", 3)
    assert resource["acls"] == [
        {"principal": "User:*", "host": "*", "operation": 4, "permissionType": 2}
    ]
    [filtered] = done["deleted"]["filterResponses"]
    assert filtered["errorCode"] == 0
    assert [(m["resourceName"], m["principal"]) for m in filtered["matchingAcls"]] == [
        ("payments", "User:*")
    ]

    (again,) = kafkajs.run({"kind": "acls", "describe": payments})
    assert again["described"]["resources"] == []


# -- kafka-acls.sh ---------------------------------------------------------------------

ACLS = "org.apache.kafka.tools.AclCommand"


@pytest.fixture(scope="module")
def tools(
    kafka_home: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ApacheKafka]:
    yield ApacheKafka(tmp_path_factory.mktemp("acl-tools"), kafka_home)


def test_kafka_acls_adds_lists_and_removes_with_a_tenants_key(
    gateway_cluster: Any, tools: ApacheKafka, tmp_path: Path
) -> None:
    tenant = unique("acl-cli")
    java = Java(tools, acl_admin(gateway_cluster, tenant), tmp_path)
    reader = gateway_cluster.tenant(tenant)
    admin = java.admin()

    added = java.ok(
        ACLS,
        *admin,
        *flags(f"--add --allow-principal User:{reader.key_id} --operation Read"),
        *flags("--topic orders --resource-pattern-type prefixed"),
    )
    assert "orders" in added

    listed = java.ok(ACLS, *admin, *flags("--list --topic orders --resource-pattern-type match"))
    assert "name=orders, patternType=PREFIXED" in listed
    assert f"principal=User:{reader.key_id}, host=*, operation=READ, permissionType=ALLOW" in listed
    assert tenant not in listed

    java.ok(
        ACLS,
        *admin,
        *flags(f"--remove --force --allow-principal User:{reader.key_id} --operation Read"),
        *flags("--topic orders --resource-pattern-type prefixed"),
    )
    after = java.ok(ACLS, *admin, *flags("--list --topic orders --resource-pattern-type prefixed"))
    assert "name=orders" not in after

    refused = Java(tools, reader, tmp_path / "reader")
    (tmp_path / "reader").mkdir()
    done = refused.run(
        ACLS,
        *refused.admin(),
        *flags("--add --allow-principal User:* --operation Read --topic orders"),
    )
    assert "ClusterAuthorizationException" in failed(done), failed(done)


def test_kafka_acls_on_the_brokers_reports_security_disabled(
    gateway_cluster: Any, tools: ApacheKafka
) -> None:
    java, *rest = tools.java_command(
        ACLS, "--bootstrap-server", gateway_cluster.internal_bootstrap, "--list"
    )
    done = subprocess.run([java, *rest], capture_output=True, text=True, timeout=120)
    assert "SecurityDisabledException" in done.stdout + done.stderr, done.stdout + done.stderr
