"""Partition as leader: epochs, the high watermark, the ISR, acks=all.

A real Log under a Partition with the fake clock from conftest; followers are
simulated by calling ``record_follower_fetch`` with the offset a follower
would fetch from (everything below it is on the follower). The replica
manager's part (writing ISR proposals to the store) is played by the test:
it sets ``pending_isr`` and later hands the partition the new state, as the
image would.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import pytest
from shoal.broker.cluster.model import NodeId, PartitionState
from shoal.broker.partition import (
    CommitTimeoutError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
    Partition,
)

ME, F2, F3 = NodeId(1), NodeId(2), NodeId(3)
REPLICAS = (ME, F2, F3)
MAX_LAG_MS = 10_000


@pytest.fixture
def partition(open_log, clock):
    def factory(**log_config) -> Partition:
        log = open_log(**log_config)
        return Partition("orders", 0, uuid.uuid4(), ME, log, clock)

    return factory


def _state(leader: int, epoch: int, isr: Sequence[int], partition_epoch: int = 0) -> PartitionState:
    return PartitionState(NodeId(leader), epoch, tuple(NodeId(n) for n in isr), partition_epoch)


def _lead(p: Partition, isr: Sequence[int] = REPLICAS, epoch: int = 1, revision: int = 10):
    return p.update_state(REPLICAS, _state(ME, epoch, isr), revision)


def _produce(p: Partition, helpers, count: int = 1, acks: int = 1) -> int:
    """Append ``count`` records as the leader; returns the offset after them."""
    info = p.append_as_leader(helpers.make_batch(count), acks)
    return info.last_offset + 1


# -- becoming leader -----------------------------------------------------------------


def test_becoming_leader_starts_its_epoch_at_the_log_end(partition, helpers) -> None:
    p = partition()
    helpers.append_batches(p.log, [helpers.make_batch(3)], epoch=0)
    assert _lead(p, epoch=4) is True
    assert p.is_leader
    assert p.log.epochs.entries == [(0, 0), (4, 3)]
    assert p.log.epochs.end_offset_for(0, p.log.log_end_offset) == (0, 3)
    _produce(p, helpers, 2)
    assert p.log.epochs.entries == [(0, 0), (4, 3)], "appends continue the epoch"


def test_same_state_again_is_not_a_role_change(partition) -> None:
    p = partition()
    assert _lead(p, epoch=4) is True
    assert _lead(p, epoch=4, revision=11) is False
    assert p.revision == 11


def test_becoming_a_follower_is_a_role_change_and_forgets_followers(partition, helpers) -> None:
    p = partition()
    _lead(p)
    p.record_follower_fetch(F2, 0)
    assert p.update_state(REPLICAS, _state(F2, 2, REPLICAS), 11) is True
    assert not p.is_leader
    assert p.followers == {}
    with pytest.raises(NotLeaderError):
        p.append_as_leader(helpers.make_batch(1), 1)


# -- the high watermark -------------------------------------------------------------------


def test_sole_isr_member_commits_on_append(partition, helpers) -> None:
    p = partition()
    _lead(p, isr=(ME,))
    end = _produce(p, helpers, 3)
    assert p.high_watermark == end == 3


def test_high_watermark_is_the_smallest_log_end_in_the_isr(partition, helpers) -> None:
    p = partition()
    _lead(p)
    _produce(p, helpers, 5)
    assert p.high_watermark == 0, "follower positions are unknown until they fetch"
    p.record_follower_fetch(F2, 5)
    assert p.high_watermark == 0, "follower 3 has not fetched yet"
    p.record_follower_fetch(F3, 3)
    assert p.high_watermark == 3
    p.record_follower_fetch(F3, 5)
    assert p.high_watermark == 5


def test_followers_outside_the_isr_do_not_hold_the_high_watermark(partition, helpers) -> None:
    p = partition()
    _lead(p, isr=(ME, F2))
    _produce(p, helpers, 4)
    p.record_follower_fetch(F2, 4)
    assert p.high_watermark == 4
    p.record_follower_fetch(F3, 1)
    assert p.high_watermark == 4


def test_high_watermark_never_moves_back(partition, helpers) -> None:
    p = partition()
    _lead(p, isr=(ME, F2))
    _produce(p, helpers, 5)
    p.record_follower_fetch(F2, 5)
    assert p.high_watermark == 5
    p.record_follower_fetch(F2, 2)  # a follower that truncated and fetches again
    assert p.high_watermark == 5
    # The ISR grows by a follower further behind than the high watermark.
    p.update_state(REPLICAS, _state(ME, 1, REPLICAS, 1), 11)
    assert p.high_watermark == 5


def test_new_leader_holds_its_high_watermark_until_followers_fetch(partition, helpers) -> None:
    p = partition()
    p.update_state(REPLICAS, _state(F2, 1, REPLICAS), 10)
    helpers.append_batches(p.log, [helpers.make_batch(4)], epoch=1)  # copied from the old leader
    p.update_follower_high_watermark(2)
    assert p.high_watermark == 2
    _lead(p, epoch=2, revision=11)
    assert p.high_watermark == 2
    p.record_follower_fetch(F2, 4)
    p.record_follower_fetch(F3, 4)
    assert p.high_watermark == 4


# -- followers rejoining the ISR --------------------------------------------------------------


def test_follower_rejoins_once_it_reaches_the_high_watermark(partition, helpers) -> None:
    p = partition()
    _lead(p, isr=(ME, F2), epoch=1)
    _produce(p, helpers, 10)
    p.record_follower_fetch(F2, 10)
    assert p.high_watermark == 10
    p.record_follower_fetch(F3, 6)
    assert p.isr_expansion() is None
    p.record_follower_fetch(F3, 10)
    proposal = p.isr_expansion()
    assert proposal is not None
    assert proposal.isr == (ME, F2, F3)
    assert proposal.leader == ME
    assert proposal.leader_epoch == 1
    assert proposal.partition_epoch == p.state.partition_epoch + 1


def test_follower_rejoins_only_with_all_of_the_current_leaders_epoch(partition, helpers) -> None:
    # A new leader whose high watermark (2) lags behind where its epoch starts (6):
    # a follower must have everything this leader wrote, not just what is committed.
    p = partition()
    p.update_state(REPLICAS, _state(F2, 1, REPLICAS), 10)
    helpers.append_batches(p.log, [helpers.make_batch(6)], epoch=1)
    p.update_follower_high_watermark(2)
    _lead(p, isr=(ME, F2), epoch=2, revision=11)
    assert p.high_watermark == 2
    p.record_follower_fetch(F3, 4)
    assert p.isr_expansion() is None
    p.record_follower_fetch(F3, 6)
    proposal = p.isr_expansion()
    assert proposal is not None
    assert proposal.isr == (ME, F2, F3)


def test_not_a_leader_proposes_nothing(partition) -> None:
    p = partition()
    p.update_state(REPLICAS, _state(F2, 1, (F2,)), 10)
    p.record_follower_fetch(F3, 0)
    assert p.isr_expansion() is None
    assert p.isr_shrink(0) is None


# -- followers leaving the ISR -------------------------------------------------------------------


def test_isr_members_get_max_lag_from_the_election_before_they_are_dropped(
    partition, clock
) -> None:
    p = partition()
    _lead(p)
    clock.advance(MAX_LAG_MS)
    assert p.isr_shrink(MAX_LAG_MS) is None
    clock.advance(1)
    proposal = p.isr_shrink(MAX_LAG_MS)
    assert proposal is not None
    assert proposal.isr == (ME,)
    assert proposal.leader == ME
    assert proposal.leader_epoch == p.leader_epoch
    assert proposal.partition_epoch == p.state.partition_epoch + 1


def test_follower_fetching_at_the_log_end_stays_in_sync(partition, helpers, clock) -> None:
    p = partition()
    _lead(p)
    for _ in range(5):
        end = _produce(p, helpers)
        clock.advance(MAX_LAG_MS // 2)
        p.record_follower_fetch(F2, end)
        p.record_follower_fetch(F3, end)
    assert p.isr_shrink(MAX_LAG_MS) is None


def test_follower_reaching_the_previous_fetchs_log_end_counts_as_caught_up_then(
    partition, helpers, clock
) -> None:
    # Under steady produce a follower never sees the leader's current end when it
    # fetches, yet it is not lagging: it holds what the leader had at its last fetch.
    p = partition()
    _lead(p, isr=(ME, F2))
    _produce(p, helpers, 10)
    p.record_follower_fetch(F2, 10)  # t=0: at the log end
    _produce(p, helpers, 10)
    clock.advance(6000)
    p.record_follower_fetch(F2, 15)  # t=6000: past 10, the end at t=0 -> caught up at t=0
    _produce(p, helpers, 10)
    clock.advance(6000)
    p.record_follower_fetch(F2, 25)  # t=12000: past 20, the end at t=6000 -> caught up then
    assert p.isr_shrink(MAX_LAG_MS) is None  # 12000 - 6000 <= max lag
    clock.advance(MAX_LAG_MS - 6000 + 1)
    assert p.isr_shrink(MAX_LAG_MS) is not None


def test_follower_that_falls_behind_is_dropped_after_max_lag(partition, helpers, clock) -> None:
    p = partition()
    _lead(p)
    _produce(p, helpers, 10)
    p.record_follower_fetch(F2, 10)
    p.record_follower_fetch(F3, 10)
    start = clock.now
    _produce(p, helpers, 10)
    for _ in range(4):
        clock.advance(3000)
        end = p.log.log_end_offset
        p.record_follower_fetch(F2, end)
        p.record_follower_fetch(F3, 12)  # stuck at 12, below the end of its previous fetch
        _produce(p, helpers, 1)
    assert clock.now - start > MAX_LAG_MS
    proposal = p.isr_shrink(MAX_LAG_MS)
    assert proposal is not None
    assert proposal.isr == (ME, F2)


def test_shrink_never_removes_the_leader(partition, clock) -> None:
    p = partition()
    _lead(p, isr=(ME,))
    clock.advance(10 * MAX_LAG_MS)
    assert p.isr_shrink(MAX_LAG_MS) is None


# -- a proposal in flight ------------------------------------------------------------------


def test_pending_change_blocks_new_proposals_until_the_image_shows_it(
    partition, helpers, clock
) -> None:
    p = partition()
    _lead(p, isr=(ME, F2))
    _produce(p, helpers, 4)
    p.record_follower_fetch(F2, 4)
    p.record_follower_fetch(F3, 4)
    proposal = p.isr_expansion()
    assert proposal is not None
    p.pending_isr = proposal.isr
    assert p.isr_expansion() is None
    clock.advance(MAX_LAG_MS + 1)
    assert p.isr_shrink(MAX_LAG_MS) is None, "no shrink while the expansion is in flight"
    # An image that does not show the change yet (a config change, say) keeps it pending.
    p.update_state(REPLICAS, p.state, 11)
    assert p.pending_isr == proposal.isr
    p.update_state(REPLICAS, proposal, 12)
    assert p.pending_isr is None
    assert p.state.isr == (ME, F2, F3)


def test_pending_shrink_keeps_the_leaving_follower_in_the_high_watermark(
    partition, helpers, clock
) -> None:
    p = partition()
    _lead(p)
    _produce(p, helpers, 4)
    p.record_follower_fetch(F2, 4)
    p.record_follower_fetch(F3, 2)
    clock.advance(MAX_LAG_MS + 1)
    p.record_follower_fetch(F2, 4)
    proposal = p.isr_shrink(MAX_LAG_MS)
    assert proposal is not None
    assert proposal.isr == (ME, F2)
    p.pending_isr = proposal.isr
    p.maybe_advance_high_watermark()
    assert p.high_watermark == 2, "follower 3 is still in the ISR others may see"
    p.update_state(REPLICAS, proposal, 11)
    assert p.pending_isr is None
    assert p.high_watermark == 4


def test_pending_expansion_counts_the_joining_follower(partition, helpers) -> None:
    # Kafka's maximal ISR: once a follower may be in the ISR, nothing is committed
    # without it, or acks=all could be confirmed by fewer replicas than the ISR.
    p = partition()
    _lead(p, isr=(ME, F2))
    _produce(p, helpers, 4)
    p.record_follower_fetch(F2, 4)
    p.record_follower_fetch(F3, 4)
    proposal = p.isr_expansion()
    assert proposal is not None
    p.pending_isr = proposal.isr
    _produce(p, helpers, 4)
    p.record_follower_fetch(F2, 8)
    assert p.high_watermark == 4
    p.record_follower_fetch(F3, 8)
    assert p.high_watermark == 8


def test_new_leader_epoch_drops_a_pending_change(partition) -> None:
    p = partition()
    _lead(p, isr=(ME, F2), epoch=1)
    p.pending_isr = (ME, F2, F3)
    p.update_state(REPLICAS, _state(F2, 2, (F2,)), 11)
    assert p.pending_isr is None
    _lead(p, isr=(F2, ME), epoch=3, revision=12)
    assert p.pending_isr is None
    p.record_follower_fetch(F3, p.log.log_end_offset)
    proposal = p.isr_expansion()
    assert proposal is not None, "the new leader may propose again"
    assert proposal.isr == (F2, ME, F3)


def test_a_pending_change_overtaken_by_a_later_state_is_dropped(partition) -> None:
    # The controller wrote our expansion and then, in the same leader epoch, another
    # ISR (a broker that left); the image may show only the second.
    p = partition()
    p.update_state(REPLICAS, _state(ME, 1, (ME, F2), partition_epoch=4), 10)
    p.pending_isr = (ME, F2, F3)
    p.update_state(REPLICAS, _state(ME, 1, (ME, F3), partition_epoch=6), 11)
    assert p.pending_isr is None
    p.record_follower_fetch(F2, p.log.log_end_offset)
    proposal = p.isr_expansion()
    assert proposal is not None, "the leader proposes again from the state it has"
    assert proposal.isr == (ME, F3, F2)
    assert proposal.partition_epoch == 7


# -- acks=all -------------------------------------------------------------------------------


def test_acks_all_is_refused_below_min_insync_replicas(partition, helpers) -> None:
    p = partition(min_insync_replicas=2)
    _lead(p, isr=(ME,))
    with pytest.raises(NotEnoughReplicasError):
        p.append_as_leader(helpers.make_batch(1), -1)
    assert p.log.log_end_offset == 0, "nothing is written"
    assert p.append_as_leader(helpers.make_batch(1), 1).first_offset == 0
    p.update_state(REPLICAS, _state(ME, 1, (ME, F2), 1), 11)
    assert p.append_as_leader(helpers.make_batch(1), -1).first_offset == 1


async def test_wait_for_commit_returns_once_the_high_watermark_passes(partition, helpers) -> None:
    p = partition()
    _lead(p, isr=(ME, F2))
    end = _produce(p, helpers, 3, acks=-1)
    waiting = asyncio.create_task(p.wait_for_commit(end, 5.0))
    await asyncio.sleep(0)
    p.record_follower_fetch(F2, end - 1)
    await asyncio.sleep(0)
    assert not waiting.done()
    p.record_follower_fetch(F2, end)
    await asyncio.wait_for(waiting, 1.0)
    assert p.high_watermark == end


async def test_wait_for_commit_of_committed_records_returns_at_once(partition, helpers) -> None:
    p = partition()
    _lead(p, isr=(ME,))
    end = _produce(p, helpers, 2, acks=-1)
    await asyncio.wait_for(p.wait_for_commit(end, 0.0), 1.0)


async def test_wait_for_commit_fails_when_leadership_moves(partition, helpers) -> None:
    p = partition()
    _lead(p, isr=(ME, F2))
    end = _produce(p, helpers, 1, acks=-1)
    waiting = asyncio.create_task(p.wait_for_commit(end, 5.0))
    await asyncio.sleep(0)
    p.update_state(REPLICAS, _state(F2, 2, (F2,)), 11)
    with pytest.raises(NotLeaderError):
        await asyncio.wait_for(waiting, 1.0)


async def test_wait_for_commit_fails_when_reelected_under_a_new_epoch(partition, helpers) -> None:
    # The records may have been cut by the leader in between: the write is not confirmed.
    p = partition()
    _lead(p, isr=(ME, F2), epoch=1)
    end = _produce(p, helpers, 1, acks=-1)
    waiting = asyncio.create_task(p.wait_for_commit(end, 5.0))
    await asyncio.sleep(0)
    _lead(p, isr=(ME,), epoch=2, revision=11)
    with pytest.raises(NotLeaderError):
        await asyncio.wait_for(waiting, 1.0)


async def test_wait_for_commit_reports_an_isr_shrunk_below_min_insync(partition, helpers) -> None:
    p = partition(min_insync_replicas=2)
    _lead(p)
    end = _produce(p, helpers, 1, acks=-1)
    waiting = asyncio.create_task(p.wait_for_commit(end, 5.0))
    await asyncio.sleep(0)
    p.update_state(REPLICAS, _state(ME, 1, (ME,), 1), 11)  # followers dropped: HW jumps
    assert p.high_watermark == end
    with pytest.raises(NotEnoughReplicasAfterAppendError):
        await asyncio.wait_for(waiting, 1.0)


async def test_wait_for_commit_times_out(partition, helpers) -> None:
    p = partition()
    _lead(p, isr=(ME, F2))
    end = _produce(p, helpers, 1, acks=-1)
    p.record_follower_fetch(F2, 0)
    with pytest.raises(CommitTimeoutError):
        await asyncio.wait_for(p.wait_for_commit(end, 0.05), 1.0)
    assert not p._waiters, "a timed-out wait leaves no waiter behind"


# -- who is woken by what ------------------------------------------------------------


def _waiters(p: Partition) -> tuple[asyncio.Future[None], asyncio.Future[None]]:
    """A consumer's fetch (woken by every change) and a replica's (by records and roles)."""
    loop = asyncio.get_running_loop()
    reader, replica = loop.create_future(), loop.create_future()
    p.add_waiter(reader)
    p.add_waiter(replica, data_only=True)
    return reader, replica


async def test_a_new_high_watermark_wakes_readers_but_not_replicas(partition, helpers) -> None:
    # A replica reads to the log end: the watermark alone gives its fetch nothing to
    # answer with (Kafka's DelayedFetch completes it on min_bytes of records).
    p = partition()
    _lead(p, isr=(ME, F2))
    end = _produce(p, helpers, 2)
    reader, replica = _waiters(p)
    p.record_follower_fetch(F2, end)
    assert p.high_watermark == end
    assert reader.done() and not replica.done()
    p.remove_waiter(replica)
    assert not p._waiters and not p._data_waiters


async def test_a_followers_new_log_start_wakes_readers_but_not_replicas(partition) -> None:
    p = partition()
    _lead(p)
    reader, replica = _waiters(p)
    p.record_follower_fetch(F2, 0, log_start_offset=0)  # a DeleteRecords waits on this
    assert reader.done() and not replica.done()


async def test_records_and_role_changes_wake_everyone(partition, helpers) -> None:
    p = partition()
    _lead(p, isr=(ME, F2))
    reader, replica = _waiters(p)
    _produce(p, helpers, 1)
    assert reader.done() and replica.done()
    reader, replica = _waiters(p)
    p.update_state(REPLICAS, _state(F2, 2, (F2,)), 11)
    assert reader.done() and replica.done()
    assert not p._waiters and not p._data_waiters
