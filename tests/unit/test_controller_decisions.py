"""The controller's decisions: leader elections and preferred-leader rebalancing.

Each test builds a cluster image (brokers, topics, partition states with the
store revision of each), asks ``elect_leaders`` or
``rebalance_preferred_leaders`` what to change, and checks the changes as
Kafka's controller would make them: who leads, who stays in the ISR, which
epochs move, and which revision the compare-and-swap is guarded by.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence

import pytest
from shoal.broker.cluster.model import (
    NO_LEADER,
    BrokerRegistration,
    ClusterImage,
    NodeId,
    PartitionState,
    TopicImage,
    TopicName,
    TopicRecord,
)
from shoal.broker.cluster.store import PartitionChange
from shoal.broker.controller.decisions import (
    PREFERRED_ELECTION,
    UNCLEAN_ELECTION,
    ElectionOutcome,
    IsrChangeRefusedError,
    IsrChangeRequest,
    alter_isr,
    changed_since,
    elect_leaders,
    elect_requested,
    rebalance_preferred_leaders,
)

UNCLEAN = "unclean.leader.election.enable"
PartitionSpec = tuple[Sequence[int], PartitionState]
"""A partition's replica assignment (preferred leader first) and its state."""


def _state(
    leader: int, isr: Sequence[int], leader_epoch: int = 3, partition_epoch: int = 7
) -> PartitionState:
    return PartitionState(
        NodeId(leader), leader_epoch, tuple(NodeId(n) for n in isr), partition_epoch
    )


def _topic(
    name: str, partitions: Sequence[PartitionSpec], configs: Mapping[str, str] | None = None
) -> TopicImage:
    record = TopicRecord(
        TopicName(name),
        uuid.uuid5(uuid.NAMESPACE_DNS, name),
        tuple(tuple(NodeId(n) for n in replicas) for replicas, _ in partitions),
        dict(configs or {}),
    )
    return TopicImage(
        record,
        {i: state for i, (_, state) in enumerate(partitions)},
        revision=10,
        # Distinct per partition, so a test can tell which one guards a change.
        partition_revisions={i: 100 + 10 * i for i in range(len(partitions))},
    )


def _image(
    topics: Iterable[TopicImage], live: Iterable[int], shutting_down: Iterable[int] = ()
) -> ClusterImage:
    stopping = set(shutting_down)
    brokers = {
        NodeId(n): BrokerRegistration(NodeId(n), f"broker-{n}", 9092, None, n in stopping)
        for n in live
    }
    return ClusterImage.build("cluster", 500, brokers, {t.record.name: t for t in topics})


def _apply(image: ClusterImage, changes: Sequence[PartitionChange]) -> ClusterImage:
    """The image after the store accepted ``changes`` (each bumps its partition's revision)."""
    topics = dict(image.topics)
    for change in changes:
        topic = topics[change.topic]
        assert topic.partition_revisions[change.index] == change.expected_revision
        topics[change.topic] = TopicImage(
            topic.record,
            {**topic.partitions, change.index: change.state},
            topic.revision,
            {**topic.partition_revisions, change.index: change.expected_revision + 1},
        )
    return ClusterImage.build(image.cluster_id, image.revision + 1, image.brokers, topics)


def _never(_: TopicImage) -> bool:
    return False


def _by_config(topic: TopicImage) -> bool:
    return topic.record.configs.get(UNCLEAN) == "true"


def _only(changes: Sequence[PartitionChange]) -> PartitionChange:
    assert len(changes) == 1, changes
    return changes[0]


# -- a healthy cluster -------------------------------------------------------------


def test_healthy_cluster_needs_no_election_and_no_rebalance() -> None:
    orders = _topic(
        "orders",
        [
            ((1, 2, 3), _state(1, (1, 2, 3))),
            ((2, 3, 1), _state(2, (2, 3, 1))),
            ((3, 1, 2), _state(3, (3, 1, 2))),
        ],
    )
    image = _image([orders], live=(1, 2, 3))
    assert elect_leaders(image, _never) == []
    assert rebalance_preferred_leaders(image, 10) == []


def test_partition_without_state_yet_is_skipped() -> None:
    # A topic being created: its assignment is written before its partition states.
    record = TopicRecord(TopicName("new"), uuid.uuid4(), ((NodeId(1), NodeId(2)),))
    image = _image([TopicImage(record, {}, revision=10)], live=(2,))
    assert elect_leaders(image, _never) == []
    assert rebalance_preferred_leaders(image, 0) == []


# -- the leader goes away --------------------------------------------------------------


