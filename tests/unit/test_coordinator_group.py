"""Group and Member state: protocol choice, subscriptions, membership bookkeeping, storage form."""

from __future__ import annotations

import asyncio
import struct

from coordinator_fixtures import consumer_subscription
from shoal.broker.coordinator.group import Group, GroupState, Member, subscribed_topics
from shoal.broker.coordinator.records import GroupValue, MemberValue


def member(
    member_id: str,
    protocols: list[tuple[str, bytes]] | None = None,
    *,
    instance: str | None = None,
    protocol_type: str = "consumer",
    rebalance_ms: int = 1000,
) -> Member:
    return Member(
        member_id,
        instance,
        "client",
        "/host",
        5000,
        rebalance_ms,
        protocol_type,
        protocols if protocols is not None else [("range", consumer_subscription("t"))],
    )


def names(*protocols: str) -> list[tuple[str, bytes]]:
    return [(name, name.encode()) for name in protocols]


# -- protocols ---------------------------------------------------------------------


def test_an_empty_group_supports_any_protocol_type_with_some_protocol() -> None:
    group = Group("g")
    assert group.supports("consumer", names("range"))
    assert group.supports("connect", names("sessioned"))
    assert not group.supports("", names("range"))
    assert not group.supports("consumer", [])


def test_a_group_with_members_needs_the_same_type_and_a_protocol_everyone_supports() -> None:
    group = Group("g")
    group.add(member("a", names("range", "roundrobin")))
    group.add(member("b", names("roundrobin", "sticky")))
    assert group.candidate_protocols() == {"roundrobin"}
    assert group.supports("consumer", names("roundrobin"))
    assert not group.supports("consumer", names("range"))
    assert not group.supports("connect", names("roundrobin"))


def test_protocol_selection_is_by_votes_among_protocols_all_members_support() -> None:
    group = Group("g")
    # Shared by all: range and cooperative. a and b vote range (b's favourite is not
    # shared), c votes cooperative: range wins two to one.
    group.add(member("a", names("range", "cooperative")))
    group.add(member("b", names("only-b", "range", "cooperative")))
    group.add(member("c", names("cooperative", "range")))
    assert group.candidate_protocols() == {"range", "cooperative"}
    assert group.select_protocol() == "range"


def test_a_members_vote_skips_protocols_not_everyone_supports() -> None:
    m = member("a", names("sticky", "range"))
    assert m.vote({"range"}) == "range"


def test_metadata_for_a_protocol_the_member_does_not_list_is_empty() -> None:
    m = member("a", [("range", b"r"), ("sticky", b"s")])
    assert m.metadata_for("sticky") == b"s"
    assert m.metadata_for("roundrobin") == b""
    assert m.metadata_for(None) == b""


def test_max_rebalance_timeout_is_the_largest_of_the_members() -> None:
    group = Group("g")
    assert group.max_rebalance_timeout_ms == 0
    group.add(member("a", rebalance_ms=100))
    group.add(member("b", rebalance_ms=700))
    assert group.max_rebalance_timeout_ms == 700


# -- membership bookkeeping -----------------------------------------------------------


def test_the_first_member_added_leads_and_sets_the_protocol_type() -> None:
    group = Group("g")
    group.add(member("a", protocol_type="connect"))
    group.add(member("b", protocol_type="connect"))
    assert group.leader_id == "a"
    assert group.protocol_type == "connect"


def test_removing_the_leader_hands_leadership_to_a_remaining_member() -> None:
    group = Group("g")
    for name in ("a", "b", "c"):
        group.add(member(name))
    removed = group.remove("a")
    assert removed is not None and removed.member_id == "a"
    assert group.leader_id in {"b", "c"}
    group.remove("b")
    group.remove("c")
    assert group.leader_id is None
    assert group.remove("zzz") is None


def test_static_members_are_indexed_by_instance_id() -> None:
    group = Group("g")
    group.add(member("m-1", instance="i-1"))
    group.add(member("m-2"))
    assert group.static_members == {"i-1": "m-1"}
    group.remove("m-1")
    assert group.static_members == {}


