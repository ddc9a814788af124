"""Keeps the current lease alive from a background thread.

Step bodies block the worker thread (a model call, a slow query), so lease extension runs
beside them in a named daemon thread with its own store connection. When the lease cannot
be extended the thread sets the lease's ``lost`` flag, and when the store reports a cancel
request it sets ``cancel``; the workflow context checks both at every step boundary. (The
boundary's own checkpoint commit also reports a cancel, so a task of short steps does not
wait for a heartbeat to learn of one.)

A beat the store does not answer is tried again at once, each attempt bounded, until the
lease's end (``retries.retrying_until``): a dropped connection or a short network cut
costs a reconnection, not the lease. While the thread's calls fail the worker is cut
off: it claims nothing (:attr:`LeaseKeeper.cut_off`), the thread tries every
``CUT_OFF_RETRY_S`` until the store answers, and a lease lost meanwhile is reported to
the store as lost by a living worker (``forgive_lost_claim``), so it does not count as a
step crashing its worker.

Each beat runs a list of small periodic tasks in order: report the thread's wake-up drift
(with an observer), tell the store of claims lost while cut off, refresh the worker's
registration and extend the running task's lease; claim batching (``batch.py``) adds its
own (hand held tasks back, extend held leases, commit held completions). They share the
beat because each keeps something that runs out with a lease. A task that finds the
store closed stops the thread; any other error it lets out is logged and the beat goes on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from ..engine.claim import Claim
from ..engine.deadlines import describe_timeout
from ..engine.logs import task_fields
from ..errors import ForkUnsafe, LeaseLostError, StoreClosed
from ..model import crashpoints
from ..model.values import LeaseDuration, WorkerId
from ..store.base import WorkflowStore
from ..store.outage import is_outage
from ..store.records import Lease
from ..store.retries import retrying_until
from .observer import CycleObserver

log = logging.getLogger("runifold_sync.worker.heartbeat")

# How often a cut-off heartbeat thread tries the store again (at most its interval).
CUT_OFF_RETRY_S = 0.5
# No attempt of a beat is cut off sooner than this (half the interval otherwise): on a
# loaded host a healthy answer can take a few hundred milliseconds.
MIN_ATTEMPT_S = 1.0


class LeaseKeeper:
    """The heartbeat thread of one worker. With an ``observer`` it also reports each
    beat's timing, its own wake-up drift and the store's pool waits (see ``observer``)."""

    def __init__(
        self,
        store: WorkflowStore,
        duration: LeaseDuration,
        interval_s: float,
        name: str,
        observer: CycleObserver | None = None,
    ) -> None:
        self.store = store
        self.duration = duration
        self._duration_s = duration.seconds  # read at every claim's watch
        self._observer = observer
        self._interval_s = interval_s
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._worker_id: WorkerId | None = None  # refreshed in the worker registry when set
        self._claim: Claim | None = None  # the running task's (kept after unwatch)
        self._lease: Lease | None = None  # its lease as last renewed; None once unwatched or lost
        # The running task's (task id, fencing token) once its claim-ending write began:
        # a heartbeat refused after that found the task ended by this worker, not lost.
        self._ending: tuple[str, int] | None = None
        self._watched_at = 0.0  # monotonic time the running task's watch began
        self._overdue_told: str | None = None  # the overdue body already logged
        self._hand_back: str | None = None  # see hand_back_at_boundary
        # Each attempt of a beat gets at most this long (and never past the lease's end).
        self.attempt_s = max(interval_s / 2, MIN_ATTEMPT_S)
        self._cut_off = False  # the thread's last store call failed for an outage
        self._failed_at = float("-inf")  # monotonic time of that failure
        self._drift_s: float | None = None  # how late the thread woke for this beat
        # Claims lost while cut off, to tell the store once it answers: (lease, revision),
        # and the (task, token) of each one queued until told, so each is queued once.
        self._forgiven: list[tuple[Lease, int]] = []
        self._forgiven_claims: set[tuple[str, int]] = set()
        self._tasks: list[Callable[[], None]] = [
            self._report_waits,
            self._send_forgiven,  # first: a worker taking their tasks over may count them as crashes
            self._refresh_registration,
            self._extend_current,  # before claim batching's: held leases must not delay it
        ]

    def every_beat(self, *tasks: Callable[[], None]) -> None:
        """Run ``tasks`` on the heartbeat thread at each beat, after those already given."""
        with self._lock:
            self._tasks.extend(tasks)

    def announce(self, worker_id: WorkerId) -> None:
        """Keep ``worker_id``'s ``last_seen`` fresh in the store's worker registry, idle or not."""
        with self._lock:
            self._worker_id = worker_id
            self._start()

    def start(self) -> None:
        """Start the thread in this process, once."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        """Start the thread in this process, once (caller holds the lock)."""
        if self._pid != os.getpid():
            raise ForkUnsafe(
                "a worker cannot be used in a process forked from the one that built it; "
                "build the worker after the fork (a pool's worker factory runs in each child)"
            )
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def watch(self, claim: Claim, extended_at: float | None = None) -> None:
        """Start extending ``claim``'s lease, last extended (or claimed) at monotonic time
        ``extended_at`` (default now), and setting its flags."""
        start = time.monotonic() if extended_at is None else extended_at
        lease = claim.lease
        with self._lock:
            self._lease = lease
            self._ending = None
            self._watched_at = time.monotonic()
            claim.deadline = start + self._duration_s
            claim.store_offset_s = lease.expires_at.timestamp() - claim.deadline
            claim.hand_back = self._hand_back
            if lease.cancel_requested is not None:  # requested while a previous owner ran
                claim.cancel = True
            self._claim = claim
            self._start()

    def hand_back_at_boundary(self, reason: str) -> None:
        """Have the running task, and any watched from now on, handed back at its next
        step boundary for ``reason``. Takes no lock (a signal handler calls it on the
        thread that may hold one); ``watch`` reads it after making a claim's flags."""
        self._hand_back = reason
        claim = self._claim
        if claim is not None:
            claim.hand_back = reason

    def ending(self) -> None:
        """The running task's claim-ending write (complete, suspend, fail...) is about to
        be sent: a heartbeat refused from now on is no lease lost worth a warning (the
        write's own answer says whether the lease held)."""
        with self._lock:
            lease = self._lease
            self._ending = None if lease is None else (lease.task_id, lease.fencing_token)

    def running_for(self) -> tuple[str, float] | None:
        """The running task's id and how long it has run, None when no task runs."""
        with self._lock:
            lease = self._lease
            return None if lease is None else (lease.task_id, time.monotonic() - self._watched_at)

    @property
    def cut_off(self) -> bool:
        """The thread's last store call failed for an outage (and the thread still runs):
        a worker takes no new work until it answers again."""
        thread = self._thread
        return self._cut_off and thread is not None and thread.is_alive()

    def cut_off_within(self, seconds: float) -> bool:
        """Whether the thread's store calls failed for an outage in the last ``seconds``."""
        return time.monotonic() - self._failed_at < seconds

    def forgive_if_cut_off(self, lease: Lease, revision: int, extended_at: float | None = None) -> None:
        """``lease`` (of a claim that saw ``revision``) was found lost: when the thread
        could not reach the store since the lease was last extended (at ``extended_at``
        for a held lease; the running one's the keeper knows), the worker lived through
        the loss, cut off, and the store is told (once it answers) so that the claim does
        not count as a crash. A lease that simply ran out (a process frozen or starved)
        counts as before."""
        with self._lock:
            claim = self._claim
            if extended_at is None and claim is not None and _same(claim.lease, lease):
                extended_at = claim.deadline - self.duration.seconds
            if extended_at is not None and self._failed_at >= extended_at:
                self._forgive(lease, revision)

    def _forgive(self, lease: Lease, revision: int) -> None:
        """Queue the report of a claim lost while cut off, once (caller holds the lock)."""
        key = (lease.task_id, lease.fencing_token)
        if key not in self._forgiven_claims:
            self._forgiven_claims.add(key)
            self._forgiven.append((lease, revision))

    def unwatch(self) -> None:
        with self._lock:
            self._lease = None

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._stop = True
            self._lease = None
            thread, self._thread = self._thread, None
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            asked_at = time.monotonic()
            wait_s = min(self._interval_s, CUT_OFF_RETRY_S) if self._cut_off else self._interval_s
            stopped = self._wake.wait(wait_s)
            self._drift_s = None if stopped else time.monotonic() - asked_at - wait_s
            with self._lock:
                if self._stop:
                    return
                tasks = tuple(self._tasks)
            for task in tasks:
                try:
                    task()
                except StoreClosed:
                    return  # closed under a worker nobody closed: nothing left to keep
                except Exception:  # a bug there must not stop the heartbeat
                    log.exception("a heartbeat task failed")

    def _refresh_registration(self) -> None:
        """Keep the worker's ``last_seen`` fresh in the store's worker registry."""
        worker_id = self._worker_id
        if worker_id is None:
            return
        try:
            with retrying_until(time.monotonic() + self.attempt_s):
                self.store.worker_seen(worker_id, self._pid)
            self.answered()
        except StoreClosed:
            raise
        except Exception as exc:
            self.failed(exc, "worker registry update failed", {"worker_id": str(worker_id)})

    def answered(self) -> None:
        """A store call of the thread was answered: the worker is not cut off."""
        self._cut_off = False

    def failed(self, exc: Exception, message: str, extra: dict[str, object]) -> None:
        """A store call of the thread failed: an outage cuts the worker off (see
        :attr:`cut_off`); said once per outage by the store's outage log."""
        if is_outage(exc):
            self._failed_at = time.monotonic()
            self._cut_off = True
        self.store.outage.report(log, message, exc, extra)

    def _send_forgiven(self) -> None:
        """Tell the store of the claims lost while cut off (:meth:`forgive_if_cut_off`);
        those it cannot take now wait for the next beat."""
        with self._lock:
            forgiven, self._forgiven = self._forgiven, []
        for at, (lease, revision) in enumerate(forgiven):
            try:
                with retrying_until(time.monotonic() + self.attempt_s):
                    taken_back = self.store.forgive_lost_claim(lease, revision)
                self.answered()
            except StoreClosed:
                raise
            except Exception as exc:
                self.failed(exc, "could not report a lease lost while cut off", task_fields(lease))
                if is_outage(exc):
                    with self._lock:
                        self._forgiven[:0] = forgiven[at:]
                    return
                continue
            with self._lock:  # told: a late second report of it is refused by the store
                self._forgiven_claims.discard((lease.task_id, lease.fencing_token))
            if taken_back:
                log.info(
                    "lease lost while cut off from the store: not counted as a crash",
                    extra=task_fields(lease),
                )

    def _report_waits(self) -> None:
        """How late the thread woke for this beat (a frozen or starved process), and the
        store's pool waits since the last beat."""
        drift_s = self._drift_s
        if self._observer is None or drift_s is None:
            return
        self._observer.runtime_stall(max(drift_s, 0.0))
        waits = self.store.pool_waits()
        self._observer.pool_wait(waits.requests, waits.waited, waits.wait_s)

    def _beat_landed(self, claim: Claim, started: float) -> None:
        """Report a beat sent at ``started`` that just got its answer: how late it was
        against the beat due an interval after the last extension, and the lease left."""
        if self._observer is not None:
            due = claim.deadline - self.duration.seconds + self._interval_s
            self._observer.heartbeat(max(started - due, 0.0), max(claim.deadline - time.monotonic(), 0.0))

    def _extend_current(self) -> None:
        """Extend the running task's lease, unless a body is past its timeout."""
        with self._lock:
            lease, claim = self._lease, self._claim
        if lease is None or claim is None or self._past_timeout(lease, claim):
            return
        started = time.monotonic()
        if crashpoints.ARMED:
            crashpoints.reached("before_heartbeat", lease.task_id)
        try:
            # Tried again at once while the lease lasts, each attempt bounded: the lease
            # must not run out while one attempt waits on a dead connection.
            with retrying_until(lambda: claim.deadline, self.attempt_s):
                renewed = self.store.heartbeat(lease, self.duration)
            self.answered()
            if crashpoints.ARMED:
                crashpoints.reached("after_heartbeat", lease.task_id)
        except LeaseLostError:
            self.answered()
            self._beat_landed(claim, started)
            claim.lost = True
            with self._lock:
                current = self._lease is lease
                ended = self._ending == (lease.task_id, lease.fencing_token)
                if current:  # lost for good: stop beating for it (and logging it)
                    self._lease = None
                if current and not ended and self._failed_at >= claim.deadline - self.duration.seconds:
                    self._forgive(lease, claim.claimed.revision)  # ran out while cut off
            if current and not ended:  # otherwise the cycle ended the lease itself
                log.warning("lease lost", extra=task_fields(lease))
            return
        except StoreClosed:
            claim.lost = True  # nothing can extend it now
            raise
        except Exception as exc:
            self.failed(exc, "heartbeat failed", task_fields(lease))
            if claim.expired():
                claim.lost = True
                if is_outage(exc):
                    with self._lock:
                        self._forgive(lease, claim.claimed.revision)  # ran out while cut off
            return
        self._beat_landed(claim, started)
        if renewed.cancel_requested is not None:
            claim.cancel = True
        if renewed.paused is not None:
            claim.pause = True
        with self._lock:
            if self._lease is lease:
                self._lease = renewed
                claim.deadline = started + self.duration.seconds

    def _past_timeout(self, lease: Lease, claim: Claim) -> bool:
        """True while a body of the running task is past its timeout: its lease is then
        left to run out (said once per body), since the task must not stay with a body
        that cannot be interrupted. Extensions resume if the body ends while the lease
        still holds (an effect's late result is worth keeping)."""
        overdue = claim.bodies.overdue()
        if overdue is None:
            return False
        call_id, timeout_s = overdue
        told = f"{lease.task_id}/{lease.fencing_token}/{call_id}"
        if self._overdue_told != told:
            self._overdue_told = told
            log.warning(
                "%s is past its timeout of %s: its lease is no longer extended, so another "
                "worker takes the task over once it runs out",
                call_id,
                describe_timeout(timeout_s),
                extra=task_fields(lease),
            )
        return True


def _same(one: Lease, other: Lease) -> bool:
    """Leases of the same claim (one may be the other extended)."""
    return one.task_id == other.task_id and one.fencing_token == other.fencing_token
