"""Completions held back so that a claim batch's short tasks commit their ends together.

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
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ..engine.logs import task_fields
from ..errors import CancelPending, LeaseLostError, StoreClosed
from ..model import crashpoints
from ..model.outcomes import Completed, LeaseLost, RunOutcome
from ..store.records import ClaimedTask, ClaimRequest, Completion

if TYPE_CHECKING:
    from ..engine.task_run import TaskRun
    from ..store.base import WorkflowStore
    from .claim_ahead import ClaimedAhead
    from .heartbeat import LeaseKeeper

log = logging.getLogger("runifold_sync.worker.worker")

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

    def __init__(self, store: WorkflowStore, keeper: LeaseKeeper, ahead: ClaimedAhead) -> None:
        self._store = store
        self._keeper = keeper
        self._ahead = ahead
        self._lock = threading.Lock()  # the lists below are shared with the heartbeat thread
        self._held: list[HeldCompletion] = []
        self._stored: list[tuple[HeldCompletion, RunOutcome | CancelPending | LeaseLostError]] = []
        self.allowed = False  # this cycle may hold its completion (set by the worker)
        keeper.each_beat(self.commit_overdue)

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
        self._keeper.hold([claimed.lease], hand_back=False)
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
            self._keeper.hold([each.claimed.lease for each in held], hand_back=False)
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
            if self._keeper.take(lease.task_id) is None:  # it could not be extended while held
                outcomes[lease.task_id] = LeaseLost(lease.task_id, lease.fencing_token, "complete")
            else:
                live.append(each)
        if live:
            with crashpoints.transition("complete_batch"):
                done = self._store.complete_batch([each.completion for each in live], then_claim=then_claim)
            self._ahead.hold(done.claimed)
            for each in live:
                task_id = each.claimed.lease.task_id
                outcomes[task_id] = done.refused.get(task_id, each.outcome)
        return [(each, outcomes[each.claimed.lease.task_id]) for each in held]
