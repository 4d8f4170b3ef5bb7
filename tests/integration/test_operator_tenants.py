"""Tenant resources against a real broker, etcd and gateway: what the Tenant handler does.

The Secrets the operator returns are turned into what the Kubernetes API
would hand back (``data`` in base64) and read again, as the handler does on
its next pass. Keys are used the way a tenant would use them: confluent-kafka
configured from the Secret's client.properties, through the gateway.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import aetcd
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from conftest import EtcdServer, GatewayCluster, start_gateway_cluster
from gateway_env import sasl_login
from harness import wait_until
from raw_kafka import RawConnection, request_class
from shoal.operator.endpoints import ClusterEndpoints
from shoal.operator.kafka_admin import ClusterAdmin
from shoal.operator.tenants import (
    CertificateSubjectTakenError,
    KeySecret,
    TenantOutcome,
    TenantSpec,
    read_key_secret,
    reconcile_tenant,
    remove_tenant,
)
from shoal.operator.topics import TopicSpec, reconcile_topic
from shoal.tenancy.keys import mint_key
from shoal.tenancy.model import ApiKey, Operation, PatternType, Quotas, ResourceType
from shoal.tenancy.store import MAX_TXN_OPS, TenancyStore

from shoal.etcd_address import EtcdAddress

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    root = tmp_path_factory.mktemp("operator-tenants")
    gateway_cluster, brokers = start_gateway_cluster(etcd, root, brokers=1)
    try:
        yield gateway_cluster
    finally:
        if gateway_cluster.gateway.running:
            gateway_cluster.gateway.stop()
        for broker in brokers:
            broker.kill()
        shutil.rmtree(root, ignore_errors=True)


def endpoints(cluster: GatewayCluster) -> ClusterEndpoints:
    gateway = cluster.gateway
    return ClusterEndpoints(
        cluster.etcd_url, cluster.internal_bootstrap, gateway.bootstrap, gateway.http_url
    )


def tenant(name: str, **spec: Any) -> TenantSpec:
    return TenantSpec.from_resource(name, {"cluster": "demo", **spec}, namespace="team")


def reconcile(
    cluster: GatewayCluster, spec: TenantSpec, known: Mapping[str, KeySecret]
) -> TenantOutcome:
    async def go() -> TenantOutcome:
        async with TenancyStore(cluster.etcd_url) as store:
            return await reconcile_tenant(store, spec, known, endpoints(cluster))

    return asyncio.run(go())


def on_the_cluster(cluster: GatewayCluster, action: Any) -> Any:
    """Run ``action(store, admin)`` against the cluster's tenancy store and brokers."""

    async def go() -> Any:
        async with (
            TenancyStore(cluster.etcd_url) as store,
            ClusterAdmin(cluster.internal_bootstrap) as admin,
        ):
            return await action(store, admin)

    return asyncio.run(go())


def stored(outcome: TenantOutcome) -> dict[str, KeySecret]:
    """The Secrets as the API server would return them, read back by key name."""
    known = {}
    for manifest in outcome.secrets:
        data = {k: base64.b64encode(v.encode()).decode() for k, v in manifest["stringData"].items()}
        found = read_key_secret({"metadata": manifest["metadata"], "data": data})
        assert found is not None
        known[found.key_name] = found
    return known


def client_config(outcome: TenantOutcome, key: str, **extra: Any) -> dict[str, Any]:
    """confluent-kafka settings read from the key's Secret's client.properties."""
    [manifest] = [s for s in outcome.secrets if s["metadata"]["labels"]["shoal.dev/key"] == key]
    lines = manifest["stringData"]["client.properties"].splitlines()
    return {**dict(line.split("=", 1) for line in lines), **extra}


def logs_in(bootstrap: str, secret: KeySecret) -> bool:
    """Whether the gateway accepts the key and answers a request on its connection."""
    metadata = request_class(3, 12)
    try:
        with RawConnection(bootstrap) as conn:
            if sasl_login(conn, secret.key_id, secret.password).error_code != 0:
                return False
            conn.send(
                metadata(
                    topics=None,
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                )
            )
            return bool(conn.receive(metadata)[1].brokers)
    except ConnectionError:
        return False


def make_topic(cluster: GatewayCluster, tenant_name: str, topic: str) -> None:
    spec = TopicSpec.from_resource(
        topic, {"cluster": "demo", "tenant": tenant_name, "partitions": 1, "replicas": 1}
    )
    on_the_cluster(cluster, lambda store, admin: reconcile_topic(admin, store, spec))


