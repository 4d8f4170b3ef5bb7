"""When the gateway stops believing in a broker: answers about who is alive, counted.

The gateway asks the brokers in turn which brokers are alive
(``ClusterView.refresh_brokers``; every few seconds a full refresh asks the
broker its control connection is on). A broker left out of two answers in a row
has been fenced (its etcd session expired: dead, frozen or cut off) and its
partitions are led elsewhere, so the gateway closes the connections it relays
to it and their clients look for the new leaders. One answer is not enough:
one broker's view may lag etcd's for a moment. And a broker's own answer that
it is alive counts for nothing: cut off from etcd but not from the gateway,
it keeps its last view, in which it is alive and leads what it led, and it
would vouch for itself for as long as the cut lasts.

Pure: the gateway feeds it answers and closes what it returns.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

GONE_AFTER_ANSWERS: Final = 2


class BrokerAbsences:
    def __init__(self) -> None:
        self._missing: dict[int, int] = {}
        """How many answers in a row have left out each broker with clients."""

    def answer(
        self, live: Collection[int], answered_by: int | None, with_clients: Collection[int]
    ) -> list[int]:
        """Record one answer (``live``, given by broker ``answered_by``; None: not known,
        so it may be any broker's, and counts for none) and return the brokers with
        clients that are now to be taken as gone."""
        gone = []
        for node_id in with_clients:
            if node_id in live and answered_by in (node_id, None):
                continue  # its own word, or maybe its own: neither for it nor against it
            if node_id in live:
                self._missing.pop(node_id, None)
                continue
            self._missing[node_id] = self._missing.get(node_id, 0) + 1
            if self._missing[node_id] >= GONE_AFTER_ANSWERS:
                del self._missing[node_id]
                gone.append(node_id)
        for node_id in [n for n in self._missing if n not in with_clients]:
            del self._missing[node_id]
        return gone
