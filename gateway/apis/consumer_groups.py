"""KIP-848 consumer groups through the gateway: ConsumerGroupHeartbeat (68) and
ConsumerGroupDescribe (69), inside the tenant's namespace.

The group id is mapped like every group id (``billing`` is ``acme.billing``),
subscribed topic names like topic names. A regex subscription ``R`` becomes
``acme\\.(?:R)`` on the brokers (a leading ``^`` dropped), which match it
against whole topic names: it can only ever match the tenant's own topics.
``R`` must compile on its own first, so that no unbalanced parenthesis can
close the group early (``x)|(.*`` would otherwise reach every tenant's
topics). Patterns are RE2's, as Kafka's (:mod:`shoal.topic_regex`).

Partitions travel by topic id. The brokers assign only topics a member
subscribed to, and those are the tenant's, so assignments pass unchanged;
owned partitions a client reports are only compared with what it was given.

Kafka's checks: a heartbeat needs READ on the group and DESCRIBE on each
topic it subscribes to by name (TOPIC_AUTHORIZATION_FAILED otherwise);
ConsumerGroupDescribe needs DESCRIBE on the group, and the topics of its
members' assignments are shown by name only where the key may DESCRIBE
them. Topics a regex matches are not filtered by the key's ACLs (the
brokers know no tenants): they may be assigned, and the key's fetches of
them are refused with TOPIC_AUTHORIZATION_FAILED, as every fetch is.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.gateway.apis.base import (
    NO_THROTTLE,
    NOT_REQUESTED,
    Answer,
    E,
    Forward,
    RequestContext,
    Step,
    replace,
)
from shoal.gateway.namespace import Namespace
from shoal.tenancy.model import Operation, ResourceType

from shoal.topic_regex import TopicRegex, TopicRegexError

_REGEX_OPEN: Final = "(?:"
_REGEX_CLOSE: Final = ")"


def _literal(text: str) -> str:
    """``text`` as a regex that matches it alone (tenant names: letters, digits, '-', '.')."""
    return "".join(c if c.isalnum() else "\\" + c for c in text)


def regex_inward(ns: Namespace, pattern: str) -> str:
    """The brokers' regex for a tenant's: only the tenant's topics can match it."""
    return _literal(ns.prefix) + _REGEX_OPEN + _unanchored(pattern) + _REGEX_CLOSE


def _unanchored(pattern: str) -> str:
    """``pattern`` without the ``^`` anchors that start a branch of it.

    Clients anchor their patterns, and librdkafka wraps and joins them
    (``(^orders-.*)|(^audit)``); the brokers match whole names anyway, so
    such an anchor means nothing there, but after the tenant's prefix it
    could never match. A ``^`` is dropped where it opens the pattern, a
    group or an alternative; one anywhere else is kept (it can only make
    the pattern match less, never another tenant's topics).
    """
    out: list[str] = []
    in_class, at_branch_start = False, True
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index : index + 2])
            index += 2
            at_branch_start = False
            continue
        index += 1
        if in_class:
            in_class = char != "]"
            out.append(char)
            continue
        if char == "^" and at_branch_start:
            continue
        out.append(char)
        if char == "(" and pattern.startswith("?:", index):
            out.append("?:")
            index += 2
        at_branch_start = char in "(|"
        in_class = char == "["
    return "".join(out)


def regex_outward(ns: Namespace, pattern: str | None) -> str | None:
    """The tenant's regex back from the brokers' (None if it is not one the gateway made)."""
    if pattern is None or pattern == "":
        return pattern
    head = _literal(ns.prefix) + _REGEX_OPEN
    if pattern.startswith(head) and pattern.endswith(_REGEX_CLOSE):
        return pattern[len(head) : -len(_REGEX_CLOSE)]
    return None


def _heartbeat_refusal(ctx: RequestContext, code: E, message: str | None = None) -> Answer:
    return Answer(
        ctx.api.response(
            throttle_time=NO_THROTTLE,
            error_code=code,
            error_message=message,
            member_id=None,
            member_epoch=0,
            heartbeat_interval=NO_THROTTLE,
            assignment=None,
        )
    )


