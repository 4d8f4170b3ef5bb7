"""A client's fetch session (KIP-227) through the gateway: the broker's, mirrored per connection.

Each client connection has its own connection to its broker
(:mod:`shoal.gateway.session`), so a client's fetch session is the broker's
session on that upstream connection. The gateway passes the broker's session
id and epochs through, and keeps two things the broker cannot:

* **Which id the connection may name.** A session id is accepted only on the
  connection whose fetch opened it; any other id (another connection's, another
  tenant's, a guess) is answered FETCH_SESSION_ID_NOT_FOUND without reaching a
  broker. A full fetch closes the connection's session, whatever id it names,
  so one connection holds at most one session, and no request closes another's.
* **What the session holds, topic by topic.** An incremental request names
  only what changed, so the partitions it does not name were checked when they
  were listed. The broker's session holds only topics the key may read; the
  gateway keeps the others out of it, and answers them with their error in every
  answer, as Kafka answers an errored partition of a session every time. When
  the tenant's ACLs change, every topic is judged again: one no longer readable
  is forgotten upstream and answered with its error from then on; one readable
  again is listed upstream from where the client left it. Refused topics are
  judged again at every request (a topic id may come to name a topic).

The broker's answer is what opens, keeps or ends a session, so a connection
rewrites a fetch only once its previous fetch is answered
(:mod:`shoal.gateway.session`): requests change the view in the order the
broker reads them.

A broker error in an answer (an evicted session, a wrong epoch) leaves the
connection without a usable session: its next incremental request is refused
until a full fetch opens a new one, which is what Kafka's clients do on either
error. A session the broker ends (everything forgotten) ends here too.

The module is pure: :func:`shoal.gateway.apis.records.fetch` judges topics and
shapes the requests and answers; this keeps the session's view.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shoal.wire import NO_SESSION, ErrorCode

TopicKey = str | uuid.UUID
"""A topic as the client names it: its name (Fetch up to v12) or its id (v13+)."""
Verdict = ErrorCode | None
"""Why the gateway keeps a topic from the broker, or None when the key may read it."""


@dataclass(slots=True)
class SessionTopic:
    partitions: dict[int, Any]
    """Each partition in the session, as the client last listed it (its FetchPartition)."""
    refusal: Verdict
    """None while the broker's session holds the topic's partitions."""


@dataclass(slots=True)
class SessionPlan:
    """What one request changes upstream, and what the gateway answers itself."""

    send: dict[TopicKey, list[Any]] = field(default_factory=dict)
    """Partitions to list upstream (the client's FetchPartitions), by topic."""
    forget: dict[TopicKey, list[int]] = field(default_factory=dict)
    """Partitions the broker's session must drop, by topic."""


@dataclass(slots=True)
class ClientFetchSession:
    """One connection's view of its fetch session. The connection's task owns it."""

    id: int = NO_SESSION
    """The broker's id for this connection's session: the only one the client may name,
    and the one a full fetch closes."""
    usable: bool = False
    """Whether an incremental request may go on in the session (opened, no error since)."""
    by_id: bool = False
    """Whether the session names topics by id, as the request that opened it did."""
    topics: dict[TopicKey, SessionTopic] = field(default_factory=dict)
    judged_with: object = None
    """The tenant's ACL bindings the readable topics were last judged with."""

    def restart(self, by_id: bool, bindings: object) -> int:
        """Forget the session for a full fetch; the id the broker must close (or 0)."""
        closing = self.id
        self.id = NO_SESSION
        self.usable = False
        self.by_id = by_id
        self.topics = {}
        self.judged_with = bindings
        return closing

    def to_judge_again(self, bindings: object, listed: Iterable[TopicKey]) -> list[TopicKey]:
        """The session's topics an incremental request must judge though it does not list
        them: every one when the ACLs changed since the last judgement, else the refused."""
        named = set(listed)
        if bindings is not self.judged_with:
            self.judged_with = bindings
            return [key for key in self.topics if key not in named]
        return [
            key
            for key, topic in self.topics.items()
            if topic.refusal is not None and key not in named
        ]

    def apply(
        self,
        listed: Sequence[tuple[TopicKey, Sequence[Any], Verdict]],
        judged: Iterable[tuple[TopicKey, Verdict]],
        forgotten: Iterable[tuple[TopicKey, Iterable[int]]],
    ) -> SessionPlan:
        """Take one request into the view, in Kafka's order: the partitions it lists,
        then the ones it forgets. ``judged`` are the verdicts of unlisted topics."""
        plan = SessionPlan()
        for key, partitions, verdict in listed:
            self._list(plan, key, partitions, verdict)
        for key, verdict in judged:
            self._judge(plan, key, verdict)
        for key, indexes in forgotten:
            self._forget(plan, key, indexes)
        return plan

    def _list(
        self, plan: SessionPlan, key: TopicKey, partitions: Sequence[Any], verdict: Verdict
    ) -> None:
        topic = self.topics.get(key)
        held = topic is not None and topic.refusal is None
        if topic is None:
            topic = self.topics[key] = SessionTopic({}, verdict)
        elif held and verdict is not None:
            self._forget_all(plan, key, topic)
        topic.partitions.update((p.partition, p) for p in partitions)
        topic.refusal = verdict
        if verdict is None and held:
            plan.send.setdefault(key, []).extend(partitions)
        elif verdict is None:
            # A topic the broker did not hold gets all its partitions, not only the
            # ones this request lists.
            plan.send[key] = list(topic.partitions.values())

    def _judge(self, plan: SessionPlan, key: TopicKey, verdict: Verdict) -> None:
        topic = self.topics[key]
        if topic.refusal is None and verdict is not None:
            self._forget_all(plan, key, topic)
        elif topic.refusal is not None and verdict is None:
            plan.send[key] = list(topic.partitions.values())
        topic.refusal = verdict

    def _forget(self, plan: SessionPlan, key: TopicKey, indexes: Iterable[int]) -> None:
        topic = self.topics.get(key)
        if topic is None:
            return
        for index in indexes:
            if topic.partitions.pop(index, None) is not None and topic.refusal is None:
                plan.forget.setdefault(key, []).append(index)
        if not topic.partitions:
            del self.topics[key]

    @staticmethod
    def _forget_all(plan: SessionPlan, key: TopicKey, topic: SessionTopic) -> None:
        plan.forget.setdefault(key, []).extend(topic.partitions)
        plan.send.pop(key, None)

    def holds(self, key: TopicKey) -> bool:
        """Whether the broker's session may answer for the topic (the gateway lets it)."""
        topic = self.topics.get(key)
        return topic is not None and topic.refusal is None

    def refused(self) -> list[tuple[TopicKey, ErrorCode, list[int]]]:
        """The topics the gateway answers itself: (topic, error, partitions)."""
        return [
            (key, topic.refusal, list(topic.partitions))
            for key, topic in self.topics.items()
            if topic.refusal is not None
        ]

    def answered(self, incremental: bool, code: ErrorCode, session_id: int) -> None:
        """Take the broker's answer to a request of this session."""
        if code is ErrorCode.fetch_session_id_not_found:
            # Gone from the broker: its id may be another connection's one day.
            self.id = NO_SESSION
            self.usable = False
        elif code is not ErrorCode.none:
            # The broker may still hold the session: its id stays, for a full fetch to
            # close, but nothing more goes on in it.
            self.usable = False
        elif not incremental:
            self.id = session_id
            self.usable = session_id != NO_SESSION
        elif session_id == NO_SESSION:
            self.id = NO_SESSION
            self.usable = False
