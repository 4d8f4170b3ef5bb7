"""Where a follower cuts its log after a leader change: pure functions (KIP-101, KIP-279).

The follower asks the leader, with OffsetForLeaderEpoch, where its own latest
epoch ended in the leader's log. Everything the follower has past that point
was written by a leader whose records did not survive, so it is removed
before the follower fetches anything; a divergent tail is never served.

When the leader answers with an epoch the follower never had, one answer is
not enough: the follower cuts where its own older epoch ended and asks again
with that epoch, until both name the same epoch (KIP-279, as Kafka's
``AbstractFetcherThread.getOffsetTruncationState``).
"""

from __future__ import annotations

from typing import NamedTuple

from shoal.broker.log.epochs import UNDEFINED, LeaderEpochCache


class Truncation(NamedTuple):
    offset: int
    """Where to cut the log; the log end offset means nothing to cut."""
    complete: bool
    """False when the replica must ask the leader again, with its latest epoch after the cut."""


def truncation_offset(
    epochs: LeaderEpochCache,
    log_end_offset: int,
    high_watermark: int,
    leader_epoch: int,
    leader_end_offset: int,
) -> Truncation:
    """The offset to truncate to, given the leader's answer (``leader_epoch``,
    ``leader_end_offset``) for this replica's latest epoch.

    * The leader does not know the epoch (or this replica has none): keep
      what is known to be committed, the high watermark.
    * The leader answered with an epoch this replica has: cut where it ended
      in the leader's log or in ours, whichever is first.
    * The leader answered with an epoch this replica never had: cut where
      our largest older epoch ended, and ask again (not complete). Cutting at
      the leader's answer instead would keep records of that older epoch
      which the leader has under the epoch we never had.
    """
    if UNDEFINED in (leader_epoch, leader_end_offset):
        return Truncation(min(high_watermark, log_end_offset), complete=True)
    if leader_epoch == epochs.latest_epoch:
        return Truncation(min(leader_end_offset, log_end_offset), complete=True)
    own_epoch, own_end = epochs.end_offset_for(leader_epoch, log_end_offset)
    if own_epoch == UNDEFINED:
        return Truncation(min(high_watermark, log_end_offset), complete=True)
    if own_epoch != leader_epoch:
        return Truncation(min(own_end, log_end_offset), complete=False)
    return Truncation(min(leader_end_offset, own_end, log_end_offset), complete=True)