def test_dead_leader_is_replaced_by_the_first_live_isr_replica_in_assignment_order() -> None:
    # The ISR lists 3 before 2; Kafka picks by assignment order, so 2 leads.
    orders = _topic(
        "orders", [((1, 2, 3), _state(1, (1, 3, 2), leader_epoch=4, partition_epoch=9))]
    )
    change = _only(elect_leaders(_image([orders], live=(2, 3)), _never))
    assert (change.topic, change.index) == ("orders", 0)
    assert change.state.leader == 2
    assert set(change.state.isr) == {2, 3}
    assert change.state.leader_epoch == 5
    assert change.state.partition_epoch == 10
    assert change.expected_revision == orders.partition_revisions[0]


def test_dead_leader_is_not_replaced_by_a_live_replica_outside_the_isr() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 3)))])
    change = _only(elect_leaders(_image([orders], live=(2, 3)), _never))
    assert change.state.leader == 3
    assert change.state.isr == (3,)


def test_dead_follower_leaves_the_isr_and_the_leader_epoch_stays() -> None:
    orders = _topic(
        "orders", [((1, 2, 3), _state(1, (1, 2, 3), leader_epoch=4, partition_epoch=9))]
    )
    change = _only(elect_leaders(_image([orders], live=(1, 3)), _never))
    assert change.state.leader == 1
    assert change.state.isr == (1, 3)
    assert change.state.leader_epoch == 4, "followers leaving must not fence the leader"
    assert change.state.partition_epoch == 10
    assert change.expected_revision == orders.partition_revisions[0]


def test_each_change_is_guarded_by_its_own_partitions_revision() -> None:
    orders = _topic(
        "orders",
        [
            ((1, 2), _state(1, (1, 2))),
            ((2, 3), _state(2, (2, 3))),
            ((3, 1), _state(3, (3, 1))),
        ],
    )
    changes = elect_leaders(_image([orders], live=(1, 3)), _never)
    by_index = {c.index: c for c in changes}
    assert set(by_index) == {0, 1}, "partition 2 does not involve broker 2"
    assert by_index[0].state.isr == (1,)
    assert by_index[0].state.leader == 1
    assert by_index[1].state.leader == 3
    assert by_index[1].state.isr == (3,)
    for index, change in by_index.items():
        assert change.expected_revision == orders.partition_revisions[index]


# -- no ISR member left ---------------------------------------------------------------


def test_all_isr_replicas_dead_takes_the_partition_offline_and_keeps_its_isr() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 2), leader_epoch=4, partition_epoch=9))])
    change = _only(elect_leaders(_image([orders], live=(3,)), _never))
    assert change.state.leader == NO_LEADER
    assert change.state.isr == (1, 2), "the last ISR is what a clean election needs later"
    assert change.state.leader_epoch == 5
    assert change.state.partition_epoch == 10


def test_offline_partition_is_not_changed_again_while_its_isr_stays_dead() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 2)))])
    image = _image([orders], live=(3,))
    offline = _apply(image, elect_leaders(image, _never))
    assert elect_leaders(offline, _never) == []


def test_returning_isr_member_of_an_offline_partition_is_elected() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 2), leader_epoch=4))])
    image = _image([orders], live=(3,))
    offline = _apply(image, elect_leaders(image, _never))
    offline_state = offline.topics[TopicName("orders")].partitions[0]

    back = ClusterImage.build(
        "cluster",
        offline.revision + 1,
        {**offline.brokers, NodeId(2): BrokerRegistration(NodeId(2), "broker-2", 9092)},
        offline.topics,
    )
    change = _only(elect_leaders(back, _never))
    assert change.state.leader == 2
    assert change.state.isr == (2,), "broker 1 is still gone"
    assert change.state.leader_epoch == offline_state.leader_epoch + 1
    assert change.expected_revision == offline.topics[TopicName("orders")].partition_revisions[0]


def test_unclean_election_only_where_the_topic_allows_it() -> None:
    clean = _topic("clean", [((1, 2, 3), _state(1, (1, 2)))], {UNCLEAN: "false"})
    unclean = _topic("unclean", [((1, 2, 3), _state(1, (1, 2), leader_epoch=4))], {UNCLEAN: "true"})
    changes = {c.topic: c for c in elect_leaders(_image([clean, unclean], live=(3,)), _by_config)}
    assert changes[TopicName("clean")].state.leader == NO_LEADER
    assert changes[TopicName("clean")].state.isr == (1, 2)
    assert changes[TopicName("unclean")].state.leader == 3
    assert changes[TopicName("unclean")].state.isr == (3,)
    assert changes[TopicName("unclean")].state.leader_epoch == 5