def produce(config: dict[str, Any], topic: str, value: bytes) -> KafkaError | None:
    producer = Producer({**config, "acks": "all", "message.timeout.ms": 10_000})
    outcome: list[KafkaError | None] = []
    producer.produce(topic, value=value, on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(15)
    return outcome[0]


def consume_one(config: dict[str, Any], topic: str, commit_as: str | None = None) -> bytes:
    """The first record of the topic; its offset committed for group ``commit_as``, if given."""
    group = commit_as or f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        message = wait_until(lambda: consumer.poll(0.5), 20, f"a record from {topic}")
        assert message.error() is None, message.error()
        if commit_as is not None:
            consumer.commit(message, asynchronous=False)
        return bytes(message.value())
    finally:
        consumer.close()


def spec_keys(spec: TenantSpec) -> list[dict[str, str]]:
    return [{"name": k.name, "role": k.role.value} for k in spec.keys]


def keys_of(cluster: GatewayCluster, tenant_name: str) -> dict[str, ApiKey]:
    keys = on_the_cluster(cluster, lambda store, _admin: store.list_keys(tenant_name))
    return {k.key_id: k for k in keys}


def test_a_tenants_keys_produce_and_consume_through_the_gateway(cluster: GatewayCluster) -> None:
    spec = tenant(
        "shop",
        quotas={"producerByteRate": 5_000_000, "maxPartitions": 8},
        keys=[{"name": "app"}, {"name": "viewer", "role": "read-only"}],
    )
    outcome = reconcile(cluster, spec, {})

    record = on_the_cluster(cluster, lambda store, _admin: store.get_tenant("shop"))
    assert record.quotas == Quotas(producer_byte_rate=5_000_000, max_partitions=8)
    known = stored(outcome)
    assert outcome.status == {
        "tenant": "shop",
        "keyCount": 2,
        "keys": [
            {"name": "app", "keyId": known["app"].key_id, "secretName": "shoal-shop-app"},
            {"name": "viewer", "keyId": known["viewer"].key_id, "secretName": "shoal-shop-viewer"},
        ],
    }
    assert outcome.obsolete_secrets == []
    for secret in known.values():
        wait_until(lambda s=secret: logs_in(cluster.gateway.bootstrap, s), 10, "a new key served")

    make_topic(cluster, "shop", "orders")
    app, viewer = client_config(outcome, "app"), client_config(outcome, "viewer")
    assert produce(app, "orders", b"first") is None
    assert consume_one(viewer, "orders") == b"first"
    refused = produce(viewer, "orders", b"not allowed")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    raised = tenant("shop", quotas={"maxPartitions": 16}, keys=spec_keys(spec))
    reconcile(cluster, raised, known)
    record = on_the_cluster(cluster, lambda store, _admin: store.get_tenant("shop"))
    assert record.quotas == Quotas(max_partitions=16)


def test_kept_keys_stay_and_dropped_or_lost_ones_are_revoked(cluster: GatewayCluster) -> None:
    both = tenant("keep", keys=[{"name": "a"}, {"name": "b"}])
    first = reconcile(cluster, both, {})
    known = stored(first)

    again = reconcile(cluster, both, known)
    assert stored(again) == known  # same ids, same passwords: nothing regenerated
    assert set(keys_of(cluster, "keep")) == {known["a"].key_id, known["b"].key_id}

    only_a = tenant("keep", keys=[{"name": "a"}])
    dropped = reconcile(cluster, only_a, known)
    assert dropped.obsolete_secrets == ["shoal-keep-b"]
    assert [s["metadata"]["name"] for s in dropped.secrets] == ["shoal-keep-a"]
    assert keys_of(cluster, "keep")[known["b"].key_id].revoked
    wait_until(
        lambda: not logs_in(cluster.gateway.bootstrap, known["b"]), 5, "the dropped key refused"
    )
    assert logs_in(cluster.gateway.bootstrap, known["a"])

    # The Secret of "a" was lost: a new key replaces it and the old one is revoked.
    replaced = stored(reconcile(cluster, only_a, {}))["a"]
    assert replaced.key_id != known["a"].key_id
    keys = keys_of(cluster, "keep")
    assert keys[known["a"].key_id].revoked and not keys[replaced.key_id].revoked


def test_bindings_follow_the_spec(cluster: GatewayCluster) -> None:
    def write_acl(name: str) -> dict[str, str]:
        return {"key": "w", "resourceType": "TOPIC", "resourceName": name, "operation": "WRITE"}

    def bindings() -> set[tuple[str, str, str]]:
        found = on_the_cluster(cluster, lambda store, _admin: store.list_bindings("acl"))
        return {(b.principal, b.resource_name, b.operation.name) for b in found}

    first = reconcile(
        cluster, tenant("acl", keys=[{"name": "w", "role": "none"}], acls=[write_acl("in")]), {}
    )
    key_id = stored(first)["w"].key_id
    assert bindings() == {(key_id, "in", "WRITE")}

    changed = tenant(
        "acl",
        keys=[{"name": "w", "role": "none"}],
        acls=[
            write_acl("out"),
            {"key": "*", "resourceType": "TOPIC", "resourceName": "x", "operation": "DESCRIBE"},
        ],
    )
    reconcile(cluster, changed, stored(first))
    assert bindings() == {(key_id, "out", "WRITE"), ("*", "x", "DESCRIBE")}

    found = on_the_cluster(cluster, lambda store, _admin: store.list_bindings("acl"))
    [wildcard] = [b for b in found if b.principal == "*"]
    assert (wildcard.resource_type, wildcard.pattern_type, wildcard.operation) == (
        ResourceType.TOPIC,
        PatternType.LITERAL,
        Operation.DESCRIBE,
    )


def revisions_in_etcd(cluster: GatewayCluster, tenant_name: str) -> dict[str, int]:
    """The revision that last wrote each of the tenant's keys and bindings, as etcd has it:
    "key:<id>" and "acl:<principal>:<resource>"."""
    address = EtcdAddress.parse(cluster.etcd_url)
    root = address.root.encode() + b"/tenancy/"

    async def go() -> dict[str, int]:
        async with aetcd.Client(host=address.host, port=address.port) as client:
            found = await client.get_prefix(root)
        written = {}
        for kv in found:
            kind, _, rest = bytes(kv.key)[len(root) :].partition(b"/")
            if kind == b"keys" and ApiKey.from_json(kv.value).tenant == tenant_name:
                written[f"key:{rest.decode()}"] = int(kv.mod_revision)
            elif kind == b"acls" and rest.startswith(tenant_name.encode() + b"/"):
                binding = json.loads(kv.value)
                name = f"acl:{binding['principal']}:{binding['resource_name']}"
                written[name] = int(kv.mod_revision)
        return written

    return asyncio.run(go())


def test_a_new_key_is_stored_no_later_than_every_binding_its_spec_gives_it(
    cluster: GatewayCluster,
) -> None:
    """A gateway that sees a new key must see all its bindings: one read never finds the
    key with its role's bindings but without the ACLs declared for it, even when there
    are more than one etcd transaction holds."""
    declared = [
        {"key": "w", "resourceType": "TOPIC", "resourceName": f"t{i}", "operation": "WRITE"}
        for i in range(MAX_TXN_OPS + 40)
    ]
    outcome = reconcile(cluster, tenant("many-acls", keys=[{"name": "w"}], acls=declared), {})
    key_id = stored(outcome)["w"].key_id

    written = revisions_in_etcd(cluster, "many-acls")
    key_written = written.pop(f"key:{key_id}")
    ours = {name: rev for name, rev in written.items() if name.startswith(f"acl:{key_id}:")}
    assert {f"acl:{key_id}:t{i}" for i in range(len(declared))} <= ours.keys()
    assert max(ours.values()) <= key_written


def test_removing_a_tenant_revokes_its_keys_and_deletes_its_topics_only(
    cluster: GatewayCluster,
) -> None:
    doomed = tenant("doomed", keys=[{"name": "app"}])
    outcome = reconcile(cluster, doomed, {})
    [secret] = stored(outcome).values()
    survivor = tenant("survivor", keys=[{"name": "app"}])
    reconcile(cluster, survivor, {})
    make_topic(cluster, "doomed", "t1")
    make_topic(cluster, "doomed", "t2")
    make_topic(cluster, "survivor", "t1")
    wait_until(lambda: logs_in(cluster.gateway.bootstrap, secret), 10, "the key served")
    config = client_config(outcome, "app")
    assert produce(config, "t1", b"x") is None
    consume_one(config, "t1", commit_as="readers")
    groups = on_the_cluster(cluster, lambda _store, admin: admin.consumer_groups())
    assert "doomed.readers" in groups

    on_the_cluster(cluster, lambda store, admin: remove_tenant(store, admin, doomed))

    topics = on_the_cluster(cluster, lambda _store, admin: admin.partitions())
    names = {p.topic for p in topics}
    assert "survivor.t1" in names
    assert not {"doomed.t1", "doomed.t2"} & names
    assert on_the_cluster(cluster, lambda store, _admin: store.get_tenant("doomed")) is None
    assert keys_of(cluster, "doomed") == {}
    assert "doomed.readers" not in on_the_cluster(
        cluster, lambda _store, admin: admin.consumer_groups()
    )
    assert len(keys_of(cluster, "survivor")) == 1
    wait_until(lambda: not logs_in(cluster.gateway.bootstrap, secret), 5, "the key refused")

    on_the_cluster(cluster, lambda store, admin: remove_tenant(store, admin, doomed))  # no-op


def subjects_of(cluster: GatewayCluster, tenant_name: str) -> dict[str, str | None]:
    """The certificate subject of each live key of the tenant, by key id."""
    keys = keys_of(cluster, tenant_name).values()
    return {k.key_id: k.certificate_subject for k in keys if not k.revoked}


def test_a_keys_certificate_subject_follows_the_spec(cluster: GatewayCluster) -> None:
    def with_subjects(**subjects: str | None) -> TenantSpec:
        keys = [
            {"name": name} | ({"certificateSubject": s} if s is not None else {})
            for name, s in subjects.items()
        ]
        return tenant("certs", keys=keys)

    first = reconcile(cluster, with_subjects(a="CN=certs-a, O=acme", b=None), {})
    known = stored(first)
    a, b = known["a"].key_id, known["b"].key_id
    assert subjects_of(cluster, "certs") == {a: "CN=certs-a,O=acme", b: None}
    assert first.status["keys"] == [
        {
            "name": "a",
            "keyId": a,
            "secretName": "shoal-certs-a",
            "certificateSubject": "CN=certs-a,O=acme",
        },
        {"name": "b", "keyId": b, "secretName": "shoal-certs-b"},
    ]
    # The Secret is the SASL one still: the client brings its own certificate.
    assert "ssl.certificate.location" not in client_config(first, "a")

    changed = reconcile(
        cluster, with_subjects(a="CN=certs-a2,O=acme", b="CN=certs-b,O=acme"), known
    )
    assert stored(changed) == known  # the same keys, their subjects changed
    assert subjects_of(cluster, "certs") == {a: "CN=certs-a2,O=acme", b: "CN=certs-b,O=acme"}

    # A subject moves from one key to another of the same Tenant.
    swapped = reconcile(
        cluster, with_subjects(a="CN=certs-b,O=acme", b="CN=certs-a2,O=acme"), known
    )
    assert stored(swapped) == known
    assert subjects_of(cluster, "certs") == {a: "CN=certs-b,O=acme", b: "CN=certs-a2,O=acme"}

    cleared = reconcile(cluster, with_subjects(a=None, b="CN=certs-a2,O=acme"), known)
    assert subjects_of(cluster, "certs") == {a: None, b: "CN=certs-a2,O=acme"}
    assert "certificateSubject" not in cleared.status["keys"][0]

    # The Secret of "b" was lost: its new key takes the subject, the old one is revoked.
    replaced = stored(
        reconcile(cluster, with_subjects(a=None, b="CN=certs-a2,O=acme"), {"a": known["a"]})
    )
    assert replaced["b"].key_id != b
    assert subjects_of(cluster, "certs") == {a: None, replaced["b"].key_id: "CN=certs-a2,O=acme"}
    assert keys_of(cluster, "certs")[b].revoked


def test_a_certificate_subject_signs_in_as_one_key_only(cluster: GatewayCluster) -> None:
    subject = "CN=shared,O=acme"
    owner = tenant("cert-owner", keys=[{"name": "app", "certificateSubject": subject}])
    known = stored(reconcile(cluster, owner, {}))

    rival = tenant("cert-rival", keys=[{"name": "app", "certificateSubject": "CN=shared, O=acme"}])
    with pytest.raises(CertificateSubjectTakenError) as refused:
        reconcile(cluster, rival, {})
    assert str(refused.value) == (
        "spec.keys[app].certificateSubject: certificate subject 'CN=shared,O=acme'"
        " already signs in as a key this Tenant does not manage"
    )
    assert subjects_of(cluster, "cert-rival") == {}  # refused before any key was made

    # A key of the same tenant that the resource does not manage holds it too.
    async def by_hand(store: TenancyStore, _admin: ClusterAdmin) -> None:
        minted = mint_key("cert-owner", "made with the CLI", 0)
        await store.add_key(replace(minted.key, certificate_subject="CN=by-hand,O=acme"), [])

    on_the_cluster(cluster, by_hand)
    wants_by_hand = tenant(
        "cert-owner",
        keys=[
            {"name": "app", "certificateSubject": subject},
            {"name": "x", "certificateSubject": "CN=by-hand,O=acme"},
        ],
    )
    with pytest.raises(CertificateSubjectTakenError, match=r"spec\.keys\[x\]"):
        reconcile(cluster, wants_by_hand, known)

    # Once the owner lets go of it, the rival gets it.
    reconcile(cluster, tenant("cert-owner", keys=[{"name": "app"}]), known)
    claimed = stored(reconcile(cluster, rival, {}))
    assert subjects_of(cluster, "cert-rival") == {claimed["app"].key_id: subject}
