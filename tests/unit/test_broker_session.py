"""When a broker may still act as a leader: BrokerSession over a fake clock."""

from __future__ import annotations

from shoal.broker.cluster.session import MARGIN_S, BrokerSession

TTL = 9.0
WINDOW = 9.0


def registered(at: float = 0.0) -> BrokerSession:
    session = BrokerSession(retry_window_s=WINDOW)
    session.renewed(at, TTL)
    return session


def test_a_renewed_session_leads_until_its_deadline_less_a_margin() -> None:
    session = registered()
    assert session.may_lead(TTL - MARGIN_S - 0.01)
    assert not session.may_lead(TTL - MARGIN_S)
    session.renewed(3.0, TTL)
    assert session.may_lead(TTL + 2.0)


def test_a_frozen_broker_that_never_tried_to_renew_stops_leading() -> None:
    session = registered()
    assert not session.may_lead(40.0)  # woke from a 40 s SIGSTOP: it may have been replaced


def test_renewals_that_fail_keep_it_leading_through_an_etcd_outage() -> None:
    session = registered()
    for now in (3.0, 6.0, 9.0, 12.0, 15.0):
        session.renewal_failed(now)
        assert session.may_lead(now + 0.1)
    assert not session.may_lead(15.0 + WINDOW + 0.1)  # and stopped trying: stops leading


def test_after_registering_again_it_leads_only_once_its_view_has_caught_up() -> None:
    session = registered()
    session.registered_again(120)
    session.renewed(20.0, TTL)
    session.image_at(119)
    assert not session.may_lead(20.5)
    session.image_at(121)
    assert session.may_lead(20.5)


def test_before_registering_there_is_no_session_to_lose() -> None:
    assert BrokerSession(retry_window_s=WINDOW).may_lead(1e9)
