"""Splitting a tenant's quota between gateway replicas (shoal.gateway.quota_shares)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoal.gateway.quota_shares import (
    FLOOR,
    HEADROOM,
    Load,
    QuotaShares,
    TrafficLedger,
    parse_report,
    split_quota,
)

Q = 1_000_000.0


def test_without_reports_the_quota_is_split_evenly() -> None:
    assert split_quota(Q, ["a", "b"], {}) == {"a": Q / 2, "b": Q / 2}
    assert split_quota(Q, ["a"], {}) == {"a": Q}
    assert split_quota(Q, [], {}) == {}


def test_a_replica_that_waited_gets_what_an_idle_one_does_not_need() -> None:
    parts = split_quota(Q, ["a", "b"], {"a": Load(Q / 2, waited=True)})
    assert parts["b"] == pytest.approx(FLOOR * Q / 2)
    assert parts["a"] == pytest.approx(Q - FLOOR * Q / 2)


def test_a_calm_replica_keeps_what_it_uses_with_headroom_and_the_waiting_share_the_rest() -> None:
    loads = {
        "a": Load(0.2 * Q, waited=False),
        "b": Load(0.3 * Q, waited=True),
        "c": Load(0.3 * Q, waited=True),
    }
    parts = split_quota(Q, ["a", "b", "c"], loads)
    assert parts["a"] == pytest.approx(HEADROOM * 0.2 * Q)
    assert parts["b"] == parts["c"] == pytest.approx((Q - HEADROOM * 0.2 * Q) / 2)


def test_when_none_waited_the_split_follows_the_traffic_with_room_to_grow() -> None:
    parts = split_quota(Q, ["a", "b"], {"a": Load(0.3 * Q, False), "b": Load(0.1 * Q, False)})
    assert parts["a"] > parts["b"]
    assert parts["a"] >= HEADROOM * 0.3 * Q and parts["b"] >= HEADROOM * 0.1 * Q


def test_reports_of_gateways_that_went_away_are_ignored() -> None:
    parts = split_quota(Q, ["a"], {"a": Load(10.0, False), "gone": Load(Q, True)})
    assert parts == {"a": Q}


@given(
    st.dictionaries(
        st.sampled_from("abcdef"),
        st.builds(Load, st.floats(0, 3 * Q), st.booleans()),
    ),
    st.sets(st.sampled_from("abcdef"), min_size=1),
)
def test_the_parts_always_sum_to_the_quota_and_none_is_starved(
    loads: dict[str, Load], members: set[str]
) -> None:
    parts = split_quota(Q, sorted(members), loads)
    assert set(parts) == members
    assert sum(parts.values()) == pytest.approx(Q)
    floor = FLOOR * Q / len(members)
    assert all(part >= floor * (1 - 1e-9) for part in parts.values())


def test_a_tenant_using_one_of_two_replicas_converges_to_nearly_all_of_its_quota() -> None:
    """Round by round, as the replicas would see it: all clients on replica a."""
    shares = {name: QuotaShares(name) for name in ("a", "b")}
    ledgers = {name: TrafficLedger() for name in ("a", "b")}
    for _ in range(3):
        part = shares["a"].share("produce", "acme", Q)
        assert part is not None
        ledgers["a"].admitted("produce", "acme", int(part), waited=True)
        reports = {name: ledger.report(1.0) for name, ledger in ledgers.items()}
        for replica in shares.values():
            replica.update(reports)
    assert shares["a"].share("produce", "acme", Q) == pytest.approx(Q * (1 - FLOOR / 2))
    assert shares["b"].share("produce", "acme", Q) == pytest.approx(Q * FLOOR / 2)
    assert shares["a"].share("fetch", "acme", Q) == Q / 2, "the other direction is its own"
    assert shares["a"].share("produce", "acme", None) is None
    assert shares["a"].count == 2


def test_a_throttled_tenant_is_reported_as_waiting_until_its_throttle_runs_out() -> None:
    """Clients told to back off for longer than a round send nothing in it; the replica
    must not read as idle then, or the split leaves it the floor while they still want
    their part."""
    now = [0.0]
    ledger = TrafficLedger(clock=lambda: now[0])
    ledger.admitted("produce", "acme", 500_000, waited=False)
    ledger.throttled("produce", "acme", 2.5)
    assert parse_report(ledger.report(1.0))["produce"] == {"acme": Load(500_000, True)}
    now[0] = 1.0
    assert parse_report(ledger.report(1.0))["produce"] == {"acme": Load(0.0, True)}
    now[0] = 2.0
    ledger.throttled("produce", "acme", 0.1)  # a shorter throttle does not cut the longer one
    assert parse_report(ledger.report(1.0))["produce"] == {"acme": Load(0.0, True)}
    now[0] = 3.0
    assert parse_report(ledger.report(1.0))["produce"] == {"acme": Load(0.0, True)}
    now[0] = 4.0
    assert parse_report(ledger.report(1.0))["produce"] == {}


def test_a_replica_alone_or_not_yet_in_the_round_takes_its_even_part() -> None:
    shares = QuotaShares("new")
    assert shares.share("produce", "acme", Q) == Q
    shares.update({"old": b""})
    assert shares.share("produce", "acme", Q) == Q / 2


def test_an_unreadable_report_reports_nothing() -> None:
    nothing = {"produce": {}, "fetch": {}, "mutations": {}, "logins": {}, "requests": {}}
    assert parse_report(b"not json") == nothing
    assert parse_report(b"") == nothing


def test_controller_mutations_are_split_like_bytes() -> None:
    """The mutation quota (partitions a second) goes where the topic requests are."""
    rate = 10.0
    shares = {name: QuotaShares(name) for name in ("a", "b")}
    ledger = TrafficLedger()
    ledger.admitted("mutations", "acme", 8, waited=True)
    reports = {"a": ledger.report(1.0), "b": TrafficLedger().report(1.0)}
    for replica in shares.values():
        replica.update(reports)
    assert shares["a"].share("mutations", "acme", rate) == pytest.approx(rate * (1 - FLOOR / 2))
    assert shares["b"].share("mutations", "acme", rate) == pytest.approx(rate * FLOOR / 2)
    assert shares["a"].share("produce", "acme", rate) == rate / 2
    # A report from a gateway that knew no mutations still reads.
    assert parse_report(b'{"produce": {}, "fetch": {}}')["mutations"] == {}


def test_logins_are_split_like_bytes() -> None:
    """The connection creation rate goes where the tenant's logins are held."""
    rate = 4.0
    shares = {name: QuotaShares(name) for name in ("a", "b")}
    ledger = TrafficLedger()
    ledger.admitted("logins", "acme", 4, waited=True)
    reports = {"a": ledger.report(1.0), "b": TrafficLedger().report(1.0)}
    for replica in shares.values():
        replica.update(reports)
    assert shares["a"].share("logins", "acme", rate) == pytest.approx(rate * (1 - FLOOR / 2))
    assert shares["b"].share("logins", "acme", rate) == pytest.approx(rate * FLOOR / 2)
    # A report from a gateway that knew no logins still reads.
    assert parse_report(b'{"produce": {}, "fetch": {}, "mutations": {}}')["logins"] == {}


def test_open_connections_are_reported_and_counted_on_the_other_replicas() -> None:
    here, there = TrafficLedger(), TrafficLedger()
    for _ in range(3):
        here.connected("acme")
    here.disconnected("acme")
    there.connected("acme")
    there.connected("globex")
    shares = QuotaShares("here")
    shares.update({"here": here.report(1.0), "there": there.report(1.0)})
    assert here.connections == {"acme": 2}
    assert shares.connections_elsewhere("acme") == 1
    assert shares.connections_elsewhere("globex") == 1
    assert shares.connections_elsewhere("initech") == 0
    there.disconnected("globex")
    assert "globex" not in there.connections
