"""`shoal tenant|key|acl|quota` against a real etcd (and a broker for tenant deletion)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import BrokerFactory
from harness import EtcdServer
from shoal.tenancy.secrets import verify_secret
from shoal.tenancy.store import TenancyStore


def shoal(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    result = subprocess.run(
        [sys.executable, "-m", "shoal", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def as_json(*args: str) -> Any:
    return json.loads(shoal(*args, "-o", "json").stdout)


def test_tenants_keys_acls_and_quotas(etcd: EtcdServer) -> None:
    url = etcd.chroot_url()
    assert as_json("tenant", "create", "acme", "--etcd", url)["name"] == "acme"
    again = shoal("tenant", "create", "acme", "--etcd", url, check=False)
    assert again.returncode == 1
    assert "already exists" in again.stderr
    bad = shoal("tenant", "create", "Not.Valid", "--etcd", url, check=False)
    assert bad.returncode == 1
    assert "tenant name" in bad.stderr

    created = as_json("key", "create", "acme", "--etcd", url, "--description", "ci")
    assert created["key_id"].startswith("K")
    assert len(created["secret"]) >= 40
    assert created["tenant"] == "acme"
    read_only = as_json("key", "create", "acme", "--etcd", url, "--read-only")
    ops = {(a["resource_type"], a["operation"]) for a in read_only["acls"]}
    assert ("TOPIC", "READ") in ops
    assert not any(op in ("WRITE", "ALL", "CREATE") for _, op in ops)

    listed = as_json("key", "list", "acme", "--etcd", url)
    assert {k["key_id"] for k in listed} == {created["key_id"], read_only["key_id"]}
    assert "secret" not in json.dumps(listed)
    nothing = shoal("key", "create", "nobody", "--etcd", url, check=False)
    assert nothing.returncode == 1
    assert "does not exist" in nothing.stderr

    # Only a slow salted hash is stored, and it verifies the secret shown once.
    async def stored_hash() -> str:
        async with TenancyStore(url) as store:
            key = await store.get_key(created["key_id"])
            assert key is not None
            return key.secret_hash

    secret_hash = asyncio.run(stored_hash())
    assert created["secret"] not in secret_hash
    assert secret_hash.startswith("scrypt$")
    assert verify_secret(created["secret"], secret_hash)
    assert not verify_secret(created["secret"] + "x", secret_hash)

    revoked = as_json("key", "revoke", created["key_id"], "--etcd", url)
    assert revoked["revoked"] is True

    added = as_json(
        "acl", "add", "acme", "--etcd", url, "--resource-type", "topic", "--name", "orders",
        "--prefixed", "--operation", "write", "--principal", read_only["key_id"],
    )  # fmt: skip
    assert added["pattern_type"] == "PREFIXED"
    acls = as_json("acl", "list", "acme", "--etcd", url)
    assert added in acls
    shoal(
        "acl", "remove", "acme", "--etcd", url, "--resource-type", "topic", "--name", "orders",
        "--prefixed", "--operation", "write", "--principal", read_only["key_id"],
    )  # fmt: skip
    assert added not in as_json("acl", "list", "acme", "--etcd", url)

    quotas = as_json(
        "quota", "set", "acme", "--etcd", url, "--producer-byte-rate", "1048576",
        "--max-partitions", "12", "--max-connections", "40",
        "--controller-mutation-rate", "2.5", "--max-storage-bytes", "200000",
        "--max-connection-rate", "4", "--request-percentage", "150",
    )  # fmt: skip
    assert quotas["quotas"] == {
        "producer_byte_rate": 1048576,
        "consumer_byte_rate": None,
        "max_partitions": 12,
        "max_connections": 40,
        "controller_mutation_rate": 2.5,
        "max_storage_bytes": 200000,
        "max_connection_rate": 4.0,
        "request_percentage": 150.0,
    }
    shown = as_json("quota", "show", "acme", "--etcd", url)
    assert shown["producer_byte_rate"] == 1048576
    assert shown["controller_mutation_rate"] == 2.5
    assert shown["max_storage_bytes"] == 200000
    assert shown["max_connection_rate"] == 4.0
    assert shown["request_percentage"] == 150.0
    refused = shoal("quota", "set", "acme", "--etcd", url, "--request-percentage", "0", check=False)
    assert refused.returncode != 0 and "greater than 0" in refused.stderr
    refused = shoal(
        "quota", "set", "acme", "--etcd", url, "--max-connection-rate", "0", check=False
    )
    assert refused.returncode != 0 and "greater than 0" in refused.stderr
    refused = shoal(
        "quota", "set", "acme", "--etcd", url, "--controller-mutation-rate", "0", check=False
    )
    assert refused.returncode != 0 and "greater than 0" in refused.stderr
    described = as_json("tenant", "describe", "acme", "--etcd", url)
    assert len(described["keys"]) == 2
    assert [t["name"] for t in as_json("tenant", "list", "--etcd", url)] == ["acme"]


def test_deleting_a_tenant_deletes_its_topics_groups_keys_and_acls(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory()
    url = broker.etcd_url
    shoal("tenant", "create", "acme", "--etcd", url)
    shoal("tenant", "create", "other", "--etcd", url)
    key = as_json("key", "create", "acme", "--etcd", url)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics(
        [NewTopic(name, 1) for name in ("acme.orders", "acme.audit", "other.orders")]
    ).values():
        future.result(30)
    for group in ("acme.readers", "other.readers"):
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        consumer.commit(offsets=[TopicPartition("other.orders", 0, 0)], asynchronous=False)
        consumer.close()

    done = shoal("tenant", "delete", "acme", "--etcd", url, "--brokers", broker.bootstrap)
    assert "2 topics, 1 groups, 1 keys" in done.stdout
    assert set(admin.list_topics(timeout=10).topics) - {"__consumer_offsets"} == {"other.orders"}
    groups = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
    assert groups == {"other.readers"}
    assert shoal("tenant", "describe", "acme", "--etcd", url, check=False).returncode == 1
    assert as_json("key", "list", "--etcd", url) == []
    assert key["key_id"] not in shoal("key", "list", "--etcd", url).stdout
    assert [t["name"] for t in as_json("tenant", "list", "--etcd", url)] == ["other"]
