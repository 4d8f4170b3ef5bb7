"""Reading a Topic's spec, and the config changes that make a topic match it."""

from __future__ import annotations

import pytest
from shoal.operator.cluster_state import PartitionInfo, TopicState
from shoal.operator.topics import TopicSpec, config_changes


def test_the_crd_defaults_apply_and_the_broker_name_is_the_tenants() -> None:
    spec = TopicSpec.from_resource("orders", {"cluster": "c", "tenant": "acme", "partitions": 6})
    assert spec.topic_name == "orders"
    assert spec.broker_name == "acme.orders"
    assert spec.replicas == 3
    assert dict(spec.config) == {}


def test_topic_name_overrides_the_resource_name() -> None:
    spec = TopicSpec.from_resource(
        "orders-k8s",
        {"cluster": "c", "tenant": "acme", "partitions": 1, "topicName": "Orders.v2"},
    )
    assert spec.broker_name == "acme.Orders.v2"


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ({"tenant": "acme", "partitions": 1}, "spec.cluster"),
        ({"cluster": "c", "tenant": "Acme", "partitions": 1}, "tenant name 'Acme'"),
        ({"cluster": "c", "tenant": "acme"}, "spec.partitions"),
        ({"cluster": "c", "tenant": "acme", "partitions": 0}, "spec.partitions"),
        ({"cluster": "c", "tenant": "acme", "partitions": 1, "replicas": 17}, "spec.replicas"),
        ({"cluster": "c", "tenant": "acme", "partitions": True}, "spec.partitions"),
        ({"cluster": "c", "tenant": "acme", "partitions": 1, "topicName": "a/b"}, "'a/b'"),
        (
            {"cluster": "c", "tenant": "acme", "partitions": 1, "config": {"retention.ms": 5}},
            "spec.config",
        ),
    ],
)
def test_bad_specs_are_refused_with_the_field_named(
    spec: dict[str, object], complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint.replace(".", r"\.")):
        TopicSpec.from_resource("orders", spec)


def test_config_changes_set_what_differs_and_reset_what_left_the_spec() -> None:
    to_set, to_reset = config_changes(
        {"retention.ms": "1000", "cleanup.policy": "compact"},
        {"retention.ms": "1000", "cleanup.policy": "delete", "segment.bytes": "1024"},
    )
    assert to_set == {"cleanup.policy": "compact"}
    assert to_reset == ["segment.bytes"]


def test_config_changes_are_empty_when_the_topic_matches() -> None:
    assert config_changes({"a": "1"}, {"a": "1"}) == ({}, [])


def test_topic_state_counts_partitions_short_of_their_replicas() -> None:
    state = TopicState(
        "acme.orders",
        "id",
        (
            PartitionInfo("acme.orders", 0, 1, (1, 2, 3), (1, 2, 3)),
            PartitionInfo("acme.orders", 1, 2, (2, 3, 1), (2,)),
            PartitionInfo("acme.orders", 2, -1, (3, 1, 2), (1, 2)),
        ),
    )
    assert state.replicas == 3
    assert state.under_replicated == 2
