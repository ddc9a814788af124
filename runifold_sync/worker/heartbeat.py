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
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta

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
        self._store = store
        self._observer = observer
        self._duration = duration
        self._interval_s = interval_s
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._lease: Lease | None = None
        # The running task's (task id, fencing token) once its claim-ending write began:
        # a heartbeat refused after that found the task ended by this worker, not lost.
        self._ending: tuple[str, int] | None = None
        self._claim: Claim | None = None  # the running task's (kept after unwatch)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._worker_id: WorkerId | None = None  # refreshed in the worker registry when set
        # Leases of tasks claimed ahead in a batch, kept alive until their turn, with the
        # monotonic time each was last extended from; a lease that could not be extended
        # is dropped, so ``take`` reports it lost.
        self._held: dict[str, tuple[Lease, float]] = {}
        # Held tasks given back to the queue because the running one took long (see
        # _hand_back_held), until the worker comes to them.
        self._handed_back: set[str] = set()
        # Held leases never handed back: tasks whose completion waits for their batch's
        # commit (held_completions.py).
        self._completion_held: set[str] = set()
        self._watched_at = 0.0  # monotonic time the running task's watch began
        self._overdue_told: str | None = None  # the overdue body already logged
        self._on_beat: Callable[[], None] | None = None  # see each_beat
        self._hand_back: str | None = None  # see hand_back_at_boundary
        # Each attempt of a beat gets at most this long (and never past the lease's end).
        self._attempt_s = max(interval_s / 2, MIN_ATTEMPT_S)
        self._cut_off = False  # the thread's last store call failed for an outage
        self._failed_at = float("-inf")  # monotonic time of that failure
        self._watched: tuple[str, int] | None = None  # (task, token) of the last watched lease
        self._watched_revision = 0  # the revision its claim saw
        # Held leases lost, with the monotonic time each was last extended from.
        self._lost_held: dict[str, float] = {}
        # Claims lost while cut off, to tell the store once it answers: (lease, revision),
        # and the (task, token) of each one queued until told, so each is queued once.
        self._forgiven: list[tuple[Lease, int]] = []
        self._forgiven_claims: set[tuple[str, int]] = set()

    def announce(self, worker_id: WorkerId) -> None:
        """Keep ``worker_id``'s ``last_seen`` fresh in the store's worker registry, idle or not."""
        with self._lock:
            self._worker_id = worker_id
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
            self._watched = (lease.task_id, lease.fencing_token)
            self._watched_revision = claim.claimed.revision
            self._ending = None
            self._watched_at = time.monotonic()
            claim.deadline = start + self._duration.seconds
            claim.store_offset_s = lease.expires_at.timestamp() - claim.deadline
            claim.hand_back = self._hand_back
            claim.requested(lease.cancel_requested, None)  # requested while a previous owner ran
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

    def hold(self, leases: list[Lease], *, hand_back: bool = True) -> None:
        """Keep ``leases`` (claimed ahead, not running yet) alive until taken; with
        ``hand_back`` False (tasks that ran, their completion held) never give them back."""
        now = time.monotonic()
        with self._lock:
            for lease in leases:
                self._held[lease.task_id] = (lease, now)
                if not hand_back:
                    self._completion_held.add(lease.task_id)
            self._start()

    def take(self, task_id: str) -> tuple[Lease, float] | None:
        """The latest form of a held lease (extended, cancel request noted) and the
        monotonic time it was extended from, no longer kept here; None when it was lost
        while waiting or handed back (see :meth:`was_handed_back`)."""
        with self._lock:
            self._completion_held.discard(task_id)
            return self._held.pop(task_id, None)

    def was_handed_back(self, task_id: str) -> bool:
        """Whether a held task went back to the queue unstarted (asked once per task)."""
        with self._lock:
            if task_id in self._handed_back:
                self._handed_back.remove(task_id)
                return True
            return False

    def ending(self) -> None:
        """The running task's claim-ending write (complete, suspend, fail...) is about to
        be sent: a heartbeat refused from now on is no lease lost worth a warning (the
        write's own answer says whether the lease held)."""
        with self._lock:
            lease = self._lease
            self._ending = None if lease is None else (lease.task_id, lease.fencing_token)

    def known_task_ids(self) -> set[str]:
        """The tasks whose leases this keeper extends: the running one and those held."""
        with self._lock:
            running = set() if self._lease is None else {self._lease.task_id}
            return running | set(self._held)

    @property
    def cut_off(self) -> bool:
        """The thread's last store call failed for an outage (and the thread still runs):
        a worker takes no new work until it answers again."""
        thread = self._thread
        return self._cut_off and thread is not None and thread.is_alive()

    def cut_off_within(self, seconds: float) -> bool:
        """Whether the thread's store calls failed for an outage in the last ``seconds``."""
        return time.monotonic() - self._failed_at < seconds

    def forgive_if_cut_off(self, lease: Lease, revision: int) -> None:
        """``lease`` (of a claim that saw ``revision``) was found lost: when the thread
        could not reach the store since the lease was last extended, the worker lived
        through the loss, cut off, and the store is told (once it answers) so that the
        claim does not count as a crash. A lease that simply ran out (a process frozen
        or starved) counts as before."""
        with self._lock:
            extended = self._lost_held.pop(lease.task_id, None)
            claim = self._claim
            if (
                extended is None
                and claim is not None
                and self._watched == (lease.task_id, lease.fencing_token)
            ):
                extended = claim.deadline - self._duration.seconds
            if extended is not None and self._failed_at >= extended:
                self._forgive(lease, revision)

    def _forgive(self, lease: Lease, revision: int) -> None:
        """Queue the report of a claim lost while cut off, once (caller holds the lock)."""
        claim = (lease.task_id, lease.fencing_token)
        if claim not in self._forgiven_claims:
            self._forgiven_claims.add(claim)
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

    def _extend_held(self) -> bool:
        """Extend every held lease; False when the store was closed under the keeper."""
        with self._lock:
            held = list(self._held.values())
        for lease, extended in held:
            started = time.monotonic()
            if crashpoints.ARMED:
                crashpoints.reached("before_heartbeat", lease.task_id)
            end = extended + self._duration.seconds
            try:
                with retrying_until(end, self._attempt_s):
                    renewed: Lease | None = self._store.heartbeat(lease, self._duration)
                self._answered()
                if crashpoints.ARMED:
                    crashpoints.reached("after_heartbeat", lease.task_id)
            except LeaseLostError:
                self._answered()
                renewed = None
                log.warning(
                    "lease of a held task (claimed ahead, or its completion held) lost",
                    extra=task_fields(lease),
                )
            except StoreClosed:
                return False
            except Exception as exc:  # an unreachable store: try again at the next beat
                self._failed(exc, "heartbeat of a task claimed ahead failed", task_fields(lease))
                continue
            with self._lock:
                current = self._held.get(lease.task_id)
                if current is not None and current[0] is lease:
                    if renewed is None:
                        del self._held[lease.task_id]
                        self._completion_held.discard(lease.task_id)
                        self._lost_held[lease.task_id] = current[1]
                    else:
                        self._held[lease.task_id] = (renewed, started)
        return True

    def _loop(self) -> None:
        while True:
            asked_at = time.monotonic()
            wait_s = min(self._interval_s, CUT_OFF_RETRY_S) if self._cut_off else self._interval_s
            stopped = self._wake.wait(wait_s)
            if self._observer is not None and not stopped:
                self._report_waits(time.monotonic() - asked_at - wait_s)
            with self._lock:
                if self._stop:
                    return
                lease, claim, worker_id = self._lease, self._claim, self._worker_id
            # Claims lost while cut off first: a worker that takes one of their tasks over
            # once the network heals may be counting them as crashes meanwhile.
            if not self._send_forgiven():
                return
            if worker_id is not None:
                try:
                    with retrying_until(time.monotonic() + self._attempt_s):
                        self._store.worker_seen(worker_id, self._pid)
                    self._answered()
                except StoreClosed:
                    return  # closed under a worker nobody closed: nothing left to keep
                except Exception as exc:
                    self._failed(exc, "worker registry update failed", {"worker_id": str(worker_id)})
            # The running task's lease first: leases claimed ahead must not delay it.
            if lease is not None and claim is not None and not self._extend_current(lease, claim):
                return
            if not self._hand_back_held() or not self._extend_held():
                return
            if not self._beat_hook():
                return

    def _answered(self) -> None:
        self._cut_off = False

    def _failed(self, exc: Exception, message: str, extra: dict[str, object]) -> None:
        """A store call of the thread failed: an outage cuts the worker off (see
        :attr:`cut_off`); said once per outage by the store's outage log."""
        if is_outage(exc):
            self._failed_at = time.monotonic()
            self._cut_off = True
        self._store.outage.report(log, message, exc, extra)

    def _send_forgiven(self) -> bool:
        """Tell the store of the claims lost while cut off (:meth:`forgive_if_cut_off`);
        those it cannot take now wait for the next beat. False when the store was closed
        under the keeper."""
        with self._lock:
            forgiven, self._forgiven = self._forgiven, []
        for at, (lease, revision) in enumerate(forgiven):
            try:
                with retrying_until(time.monotonic() + self._attempt_s):
                    taken_back = self._store.forgive_lost_claim(lease, revision)
                self._answered()
            except StoreClosed:
                return False
            except Exception as exc:
                self._failed(exc, "could not report a lease lost while cut off", task_fields(lease))
                if is_outage(exc):
                    with self._lock:
                        self._forgiven[:0] = forgiven[at:]
                    return True
                continue
            with self._lock:  # told: a late second report of it is refused by the store
                self._forgiven_claims.discard((lease.task_id, lease.fencing_token))
            if taken_back:
                log.info(
                    "lease lost while cut off from the store: not counted as a crash",
                    extra=task_fields(lease),
                )
        return True

    def each_beat(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` on the heartbeat thread after each beat (the worker's held
        completions commit those overdue while a body runs, ``held_completions.py``)."""
        with self._lock:
            self._on_beat = hook

    def _beat_hook(self) -> bool:
        """Run the ``each_beat`` hook; False when the store was closed under the keeper."""
        hook = self._on_beat
        if hook is None:
            return True
        try:
            hook()
        except StoreClosed:
            return False
        except Exception:  # a bug there must not stop the heartbeat
            log.exception("the heartbeat's hook failed")
        return True

    def _report_waits(self, drift_s: float) -> None:
        """The thread woke ``drift_s`` after it asked to (a frozen or starved process),
        and the store's pool waits since the last beat."""
        assert self._observer is not None
        self._observer.runtime_stall(max(drift_s, 0.0))
        waits = self._store.pool_waits()
        self._observer.pool_wait(waits.requests, waits.waited, waits.wait_s)

    def _beat_landed(self, flags: Claim, started: float) -> None:
        """Report a beat sent at ``started`` that just got its answer: how late it was
        against the beat due an interval after the last extension, and the lease left."""
        if self._observer is not None:
            due = flags.deadline - self._duration.seconds + self._interval_s
            self._observer.heartbeat(max(started - due, 0.0), max(flags.deadline - time.monotonic(), 0.0))

    def _hand_back_held(self) -> bool:
        """Give held tasks back to the queue, unstarted, once the running task has kept
        the worker for half a lease: other workers may be idle while they wait behind it.
        False when the store was closed under the keeper."""
        with self._lock:
            running_s = time.monotonic() - self._watched_at
            held = [
                lease
                for lease, _extended in self._held.values()
                if lease.task_id not in self._completion_held
            ]
            if self._lease is None or not held or running_s < self._duration.seconds / 2:
                return True
            for lease in held:
                del self._held[lease.task_id]
            self._handed_back.update(lease.task_id for lease in held)
        reason = f"handed back unstarted: the task before it ran for {running_s:.0f} s"
        for lease in held:
            try:
                with (
                    retrying_until(time.monotonic() + self._attempt_s),
                    crashpoints.transition("hand_back"),
                ):
                    self._store.release(lease, delay=timedelta(0), reason=reason)
            except StoreClosed:
                return False
            except Exception as exc:  # lost already, or an unreachable store: its lease runs out
                self._failed(exc, "could not hand back a task claimed ahead", task_fields(lease))
        return True

    def _extend_current(self, lease: Lease, flags: Claim) -> bool:
        """Extend the running task's lease, unless a body is past its timeout; False when
        the store was closed under the keeper."""
        if self._past_timeout(lease, flags):
            return True
        started = time.monotonic()
        if crashpoints.ARMED:
            crashpoints.reached("before_heartbeat", lease.task_id)
        try:
            # Tried again at once while the lease lasts, each attempt bounded: the lease
            # must not run out while one attempt waits on a dead connection.
            with retrying_until(lambda: flags.deadline, self._attempt_s):
                renewed = self._store.heartbeat(lease, self._duration)
            self._answered()
            if crashpoints.ARMED:
                crashpoints.reached("after_heartbeat", lease.task_id)
        except LeaseLostError:
            self._answered()
            self._beat_landed(flags, started)
            flags.lost = True
            with self._lock:
                current = self._lease is lease
                ended = self._ending == (lease.task_id, lease.fencing_token)
                if current:  # lost for good: stop beating for it (and logging it)
                    self._lease = None
                if current and not ended and self._failed_at >= flags.deadline - self._duration.seconds:
                    self._forgive(lease, self._watched_revision)  # ran out while cut off
            if current and not ended:  # otherwise the cycle ended the lease itself
                log.warning("lease lost", extra=task_fields(lease))
            return True
        except StoreClosed:
            flags.lost = True  # nothing can extend it now
            return False
        except Exception as exc:
            self._failed(exc, "heartbeat failed", task_fields(lease))
            if flags.expired():
                flags.lost = True
                if is_outage(exc):
                    with self._lock:
                        self._forgive(lease, self._watched_revision)  # ran out while cut off
            return True
        self._beat_landed(flags, started)
        flags.requested(renewed.cancel_requested, renewed.paused)
        with self._lock:
            if self._lease is lease:
                self._lease = renewed
                flags.deadline = started + self._duration.seconds
        return True

    def _past_timeout(self, lease: Lease, flags: Claim) -> bool:
        """True while a body of the running task is past its timeout: its lease is then
        left to run out (said once per body), since the task must not stay with a body
        that cannot be interrupted. Extensions resume if the body ends while the lease
        still holds (an effect's late result is worth keeping)."""
        overdue = flags.bodies.overdue()
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
