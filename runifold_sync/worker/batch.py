"""Claim batching: the tasks a worker claimed before their turn, and the completions it
holds so that a batch's short tasks commit their ends together.

How many tasks a claim asks for is :class:`ClaimSize`'s: a fixed ``claim_batch``, or
with ``claim_batch="auto"`` a size that grows while claims come back full and tasks are
short, and falls to one task when they are not.

Tasks claimed ahead are the rest of a claim batch, or the next task claimed in a
completion's transaction (:class:`ClaimedAhead`). Their leases, and those of tasks whose
completion is held, are kept alive by the heartbeat thread until the worker comes to
them (:class:`HeldLeases`); tasks claimed ahead are handed back unstarted when the running
one keeps the worker long, or when it stops.

A worker that claimed a batch runs its tasks in turn. A task that completes while more
of the batch is still to run has its completion held instead of committed, and the held
completions are committed in one transaction (``store.complete_batch``) once the batch
has run, with the claim of the next batch in the same transaction: a one-step task then
shares one commit with the rest of its batch instead of making its own, which is most of
what such a task costs (``benchmarks/completion_batch.py``).

Only :meth:`WorkflowWorker.run` holds completions (a loop that comes back at once), only
with ``claim_batch`` above 1 and no tracer (a cycle's span covers its completion), and
never the completion of a task with a compensation still to run (a cancel that wins over
the held completion must then undo it, which is not a held task's business).

What stays true:

- A held task is reported complete (its outcome, the observer, a pool's supervisor) only
  after that commit. Until then it is what a crash between the last step and the
  completion always was: if the worker dies, the lease runs out and the task runs again
  from its last commit.
- Its lease is kept by the heartbeat thread meanwhile, and never handed back.
- A held completion the store refuses is settled as the task's own completion would
  have been: a cancel requested meanwhile wins (the task ends cancelled), a lost lease
  is a :class:`~runifold_sync.model.outcomes.LeaseLost`.
- It waits little: held completions are committed before the next body starts once
  the oldest has waited ``HOLD_LIMIT_S``, and while a body runs longer than that the
  heartbeat thread commits them at its next beat (so at most a heartbeat interval
  late); their outcomes are then reported when that body's cycle ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import attrs

from ..engine.logs import task_fields
from ..errors import CancelPending, LeaseLostError, StoreClosed, StoreUnavailable
from ..model import crashpoints
from ..model.outcomes import Completed, LeaseLost, RunOutcome
from ..store.records import ClaimedTask, ClaimRequest, Completion, Lease
from ..store.retries import retrying_until

if TYPE_CHECKING:
    from ..engine.task_run import TaskRun
    from ..model.cancellation import CancellationToken
    from .heartbeat import LeaseKeeper

log = logging.getLogger("runifold_sync.worker.worker")


# With claim_batch="auto": the longest a claim's tasks are expected to take together, so
# the longest its last task is expected to wait behind the others (at most a twentieth
# of the lease, which is well under the half lease after which held tasks go back).
HOLD_BUDGET_S = 0.1
# The weight of the latest task's duration in the running average of durations.
DURATION_WEIGHT = 0.25


class ClaimSize:
    """How many tasks the worker's next claim asks for (``limit``).

    A fixed ``claim_batch`` asks for that many every time. Adaptive (``"auto"``), a
    worker starts at one task and doubles the size after each claim that came back full
    (the queue is deeper than the claim), up to ``maximum`` and to as many tasks as fit
    in the hold budget (``HOLD_BUDGET_S``, or a twentieth of the lease if less) at the
    running average of its tasks' durations; a claim that comes back short (the queue is
    shallow, or empty) or a task that alone outlasts the budget puts it back to one. So
    a batch is claimed only from a queue deep enough that other workers have work of
    their own, and only of tasks short enough that the last one waits briefly: a worker
    whose queue turns shallow asks for one task at its next claim, and tasks that turn
    out long are claimed one at a time (those already held are handed back as ever,
    once the task before them has run for half a lease)."""

    __slots__ = ("adaptive", "largest", "limit", "maximum", "task_s", "_budget_s", "_running_since")

    def __init__(self, maximum: int, *, adaptive: bool, lease_s: float) -> None:
        self.maximum = maximum
        self.adaptive = adaptive
        self.limit = 1 if adaptive else maximum
        self.largest = self.limit  # the largest limit reached so far (tests, diagnostics)
        self.task_s: float | None = None  # running average of task durations, seconds
        self._budget_s = min(HOLD_BUDGET_S, lease_s / 20)
        self._running_since = 0.0  # monotonic start of the running task's cycle

    def begin(self, at: float) -> None:
        """A task's cycle started at monotonic ``at``."""
        self._running_since = at

    def ending(self) -> int:
        """The size of the claim made with the running task's completion, which comes
        before :meth:`ran` hears how long the task took: one task if it has outlasted
        the budget already."""
        if self.adaptive and time.monotonic() - self._running_since > self._budget_s:
            self.limit = 1
        return self.limit

    def claimed(self, asked: int, got: int) -> None:
        """A claim for ``asked`` tasks came back with ``got``."""
        if not self.adaptive:
            return
        if got < asked:
            self.limit = 1
            return
        task_s = self.task_s
        fit = self.maximum if task_s is None or task_s <= 0 else int(self._budget_s / task_s)
        # Nothing is known of the tasks' durations before the first has run: one task.
        self.limit = 1 if task_s is None else max(1, min(self.limit * 2, self.maximum, fit))
        self.largest = max(self.largest, self.limit)

    def ran(self, seconds: float) -> None:
        """A task's cycle took ``seconds`` on this worker."""
        if not self.adaptive:
            return
        task_s = self.task_s
        self.task_s = seconds if task_s is None else task_s + DURATION_WEIGHT * (seconds - task_s)
        if seconds > self._budget_s:
            self.limit = 1
        elif self.limit > 1 and self.limit * self.task_s > self._budget_s:
            self.limit = max(1, int(self._budget_s / self.task_s))


