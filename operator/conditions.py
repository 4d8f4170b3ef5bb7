"""Status conditions as Kubernetes API conventions describe them, computed without I/O.

Every resource reports ``Ready``; a Cluster also ``Reconciling`` (work in
progress: applying children, rolling, moving partitions) and ``Degraded``
(something is wrong that waiting will not fix). A condition's
``lastTransitionTime`` changes only when its status does, so a client can
tell how long a resource has been Ready; ``observedGeneration`` says which
spec the condition is about.

The functions return a new list of conditions; the handlers put it in the
status patch.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

READY: Final = "Ready"
RECONCILING: Final = "Reconciling"
DEGRADED: Final = "Degraded"

Status = Literal["True", "False", "Unknown"]
Conditions = list[dict[str, Any]]


def _timestamp(now: datetime.datetime | None) -> str:
    moment = now or datetime.datetime.now(tz=datetime.UTC)
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: bool | Status,
    reason: str,
    message: str,
    generation: int,
    now: datetime.datetime | None = None,
) -> Conditions:
    """``conditions`` with ``type_`` set (added or replaced in place; order kept)."""
    status_text = ("True" if status else "False") if isinstance(status, bool) else status
    previous = next((c for c in conditions if c.get("type") == type_), None)
    unchanged = previous is not None and previous.get("status") == status_text
    condition = {
        "type": type_,
        "status": status_text,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": (
            previous.get("lastTransitionTime") if unchanged and previous else None
        )
        or _timestamp(now),
    }
    if previous is None:
        return [*map(dict, conditions), condition]
    return [condition if c is previous else dict(c) for c in conditions]


def find(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: Sequence[Mapping[str, Any]], type_: str) -> bool:
    condition = find(conditions, type_)
    return condition is not None and condition.get("status") == "True"


def ready(
    conditions: Sequence[Mapping[str, Any]],
    generation: int,
    message: str = "",
    reason: str = "Reconciled",
    now: datetime.datetime | None = None,
) -> Conditions:
    """Ready, nothing in progress, nothing wrong."""
    result = set_condition(conditions, READY, True, reason, message, generation, now)
    result = set_condition(result, RECONCILING, False, reason, "", generation, now)
    return set_condition(result, DEGRADED, False, reason, "", generation, now)


def reconciling(
    conditions: Sequence[Mapping[str, Any]],
    generation: int,
    reason: str,
    message: str,
    now: datetime.datetime | None = None,
) -> Conditions:
    """Work in progress. Ready keeps its status (a rolling cluster still serves);
    a resource never Ready before reports Ready False for the same reason."""
    result = set_condition(conditions, RECONCILING, True, reason, message, generation, now)
    if find(result, READY) is None:
        result = set_condition(result, READY, False, reason, message, generation, now)
    return result


def not_ready(
    conditions: Sequence[Mapping[str, Any]],
    generation: int,
    reason: str,
    message: str,
    now: datetime.datetime | None = None,
) -> Conditions:
    """Not Ready for a reason that may pass (a missing Cluster, an unreachable broker)."""
    result = set_condition(conditions, READY, False, reason, message, generation, now)
    return set_condition(result, RECONCILING, False, reason, "", generation, now)


def degraded(
    conditions: Sequence[Mapping[str, Any]],
    generation: int,
    reason: str,
    message: str,
    now: datetime.datetime | None = None,
) -> Conditions:
    """Something is wrong that the user must fix: Degraded True, Ready False."""
    result = set_condition(conditions, DEGRADED, True, reason, message, generation, now)
    result = set_condition(result, READY, False, reason, message, generation, now)
    return set_condition(result, RECONCILING, False, reason, "", generation, now)
