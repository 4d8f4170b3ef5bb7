"""Reading a Tenant's spec, its keys' bindings and Secrets, and the client settings."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from shoal.operator.client_settings import escape_property, jaas_config, properties_text
from shoal.operator.endpoints import ClusterEndpoints
from shoal.operator.tenants import (
    KeySecret,
    TenantSpec,
    binding_changes,
    key_secret,
    read_key_secret,
    wanted_bindings,
)
from shoal.tenancy.acl import default_bindings, read_only_bindings
from shoal.tenancy.keys import KeyRole
from shoal.tenancy.model import (
    AclBinding,
    ApiKey,
    Operation,
    PatternType,
    Permission,
    Quotas,
    ResourceType,
)

ENDPOINTS = ClusterEndpoints(
    "http://etcd:2379/shoal", "b0:19092", "gw.ns.svc:9092", "http://gw.ns.svc:8080"
)


def tenant_spec(**spec: Any) -> TenantSpec:
    return TenantSpec.from_resource("acme", {"cluster": "demo", **spec}, namespace="team")


def test_defaults_tenant_id_from_the_resource_name_and_roles_from_the_crd() -> None:
    spec = tenant_spec(keys=[{"name": "app"}, {"name": "viewer", "role": "read-only"}])
    assert spec.tenant == "acme"
    assert spec.quotas == Quotas()
    assert [(k.name, k.role) for k in spec.keys] == [
        ("app", KeyRole.DEFAULT),
        ("viewer", KeyRole.READ_ONLY),
    ]


def test_quotas_and_acls_are_read() -> None:
    spec = tenant_spec(
        name="other",
        quotas={
            "producerByteRate": 1000,
            "maxPartitions": 0,
            "controllerMutationRate": 2.5,
            "maxStorageBytes": 200_000,
            "maxConnectionRate": 4,
            "requestPercentage": 250,
        },
        keys=[{"name": "app", "role": "none"}],
        acls=[
            {"key": "app", "resourceType": "TOPIC", "resourceName": "in", "operation": "READ"},
            {
                "key": "*",
                "resourceType": "GROUP",
                "patternType": "PREFIXED",
                "resourceName": "g-",
                "operation": "ALL",
                "permission": "DENY",
            },
        ],
    )
    assert spec.tenant == "other"
    assert spec.quotas == Quotas(
        producer_byte_rate=1000,
        max_partitions=0,
        controller_mutation_rate=2.5,
        max_storage_bytes=200_000,
        max_connection_rate=4.0,
        request_percentage=250.0,
    )
    assert spec.acls[0].pattern_type is PatternType.LITERAL
    assert spec.acls[0].permission is Permission.ALLOW
    assert spec.acls[1].pattern_type is PatternType.PREFIXED


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ({"keys": [{"name": "a"}, {"name": "a"}]}, "a name of its own"),
        ({"keys": [{"name": "a", "role": "admin"}]}, "role"),
        ({"keys": [{"name": "Has Space"}]}, "key name 'Has Space'"),
        (
            {
                "acls": [
                    {"key": "*", "resourceType": "TOPIC", "resourceName": "", "operation": "ALL"}
                ]
            },
            "resource name",
        ),
        ({"name": "No_Good"}, "tenant name"),
        ({"quotas": {"maxPartitions": -1}}, "maxPartitions"),
        ({"quotas": {"controllerMutationRate": 0}}, "controllerMutationRate"),
        ({"quotas": {"controllerMutationRate": "fast"}}, "controllerMutationRate"),
        ({"quotas": {"maxStorageBytes": 0}}, "maxStorageBytes"),
        ({"quotas": {"maxStorageBytes": 1.5}}, "maxStorageBytes"),
        ({"quotas": {"maxConnectionRate": 0}}, "maxConnectionRate"),
        ({"quotas": {"maxConnectionRate": "fast"}}, "maxConnectionRate"),
        ({"quotas": {"requestPercentage": 0}}, "requestPercentage"),
        ({"quotas": {"requestPercentage": -5.5}}, "requestPercentage"),
        ({"quotas": {"requestPercentage": True}}, "requestPercentage"),
        (
            {
                "acls": [
                    {"key": "x", "resourceType": "TOPIC", "resourceName": "t", "operation": "READ"}
                ]
            },
            "key 'x' is not in spec.keys",
        ),
        (
            {
                "acls": [
                    {"key": "*", "resourceType": "QUEUE", "resourceName": "t", "operation": "READ"}
                ]
            },
            "QUEUE",
        ),
    ],
)
def test_bad_specs_are_refused(spec: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint.replace(".", r"\.").replace("*", r"\*")):
        tenant_spec(**spec)


def test_certificate_subjects_are_read_in_their_canonical_spelling() -> None:
    spec = tenant_spec(
        keys=[
            {"name": "app", "certificateSubject": "CN=orders, OU=apps, O=acme"},
            {"name": "plain"},
        ]
    )
    assert [(k.name, k.certificate_subject) for k in spec.keys] == [
        ("app", "CN=orders,OU=apps,O=acme"),
        ("plain", None),
    ]


@pytest.mark.parametrize(
    ("subject", "complaint"),
    [
        ("", "distinguished name"),
        ("   ", "distinguished name"),
        ("O=acme", "has no CN"),
        ("CN=orders,,O=acme", "not an RFC 4514 name"),
        (42, "distinguished name"),
    ],
)
def test_bad_certificate_subjects_are_refused_naming_the_key(subject: Any, complaint: str) -> None:
    with pytest.raises(ValueError, match=r"^spec\.keys\[app\]\.certificateSubject: .*" + complaint):
        tenant_spec(keys=[{"name": "app", "certificateSubject": subject}])


def test_two_keys_of_a_spec_cannot_share_a_certificate_subject() -> None:
    with pytest.raises(ValueError, match="certificateSubject of its own"):
        tenant_spec(
            keys=[
                {"name": "a", "certificateSubject": "CN=orders,O=acme"},
                # The same subject, spelt otherwise.
                {"name": "b", "certificateSubject": "CN=orders, O=acme"},
            ]
        )


def test_only_keys_marked_by_this_resource_are_its_own() -> None:
    spec = tenant_spec(keys=[{"name": "app"}])
    mine = ApiKey("K1", "acme", "h", 0, "k8s:team/acme/app payments service")
    elsewhere = ApiKey("K2", "acme", "h", 0, "k8s:other/acme/app")
    by_hand = ApiKey("K3", "acme", "h", 0, "made with the CLI")
    assert spec.marked_key_name(mine) == "app"
    assert spec.marked_key_name(elsewhere) is None
    assert spec.marked_key_name(by_hand) is None


def test_wanted_bindings_are_the_roles_plus_the_acls() -> None:
    spec = tenant_spec(
        keys=[
            {"name": "app"},
            {"name": "viewer", "role": "read-only"},
            {"name": "bare", "role": "none"},
        ],
        acls=[
            {"key": "bare", "resourceType": "TOPIC", "resourceName": "t", "operation": "WRITE"},
            {
                "key": "*",
                "resourceType": "TOPIC",
                "resourceName": "secret",
                "operation": "ALL",
                "permission": "DENY",
            },
        ],
    )
    wanted = wanted_bindings(spec, {"app": "KA", "viewer": "KV", "bare": "KB"})
    topic = ResourceType.TOPIC
    assert wanted == {
        *default_bindings("acme", "KA"),
        *read_only_bindings("acme", "KV"),
        AclBinding("acme", "KB", topic, PatternType.LITERAL, "t", Operation.WRITE),
        AclBinding(
            "acme", "*", topic, PatternType.LITERAL, "secret", Operation.ALL, Permission.DENY
        ),
    }


def test_binding_changes_touch_only_managed_principals() -> None:
    def read(principal: str, name: str) -> AclBinding:
        return AclBinding(
            "acme", principal, ResourceType.TOPIC, PatternType.LITERAL, name, Operation.READ
        )

    existing = [read("KA", "keep"), read("KA", "drop"), read("KX", "foreign"), read("*", "old")]
    wanted = [read("KA", "keep"), read("KA", "new")]
    add, remove = binding_changes(existing, wanted, {"KA", "*"})
    assert add == [read("KA", "new")]
    assert remove == [read("*", "old"), read("KA", "drop")]


def test_the_secret_carries_credentials_and_client_settings() -> None:
    spec = tenant_spec(keys=[{"name": "app"}])
    secret = key_secret(spec, "app", "KID", "pw", ENDPOINTS, tls=True)
    assert secret["metadata"]["name"] == "shoal-acme-app"
    assert secret["metadata"]["namespace"] == "team"
    assert secret["metadata"]["labels"]["shoal.dev/tenant"] == "acme"
    assert secret["metadata"]["labels"]["shoal.dev/key"] == "app"
    assert secret["type"] == "Opaque"
    data = secret["stringData"]
    assert data["bootstrap"] == "gw.ns.svc:9092"
    assert (data["username"], data["password"]) == ("KID", "pw")
    assert data["http"] == "http://gw.ns.svc:8080"
    assert data["client.properties"].splitlines() == [
        "bootstrap.servers=gw.ns.svc:9092",
        "security.protocol=SASL_SSL",
        "sasl.mechanism=PLAIN",
        "sasl.username=KID",
        "sasl.password=pw",
    ]
    assert data["sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
        ' username="KID" password="pw";'
    )
    assert (
        "SASL_PLAINTEXT"
        in key_secret(spec, "app", "K", "p", ENDPOINTS, tls=False)["stringData"][
            "client.properties"
        ]
    )


def test_a_secret_read_back_from_the_api_gives_its_key() -> None:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    secret = {
        "metadata": {"labels": {"shoal.dev/key": "app"}},
        "data": {"username": b64("KID"), "password": b64("pw")},
    }
    assert read_key_secret(secret) == KeySecret("app", "KID", "pw")
    assert read_key_secret({"metadata": {}, "data": {}}) is None
    assert read_key_secret({**secret, "data": {"username": "!!", "password": b64("pw")}}) is None


def test_properties_escaping_follows_java_properties() -> None:
    assert escape_property("a=b:c d", key=True) == r"a\=b\:c\ d"
    assert escape_property("a=b:c d") == "a=b:c d"
    assert escape_property(" lead\\tail\n") == r"\ lead\\tail\n"
    assert escape_property("#x") == r"\#x"
    assert escape_property("é😀") == r"\u00e9\ud83d\ude00"
    assert properties_text({"k": "v", "x y": "1"}) == "k=v\nx\\ y=1\n"


def test_jaas_quotes_are_escaped() -> None:
    assert 'password="a\\"b\\\\c";' in jaas_config("K", 'a"b\\c')