class HeldLeases:
    """The leases of tasks this worker holds but does not run: claimed ahead, or run with
    their completion held. Two of the heartbeat thread's periodic tasks keep them: each
    beat extends every one (a lease that cannot be extended is dropped, so :meth:`take`
    reports it lost), and once the running task has kept the worker for half a lease
    those claimed ahead go back to the queue unstarted."""

    def __init__(self, keeper: LeaseKeeper) -> None:
        self.keeper = keeper
        self._lock = threading.Lock()
        # By task id: the lease and the monotonic time it was last extended from.
        self._held: dict[str, tuple[Lease, float]] = {}
        # Handed back because the running task took long, until the worker comes to them.
        self._handed_back: set[str] = set()
        self._completion_held: set[str] = set()  # never handed back: their task ran
        self._lost: dict[str, float] = {}  # lost while held: when each was last extended from
        keeper.every_beat(self.hand_back_overdue, self.extend)

    def hold(self, leases: list[Lease], *, hand_back: bool = True) -> None:
        """Keep ``leases`` alive until taken; with ``hand_back`` False (tasks that ran,
        their completion held) never give them back."""
        now = time.monotonic()
        with self._lock:
            for lease in leases:
                self._held[lease.task_id] = (lease, now)
                if not hand_back:
                    self._completion_held.add(lease.task_id)
        self.keeper.start()

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

    def lost(self, task_id: str) -> float | None:
        """When the lease of ``task_id``, lost while held, was last extended from (asked
        once); None when it was not lost while held."""
        with self._lock:
            return self._lost.pop(task_id, None)

    def task_ids(self) -> set[str]:
        with self._lock:
            return set(self._held)

    def extend(self) -> None:
        """Extend every held lease (a periodic task of the heartbeat thread)."""
        keeper = self.keeper
        with self._lock:
            held = list(self._held.values())
        for lease, extended in held:
            started = time.monotonic()
            if crashpoints.ARMED:
                crashpoints.reached("before_heartbeat", lease.task_id)
            try:
                with retrying_until(extended + keeper.duration.seconds, keeper.attempt_s):
                    renewed: Lease | None = keeper.store.heartbeat(lease, keeper.duration)
                keeper.answered()
                if crashpoints.ARMED:
                    crashpoints.reached("after_heartbeat", lease.task_id)
            except LeaseLostError:
                keeper.answered()
                renewed = None
                log.warning(
                    "lease of a held task (claimed ahead, or its completion held) lost",
                    extra=task_fields(lease),
                )
            except StoreClosed:
                raise
            except Exception as exc:  # an unreachable store: try again at the next beat
                keeper.failed(exc, "heartbeat of a task claimed ahead failed", task_fields(lease))
                continue
            with self._lock:
                current = self._held.get(lease.task_id)
                if current is not None and current[0] is lease:
                    if renewed is None:
                        del self._held[lease.task_id]
                        self._completion_held.discard(lease.task_id)
                        self._lost[lease.task_id] = current[1]
                    else:
                        self._held[lease.task_id] = (renewed, started)

    def hand_back_overdue(self) -> None:
        """Give tasks claimed ahead back to the queue, unstarted, once the running task
        has kept the worker for half a lease: other workers may be idle while they wait
        behind it (a periodic task of the heartbeat thread)."""
        keeper = self.keeper
        running = keeper.running_for()
        if running is None or running[1] < keeper.duration.seconds / 2:
            return
        with self._lock:
            held = [lease for lease, _at in self._held.values() if lease.task_id not in self._completion_held]
            for lease in held:
                del self._held[lease.task_id]
            self._handed_back.update(lease.task_id for lease in held)
        reason = f"handed back unstarted: the task before it ran for {running[1]:.0f} s"
        for lease in held:
            try:
                with (
                    retrying_until(time.monotonic() + keeper.attempt_s),
                    crashpoints.transition("hand_back"),
                ):
                    keeper.store.release(lease, delay=timedelta(0), reason=reason)
            except StoreClosed:
                raise
            except Exception as exc:  # lost already, or an unreachable store: its lease runs out
                keeper.failed(exc, "could not hand back a task claimed ahead", task_fields(lease))


