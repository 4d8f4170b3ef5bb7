"""When the roller may restart a broker, in which order, and when it has rejoined."""

from __future__ import annotations

from shoal.operator.cluster_state import PartitionInfo
from shoal.operator.roller import (
    RollBlocked,
    rejoin_pending,
    restart_blockers,
    roll_order,
)


def part(
    topic: str, isr: tuple[int, ...], replicas: tuple[int, ...] = (0, 1, 2), partition: int = 0
) -> PartitionInfo:
    leader = isr[0] if isr else -1
    return PartitionInfo(topic, partition, leader, replicas, isr)


def offline(
    topic: str, last_isr: tuple[int, ...], replicas: tuple[int, ...] = (0, 1, 2)
) -> PartitionInfo:
    """No leader; the controller keeps the last ISR, as Kafka's does."""
    return PartitionInfo(topic, 0, -1, replicas, last_isr)


MIN2 = {"orders": 2}


def test_full_isr_of_three_with_min_two_is_safe() -> None:
    assert restart_blockers(0, [part("orders", (0, 1, 2))], MIN2) == []


def test_isr_of_two_including_the_broker_blocks_with_partition_and_numbers() -> None:
    reasons = restart_blockers(0, [part("orders", (0, 1), partition=3)], MIN2)
    assert reasons == [
        "orders-3: ISR [0, 1] without broker 0 has 1 member(s), below min.insync.replicas=2"
    ]


def test_isr_of_two_without_the_broker_is_safe() -> None:
    assert restart_blockers(2, [part("orders", (0, 1))], MIN2) == []


def test_broker_out_of_an_isr_already_under_min_does_not_block() -> None:
    # Restarting a lagging or dead follower cannot shrink the ISR; it may be the repair.
    assert restart_blockers(2, [part("orders", (0,))], MIN2) == []


def test_last_in_sync_replica_blocks() -> None:
    reasons = restart_blockers(0, [part("orders", (0,))], MIN2)
    assert len(reasons) == 1
    assert reasons[0].startswith("orders-0: broker 0 is its last in-sync replica")
    assert "ISR [0]" in reasons[0]


def test_last_in_sync_replica_blocks_even_when_min_isr_is_one() -> None:
    reasons = restart_blockers(1, [part("logs", (1,))], {"logs": 1})
    assert [r.split(":")[0] for r in reasons] == ["logs-0"]


def test_replication_factor_one_never_blocks() -> None:
    single = part("scratch", (0,), replicas=(0,))
    assert restart_blockers(0, [single], {"scratch": 1}) == []
    assert restart_blockers(0, [single], {"scratch": 2}) == []


def test_replication_factor_at_min_isr_allows_a_restart_that_keeps_a_leader() -> None:
    # Any restart of any replica stalls acks=all writes here; waiting would never help.
    assert restart_blockers(0, [part("strict", (0, 1, 2))], {"strict": 3}) == []
    assert restart_blockers(0, [part("pair", (0, 1), replicas=(0, 1))], {"pair": 2}) == []


def test_replication_factor_at_min_isr_still_refuses_to_go_offline() -> None:
    reasons = restart_blockers(0, [part("pair", (0,), replicas=(0, 1))], {"pair": 2})
    assert [r.split(":")[0] for r in reasons] == ["pair-0"]


def test_in_sync_member_of_a_partition_already_under_min_blocks() -> None:
    # RF 4, min 3, ISR {0, 1}: the broker holds one of the two in-sync copies left.
    reasons = restart_blockers(0, [part("wide", (0, 1), replicas=(0, 1, 2, 3))], {"wide": 3})
    assert reasons == [
        "wide-0: ISR [0, 1] without broker 0 has 1 member(s), below min.insync.replicas=3"
    ]


def test_offline_partition_does_not_block_even_if_its_last_isr_names_the_broker() -> None:
    assert restart_blockers(0, [offline("orders", (0,))], MIN2) == []


def test_topics_with_different_min_isr_are_judged_each_by_its_own() -> None:
    partitions = [
        part("relaxed", (0, 1)),
        part("strict", (0, 1, 2)),
        part("orders", (0, 2), partition=0),
        part("orders", (0, 1, 2), partition=1),
        part("__consumer_offsets", (1, 0), partition=7),
    ]
    min_isr = {"relaxed": 1, "strict": 3, "orders": 2, "__consumer_offsets": 2}
    reasons = restart_blockers(0, partitions, min_isr)
    assert [r.split(":")[0] for r in reasons] == ["orders-0", "__consumer_offsets-7"]


def test_a_topic_missing_from_min_isr_counts_as_kafkas_default_of_one() -> None:
    assert restart_blockers(0, [part("new", (0, 1))], {}) == []
    assert restart_blockers(0, [part("new", (0,))], {}) != []


def test_partitions_of_other_brokers_are_ignored() -> None:
    assert restart_blockers(3, [part("orders", (0,)), part("orders", (0, 1))], MIN2) == []


def test_roll_blocked_keeps_every_reason_and_spells_out_the_first_few() -> None:
    reasons = [f"t-{i}: blocked" for i in range(8)]
    error = RollBlocked(2, reasons)
    assert error.reasons == reasons
    assert error.node_id == 2
    assert str(error).startswith("broker 2 cannot restart safely: t-0: blocked; t-1: blocked")
    assert str(error).endswith("t-4: blocked; and 3 more")


def test_roll_order_is_descending_with_the_controller_last() -> None:
    assert roll_order([0, 1, 2], controller_id=1, registered=[0, 1, 2]) == [2, 0, 1]
    assert roll_order([0, 1, 2, 3, 4], controller_id=None, registered=range(5)) == [4, 3, 2, 1, 0]


def test_roll_order_restarts_unregistered_brokers_first() -> None:
    assert roll_order([0, 1, 2, 3], controller_id=3, registered=[0, 2, 3]) == [1, 2, 0, 3]


def test_roll_order_ignores_a_controller_outside_the_roll() -> None:
    assert roll_order([1, 2], controller_id=0, registered=[0, 1, 2]) == [2, 1]


def test_rejoined_when_back_in_every_isr() -> None:
    partitions = [part("orders", (1, 0, 2)), part("logs", (1, 2), replicas=(1, 2))]
    assert rejoin_pending(0, partitions, offline_before=set()) == []


def test_not_rejoined_while_missing_from_an_isr_or_a_leader_is_missing() -> None:
    partitions = [
        part("orders", (1, 2), partition=0),
        part("orders", (0, 1, 2), partition=1),
        PartitionInfo("single", 0, -1, (0,), (0,)),
    ]
    assert rejoin_pending(0, partitions, offline_before=set()) == [
        "orders-0: broker 0 not in ISR [1, 2]",
        "single-0: no leader yet",
    ]


def test_partitions_offline_before_the_restart_are_not_waited_for() -> None:
    stuck = offline("orders", (2,))
    assert rejoin_pending(0, [stuck], offline_before={("orders", 0)}) == []
