"""Status conditions: transitions, kept timestamps, and the Ready/Reconciling/Degraded helpers."""

from __future__ import annotations

import datetime

from shoal.operator import conditions

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)


def _by_type(items: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {c["type"]: c for c in items}


def test_a_new_condition_is_added_with_its_generation_and_time() -> None:
    result = conditions.set_condition([], "Ready", True, "Reconciled", "ok", 3, T0)
    assert result == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Reconciled",
            "message": "ok",
            "observedGeneration": 3,
            "lastTransitionTime": "2026-01-01T12:00:00Z",
        }
    ]


def test_transition_time_is_kept_while_the_status_does_not_change() -> None:
    first = conditions.set_condition([], "Ready", True, "Reconciled", "", 1, T0)
    again = conditions.set_condition(first, "Ready", True, "Reconciled", "still", 2, T1)
    assert again[0]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert again[0]["observedGeneration"] == 2
    assert again[0]["message"] == "still"
    flipped = conditions.set_condition(again, "Ready", False, "BrokerDown", "b1", 2, T1)
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T12:05:00Z"
    assert first[0]["message"] == ""  # inputs are not changed


def test_other_conditions_keep_their_order_and_content() -> None:
    start = conditions.ready([], 1, now=T0)
    changed = conditions.set_condition(start, "Degraded", True, "X", "y", 1, T1)
    assert [c["type"] for c in changed] == ["Ready", "Reconciling", "Degraded"]
    assert changed[0] == start[0]


def test_first_reconcile_is_not_ready_and_a_later_one_keeps_ready() -> None:
    fresh = _by_type(conditions.reconciling([], 1, "Applying", "creating children", T0))
    assert fresh["Reconciling"]["status"] == "True"
    assert fresh["Ready"]["status"] == "False"
    assert fresh["Ready"]["reason"] == "Applying"

    rolling = _by_type(
        conditions.reconciling(conditions.ready([], 1, now=T0), 2, "Rolling", "broker 0", T1)
    )
    assert rolling["Ready"]["status"] == "True"
    assert rolling["Reconciling"]["status"] == "True"
    assert rolling["Reconciling"]["message"] == "broker 0"


def test_ready_clears_reconciling_and_degraded() -> None:
    broken = conditions.degraded([], 1, "ScaleDownImpossible", "topic t has 3 replicas", T0)
    assert conditions.is_true(broken, "Degraded")
    assert not conditions.is_true(broken, "Ready")
    healed = _by_type(conditions.ready(broken, 2, now=T1))
    assert healed["Ready"]["status"] == "True"
    assert healed["Degraded"]["status"] == "False"
    assert healed["Reconciling"]["status"] == "False"


def test_not_ready_carries_the_reason_and_message() -> None:
    result = conditions.not_ready([], 4, "ClusterNotFound", "no Cluster demo", T0)
    ready = conditions.find(result, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "ClusterNotFound",
        "no Cluster demo",
    )
    assert ready["observedGeneration"] == 4
