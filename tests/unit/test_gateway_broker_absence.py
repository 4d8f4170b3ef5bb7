"""When the gateway takes a broker for gone, from the brokers' answers in turn."""

from __future__ import annotations

from shoal.gateway.broker_absence import BrokerAbsences


def test_a_broker_left_out_of_two_answers_in_a_row_is_gone() -> None:
    absences = BrokerAbsences()
    assert absences.answer({1, 2}, 1, with_clients=[0, 1]) == []
    assert absences.answer({1, 2}, 2, with_clients=[0, 1]) == [0]


def test_one_lagging_answer_is_not_enough() -> None:
    absences = BrokerAbsences()
    assert absences.answer({1, 2}, 1, with_clients=[0]) == []
    assert absences.answer({0, 1, 2}, 2, with_clients=[0]) == []
    assert absences.answer({1, 2}, 1, with_clients=[0]) == []


def test_a_broker_cut_off_from_etcd_does_not_keep_itself_alive() -> None:
    # Broker 0 is cut from etcd, not from the gateway: its stale view has it alive.
    absences = BrokerAbsences()
    assert absences.answer({1, 2}, 1, with_clients=[0]) == []
    assert absences.answer({0, 1, 2}, 0, with_clients=[0]) == []
    assert absences.answer({1, 2}, 2, with_clients=[0]) == [0]


def test_only_brokers_with_clients_are_counted() -> None:
    absences = BrokerAbsences()
    assert absences.answer({1}, 1, with_clients=[]) == []
    assert absences.answer({1}, 1, with_clients=[0]) == []
    assert absences.answer({1}, 1, with_clients=[0]) == [0]


def test_an_answer_from_a_broker_not_known_counts_for_no_one() -> None:
    # A full refresh over the control connection, which may be on the cut-off broker.
    absences = BrokerAbsences()
    assert absences.answer({1, 2}, 1, with_clients=[0]) == []
    assert absences.answer({0, 1, 2}, None, with_clients=[0]) == []
    assert absences.answer({1, 2}, 2, with_clients=[0]) == [0]
