"""What an account's RBAC grants, against what the API server's audit log says it used.

A role written by hand drifts: a rule stays after the code that needed it is
gone, a verb is added "to be safe". The test control plane logs every request
a service account makes (control_plane.py, ``AUDIT_POLICY``), so the grants
can be checked against real use: every (apiGroup, resource, verb) a role
grants should appear in the log, and no request should have been refused.

Both sides are spelled as RBAC spells them: the resource of a subresource is
``clusters/status``, the core group is ``""``. A server-side apply that
creates its object is a ``patch`` request answered 201; RBAC allowed it only
because the account may also ``create`` (the API server checks that inside
the request, without a request of its own), so it counts as both.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

BINDING_KINDS: Final = ("ClusterRoleBinding", "RoleBinding")
CREATED: Final = 201
FORBIDDEN: Final = 403


class Grant(NamedTuple):
    """One verb on one resource of one API group: the unit RBAC grants in."""

    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        # kubectl's way of naming a resource of a group: clusters.shoal.dev.
        name = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{self.verb} {name}"


@dataclass(frozen=True)
class Roles:
    """The rules a set of manifests binds to one service account."""

    rules: list[Mapping[str, Any]]
    wildcards: list[str]
    """Rules with ``*`` in apiGroups, resources or verbs: they grant whatever comes."""

    @property
    def grants(self) -> set[Grant]:
        return grants_of(self.rules)


def grants_of(rules: Iterable[Mapping[str, Any]]) -> set[Grant]:
    """Every (group, resource, verb) the rules name (resourceNames narrow, never widen)."""
    return {
        Grant(group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def bound_roles(objects: Sequence[Mapping[str, Any]], namespace: str, account: str) -> Roles:
    """The rules of every Role and ClusterRole in ``objects`` that a binding in
    ``objects`` gives the ServiceAccount ``namespace/account``.

    Roles nobody binds to the account (the brokers' node reader, which the
    chart ships for the operator to bind brokers to) are not its grants.
    """

    def key(kind: str, namespace: str | None, name: str) -> tuple[str, str | None, str]:
        # A ClusterRole has no namespace; a RoleBinding names a Role of its own namespace.
        return kind, namespace if kind == "Role" else None, name

    roles = {
        key(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ("ClusterRole", "Role")
    }
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    rules: list[Mapping[str, Any]] = []
    for binding in objects:
        if binding["kind"] not in BINDING_KINDS:
            continue
        if not any(_same_subject(s, subject) for s in binding.get("subjects") or []):
            continue
        ref, meta = binding["roleRef"], binding["metadata"]
        role = roles.get(key(ref["kind"], meta.get("namespace"), ref["name"]))
        if role is None:
            raise ValueError(f"{binding['kind']} {meta['name']} binds a role not among these")
        rules += role.get("rules") or []
    wildcards = [
        str(dict(rule))
        for rule in rules
        if any("*" in rule.get(f, []) for f in ("apiGroups", "resources", "verbs"))
    ]
    return Roles(rules, wildcards)


def _same_subject(subject: Mapping[str, Any], wanted: Mapping[str, str]) -> bool:
    return all(subject.get(k) == v for k, v in wanted.items())


def service_account_user(namespace: str, account: str) -> str:
    """The user name the API server gives a ServiceAccount's tokens."""
    return f"system:serviceaccount:{namespace}:{account}"


@dataclass(frozen=True)
class Use:
    """What one user asked of the API server, from the audit log."""

    grants: set[Grant]
    refused: list[str]
    """``verb URI`` of each request answered 403 while the API server was ready."""
    refused_starting: list[str]
    """The same, while it was starting: it refuses everyone until its RBAC
    authorizer has read the roles (see ``ControlPlane.starting``)."""
    requests: int


Window = tuple[datetime.datetime, datetime.datetime]


def use_of(events: Iterable[Mapping[str, Any]], user: str, starting: Sequence[Window] = ()) -> Use:
    """The resource requests of ``user`` as grants, and the ones refused.

    Requests with no object (discovery: ``/api``, ``/apis``, ``/version``)
    are every authenticated user's by the default roles, not anything a
    chart grants. A watch logs a ResponseStarted event when it starts and a
    ResponseComplete one when it ends; both name the same request (auditID).
    A refusal received in one of the ``starting`` windows is told apart.
    """
    grants: set[Grant] = set()
    refused: dict[str, str] = {}
    refused_starting: dict[str, str] = {}
    seen: set[str] = set()
    for event in events:
        if event.get("user", {}).get("username") != user:
            continue
        seen.add(event["auditID"])
        code = (event.get("responseStatus") or {}).get("code")
        if code == FORBIDDEN:
            received = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"])
            early = any(start <= received <= ready for start, ready in starting)
            into = refused_starting if early else refused
            into[event["auditID"]] = f"{event['verb']} {event['requestURI']}"
            continue
        ref = event.get("objectRef")
        if ref is None:
            continue
        resource = ref["resource"]
        if ref.get("subresource"):
            resource = f"{resource}/{ref['subresource']}"
        grant = Grant(ref.get("apiGroup", ""), resource, event["verb"])
        grants.add(grant)
        if grant.verb == "patch" and code == CREATED:
            grants.add(grant._replace(verb="create"))
    return Use(grants, list(refused.values()), list(refused_starting.values()), len(seen))


def table(granted: set[Grant], used: set[Grant]) -> str:
    """Every grant and every use, one a line: ``granted used  verb resource.group``."""
    lines = [
        f"{'yes' if g in granted else 'no':>7} {'yes' if g in used else 'no':>4}  {g}"
        for g in sorted(granted | used, key=lambda g: (g.group, g.resource, g.verb))
    ]
    return "\n".join(["granted used  verb resource", *lines])
