"""Tenancy records and API key secrets: names, JSON round trips, slow salted hashes."""

from __future__ import annotations

import pytest
from shoal.tenancy.model import (
    AclBinding,
    ApiKey,
    Operation,
    PatternType,
    Permission,
    Quotas,
    ResourceType,
    TenancyError,
    Tenant,
    validate_tenant_name,
)
from shoal.tenancy.secrets import hash_secret, new_key_id, new_secret, verify_secret
from shoal.tenancy.store import binding_id


@pytest.mark.parametrize("name", ["acme", "a", "team-7", "x" * 63])
def test_tenant_names_that_can_prefix_topics_and_name_resources(name: str) -> None:
    assert validate_tenant_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "Acme", "acme.prod", "-acme", "acme-", "a_b", "x" * 64, "ac me", "ä"]
)
def test_tenant_names_refused(name: str) -> None:
    with pytest.raises(TenancyError):
        validate_tenant_name(name)


def test_records_round_trip_through_json() -> None:
    tenant = Tenant("acme", 1700000000000, Quotas(1048576.0, None, 12))
    assert Tenant.from_json(tenant.to_json()) == tenant
    key = ApiKey("KABC", "acme", "scrypt$...", 1700000000000, "ci", None)
    assert ApiKey.from_json(key.to_json()) == key
    assert not key.revoked
    binding = AclBinding(
        "acme",
        "*",
        ResourceType.TOPIC,
        PatternType.PREFIXED,
        "orders",
        Operation.WRITE,
        Permission.DENY,
    )
    assert AclBinding.from_dict(binding.to_dict()) == binding


def test_the_same_binding_has_one_id_and_another_binding_another() -> None:
    a = AclBinding("acme", "*", ResourceType.TOPIC, PatternType.LITERAL, "x", Operation.READ)
    b = AclBinding("acme", "*", ResourceType.TOPIC, PatternType.LITERAL, "x", Operation.WRITE)
    assert binding_id(a) == binding_id(AclBinding.from_dict(a.to_dict()))
    assert binding_id(a) != binding_id(b)


def test_key_ids_and_secrets_are_random_and_config_file_safe() -> None:
    ids = {new_key_id() for _ in range(200)}
    secrets = {new_secret() for _ in range(200)}
    assert len(ids) == 200
    assert len(secrets) == 200
    assert all(i.isalnum() and i.isupper() and len(i) == 17 for i in ids)
    assert all(len(s) >= 40 and "=" not in s and "\n" not in s for s in secrets)


def test_a_secret_verifies_only_against_its_own_salted_hash() -> None:
    secret = new_secret()
    first, second = hash_secret(secret), hash_secret(secret)
    assert first != second, "each hash has its own salt"
    assert secret not in first
    assert verify_secret(secret, first)
    assert verify_secret(secret, second)
    assert not verify_secret(secret[:-1], first)
    assert not verify_secret(new_secret(), first)


@pytest.mark.parametrize(
    "stored", ["", "plain", "scrypt$1$2$3", "md5$16384$8$1$c2FsdA$ZGlnZXN0", "scrypt$x$8$1$a$b"]
)
def test_a_malformed_stored_hash_never_verifies(stored: str) -> None:
    assert not verify_secret("anything", stored)


def test_a_binding_without_a_resource_name_is_refused() -> None:
    with pytest.raises(TenancyError):
        AclBinding("acme", "*", ResourceType.TOPIC, PatternType.PREFIXED, "", Operation.READ)