class ClaimedAhead:
    """The tasks claimed before their turn, in the order they are to run."""

    def __init__(self, leases: HeldLeases, request: Callable[[], ClaimRequest], size: ClaimSize) -> None:
        self.leases = leases
        self.size = size
        self._keeper = leases.keeper
        self._request = request  # what a completion claims for the next cycle (as of now)
        self._tasks: deque[ClaimedTask] = deque()
        # This cycle's run_once(claim_next=..., stopping=...): see completion_claim.
        self.claim_next = False
        self.stopping: CancellationToken | None = None

    def hold(self, claimed: list[ClaimedTask]) -> None:
        """Keep tasks claimed for later cycles, their leases extended by the heartbeat."""
        if claimed:
            self._tasks.extend(claimed)
            self.leases.hold([c.lease for c in claimed])

    def took(self, request: ClaimRequest | None, claimed: list[ClaimedTask]) -> None:
        """Hold what a completion claimed with ``request`` (None: it claimed nothing),
        its size noted for the next claim."""
        if request is not None:
            self.size.claimed(request.limit, len(claimed))
        self.hold(claimed)

    @property
    def holding(self) -> bool:
        """Whether tasks claimed ahead wait for their turn."""
        return bool(self._tasks)

    def next(self) -> tuple[ClaimedTask, float] | LeaseLost | None:
        """The next held task, with its latest lease and the monotonic time that lease was
        extended from; ``LeaseLost`` when its lease ran out while it waited (another
        worker has it now); None when no task is held (tasks the heartbeat thread handed
        back are skipped)."""
        while self._tasks:
            task = self._tasks.popleft()
            task_id = task.lease.task_id
            held = self.leases.take(task_id)
            if held is not None:
                lease, extended_at = held
                if lease is not task.lease:  # extended (or a cancel noted) while it waited
                    task = attrs.evolve(task, lease=lease)
                return task, extended_at
            if not self.leases.was_handed_back(task_id):
                self._keeper.forgive_if_cut_off(task.lease, task.revision, self.leases.lost(task_id))
                return LeaseLost(task_id, task.lease.fencing_token)
        return None

    def completion_claim(self) -> ClaimRequest | None:
        """The claim a completion makes in its own transaction, saving a commit per task:
        only for a loop that runs the next task at once (``claim_next``), when no task is
        held already, and never once the loop's stop token is cancelled (a SIGTERM during
        the cycle), since a stopping worker takes no new work, nor while the heartbeat
        thread cannot reach the store (a task claimed then could not be kept)."""
        stopping = self.stopping is not None and self.stopping.cancelled
        if self.claim_next and not self._tasks and not stopping and not self._keeper.cut_off:
            request = self._request()
            limit = self.size.ending()
            return request if request.limit == limit else attrs.evolve(request, limit=limit)
        return None

    def release(self) -> None:
        """Give held tasks back to the queue (the claim not counted as an attempt), so
        other workers take them now rather than after their leases expire."""
        while self._tasks:
            task = self._tasks.popleft()
            held = self.leases.take(task.lease.task_id)
            if held is None:
                continue
            try:
                with crashpoints.transition("hand_back"):
                    self._keeper.store.release(
                        held[0], delay=timedelta(0), reason="handed back unstarted by a stopping worker"
                    )
            except (LeaseLostError, StoreUnavailable) as exc:
                log.warning("could not hand back a task claimed ahead: %s", exc, extra=task_fields(held[0]))


# How long the oldest held completion may wait before the next body starts, or before
# the heartbeat thread commits it while a body runs.
HOLD_LIMIT_S = 0.05


@attrs.frozen
class Held:
    """What a cycle ended with when its task's completion was held."""

    task_id: str


@attrs.frozen
class HeldCompletion:
    """A completed task whose completion waits for its batch's commit: the run (to settle
    a refusal), the completion to send, and the outcome to report once it is stored."""

    claimed: ClaimedTask
    run: TaskRun
    completion: Completion
    outcome: Completed
    held_at: float  # monotonic


