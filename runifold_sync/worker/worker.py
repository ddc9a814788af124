"""``WorkflowWorker``: the worker loop, and the single cycle it repeats.

``run(shutdown)`` claims and executes tasks until the token is cancelled (or until
``max_tasks`` tasks have run, which is how a pool recycles its processes), waiting in
the store's ``wait_for_work`` with a jittered backoff while there is nothing to claim.
``run_once()`` is one claim-and-execute cycle (the cron mode). A supervisor only forks
processes that each build a worker and call ``run``.

Where the rest lives: executing one claimed task and its store transitions in
``execution.py``, claim batching (tasks claimed before their turn, completions held for
one commit) in ``batch.py``, the heartbeat thread in ``heartbeat.py``, the idle wait in
``idle_backoff.py``, the settings and their checks in ``settings.py``, the thread
that creates schedules' ticks while ``run`` runs in ``schedule_ticker.py``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs

from ..engine.deadlines import DeadlineListener
from ..engine.logs import task_fields
from ..engine.spans import CycleTracer
from ..errors import InvalidArgument, LeaseLostError, StoreNotWritable, StoreUnavailable
from ..model import crashpoints, validate
from ..model.cancellation import CancellationToken
from ..model.outcomes import Idle, LeaseLost, RunOutcome, Yielded
from ..model.values import LeaseDuration, WorkerId
from ..store.base import WorkflowStore
from ..store.records import ClaimRequest, Routes
from ..workflow.registry import WorkflowRegistry
from .batch import ClaimedAhead, ClaimSize, Held, HeldCompletions, HeldLeases
from .execution import ClaimExecutor
from .heartbeat import LeaseKeeper
from .idle_backoff import DEFAULT_MAX_BACKOFF, DEFAULT_MIN_BACKOFF, IdleBackoff, IdleWait
from .observer import CycleObserver
from .schedule_ticker import ScheduleTicker
from .settings import WorkerSettings

log = logging.getLogger("runifold_sync.worker.worker")
# Cycles in a row the store may refuse as not writable before the loop gives up.
NOT_WRITABLE_ATTEMPTS = 5
# A host clock this far from store time is logged when a worker starts.
CLOCK_SKEW_WARNING_S = 5.0
# How often a cut-off worker looks whether its heartbeat thread reaches the store again.
_CUT_OFF_POLL_S = 0.1
_LOST_ANSWER = "handed back unstarted: the answer to its claim was lost with the connection"
# run_once's check of ``stopping``, composed once: a pool's loop calls it for every task.
_optional_token = validate.optional(validate.is_a(CancellationToken))


@attrs.frozen
class WorkerReport:
    """What :meth:`WorkflowWorker.run` did: cycles per outcome kind (idle polls
    included), tasks run (yielded cycles not counted: their task is unfinished), and
    whether it stopped because it reached ``max_tasks`` rather than by its token."""

    outcomes: dict[str, int]
    tasks: int
    reached_max_tasks: bool


class WorkflowWorker:
    """Claims tasks from ``store`` and runs the definitions in ``registry`` as
    ``worker_id``. Configure it with ``settings`` (a :class:`WorkerSettings`) or with
    its fields as arguments (``lease_duration``, ``heartbeat_interval``, then keywords
    such as ``claim_batch=4``); those given override ``settings``. With a ``tracer``
    (a :class:`~runifold_sync.engine.spans.CycleTracer`, such as
    ``runifold_sync.ops.tracing.Tracing`` over an OpenTelemetry provider) each cycle,
    body and wait is a span, flushed by :meth:`close`. Build the tracer in the process
    that runs the worker: a pool's worker factory runs after the fork."""

    def __init__(
        self,
        store: WorkflowStore,
        registry: WorkflowRegistry,
        worker_id: WorkerId,
        lease_duration: LeaseDuration | None = None,
        heartbeat_interval: timedelta | None = None,
        *,
        settings: WorkerSettings | None = None,
        observer: CycleObserver | None = None,
        tracer: CycleTracer | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(store, WorkflowStore):
            raise InvalidArgument(
                f"store must be a WorkflowStore, got a {type(store).__name__}"
                + ("; a store URL is opened with open_store(url)" if isinstance(store, str) else "")
            )
        validate.instance("registry", registry, WorkflowRegistry)
        if not isinstance(worker_id, WorkerId):
            validate.refuse("worker_id", "a WorkerId (use WorkerId.parse)", worker_id)
        validate.optional(validate.is_a(CycleObserver))("observer", observer)
        if tracer is not None and not (callable(getattr(tracer, "cycle", None)) and hasattr(tracer, "close")):
            validate.refuse("tracer", "a CycleTracer (with cycle and close) or None", tracer)
        self.settings = _settings(settings, lease_duration, heartbeat_interval, dict(options))
        self.store = store
        self.registry = registry
        self.worker_id = worker_id
        self._observer = observer
        if observer is not None:
            store.operation_timer = observer.store_operation
        store.bound_calls(self.settings.lease_duration)
        self._registered = False
        self._keeper = LeaseKeeper(
            store,
            self.settings.lease_duration,
            self.settings.heartbeat_interval.total_seconds(),
            f"runifold-heartbeat-{worker_id}",
            observer,
        )
        self._routes_at = -1
        self._request = self._claim_request()
        size = ClaimSize(
            self.settings.max_claim,
            adaptive=self.settings.adaptive_claims,
            lease_s=self.settings.lease_duration.value.total_seconds(),
        )
        self._ahead = ClaimedAhead(HeldLeases(self._keeper), self._claim_request, size)
        self._tracer = tracer
        self._held = HeldCompletions(self._ahead)
        # Only run() holds completions for a claim batch's one commit, and only with a
        # batch to share it and no tracer (batch.py).
        self._holds = self.settings.max_claim > 1 and self._tracer is None
        self._started: dict[str, float] = {}  # monotonic start of each held task's cycle (observer)
        self._executor = ClaimExecutor(
            store, registry, worker_id, self.settings, self._keeper, self._ahead, self._held, self._tracer
        )

    @property
    def routes(self) -> Routes:
        """What this worker can run (its queues, and its registry's definitions): claims
        and the idle wait look only at those tasks."""
        return self._claim_request().routes or Routes(self.settings.queues, ())

    def _claim_request(self) -> ClaimRequest:
        """The claim this worker makes, its routes recomputed when the registry changed."""
        if self._routes_at != self.registry.revision:
            routes = Routes.serving(
                self.settings.queues,
                [(d.identity.name, d.identity.version, d.identity.fingerprint) for d in self.registry],
            )
            self._request = ClaimRequest(
                self.worker_id, self.settings.lease_duration, self.settings.max_claim, routes
            )
            self._routes_at = self.registry.revision
        return self._request

    @property
    def claim_size(self) -> ClaimSize:
        """How this worker sizes its claims: the next claim's ``limit``, the ``largest``
        it has reached, the running average of its tasks' durations (``task_s``)."""
        return self._ahead.size

    @property
    def lease_duration(self) -> LeaseDuration:
        return self.settings.lease_duration

    def report_deadlines(self, listener: DeadlineListener) -> None:
        """Tell ``listener`` the earliest deadline (``time.monotonic()``) of the step and
        effect bodies with a timeout running in this worker, each time it changes, and
        None once none runs: a body cannot be interrupted from inside, so this is how a
        pool's child tells its supervisor when to kill it. Called from the thread that
        runs the body; it should only pass the value on."""
        self._executor.deadlines = listener

    def hand_back_at_boundary(self, reason: str) -> None:
        """Hand the running task back at its next step boundary, released for any worker
        to continue (not counted as an attempt), instead of running it to its end: for a
        worker that must stop soon, such as a pool's child whose supervisor is gone.
        ``reason`` is recorded with the release. Safe to call from a signal handler."""
        self._keeper.hand_back_at_boundary(validate.free_text("reason", reason))

    def run(
        self,
        shutdown: CancellationToken,
        *,
        max_tasks: int | None = None,
        min_backoff: timedelta = DEFAULT_MIN_BACKOFF,
        max_backoff: timedelta = DEFAULT_MAX_BACKOFF,
        on_outcome: Callable[[RunOutcome], None] | None = None,
    ) -> WorkerReport:
        """Claim and execute tasks until ``shutdown`` is cancelled or ``max_tasks`` tasks
        have run, then hand back the tasks claimed ahead and report.

        A cycle that has started when the token is cancelled finishes its lease protocol
        first, its completion claiming no next task. While nothing is claimable the loop
        waits for work between ``min_backoff`` and ``max_backoff`` (see
        :class:`~runifold_sync.worker.idle_backoff.IdleWait`), noticing a cancel within half a
        second. A cycle or wait that fails (an unreachable store: a database restart) ends
        that cycle, not the loop: it is logged and retried, at once the first time (a
        connection the server dropped is replaced), then after a pause doubling from
        ``min_backoff`` to ``max_backoff``; the store reconnects, and a task the cycle held
        is claimed again once its lease expires. While the heartbeat thread cannot reach
        the store the loop claims nothing (a task it claimed could not be kept) and waits
        until it can. A store that refuses writes (:class:`StoreNotWritable`: permissions,
        a read-only database) ``NOT_WRITABLE_ATTEMPTS`` times in a row ends the loop with
        that error.
        ``on_outcome`` hears each cycle's outcome as it ends (pool children report them to
        their supervisor). While it runs, a thread creates the due ticks of the registry's
        schedules and of those created at run time that it serves
        (:mod:`~runifold_sync.worker.schedule_ticker`); :meth:`run_once` creates none.
        Signals are the caller's: a handler should only cancel ``shutdown``. The worker
        stays open: :meth:`close` it afterwards."""
        validate.instance("shutdown", shutdown, CancellationToken)
        if max_tasks is not None:
            validate.count("max_tasks", max_tasks)
        if on_outcome is not None and not callable(on_outcome):  # else a TypeError after the first task
            validate.refuse("on_outcome", "a function of a RunOutcome or None", on_outcome)
        idle = IdleWait(self.store, IdleBackoff(min_backoff, max_backoff), lambda: self.routes)
        outcomes: Counter[str] = Counter()
        tasks = 0
        refused = _RefusedWrites()
        # Always: a schedule created at run time (store.create_schedule) may be this
        # registry's to tick, whether or not the registry declares any.
        ticker = ScheduleTicker(self.store, self.registry, self.worker_id.value, lambda: self._registered)

        def report(ended: list[RunOutcome]) -> int:
            """Count and pass on the outcomes of a cycle; how many tasks they ended."""
            for outcome in ended:
                outcomes[outcome.kind] += 1
                if on_outcome is not None:
                    on_outcome(outcome)
            return sum(not isinstance(outcome, Idle | Yielded) for outcome in ended)

        failures = _Failures(min_backoff, max_backoff)
        try:
            while not shutdown.cancelled and (max_tasks is None or tasks < max_tasks):
                if self._keeper.cut_off:
                    self._wait_while_cut_off(shutdown)
                    continue
                self._hand_back_unknown_leases()
                # Claim the next task with this one's completion unless the loop ends after
                # this cycle or stops: the worker checks the token again just before the
                # completion, so a stop during the cycle makes no new claim. The last
                # cycle holds no completion: it commits those held.
                last = max_tasks is not None and tasks + len(self._held) + 1 >= max_tasks
                try:
                    ended = self._cycle(claim_next=not last, stopping=shutdown, hold=self._holds and not last)
                except Exception as exc:
                    refused.count(exc)
                    self._back_off("cycle failed", exc, shutdown, failures.next_delay())
                    continue
                refused.reset()
                failures.reset()
                self.store.outage.answered()
                tasks += report(ended)
                if ended and isinstance(ended[-1], Idle):
                    try:
                        idle.wait(shutdown)
                    except Exception as exc:
                        refused.count(exc)
                        self._back_off("waiting for work failed", exc, shutdown, failures.next_delay())
                    continue
                idle.worked()
        finally:
            if self._held:  # stopped between cycles of a batch
                tasks += report(self._commit_held_at_stop())
            ticker.close()
            self._ahead.release()
        return WorkerReport(dict(outcomes), tasks, max_tasks is not None and tasks >= max_tasks)

    def _back_off(self, what: str, exc: Exception, shutdown: CancellationToken, delay: timedelta) -> None:
        """Wait ``delay`` after a failed cycle or wait. An unavailable store is said once
        per outage (the store's :class:`~runifold_sync.store.outage.OutageLog`), not with
        a traceback per cycle; any other error is logged with its traceback."""
        message = f"worker {self.worker_id}: {what}; backing off"
        self.store.outage.report(log, message, exc, {"worker_id": self.worker_id.value})
        shutdown.wait(delay.total_seconds())

    def _hand_back_unknown_leases(self) -> None:
        """After a claim that failed once it may have committed (its answer lost with its
        connection, ``store.claims_in_doubt``), hand back the leases this worker holds
        but does not know of, so their tasks run now rather than once those leases run
        out. Between cycles every lease this worker knows of is its heartbeat's; when
        the store does not answer, this is tried again before the next cycle."""
        if self.worker_id.value not in self.store.claims_in_doubt:
            return
        try:
            running = self._keeper.running_for()
            known = self._ahead.leases.task_ids() | (set() if running is None else {running[0]})
            for lease in self.store.leases_of(self.worker_id):
                if lease.task_id in known:
                    continue
                try:
                    with crashpoints.transition("hand_back"):
                        self.store.release(lease, delay=timedelta(0), reason=_LOST_ANSWER)
                except LeaseLostError:
                    continue  # expired meanwhile: another worker's to take
                log.info("handed back a task whose claim's answer was lost", extra=task_fields(lease))
        except StoreUnavailable as exc:
            message = f"worker {self.worker_id}: could not hand back the tasks of a lost claim's answer"
            self.store.outage.report(log, message, exc, {"worker_id": self.worker_id.value})
            return
        self.store.claims_in_doubt.discard(self.worker_id.value)

    def _wait_while_cut_off(self, shutdown: CancellationToken) -> None:
        """Claim nothing until the heartbeat thread reaches the store again (or the loop
        stops): a task claimed now would lose its lease while its beats fail."""
        log.info(
            "worker %s: its heartbeat cannot reach the store; claiming nothing until it does",
            self.worker_id,
            extra={"worker_id": self.worker_id.value},
        )
        while self._keeper.cut_off and not shutdown.cancelled:
            shutdown.wait(_CUT_OFF_POLL_S)

    def run_once(self, *, claim_next: bool = False, stopping: CancellationToken | None = None) -> RunOutcome:
        """Claim one ready task and run it until it completes, waits, fails or yields.

        ``claim_next`` is for a loop that calls again at once (:meth:`run`): a completion
        then also claims the next task, in the completion's transaction, which saves a
        commit per task; the next call runs that task, and :meth:`close` hands it back
        unstarted. ``stopping`` is that loop's stop token: once it is cancelled (a SIGTERM
        during the cycle) the completion claims nothing, since a stopping worker takes no
        new work."""
        # Checked before the claim: a completion that read them would raise with the task leased.
        validate.flag("claim_next", claim_next)
        _optional_token("stopping", stopping)
        (outcome,) = self._cycle(claim_next=claim_next, stopping=stopping, hold=False)
        return outcome

    def _cycle(self, *, claim_next: bool, stopping: CancellationToken | None, hold: bool) -> list[RunOutcome]:
        """One claim-and-execute cycle; ``hold``: its completion may be held for its
        batch's one commit. Returns the outcomes it settled: the commit of the held
        completions when it is due (before the next body starts), then this cycle's own
        unless its completion is held."""
        self._held.allowed = hold
        outcome = self._claim_and_run(claim_next, stopping)
        ended = [] if isinstance(outcome, Held) else [outcome]
        # A worker that never holds (one task per claim, or a tracer) has none to commit.
        if self._holds and (self._held.due() or (self._held and not hold)):
            ended = self._commit_held() + ended
        return ended

    def _claim_and_run(self, claim_next: bool, stopping: CancellationToken | None) -> RunOutcome | Held:
        self._ahead.claim_next = claim_next
        self._ahead.stopping = stopping
        if not self._registered:  # in the process that runs, so after any fork
            definitions = sorted(
                (d.identity.name, d.identity.version, d.identity.fingerprint) for d in self.registry
            )
            self.store.register_worker(
                self.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                definitions=definitions,
                queues=self.settings.queues,
            )
            # What this registry declares, so signals to its tasks are checked where sent.
            self.store.declare_signals(d.declared_signals for d in self.registry)
            self._keeper.announce(self.worker_id)
            self._registered = True
            _warn_of_clock_skew(self.store)
        extended_at = None
        held = self._ahead.next()
        if isinstance(held, LeaseLost):
            return held
        if held is not None:
            task, extended_at = held
        else:
            if crashpoints.ARMED:
                crashpoints.reached("before_claim", str(self.worker_id))
            extended_at = time.monotonic()  # the lease runs from the claim, not from its answer
            size = self._ahead.size
            limit = size.limit
            claimed = self.store.claim(self.worker_id, self.lease_duration, limit=limit, routes=self.routes)
            size.claimed(limit, len(claimed))
            if not claimed:
                return Idle()
            task = claimed[0]
            self._ahead.hold(claimed[1:])
        if crashpoints.ARMED:
            crashpoints.reached("after_claim", task.lease.task_id)
        observer = self._observer
        size = self._ahead.size
        if observer is None and not size.adaptive:
            return self._executor.run(task, extended_at)
        if observer is not None:
            observer.claimed(task)
        started = time.monotonic()
        size.begin(started)
        outcome = self._executor.run(task, extended_at)
        size.ran(time.monotonic() - started)
        if observer is None:
            return outcome
        if isinstance(outcome, Held):
            self._started[task.lease.task_id] = started
        else:
            observer.finished(task, outcome, time.monotonic() - started)
        return outcome

    def _commit_held(self) -> list[RunOutcome]:
        """Commit the held completions (``HeldCompletions.commit``): their tasks' outcomes,
        the observer told of each."""
        started, self._started = self._started, {}
        ended = []
        for claimed, outcome in self._held.commit(self._executor.settle_refused):
            if self._observer is not None:
                self._observer.finished(claimed, outcome, time.monotonic() - started[claimed.lease.task_id])
            ended.append(outcome)
        return ended

    def _commit_held_at_stop(self) -> list[RunOutcome]:
        """The held completions of a loop that stops, committed with no claim; when the
        store cannot take them, their tasks run again once their leases run out."""
        self._ahead.claim_next = False
        try:
            return self._commit_held()
        except Exception as exc:
            message = f"worker {self.worker_id}: could not commit the completions held for its batch"
            self.store.outage.report(log, message, exc, {"worker_id": self.worker_id.value})
            return []

    def close(self) -> None:
        """Hand back tasks claimed ahead, stop the heartbeat thread and mark the worker
        stopped in the registry, then export the spans still buffered. The store belongs
        to the caller."""
        self._ahead.release()
        self._keeper.close()
        if self._registered:
            try:
                self.store.worker_stopped(self.worker_id, os.getpid())
            except StoreUnavailable:
                log.warning(
                    "could not mark worker %s stopped",
                    self.worker_id,
                    extra={"worker_id": str(self.worker_id)},
                )
        if self._tracer is not None:
            self._tracer.close()


def _warn_of_clock_skew(store: WorkflowStore) -> None:
    """Store time rules leases and timers, so a host clock far from it is no fault of the
    worker; but it is what an operator reading this host's logs and clocks must know."""
    skew_s = time.time() - store.now().timestamp()
    if abs(skew_s) > CLOCK_SKEW_WARNING_S:
        log.warning(
            "this host's clock is %+.1f s from store time; leases and timers follow store time "
            "(runifold_clock_skew_seconds)",
            skew_s,
        )


class _Failures:
    """Failed cycles and waits in a row, and the pause before the next attempt: none
    after the first (the store reconnects at once, and a dropped connection is no
    outage), then doubling from ``min_backoff`` up to ``max_backoff``."""

    def __init__(self, min_backoff: timedelta, max_backoff: timedelta) -> None:
        self._min = min_backoff
        self._max = max_backoff
        self._in_a_row = 0

    def next_delay(self) -> timedelta:
        self._in_a_row += 1
        if self._in_a_row == 1:
            return timedelta(0)
        return min(self._min * (1 << min(self._in_a_row - 2, 30)), self._max)

    def reset(self) -> None:
        self._in_a_row = 0


class _RefusedWrites:
    """Consecutive cycles the store refused as not writable. A permission or a read-only
    database does not fix itself the way a restarting server does: after
    ``NOT_WRITABLE_ATTEMPTS`` in a row the loop stops with the store's reason."""

    def __init__(self) -> None:
        self._in_a_row = 0

    def count(self, exc: Exception) -> None:
        if not isinstance(exc, StoreNotWritable):
            self._in_a_row = 0
            return
        self._in_a_row += 1
        if self._in_a_row >= NOT_WRITABLE_ATTEMPTS:
            raise exc

    def reset(self) -> None:
        self._in_a_row = 0


def _settings(
    settings: WorkerSettings | None,
    lease_duration: LeaseDuration | None,
    heartbeat_interval: timedelta | None,
    options: dict[str, Any],
) -> WorkerSettings:
    """``settings`` (or the defaults) with the settings given as arguments put in."""
    if settings is not None and not isinstance(settings, WorkerSettings):
        # The type alone: a Settings (an easy mix-up) holds the store URL, password and all.
        raise InvalidArgument(f"settings must be a WorkerSettings or None, got a {type(settings).__name__}")
    if lease_duration is not None:
        options["lease_duration"] = lease_duration
    if heartbeat_interval is not None:
        options["heartbeat_interval"] = heartbeat_interval
    return (settings or WorkerSettings()).replace(**options)