def test_removing_a_replaced_static_member_keeps_the_instance_of_its_successor() -> None:
    group = Group("g")
    group.add(member("old", instance="i-1"))
    group.static_members["i-1"] = "new"
    group.remove("old")
    assert group.static_members == {"i-1": "new"}


# -- subscriptions ------------------------------------------------------------------------


def test_subscribed_topics_reads_a_version_0_consumer_subscription() -> None:
    assert subscribed_topics(consumer_subscription("orders", "payments")) == {
        "orders",
        "payments",
    }


def test_subscribed_topics_reads_a_later_version_with_owned_partitions() -> None:
    # v1 adds owned partitions after user data; only the topic list is read.
    v1 = (
        struct.pack(">hi", 1, 1)
        + struct.pack(">h", 6)
        + b"orders"
        + struct.pack(">i", 3)
        + b"abc"
        + struct.pack(">i", 1)
        + struct.pack(">h", 6)
        + b"orders"
        + struct.pack(">ii", 1, 0)
    )
    assert subscribed_topics(v1) == {"orders"}


def test_unreadable_subscriptions_count_as_no_topics() -> None:
    assert subscribed_topics(b"") == frozenset()
    assert subscribed_topics(b"\x00\x00\x00") == frozenset()
    truncated = consumer_subscription("orders")[:10]
    assert subscribed_topics(truncated) == frozenset()


def test_group_subscribed_topics_is_the_union_over_members_of_the_chosen_protocol() -> None:
    group = Group("g")
    group.add(member("a", [("range", consumer_subscription("t", "u"))]))
    group.add(
        member("b", [("sticky", consumer_subscription("x")), ("range", consumer_subscription("v"))])
    )
    group.protocol_name = "range"
    assert group.subscribed_topics() == {"t", "u", "v"}


def test_only_consumer_groups_have_subscribed_topics() -> None:
    group = Group("g")
    group.add(member("a", [("range", consumer_subscription("t"))], protocol_type="connect"))
    group.protocol_name = "range"
    assert group.subscribed_topics() == frozenset()


# -- all rejoined ----------------------------------------------------------------------


async def test_a_group_has_not_all_rejoined_while_a_kip394_member_id_is_pending() -> None:
    group = Group("g")
    assert group.all_rejoined()
    handle = asyncio.get_running_loop().call_later(60, lambda: None)
    group.pending_members["pending"] = handle
    assert not group.all_rejoined()
    handle.cancel()


# -- storage form --------------------------------------------------------------------------


def test_a_group_round_trips_through_its_stored_value() -> None:
    group = Group("g", generation=4, state_timestamp=99)
    a = member("a", [("range", b"sub-a"), ("sticky", b"other")], instance="i-a")
    a.assignment = b"assigned-a"
    b = member("b", [("range", b"sub-b")])
    b.assignment = b"assigned-b"
    group.add(a)
    group.add(b)
    group.protocol_name = "range"
    value = group.to_value()
    assert value == GroupValue(
        "consumer",
        4,
        "range",
        "a",
        99,
        (
            MemberValue("a", "i-a", "client", "/host", 1000, 5000, b"sub-a", b"assigned-a"),
            MemberValue("b", None, "client", "/host", 1000, 5000, b"sub-b", b"assigned-b"),
        ),
    )
    loaded = Group.from_value("g", value)
    assert loaded.state is GroupState.STABLE
    assert (loaded.generation, loaded.protocol_name, loaded.leader_id) == (4, "range", "a")
    assert loaded.static_members == {"i-a": "a"}
    assert loaded.members["a"].assignment == b"assigned-a"
    assert loaded.members["a"].protocols == [("range", b"sub-a")]
    assert loaded.members["b"].session_timeout_ms == 5000
    assert loaded.members["b"].rebalance_timeout_ms == 1000
    assert loaded.to_value() == value


def test_a_stored_group_without_members_loads_empty() -> None:
    loaded = Group.from_value("g", GroupValue("consumer", 7, None, None, 5, ()))
    assert loaded.state is GroupState.EMPTY
    assert loaded.generation == 7
    assert loaded.protocol_type == "consumer"