Refused = Callable[[HeldCompletion, CancelPending | LeaseLostError], RunOutcome]


class HeldCompletions:
    """One worker's held completions, in the order their tasks ran. The worker's thread
    holds and commits them; the heartbeat thread commits those overdue while a body runs
    (``commit_overdue``), leaving their outcomes (and any refusal, which only the
    worker's thread may settle) for the worker's next ``commit``."""

    def __init__(self, ahead: ClaimedAhead) -> None:
        self._leases = ahead.leases
        self._store = ahead.leases.keeper.store
        self._ahead = ahead
        self._lock = threading.Lock()  # the lists below are shared with the heartbeat thread
        self._held: list[HeldCompletion] = []
        self._stored: list[tuple[HeldCompletion, RunOutcome | CancelPending | LeaseLostError]] = []
        self.allowed = False  # this cycle may hold its completion (set by the worker)
        ahead.leases.keeper.every_beat(self.commit_overdue)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held) + len(self._stored)

    def accepts(self, run: TaskRun) -> bool:
        """Whether the completion of ``run``, whose task just returned, is held: while
        holding is allowed, more of the batch is to run or completions are held already,
        and the task has nothing to undo."""
        return self.allowed and (self._ahead.holding or bool(self._held)) and not run.needs_compensation()

    def hold(self, claimed: ClaimedTask, run: TaskRun, completion: Completion, outcome: Completed) -> None:
        if crashpoints.ARMED:
            crashpoints.reached("completion_held", claimed.lease.task_id)
        self._leases.hold([claimed.lease], hand_back=False)
        with self._lock:
            self._held.append(HeldCompletion(claimed, run, completion, outcome, time.monotonic()))

    def due(self) -> bool:
        """Whether the worker is to commit (or report) the held completions now: the
        batch has run (no task is held ahead), the oldest has waited ``HOLD_LIMIT_S``,
        or the heartbeat thread has committed some."""
        with self._lock:
            if self._stored:
                return True
            if not self._held:
                return False
            oldest = self._held[0].held_at
        return not self._ahead.holding or time.monotonic() - oldest >= HOLD_LIMIT_S

    def commit(self, refused: Refused) -> list[tuple[ClaimedTask, RunOutcome]]:
        """Commit every held completion in one transaction (claiming the next batch in it
        when the worker goes on and holds nothing ahead) and return each task's outcome,
        those the heartbeat thread committed first; ``refused`` settles a completion the
        store refused. On the worker's thread."""
        with self._lock:
            held, self._held = self._held, []
            stored, self._stored = self._stored, []
        if held:
            stored += self._send(held, self._ahead.completion_claim())
        return [
            (each.claimed, outcome if isinstance(outcome, RunOutcome) else refused(each, outcome))
            for each, outcome in stored
        ]

    def commit_overdue(self) -> None:
        """On the heartbeat thread, at each beat: commit the held completions once the
        oldest has waited ``HOLD_LIMIT_S`` (a long body runs on the worker's thread), with
        no claim; the outcomes wait for the worker's ``commit``. Held again if the store
        cannot take them now."""
        with self._lock:
            if not self._held or time.monotonic() - self._held[0].held_at < HOLD_LIMIT_S:
                return
            held, self._held = self._held, []
        try:
            stored = self._send(held, None)
        except StoreClosed:
            raise
        except Exception as exc:  # an unreachable store: the worker's thread tries again
            self._store.outage.report(
                log, "could not commit held completions", exc, task_fields(held[0].claimed.lease)
            )
            self._leases.hold([each.claimed.lease for each in held], hand_back=False)
            with self._lock:
                self._held[:0] = held
            return
        with self._lock:
            self._stored += stored

    def _send(
        self, held: list[HeldCompletion], then_claim: ClaimRequest | None
    ) -> list[tuple[HeldCompletion, RunOutcome | CancelPending | LeaseLostError]]:
        """Complete ``held`` in one transaction: each one's outcome, or the store's
        refusal, in order."""
        outcomes: dict[str, RunOutcome | CancelPending | LeaseLostError] = {}
        live = []
        for each in held:
            lease = each.claimed.lease
            if self._leases.take(lease.task_id) is None:  # it could not be extended while held
                outcomes[lease.task_id] = LeaseLost(lease.task_id, lease.fencing_token, "complete")
            else:
                live.append(each)
        if live:
            with crashpoints.transition("complete_batch"):
                done = self._store.complete_batch([each.completion for each in live], then_claim=then_claim)
            self._ahead.took(then_claim, done.claimed)
            for each in live:
                task_id = each.claimed.lease.task_id
                outcomes[task_id] = done.refused.get(task_id, each.outcome)
        return [(each, outcomes[each.claimed.lease.task_id]) for each in held]
