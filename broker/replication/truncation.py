"""Where a follower cuts its log after a leader change: pure functions (KIP-101, KIP-279).

The follower asks the leader, with OffsetForLeaderEpoch, where its own latest
epoch ended in the leader's log. Everything the follower has past that point
was written by a leader whose records did not survive, so it is removed
before the follower fetches anything; a divergent tail is never served.
"""

from __future__ import annotations

from shoal.broker.log.epochs import UNDEFINED, LeaderEpochCache


def truncation_offset(
    epochs: LeaderEpochCache,
    log_end_offset: int,
    high_watermark: int,
    leader_epoch: int,
    leader_end_offset: int,
) -> int:
    """The offset to truncate to, given the leader's answer (``leader_epoch``,
    ``leader_end_offset``) for this replica's latest epoch.

    * The leader does not know the epoch (or this replica has none): keep
      what is known to be committed, the high watermark.
    * The leader answered with the same epoch: cut where it ended there.
    * The leader answered with an older epoch (it never had ours): cut where
      that older epoch ended in the leader's log or in ours, whichever is first.
    """
    if UNDEFINED in (leader_epoch, leader_end_offset):
        return min(high_watermark, log_end_offset)
    if leader_epoch == epochs.latest_epoch:
        return min(leader_end_offset, log_end_offset)
    own_epoch, own_end = epochs.end_offset_for(leader_epoch, log_end_offset)
    if own_epoch == UNDEFINED:
        return min(high_watermark, log_end_offset)
    return min(leader_end_offset, own_end, log_end_offset)
