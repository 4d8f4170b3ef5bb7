"""Whether this broker may still act as a leader: its session with the cluster, judged locally.

A broker's registration lives under an etcd lease it renews; when the lease
expires the controller moves the broker's leaderships away. A broker that
went on acting as leader after that (a zombie) would acknowledge acks=1
writes the new leader never sees, and serve reads the new leader has moved
past. So a leader refuses (NOT_LEADER_OR_FOLLOWER) whenever it cannot be sure
its registration still stands:

- past the renewal deadline (a keep-alive sent at ``t`` keeps the lease at
  least until ``t + TTL``, minus a margin for the two clocks) without having
  tried to renew: the process was frozen (SIGSTOP, a long stall), so it may
  well have been replaced;
- after it found its lease expired and registered again, until its view of
  the cluster has caught up with that re-registration (by then it has seen
  every leadership the controller moved while it was gone).

Past the deadline while renewals are being tried and fail, it goes on: etcd
being down for everyone looks the same from here as this broker being cut
off from it, and in an etcd outage nobody can replace anyone (etcd renews
every lease when it returns), so stopping would turn an etcd outage into a
cluster outage. Kafka's brokers make the same choice when cut off from the
controllers.

Pure logic over a monotonic clock; the etcd store feeds it.
"""

from __future__ import annotations

import math
from typing import Final

MARGIN_S: Final = 0.5
"""How much sooner than etcd could expire the lease the session counts as lapsed
(etcd reports the remaining TTL in whole seconds, and clocks drift a little)."""


class BrokerSession:
    def __init__(self, retry_window_s: float) -> None:
        self.retry_window_s = retry_window_s
        """How recent a failed renewal must be for the broker to count as trying."""
        self.valid_until = math.inf
        """Before registering there is no session to lose (and no leadership to hold)."""
        self._failed_at: float | None = None
        self._catch_up_to: int | None = None
        self._image_revision = 0

    def renewed(self, asked_at: float, ttl_s: float) -> None:
        """A renewal (or a new lease) asked for at ``asked_at`` succeeded."""
        self.valid_until = asked_at + ttl_s - MARGIN_S
        self._failed_at = None

    def renewal_failed(self, now: float) -> None:
        """etcd did not answer a renewal (unreachable, timed out)."""
        self._failed_at = now

    def registered_again(self, revision: int) -> None:
        """The lease had expired and the broker registered anew at ``revision``."""
        self._catch_up_to = revision

    def image_at(self, revision: int) -> None:
        """The broker's view of the cluster now includes every change up to ``revision``."""
        self._image_revision = max(self._image_revision, revision)

    def may_lead(self, now: float) -> bool:
        if self._catch_up_to is not None:
            if self._image_revision < self._catch_up_to:
                return False
            self._catch_up_to = None
        if now < self.valid_until:
            return True
        return self._failed_at is not None and now - self._failed_at <= self.retry_window_s
