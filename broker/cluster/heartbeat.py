"""Renewing the broker's etcd lease from a thread of its own.

The lease is the broker's session: when it lapses the controller moves the
broker's leaderships away. It must lapse soon after the process freezes
(SIGSTOP, a VM paused) for clients to see a short failover, and must not
lapse while the process is merely busy, or a loaded cluster fails over for
nothing. Renewed from the broker's event loop, it did both badly: under
heavy produce load on two cores the loop stalls for up to 1.9 s at a time
(tests/integration/test_failover_gap.py logs them as
``event=event_loop_stalled``), so the session timeout had to stay long. So
renewals go out from a thread with its own event loop and its own etcd
connection, as Kafka's brokers heartbeat from a thread of their own: a
stalled loop no longer delays them, a frozen process stops them (its
threads freeze with it).

A loop wedged for good must still end the session, as it did before: the
thread keeps one tick posted to the broker's loop, and while a tick has
waited there for ``stall_timeout_s`` it withholds renewals and logs
``event=broker_heartbeat_withheld``.

A renewal that etcd does not answer does not hold up the next one: each
round sends its own (up to :data:`MAX_PENDING` at once), and the etcd client
sends each to the next member (shoal.etcd_client). A member cut off with a
minority can hold a renewal for seconds before it refuses it; waiting on it
let leases lapse while the other two members would have renewed them. A
renewal gets ``interval_s + PENDING_S`` and no more, and one that failed or
timed out retires its connection: after etcd's link was down, TCP sat on the
old connection's retransmission backoff for seconds after the link was back,
so brokers found their leases expired (and re-registered) 3-7 s late, one by
one, and the first to return led every partition alone meanwhile.

When a renewal finds the lease gone (expired while the process was frozen,
or revoked by a peer that took the broker for dead), the thread registers
again under a new lease; the session (:mod:`shoal.broker.cluster.session`)
keeps the broker from leading until its image has caught up with that
registration. Session updates are single attribute writes, safe to make
from this thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Final

import aetcd
import aetcd.exceptions
from shoal.broker.cluster.session import BrokerSession

from shoal.etcd_address import EtcdAddress
from shoal.etcd_client import EtcdClient

log = logging.getLogger(__name__)

NEVER: Final = 2**63 - 1
LATE_S: Final = 0.5
"""A renewal round this much later than due is logged (``event=broker_heartbeat_late``)."""
STOP_WAIT_S: Final = 1.0
PENDING_S: Final = 1.0
"""A renewal unanswered this long counts as failed (etcd slow or away) for the session."""
MAX_PENDING: Final = 3
"""Renewals in flight at once: one per member of a three-member etcd."""
FROZEN_S: Final = 1.0
"""This much later than due, a round of this thread means the process was frozen."""


def retry_window(interval_s: float, ttl_s: float) -> float:
    """How recent a failed (or long unanswered) renewal must be for the broker to count as
    still trying: while etcd is away a failure is recorded at least every ``interval_s +
    PENDING_S``; a process frozen long enough to be replaced (the session timeout less a
    renewal interval) has been silent for longer than this, so a woken zombie never
    counts as trying."""
    return min(interval_s + PENDING_S + 0.75, ttl_s - interval_s - 0.25)


class LeaseHeartbeat:
    """Keeps ``lease_id`` alive every ``interval_s`` until :meth:`stop`."""

    def __init__(
        self,
        address: EtcdAddress,
        timeout_s: float,
        session: BrokerSession,
        key: bytes,
        registration: Callable[[], bytes],
        ttl_s: int,
        interval_s: float,
        stall_timeout_s: float,
    ) -> None:
        self._address = address
        self._timeout_s = timeout_s
        self._session = session
        self._key = key
        self._registration = registration
        self._ttl_s = ttl_s
        self._interval_s = interval_s
        self._stall_timeout_s = stall_timeout_s
        self.lease_id = 0
        """The lease the registration lives under now (a new one after re-registering)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main: asyncio.AbstractEventLoop | None = None
        self._tick_posted_at: float | None = None
        """When the tick now waiting on the broker's loop was posted (None: none waits)."""
        self._renewed_at = time.monotonic()
        self._last_rtt_s = 0.0
        self._pending: dict[int, float] = {}
        """When each renewal now waiting on etcd was asked, by a number of its own."""
        self._asked = 0
        self._answered_at = 0.0
        """When the latest renewal that succeeded was asked: an older one answered after
        it must not move the session's deadline back."""
        self._renewal_limit_s = interval_s + PENDING_S
        """How long one etcd request of this thread may take before it counts as failed."""
        self._client: aetcd.Client | None = None
        """The heartbeat thread's etcd connection (replaced after a renewal fails on it)."""
        self._retire_client = False
        self._resumed_at = 0.0
        """When this thread last woke from a freeze of the whole process."""

    def start(self, lease_id: int) -> None:
        self.lease_id = lease_id
        self._main = asyncio.get_running_loop()
        self._renewed_at = time.monotonic()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run()), name="etcd-heartbeat", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        """Stop renewing (before the lease is revoked: a renewal after would find none)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            # Not for long: a renewal in flight to an etcd that is gone takes its whole
            # timeout, and a stopping broker must not wait on etcd. The thread checks the
            # flag before it would register again, and exits on its own.
            await asyncio.to_thread(thread.join, STOP_WAIT_S)

    def _tick(self) -> None:
        self._tick_posted_at = None

    def _loop_stalled_s(self) -> float:
        """How long the tick posted to the broker's loop has waited to run (posting one if
        none is waiting). Measured from the post, not from the last tick: after a freeze
        of the whole process (SIGSTOP) the loop is not stalled, and renewals resume at once."""
        now = time.monotonic()
        posted = self._tick_posted_at
        main = self._main
        if posted is None and main is not None and not main.is_closed():
            self._tick_posted_at = posted = now
            main.call_soon_threadsafe(self._tick)
        return 0.0 if posted is None else now - posted

    async def _watch_pending(self) -> None:
        """Count a renewal etcd has not answered for :data:`PENDING_S` as a failed one.

        The session lets a leader go on past its deadline only while renewals are
        tried and fail (etcd away: nobody can replace anyone). A renewal to an etcd
        that is gone fails only at the client's timeout (5 s), later than a 3 s
        session's deadline; without this, every etcd outage stopped all leaders for
        a couple of seconds. A renewal asked before this thread was itself frozen
        (SIGSTOP of the process) never counts: a woken zombie must not lead on it.
        """
        last = time.monotonic()
        while not self._stop.is_set():
            await asyncio.sleep(self._interval_s)
            now = time.monotonic()
            if now - last > self._interval_s + FROZEN_S:
                self._resumed_at = now  # the whole process was frozen meanwhile
            last = now
            pending = min(self._pending.values(), default=None)
            if pending is not None and pending > self._resumed_at and now - pending > PENDING_S:
                self._session.renewal_failed(now)

    async def _run(self) -> None:
        client = self._client = EtcdClient(self._address, self._timeout_s)
        retired: set[asyncio.Task[None]] = set()
        withheld = False
        watching = asyncio.create_task(self._watch_pending())
        registering = asyncio.Lock()
        renewals: set[asyncio.Task[None]] = set()
        try:
            while not self._stop.is_set():
                await asyncio.sleep(self._interval_s)
                if self._stop.is_set():
                    return
                stalled = self._loop_stalled_s()
                if stalled > self._stall_timeout_s:
                    if not withheld:
                        log.warning(
                            "event=broker_heartbeat_withheld loop_stalled_ms=%d", stalled * 1000
                        )
                    withheld = True
                    continue
                withheld = False
                if self._retire_client:
                    # Closing cancels the renewals still waiting on it.
                    self._retire_client = False
                    closing = asyncio.create_task(client.close())
                    retired.add(closing)
                    closing.add_done_callback(retired.discard)
                    client = self._client = EtcdClient(self._address, self._timeout_s)
                if len(self._pending) < MAX_PENDING:
                    renewal = asyncio.create_task(self._renew_logged(client, registering))
                    renewals.add(renewal)
                    renewal.add_done_callback(renewals.discard)
        finally:
            watching.cancel()
            for renewal in list(renewals):
                renewal.cancel()
            await asyncio.gather(client.close(), *retired, return_exceptions=True)

    async def _renew_logged(self, client: aetcd.Client, registering: asyncio.Lock) -> None:
        try:
            await self._renew(client, registering)
        except Exception:
            # Logged, and tried again next round; the session lapses meanwhile, so a
            # broker that cannot renew stops leading (never renewal_failed here: that
            # is for etcd being away, which keeps a leader serving).
            log.exception("event=broker_heartbeat_failed")

    async def _renew(self, client: aetcd.Client, registering: asyncio.Lock) -> None:
        asked = time.monotonic()
        lease_id = self.lease_id
        late = asked - self._renewed_at - self._interval_s
        if late >= LATE_S:
            # How close the broker came to losing its session while alive (a false failover):
            # the last renewal's round trip to etcd, and this thread waiting for the CPU.
            log.warning(
                "event=broker_heartbeat_late late_ms=%d last_renewal_ms=%d session_timeout_ms=%d",
                late * 1000,
                self._last_rtt_s * 1000,
                self._ttl_s * 1000,
            )
        self._renewed_at = asked
        self._asked += 1
        number = self._asked
        self._pending[number] = asked
        try:
            try:
                renewal = client.refresh_lease(lease_id)
                reply = await asyncio.wait_for(renewal, self._renewal_limit_s)
            finally:
                del self._pending[number]
            self._last_rtt_s = time.monotonic() - asked
            if reply is not None and reply.TTL > 0:
                if lease_id == self.lease_id and asked > self._answered_at:
                    self._answered_at = asked
                    self._session.renewed(asked, int(reply.TTL))
                return
            async with registering:
                if self._stop.is_set() or lease_id != self.lease_id:
                    return  # revoked by our own deregistration, or registered again already
                # On the connection in use now: the one this renewal went out on may be
                # retired meanwhile, and using it would open it again, never to be closed.
                client = self._client or client
                await self._register_again(client)
        except (aetcd.exceptions.ClientError, TimeoutError) as exc:
            log.warning("event=broker_lease_refresh_failed error=%s", str(exc) or "timed out")
            if client is self._client:
                self._retire_client = True
            # Asked before the process was frozen, or answered after a freeze that the
            # watcher has not noticed yet (no renewal takes this long otherwise): a woken
            # zombie must not lead on it.
            now = time.monotonic()
            if asked > self._resumed_at and now - asked <= self._renewal_limit_s + FROZEN_S:
                self._session.renewal_failed(now)

    async def _register_again(self, client: aetcd.Client) -> None:
        log.warning("event=broker_lease_expired action=reregister_and_catch_up")
        # Not a leader of anything until the image shows what moved meanwhile.
        self._session.registered_again(NEVER)
        asked = time.monotonic()
        lease = await asyncio.wait_for(client.lease(self._ttl_s), self._renewal_limit_s)
        put = await asyncio.wait_for(
            client.put(self._key, self._registration(), lease=lease.id), self._renewal_limit_s
        )
        self.lease_id = int(lease.id)
        self._session.registered_again(int(put.header.revision))
        self._session.renewed(asked, self._ttl_s)
