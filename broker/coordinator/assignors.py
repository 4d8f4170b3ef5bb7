"""Server-side assignors of KIP-848 consumer groups: ``uniform`` (the default) and ``range``.

The coordinator, not a client, decides who reads what. An assignor is a pure
function from the group's members (their subscriptions and their current
target assignment) and the subscribed topics' partition counts to a new
target assignment. Partitions are named by topic id, as on the wire.

``uniform`` (Kafka's UniformAssignor) spreads every subscribed partition so
that member counts differ by at most one where subscriptions allow it, and
keeps a partition with the member that has it whenever balance permits
(stickiness: a member joining moves only the partitions it must take).
Kafka's builder for identical subscriptions uses per-member quotas (floor of
partitions / members, one extra for the first remainder members); the same
quotas are used here. For differing subscriptions a greedy pass gives each
partition, most constrained first, to its least loaded eligible member,
preferring its previous owner unless that owner is more than one ahead.
That is simpler than Kafka's heterogeneous builder; its balance can differ
from Kafka's when subscriptions overlap partially.

``range`` (Kafka's RangeAssignor for the consumer protocol) works per topic:
members subscribed to a topic, sorted by member id, take contiguous ranges,
the first ``partitions % members`` one partition more; members with the
same subscriptions thus read the same partition numbers of co-partitioned
topics (joins keyed on the partition number rely on this).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

TopicId = uuid.UUID
Partitions = Mapping[TopicId, frozenset[int]]
"""A member's partitions: topic id -> partition numbers."""


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """What an assignor knows of one member."""

    subscribed: frozenset[TopicId]
    current: Partitions
    """The member's target assignment so far (its stickiness)."""


Assignor = Callable[[Mapping[str, MemberSpec], Mapping[TopicId, int]], dict[str, Partitions]]
"""(members by id, partition count per subscribed topic id) -> new target per member."""


def uniform(
    members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int]
) -> dict[str, Partitions]:
    if not members:
        return {}
    subscriptions = {spec.subscribed for spec in members.values()}
    if len(subscriptions) == 1:
        return _uniform_homogeneous(members, topics)
    return _uniform_heterogeneous(members, topics)


def _all_partitions(topics: Mapping[TopicId, int], wanted: frozenset[TopicId]) -> list[Tp]:
    return [(t, p) for t in sorted(wanted) if t in topics for p in range(topics[t])]


Tp = tuple[TopicId, int]


def _uniform_homogeneous(
    members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int]
) -> dict[str, Partitions]:
    subscribed = next(iter(members.values())).subscribed
    partitions = _all_partitions(topics, subscribed)
    valid = set(partitions)
    order = sorted(members)
    base, extra = divmod(len(partitions), len(order))
    owned: dict[str, list[Tp]] = {m: [] for m in order}
    taken: set[Tp] = set()
    # Keep what each member has, up to its quota; the first members that held
    # more than the base keep one extra while extras remain.
    for member_id in order:
        kept = sorted(tp for tp in _flatten(members[member_id].current) if tp in valid)
        quota = base
        if len(kept) > base and extra > 0:
            quota, extra = base + 1, extra - 1
        for tp in kept[:quota]:
            owned[member_id].append(tp)
            taken.add(tp)
    free = [tp for tp in partitions if tp not in taken]
    # Fill the members below the base first, then hand out the remaining extras.
    for member_id in order:
        while len(owned[member_id]) < base and free:
            owned[member_id].append(free.pop(0))
    for member_id in order:
        if not free:
            break
        if len(owned[member_id]) == base and extra > 0:
            owned[member_id].append(free.pop(0))
            extra -= 1
    return {m: _group(tps) for m, tps in owned.items()}


def _uniform_heterogeneous(
    members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int]
) -> dict[str, Partitions]:
    eligible: dict[Tp, list[str]] = {}
    for member_id in sorted(members):
        for tp in _all_partitions(topics, members[member_id].subscribed):
            eligible.setdefault(tp, []).append(member_id)
    previous = {tp: m for m, spec in members.items() for tp in _flatten(spec.current)}
    load = dict.fromkeys(members, 0)
    owned: dict[str, list[Tp]] = {m: [] for m in members}
    # Most constrained partitions first, so that broadly subscribed members
    # do not use up the capacity that narrowly subscribed ones need.
    for tp in sorted(eligible, key=lambda tp: (len(eligible[tp]), tp)):
        candidates = eligible[tp]
        least = min(candidates, key=lambda m: (load[m], m))
        chosen = least
        holder = previous.get(tp)
        if holder in candidates and holder is not None and load[holder] <= load[least]:
            chosen = holder
        owned[chosen].append(tp)
        load[chosen] += 1
    return {m: _group(tps) for m, tps in owned.items()}


def range_(
    members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int]
) -> dict[str, Partitions]:
    owned: dict[str, list[Tp]] = {m: [] for m in members}
    for topic_id in sorted(topics):
        subscribers = sorted(m for m, spec in members.items() if topic_id in spec.subscribed)
        if not subscribers:
            continue
        base, extra = divmod(topics[topic_id], len(subscribers))
        start = 0
        for index, member_id in enumerate(subscribers):
            count = base + (1 if index < extra else 0)
            owned[member_id].extend((topic_id, p) for p in range(start, start + count))
            start += count
    return {m: _group(tps) for m, tps in owned.items()}


ASSIGNORS: Final[dict[str, Assignor]] = {"uniform": uniform, "range": range_}
DEFAULT_ASSIGNOR: Final = "uniform"
"""group.consumer.assignors lists uniform first: Kafka's default."""


def _flatten(partitions: Partitions) -> list[Tp]:
    return [(t, p) for t, ps in partitions.items() for p in ps]


def _group(tps: list[Tp]) -> dict[TopicId, frozenset[int]]:
    out: dict[TopicId, set[int]] = {}
    for topic_id, partition in tps:
        out.setdefault(topic_id, set()).add(partition)
    return {t: frozenset(ps) for t, ps in out.items()}