def test_unclean_election_is_not_used_while_an_isr_replica_is_alive() -> None:
    # Replica 3 comes first in the assignment but is out of sync; 2 is in the ISR.
    orders = _topic("orders", [((3, 1, 2), _state(1, (1, 2)))], {UNCLEAN: "true"})
    change = _only(elect_leaders(_image([orders], live=(2, 3)), _by_config))
    assert change.state.leader == 2
    assert change.state.isr == (2,)


def test_unclean_election_of_an_offline_partition_once_a_replica_is_back() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(-1, (1, 2), leader_epoch=5))], {UNCLEAN: "true"})
    assert elect_leaders(_image([orders], live=()), _by_config) == []
    change = _only(elect_leaders(_image([orders], live=(3,)), _by_config))
    assert change.state.leader == 3
    assert change.state.isr == (3,)
    assert change.state.leader_epoch == 6


# -- controlled shutdown ------------------------------------------------------------------


def test_shutting_down_leader_hands_leadership_to_another_isr_member() -> None:
    orders = _topic(
        "orders", [((1, 2, 3), _state(1, (1, 2, 3), leader_epoch=4, partition_epoch=9))]
    )
    image = _image([orders], live=(1, 2, 3), shutting_down=(1,))
    change = _only(elect_leaders(image, _never))
    assert change.state.leader == 2
    assert change.state.isr == (2, 3), "the stopping broker leaves the ISR"
    assert change.state.leader_epoch == 5
    assert change.state.partition_epoch == 10


def test_shutting_down_follower_leaves_the_isr() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 2, 3), leader_epoch=4))])
    image = _image([orders], live=(1, 2, 3), shutting_down=(2,))
    change = _only(elect_leaders(image, _never))
    assert change.state.leader == 1
    assert change.state.isr == (1, 3)
    assert change.state.leader_epoch == 4


def test_shutting_down_sole_isr_member_keeps_leading() -> None:
    # 2 and 3 are alive but out of sync: moving leadership there would lose data.
    orders = _topic("orders", [((1, 2, 3), _state(1, (1,)))])
    image = _image([orders], live=(1, 2, 3), shutting_down=(1,))
    assert elect_leaders(image, _never) == []


def test_shutting_down_sole_isr_member_keeps_leading_even_where_unclean_is_allowed() -> None:
    # A planned restart never trades data for availability; only a dead leader does.
    orders = _topic("orders", [((1, 2, 3), _state(1, (1,)))], {UNCLEAN: "true"})
    image = _image([orders], live=(1, 2, 3), shutting_down=(1,))
    assert elect_leaders(image, _by_config) == []


def test_shutting_down_broker_is_never_elected() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 2, 3)))])
    image = _image([orders], live=(2, 3), shutting_down=(2,))
    change = _only(elect_leaders(image, _never))
    assert change.state.leader == 3
    assert change.state.isr == (3,)


# -- preferred leaders ------------------------------------------------------------------


def _led_by_2(count: int, moved: int) -> TopicImage:
    """``count`` partitions preferring broker 1; the first ``moved`` are led by broker 2."""
    return _topic(
        "orders",
        [
            ((1, 2, 3), _state(2 if i < moved else 1, (1, 2, 3), leader_epoch=4, partition_epoch=9))
            for i in range(count)
        ],
    )


def test_preferred_leader_takes_leadership_back_past_the_imbalance_threshold() -> None:
    orders = _led_by_2(count=10, moved=2)  # 20% > 10%
    changes = rebalance_preferred_leaders(_image([orders], live=(1, 2, 3)), 10)
    assert sorted(c.index for c in changes) == [0, 1]
    for change in changes:
        assert change.state.leader == 1
        assert change.state.isr == (1, 2, 3)
        assert change.state.leader_epoch == 5
        assert change.state.partition_epoch == 10
        assert change.expected_revision == orders.partition_revisions[change.index]


def test_imbalance_at_or_below_the_threshold_is_tolerated() -> None:
    # Kafka rebalances when the ratio is above leader.imbalance.per.broker.percentage.
    image = _image([_led_by_2(count=10, moved=1)], live=(1, 2, 3))
    assert rebalance_preferred_leaders(image, 10) == []
    assert len(rebalance_preferred_leaders(image, 9)) == 1


def test_preferred_replica_out_of_the_isr_does_not_take_leadership() -> None:
    orders = _topic(
        "orders",
        [
            ((1, 2, 3), _state(2, (2, 3))),
            ((1, 2, 3), _state(2, (1, 2, 3))),
        ],
    )
    change = _only(rebalance_preferred_leaders(_image([orders], live=(1, 2, 3)), 10))
    assert change.index == 1
    assert change.state.leader == 1


