"""The operator replaces only the bindings it declared, never those a tenant made
through Kafka's CreateAcls, even for the principals it manages."""

from __future__ import annotations

from dataclasses import replace

from shoal.operator.tenants import binding_changes
from shoal.tenancy.model import AclBinding, BindingSource, Operation, PatternType, ResourceType


def _read(principal: str, name: str) -> AclBinding:
    return AclBinding(
        "acme", principal, ResourceType.TOPIC, PatternType.LITERAL, name, Operation.READ
    )


def test_bindings_made_through_the_kafka_api_survive_a_reconcile() -> None:
    made = [
        replace(_read("KA", "orders"), source=BindingSource.KAFKA_API),
        replace(_read("*", "audit"), source=BindingSource.KAFKA_API),
    ]
    declared_gone = _read("KA", "dropped")
    add, remove = binding_changes([*made, declared_gone], [_read("KA", "keep")], {"KA", "*"})
    assert add == [_read("KA", "keep")]
    assert remove == [declared_gone]


def test_a_declared_binding_is_added_even_if_the_tenant_made_its_twin() -> None:
    twin = replace(_read("KA", "orders"), source=BindingSource.KAFKA_API)
    add, remove = binding_changes([twin], [_read("KA", "orders")], {"KA"})
    assert add == [_read("KA", "orders")]
    assert remove == []
