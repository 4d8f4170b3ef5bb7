"""DescribeLogDirs' choice of replicas and its lag rule (the broker's pure part)."""

from shoal.broker.handlers.log_dirs import (
    ReplicaSize,
    offset_lag,
    requested_partitions,
    select,
)

REPLICAS = [
    ReplicaSize("b", 1, 300, 0),
    ReplicaSize("a", 2, 20, 0),
    ReplicaSize("a", 0, 10, 5),
    ReplicaSize("c", 0, 0, 0),
]


def test_a_null_filter_reports_every_hosted_replica_in_order() -> None:
    chosen = select(REPLICAS, requested_partitions(None))
    assert list(chosen) == ["a", "b", "c"]
    assert [r.partition for r in chosen["a"]] == [0, 2]


def test_a_filter_keeps_only_named_partitions_and_skips_unhosted_ones() -> None:
    wanted = requested_partitions([("a", [2, 7]), ("b", []), ("missing", [0]), ("a", [0])])
    chosen = select(REPLICAS, wanted)
    assert chosen == {"a": [ReplicaSize("a", 0, 10, 5), ReplicaSize("a", 2, 20, 0)]}


def test_an_empty_filter_reports_no_partitions() -> None:
    assert select(REPLICAS, requested_partitions([])) == {}


def test_lag_is_zero_on_the_leader_and_when_the_leaders_watermark_is_unknown() -> None:
    assert offset_lag(True, 100, 40) == 0
    assert offset_lag(False, None, 40) == 0
    assert offset_lag(False, 100, 40) == 60
    # A follower's log end may pass the watermark the leader last sent.
    assert offset_lag(False, 100, 120) == 0