def test_preferred_replica_that_is_dead_or_shutting_down_does_not_take_leadership() -> None:
    orders = _led_by_2(count=4, moved=4)
    assert rebalance_preferred_leaders(_image([orders], live=(2, 3)), 10) == []
    stopping = _image([orders], live=(1, 2, 3), shutting_down=(1,))
    assert rebalance_preferred_leaders(stopping, 10) == []


def test_rebalance_counts_imbalance_per_preferred_broker() -> None:
    # Broker 1 prefers 10 partitions and leads 9; broker 2 prefers 2 and leads none.
    orders = _topic(
        "orders",
        [((1, 2), _state(2 if i == 0 else 1, (1, 2))) for i in range(10)]
        + [((2, 1), _state(1, (1, 2))) for _ in range(2)],
    )
    changes = rebalance_preferred_leaders(_image([orders], live=(1, 2)), 10)
    assert sorted(c.index for c in changes) == [10, 11]
    assert all(c.state.leader == 2 for c in changes)


# -- AlterPartition: a leader's ISR request ------------------------------------------


def _isr_request(
    topic: TopicImage,
    broker: int = 1,
    isr: Sequence[int] = (1, 2, 3),
    leader_epoch: int = 3,
    partition_epoch: int = 7,
) -> IsrChangeRequest:
    return IsrChangeRequest(
        NodeId(broker),
        topic.record.topic_id,
        0,
        leader_epoch,
        partition_epoch,
        tuple(NodeId(n) for n in isr),
    )


def test_leader_adds_a_caught_up_follower_at_its_current_epochs() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 2)))])
    change = alter_isr(_image([orders], live=(1, 2, 3)), _isr_request(orders))
    assert change is not None
    assert change.state.isr == (1, 2, 3)
    assert change.state.leader == 1
    assert change.state.leader_epoch == 3, "an ISR change is not a leader change"
    assert change.state.partition_epoch == 8
    assert change.expected_revision == 100


def test_isr_request_already_in_effect_changes_nothing() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 2, 3)))])
    assert alter_isr(_image([orders], live=(1, 2, 3)), _isr_request(orders)) is None


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"leader_epoch": 2}, "fenced_leader_epoch"),
        ({"partition_epoch": 6}, "invalid_update_version"),
        ({"broker": 2}, "invalid_request"),
        ({"isr": (2, 3)}, "invalid_request"),
        ({"isr": (1, 2, 4)}, "invalid_request"),
        ({"isr": (1, 2, 2)}, "invalid_request"),
    ],
)
def test_isr_requests_kafka_refuses(kwargs: dict[str, object], code: str) -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 2)))])
    with pytest.raises(IsrChangeRefusedError) as refused:
        alter_isr(_image([orders], live=(1, 2, 3)), _isr_request(orders, **kwargs))  # type: ignore[arg-type]
    assert refused.value.code == code


def test_a_gone_or_shutting_down_broker_may_not_join_the_isr() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 2)))])
    for image in (
        _image([orders], live=(1, 2)),
        _image([orders], live=(1, 2, 3), shutting_down=(3,)),
    ):
        with pytest.raises(IsrChangeRefusedError) as refused:
            alter_isr(image, _isr_request(orders))
        assert refused.value.code == "ineligible_replica"


def test_isr_request_for_an_unknown_topic_id() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(1, (1, 2)))])
    other = _topic("other", [((1, 2, 3), _state(1, (1, 2)))])
    with pytest.raises(IsrChangeRefusedError) as refused:
        alter_isr(_image([orders], live=(1, 2, 3)), _isr_request(other))
    assert refused.value.code == "unknown_topic_id"


# -- ElectLeaders: elections an admin asks for ---------------------------------------------


def _outcomes(
    image: ClusterImage, wanted: Sequence[tuple[str, int]] | None, kind: int
) -> dict[tuple[str, int], ElectionOutcome]:
    return {(o.topic, o.index): o for o in elect_requested(image, wanted, kind, _by_config)}


def test_preferred_election_moves_leadership_back_to_the_first_replica() -> None:
    orders = _topic("orders", [((1, 2, 3), _state(2, (1, 2, 3), leader_epoch=4))])
    [outcome] = elect_requested(
        _image([orders], live=(1, 2, 3)), [("orders", 0)], PREFERRED_ELECTION, _never
    )
    assert outcome.code is None
    assert outcome.change is not None
    assert (outcome.change.state.leader, outcome.change.state.leader_epoch) == (1, 5)
    assert outcome.change.state.isr == (1, 2, 3)
    assert outcome.change.expected_revision == 100