async def consumer_group_heartbeat(ctx: RequestContext, request: Any) -> Step:
    ns, access = ctx.ns, ctx.access
    group_id = request.group_id
    if not group_id or not access.may_group(group_id, Operation.READ):
        return _heartbeat_refusal(ctx, E.group_authorization_failed)
    changes: dict[str, Any] = {"group_id": ns.inward(group_id)}
    names = request.subscribed_topic_names
    if names is not None:
        denied = sorted(n for n in names if not (n and access.may_topic(n, Operation.DESCRIBE)))
        if denied:
            return _heartbeat_refusal(
                ctx,
                E.topic_authorization_failed,
                "The following topics are not authorized: " + ", ".join(denied) + ".",
            )
        changes["subscribed_topic_names"] = tuple(ns.inward(n) for n in names)
    regex = getattr(request, "subscribed_topic_regex", None)
    if regex:
        try:
            # Each must compile alone: an unbalanced parenthesis could close the
            # group early, and RE2's \Q...\E could quote the closing one.
            TopicRegex(regex)
            TopicRegex(_unanchored(regex))
            changes["subscribed_topic_regex"] = TopicRegex(regex_inward(ns, regex)).pattern
        except TopicRegexError as exc:
            return _heartbeat_refusal(
                ctx, E.invalid_regular_expression, f"SubscribedTopicRegex is invalid: {exc}"
            )
    inward_group = changes["group_id"]

    def finish(response: Any) -> Any:
        message = response.error_message
        if message and inward_group in message:
            return replace(response, error_message=message.replace(inward_group, group_id))
        return response

    return Forward(replace(request, **changes), finish)


def _described_refusal(ctx: RequestContext, group_id: str, code: E) -> Any:
    return ctx.api.make(
        "DescribedGroup",
        error_code=code,
        error_message=None,
        group_id=group_id,
        group_state="",
        group_epoch=0,
        assignment_epoch=0,
        assignor_name="",
        members=(),
        authorized_operations=NOT_REQUESTED,
    )


async def consumer_group_describe(ctx: RequestContext, request: Any) -> Step:
    ns, access, api = ctx.ns, ctx.access, ctx.api
    want_ops = request.include_authorized_operations
    forwarded, refusals = [], []
    for group_id in request.group_ids:
        if group_id and access.may_group(group_id, Operation.DESCRIBE):
            forwarded.append(ns.inward(group_id))
        else:
            refusals.append(_described_refusal(ctx, group_id, E.group_authorization_failed))
    if not forwarded:
        return Answer(api.response(throttle_time=NO_THROTTLE, groups=tuple(refusals)))

    def finish(response: Any) -> Any:
        groups = []
        for group in response.groups:
            group_id = ns.outward_id(group.group_id)
            if group_id is None:
                continue
            groups.append(_described_outward(ctx, group, group_id, want_ops))
        return replace(response, groups=tuple(groups) + tuple(refusals))

    return Forward(replace(request, group_ids=tuple(forwarded)), finish)


def _described_outward(ctx: RequestContext, group: Any, group_id: str, want_ops: bool) -> Any:
    ns, access = ctx.ns, ctx.access
    message = group.error_message
    if message:
        message = message.replace(ns.inward(group_id), group_id)
    changes: dict[str, Any] = {"group_id": group_id, "error_message": message}
    members = []
    hidden = False
    for member in group.members:
        assignment, hide_a = _assignment_outward(ctx, member.assignment)
        target, hide_t = _assignment_outward(ctx, member.target_assignment)
        hidden = hidden or hide_a or hide_t
        members.append(
            replace(
                member,
                subscribed_topic_names=tuple(
                    n for n in (ns.outward(t) for t in member.subscribed_topic_names) if n
                ),
                subscribed_topic_regex=regex_outward(ns, member.subscribed_topic_regex),
                assignment=assignment,
                target_assignment=target,
            )
        )
    if hidden:
        # As Kafka: a group whose assignments name a topic the key may not describe
        # is refused as a whole.
        return _described_refusal(ctx, group_id, E.topic_authorization_failed)
    changes["members"] = tuple(members)
    if want_ops:
        changes["authorized_operations"] = access.authorized_operations(
            ResourceType.GROUP, group_id
        )
    return replace(group, **changes)


def _assignment_outward(ctx: RequestContext, assignment: Any) -> tuple[Any, bool]:
    """The assignment with the tenant's topic names; whether a topic had to be hidden."""
    kept = []
    hidden = False
    for tp in assignment.topic_partitions:
        name = ctx.ns.outward(tp.topic_name)
        if name is None or not ctx.access.may_topic(name, Operation.DESCRIBE):
            hidden = True
            continue
        kept.append(replace(tp, topic_name=name))
    return replace(assignment, topic_partitions=tuple(kept)), hidden
