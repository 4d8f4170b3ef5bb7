"""The controller: one broker, elected through etcd, that elects partition leaders.

Every broker runs this. While the image shows no controller, each
registered broker campaigns (creates the controller key under its own
lease; etcd lets one win). The winner acts on every new image: leaders for
partitions whose leader is gone or shutting down, ISRs without dead brokers
(:mod:`shoal.broker.controller.decisions`), and on a timer the preferred
leaders; an admin's ElectLeaders asks it for the elections it names. Its
writes compare each partition's revision and its own controller epoch, so a
controller that has been replaced, or a leader changing its ISR at the same
moment, makes the write fail instead of both winning; the next image brings
the truth and the controller decides again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from shoal.broker.cluster.model import (
    ClusterImage,
    ControllerLease,
    NodeId,
    PartitionState,
    TopicImage,
)
from shoal.broker.cluster.store import (
    AssignmentChange,
    ConflictError,
    MetadataStore,
    PartitionChange,
    StoreUnavailableError,
)
from shoal.broker.controller.decisions import (
    ElectionOutcome,
    IsrChangeRefusedError,
    IsrChangeRequest,
    alter_isr,
    changed_since,
    elect_leaders,
    elect_requested,
    rebalance_preferred_leaders,
)
from shoal.broker.controller.reassignments import (
    ReassignmentRefusedError,
    ReassignmentRequest,
    alter_reassignment,
    complete_reassignments,
)
from shoal.broker.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_RETRY_S: Final = 0.5
_CATCH_UP_S: Final = 2.0
"""How long an ISR request waits for our image to reach the partition epoch it names."""
ISR_WRITE_CHUNK: Final = 100
"""ISR changes written in one etcd transaction (etcd takes 128 operations of each kind)."""


class NotControllerError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class IsrChangeResult:
    request: IsrChangeRequest
    code: str | None
    """None when done, else the Kafka error name."""
    state: PartitionState | None


@dataclass(frozen=True, slots=True)
class ReassignmentResult:
    request: ReassignmentRequest
    code: str | None
    """None when stored, else the Kafka error name."""
    message: str | None = None


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_ms: int = 300000
    leader_imbalance_per_broker_percentage: int = 10


class Controller:
    def __init__(
        self,
        node_id: NodeId,
        store: MetadataStore,
        settings: ControllerSettings,
        unclean_allowed: Callable[[TopicImage], bool],
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.settings = settings
        self.unclean_allowed = unclean_allowed
        self.image: ClusterImage | None = None
        self.active = False
        """Whether this broker may campaign (registered, not shutting down)."""
        self._wake = asyncio.Event()
        self._image_changed = asyncio.Event()
        self._rebalance_due = False
        self._tasks: list[asyncio.Task[None]] = []
        self._settled: ClusterImage | None = None
        """The last image every decision was made for (in ``_settled_under``'s term)."""
        self._settled_under: ControllerLease | None = None

    @property
    def lease(self) -> ControllerLease | None:
        """Our term as controller, if the image says we hold it."""
        image = self.image
        if image is None or image.controller is None:
            return None
        return image.controller if image.controller.node_id == self.node_id else None

    def on_image(self, image: ClusterImage) -> None:
        self.image = image
        self._wake.set()
        self._image_changed.set()

    async def alter_partitions(self, requests: list[IsrChangeRequest]) -> list[IsrChangeResult]:
        """AlterPartition: check each leader's ISR request and write it; NotControllerError
        if this broker is not the controller.

        Every request is decided first, then the changes are written together, up to
        :data:`ISR_WRITE_CHUNK` in one etcd transaction: a broker rejoining a cluster of
        thousands of partitions comes back into their ISRs in a few writes, not one
        round trip each. A transaction that loses a compare-and-swap is written again
        change by change, so only the changes that lost are refused.
        """
        if self.lease is None:
            raise NotControllerError
        results: dict[int, IsrChangeResult] = {}
        decided: list[tuple[int, PartitionChange]] = []
        asked: set[tuple[uuid.UUID, int]] = set()
        for at, request in enumerate(requests):
            if (request.topic_id, request.index) in asked:
                # etcd refuses two writes of one key in a transaction; a leader names
                # each partition once.
                results[at] = IsrChangeResult(request, "invalid_request", None)
                continue
            asked.add((request.topic_id, request.index))
            await self._catch_up(request)
            image = self.image
            if self.lease is None or image is None:
                raise NotControllerError
            try:
                change = alter_isr(image, request)
            except IsrChangeRefusedError as exc:
                results[at] = IsrChangeResult(request, exc.code, None)
                continue
            if change is None:
                topic = image.topic_by_id(request.topic_id)
                state = topic.partitions.get(request.index) if topic is not None else None
                results[at] = IsrChangeResult(request, None, state)
                continue
            decided.append((at, change))
        codes = await self._write_isr_changes([change for _, change in decided])
        for (at, change), code in zip(decided, codes, strict=True):
            if code is None:
                _log_change(change)
            state = change.state if code is None else None
            results[at] = IsrChangeResult(requests[at], code, state)
        return [results[at] for at in range(len(requests))]

    async def _write_isr_changes(self, changes: list[PartitionChange]) -> list[str | None]:
        """Write ``changes``; each one's error name (None: written), in their order."""
        outcome: dict[int, str | None] = {}
        pending = [
            list(range(at, min(at + ISR_WRITE_CHUNK, len(changes))))
            for at in range(0, len(changes), ISR_WRITE_CHUNK)
        ]
        while pending:
            chunk = pending.pop(0)
            lease = self.lease
            if lease is None:
                raise NotControllerError
            try:
                await self.store.update_partitions([changes[at] for at in chunk], lease)
            except ConflictError:
                if len(chunk) > 1:
                    # Some change lost its compare-and-swap: find which, one by one.
                    pending[:0] = [[at] for at in chunk]
                else:
                    outcome[chunk[0]] = "invalid_update_version"
                continue
            except StoreUnavailableError as exc:
                # etcd did not take the write (no quorum where it went, or too slow): the
                # leader proposes again, as after any refusal; the connection stays up.
                # The rest are not tried: each would wait out the same timeout, and the
                # leader's request would time out before the answer.
                log.warning("event=alter_partition_not_written error=%s", exc)
                for rest in (chunk, *pending):
                    outcome |= dict.fromkeys(rest, "request_timed_out")
                break
            outcome |= dict.fromkeys(chunk)
        return [outcome[at] for at in range(len(changes))]

    async def alter_reassignments(
        self, requests: list[ReassignmentRequest]
    ) -> tuple[list[ReassignmentResult], int]:
        """AlterPartitionReassignments: start, replace or cancel each partition's move, in
        order; the results and the store revision of the last write (0: none).
        NotControllerError if this broker is not the controller.

        Each write waits until our image shows it, so the next partition of the
        same topic is decided over the record it changed.
        """
        results = []
        revision = 0
        for request in requests:
            lease, image = self.lease, self.image
            if lease is None or image is None:
                raise NotControllerError
            try:
                change = alter_reassignment(image, request)
            except ReassignmentRefusedError as exc:
                results.append(ReassignmentResult(request, exc.code, exc.message))
                continue
            if change is not None:
                try:
                    revision = await self.store.update_assignment(change, lease)
                except ConflictError as exc:
                    results.append(ReassignmentResult(request, "request_timed_out", str(exc)))
                    continue
                _log_assignment(change, "reassignment_changed")
                await self._wait_for_image(revision)
            results.append(ReassignmentResult(request, None))
        return results, revision

    async def elect(
        self, wanted: list[tuple[str, int]] | None, election_type: int
    ) -> tuple[list[ElectionOutcome], int]:
        """ElectLeaders: each partition's outcome, and the store revision of the write
        (0: none). NotControllerError if this broker is not the controller.

        The changes are written together, compared against each partition's
        revision: if a leader changed meanwhile the whole election is refused
        (REQUEST_TIMED_OUT, as Kafka answers an election it could not finish),
        and the client may ask again over the new state.
        """
        lease, image = self.lease, self.image
        if lease is None or image is None:
            raise NotControllerError
        outcomes = elect_requested(image, wanted, election_type, self.unclean_allowed)
        changes = [o.change for o in outcomes if o.change is not None]
        if not changes:
            return outcomes, 0
        try:
            revision = await self.store.update_partitions(changes, lease)
        except ConflictError as exc:
            failed = [
                replace(o, change=None, code="request_timed_out", message=str(exc))
                if o.change is not None
                else o
                for o in outcomes
            ]
            return failed, 0
        for change in changes:
            _log_change(change)
        log.info(
            "event=leaders_elected election_type=%d partitions=%d", election_type, len(changes)
        )
        return outcomes, revision

    async def _wait_for_image(self, revision: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CATCH_UP_S
        while (remaining := deadline - loop.time()) > 0:
            if self.image is not None and self.image.revision >= revision:
                return
            self._image_changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._image_changed.wait()

    async def _catch_up(self, request: IsrChangeRequest) -> None:
        """A leader may have seen a newer partition epoch than our image shows yet."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CATCH_UP_S
        while (remaining := deadline - loop.time()) > 0:
            image = self.image
            topic = image.topic_by_id(request.topic_id) if image is not None else None
            state = topic.partitions.get(request.index) if topic is not None else None
            if state is None or state.partition_epoch >= request.partition_epoch:
                return
            self._image_changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._image_changed.wait()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.active = True
        self._tasks = [loop.create_task(self._run(), name="controller")]
        if self.settings.auto_leader_rebalance_enable:
            self._tasks.append(loop.create_task(self._rebalance_timer(), name="leader-rebalance"))
        self._wake.set()

    async def stop(self) -> None:
        """Stop campaigning and give up office, so another broker takes over at once."""
        self.active = False
        lease = self.lease
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await cancel_and_wait(task)
        if lease is not None:
            await self.store.resign(lease)

    async def _rebalance_timer(self) -> None:
        while True:
            await asyncio.sleep(self.settings.leader_imbalance_check_interval_ms / 1000)
            self._rebalance_due = True
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._step()
            except (ConflictError, StoreUnavailableError) as exc:
                log.info("event=controller_retry error=%s", exc)
                await asyncio.sleep(_RETRY_S)
                self._wake.set()

    async def _step(self) -> None:
        image = self.image
        if image is None or not self.active or self.node_id not in image.brokers:
            return
        if image.controller is None:
            if await self.store.campaign(self.node_id):
                log.info("event=controller_elected node_id=%d", self.node_id)
            return
        lease = self.lease
        if lease is None:
            return
        settled = self._settled if self._settled_under == lease else None
        scope = changed_since(settled, image)
        changes = elect_leaders(scope, self.unclean_allowed)
        if not changes and self._rebalance_due:
            self._rebalance_due = False
            changes = rebalance_preferred_leaders(
                image, self.settings.leader_imbalance_per_broker_percentage
            )
            if changes:
                log.info("event=preferred_leader_election partitions=%d", len(changes))
        if changes:
            await self.store.update_partitions(changes, lease)
            for change in changes:
                _log_change(change)
            return
        for completed in complete_reassignments(scope):
            await self.store.update_assignment(completed, lease)
            _log_assignment(completed, "reassignment_completed")
        # Nothing left to decide here: later images are looked at for what changed since.
        self._settled, self._settled_under = image, lease


def _log_change(change: PartitionChange) -> None:
    state = change.state
    log.info(
        "event=partition_state_changed topic=%s partition=%d leader=%d leader_epoch=%d isr=%s",
        change.topic,
        change.index,
        state.leader,
        state.leader_epoch,
        ",".join(map(str, state.isr)),
    )


def _log_assignment(change: AssignmentChange, event: str) -> None:
    for partition in change.partitions:
        state = partition.state
        log.info(
            "event=%s topic=%s partition=%d replicas=%s adding=%s removing=%s leader=%d isr=%s",
            event,
            partition.topic,
            partition.index,
            ",".join(map(str, change.record.assignment[partition.index])),
            ",".join(map(str, state.adding)),
            ",".join(map(str, state.removing)),
            state.leader,
            ",".join(map(str, state.isr)),
        )