def test_preferred_election_answers_as_kafka_for_each_partition() -> None:
    orders = _topic(
        "orders",
        [
            ((1, 2), _state(1, (1, 2))),  # the preferred replica leads already
            ((3, 1), _state(1, (1,))),  # preferred alive but out of sync
            ((4, 1), _state(1, (1, 4))),  # preferred in the ISR but gone
        ],
    )
    wanted = [("orders", 0), ("orders", 1), ("orders", 2), ("orders", 3), ("nope", 0)]
    outcomes = _outcomes(_image([orders], live=(1, 2, 3)), wanted, PREFERRED_ELECTION)
    assert {key: o.code for key, o in outcomes.items()} == {
        ("orders", 0): "election_not_needed",
        ("orders", 1): "preferred_leader_not_available",
        ("orders", 2): "preferred_leader_not_available",
        ("orders", 3): "unknown_topic_or_partition",
        ("nope", 0): "unknown_topic_or_partition",
    }
    assert all(o.change is None for o in outcomes.values())


def test_election_of_every_partition_leaves_out_those_that_need_none() -> None:
    orders = _topic("orders", [((1, 2), _state(1, (1, 2))), ((1, 2), _state(2, (1, 2)))])
    outcomes = _outcomes(_image([orders], live=(1, 2)), None, PREFERRED_ELECTION)
    assert list(outcomes) == [("orders", 1)]
    assert outcomes["orders", 1].code is None


def test_unclean_election_is_for_partitions_without_a_leader() -> None:
    led = _topic("led", [((1, 2), _state(1, (1, 2)))], {UNCLEAN: "true"})
    outcomes = _outcomes(_image([led], live=(1, 2)), [("led", 0)], UNCLEAN_ELECTION)
    assert outcomes["led", 0].code == "election_not_needed"


def test_unclean_election_takes_a_live_replica_only_where_the_topic_allows_it() -> None:
    allowed = _topic(
        "allowed", [((1, 2, 3), _state(-1, (1, 2), leader_epoch=5))], {UNCLEAN: "true"}
    )
    refused = _topic("refused", [((1, 2, 3), _state(-1, (1, 2)))])
    outcomes = _outcomes(
        _image([allowed, refused], live=(3,)), [("allowed", 0), ("refused", 0)], UNCLEAN_ELECTION
    )
    change = outcomes["allowed", 0].change
    assert change is not None
    assert (change.state.leader, change.state.isr, change.state.leader_epoch) == (3, (3,), 6)
    assert outcomes["refused", 0].code == "eligible_leaders_not_available"
    assert "unclean.leader.election.enable" in (outcomes["refused", 0].message or "")


def test_unclean_election_prefers_a_live_in_sync_replica() -> None:
    orders = _topic("orders", [((3, 1, 2), _state(-1, (1, 2)))], {UNCLEAN: "true"})
    outcomes = _outcomes(_image([orders], live=(2, 3)), [("orders", 0)], UNCLEAN_ELECTION)
    change = outcomes["orders", 0].change
    assert change is not None
    assert (change.state.leader, change.state.isr) == (2, (2,))


def test_unclean_election_with_no_replica_alive_elects_nobody() -> None:
    orders = _topic("orders", [((1, 2), _state(-1, (1,)))], {UNCLEAN: "true"})
    outcomes = _outcomes(_image([orders], live=(3,)), [("orders", 0)], UNCLEAN_ELECTION)
    assert outcomes["orders", 0].code == "eligible_leaders_not_available"


def test_after_a_settled_image_only_the_topics_that_changed_are_decided_on() -> None:
    quiet = _topic("quiet", [([0, 1, 2], _state(0, [0, 1, 2]))])
    busy = _topic("busy", [([0, 1, 2], _state(1, [0, 1, 2]))])
    settled = _image([quiet, busy], live=[0, 1, 2])
    # Broker 1's lease lapsed and the store wrote "busy" again meanwhile.
    busy_again = _topic("busy", [([0, 1, 2], _state(1, [1, 2]))])
    same_brokers = _image([quiet, busy_again], live=[0, 1, 2])
    scope = changed_since(settled, same_brokers)
    assert set(scope.topics) == {"busy"}
    assert scope.brokers == same_brokers.brokers

    # Other brokers: any partition may need a leader or a smaller ISR, so the whole image.
    one_gone = _image([quiet, busy_again], live=[0, 2])
    assert changed_since(settled, one_gone) is one_gone
    changes = elect_leaders(changed_since(settled, one_gone), _never)
    assert {c.topic for c in changes} == {"quiet", "busy"}
    assert changed_since(None, same_brokers) is same_brokers


def _never(_topic: TopicImage) -> bool:
    return False
