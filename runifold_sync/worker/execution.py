"""Executing one claimed task: rebuild its exact definition version, replay its checkpoint,
run the main function, and end the claim with exactly one fenced store transition
(complete, suspend, retry, release, acknowledge a cancel, or fail).

Workflow failures become outcomes; only programming errors and an unreachable store
raise. Each transition is bracketed by its crash points (``crashpoints.transition``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

import attrs

from ..engine.claim import Claim
from ..engine.deadlines import DeadlineListener, RunningBodies
from ..engine.interrupts import (
    CancelRequested,
    ContinueRequested,
    FailRequested,
    RetryRequested,
    SuspendRequested,
    UnknownPatch,
    YieldRequested,
    uncaught,
    unwound,
)
from ..engine.logs import task_fields
from ..engine.spans import NO_SPANS, ClaimSpans, CycleTracer
from ..engine.task_run import TaskRun
from ..errors import (
    CancelPending,
    CheckpointError,
    FingerprintMismatch,
    InputMismatch,
    LeaseLostError,
    OutputNotSerializable,
    StepFailed,
    StoreUnavailable,
)
from ..model import crashpoints
from ..model.checkpoint import Checkpoint, CheckpointWrite
from ..model.codec import MAX_NESTING_DEPTH, NotJsonable, from_json, to_json
from ..model.outcomes import (
    Cancelled,
    Completed,
    ContinuedAsNew,
    DefinitionUnavailable,
    Failed,
    FailureDetail,
    LeaseLost,
    Retried,
    RunOutcome,
    Suspended,
    Yielded,
)
from ..model.tracebacks import kept_traceback
from ..model.values import WorkerId
from ..store.base import WorkflowStore
from ..store.outage import is_outage
from ..store.records import ClaimedTask, Completion
from ..store.retries import retrying_until
from ..workflow.registry import WorkflowDefinition, WorkflowRegistry
from .batch import ClaimedAhead, Held, HeldCompletion, HeldCompletions
from .heartbeat import LeaseKeeper
from .settings import WorkerSettings

log = logging.getLogger("runifold_sync.worker.worker")

# What running a claim ends with: an outcome, or its completion held for the batch.
Cycle = RunOutcome | Held
# How often a claim over the crash-loop limit looks again for lost claims being reported.
_REPORT_POLL_S = 0.2


class ClaimExecutor:
    """Runs the tasks one worker claimed, one at a time, on the worker's thread."""

    def __init__(
        self,
        store: WorkflowStore,
        registry: WorkflowRegistry,
        worker_id: WorkerId,
        settings: WorkerSettings,
        keeper: LeaseKeeper,
        ahead: ClaimedAhead,
        held: HeldCompletions,
        tracer: CycleTracer | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.worker_id = worker_id
        self._max_steps_per_claim = settings.max_steps_per_claim
        self._max_entry_bytes = settings.max_entry_bytes
        self._unavailable_delay = settings.unavailable_delay
        self._lease_s = settings.lease_duration.seconds
        self._keeper = keeper
        self._ahead = ahead  # holds what a completion claims for the next cycle
        self._held = held  # completions waiting for their batch's commit
        self._tracer = tracer
        self.deadlines: DeadlineListener | None = None  # hears the running bodies' deadlines

    def run(self, claimed: ClaimedTask, extended_at: float | None = None) -> Cycle:
        """Run ``claimed`` (its lease last extended at monotonic ``extended_at``, default
        now) until its workflow completes, waits, fails or yields, and make the one fenced
        transition that ends the claim (or hold its completion, when ``held`` accepts it);
        inside its cycle span when tracing is on."""
        tracer = self._tracer
        if tracer is None:
            return self._claim(claimed, extended_at, NO_SPANS)
        return tracer.cycle(claimed, lambda spans: _settled(self._claim(claimed, extended_at, spans)))

    def _claim(self, claimed: ClaimedTask, extended_at: float | None, spans: ClaimSpans) -> Cycle:
        lease = claimed.lease
        definition = self.registry.get(claimed.definition_name, claimed.definition_version)
        if definition is None:
            return self._hand_back(
                claimed, f"{_wanted(claimed)} is not registered on worker {self.worker_id}"
            )
        try:
            checkpoint = self._load_checkpoint(claimed, definition)
        except FingerprintMismatch as exc:
            # A deploy changed this version's steps: another worker may still have the
            # steps the checkpoint was written by, so the task waits for it, never fails.
            return self._hand_back(
                claimed,
                f"{_wanted(claimed)} with the steps its checkpoint was written by (fingerprint "
                f"{exc.recorded}) is not on worker {self.worker_id}, whose steps have fingerprint "
                f"{exc.registered}",
            )
        except CheckpointError as exc:
            failure = FailRequested(str(exc), cause="checkpoint", error=exc)
            return self._fail(claimed, claimed.revision, None, failure)
        if checkpoint.phase == "failed":  # requeued by an operator: failing steps start afresh
            checkpoint.step_failures.clear()
            checkpoint.deadlines.clear()
        checkpoint.phase = "running"
        checkpoint.usage = checkpoint.usage.claimed()
        claim = Claim(
            claimed, self._max_steps_per_claim, self._max_entry_bytes, spans, RunningBodies(self.deadlines)
        )
        self._keeper.watch(claim, extended_at)
        try:
            # The cycle's store calls end with the lease, and are tried again until then.
            with retrying_until(lambda: claim.deadline):
                ctx = TaskRun.open(claim, definition, checkpoint, self.store)
                try:
                    return self._execute(claimed, definition, ctx)
                except StoreUnavailable as exc:
                    # The store did not answer before the lease ran out: the cycle fails
                    # (an outage, as the worker's loop says), its lease lost while cut off.
                    if claim.expired() and is_outage(exc):
                        self._keeper.forgive_if_cut_off(lease, claimed.revision)
                    raise
        finally:
            self._keeper.unwatch()

    def _hand_back(self, claimed: ClaimedTask, reason: str) -> RunOutcome:
        """Release a task this worker cannot run, for a worker that can, after a delay."""
        lease = claimed.lease
        log.warning(reason, extra=task_fields(lease))
        try:
            with crashpoints.transition("unavailable"):
                self.store.release(lease, delay=self._unavailable_delay, reason=reason)
        except LeaseLostError as error:
            return self._lease_lost(claimed, error)
        return DefinitionUnavailable(lease.task_id, claimed.definition_name, claimed.definition_version)

    def _load_checkpoint(self, claimed: ClaimedTask, definition: WorkflowDefinition) -> Checkpoint:
        """The claimed task's checkpoint: its head and, in one read, its journal rows
        (only the lease holder writes them, so they match the head)."""
        identity = definition.identity
        if claimed.checkpoint_json is None:
            return Checkpoint(identity)
        task_id = claimed.lease.task_id
        checkpoint = Checkpoint.decode(task_id, claimed.checkpoint_json, self.store.read_journal(task_id))
        if checkpoint.definition != identity:
            raise FingerprintMismatch(
                claimed.lease.task_id, checkpoint.definition.fingerprint, identity.fingerprint
            )
        return checkpoint

    def _execute(self, claimed: ClaimedTask, definition: WorkflowDefinition, ctx: TaskRun) -> Cycle:
        return self._guarded(claimed, ctx, lambda: self._run(claimed, definition, ctx))

    def _guarded(self, claimed: ClaimedTask, ctx: TaskRun, run: Callable[[], Cycle]) -> Cycle:
        """``run`` with a requested failure ending the task failed (after its undo) and a
        lost lease ending the cycle."""
        try:
            with unwound():  # a lost lease found in user code is raised as its LeaseLostError
                try:
                    return run()
                except FailRequested as failure:
                    return self._fail_after_undo(claimed, ctx, failure)
        except LeaseLostError as error:  # also while undoing, or the final write: the new owner carries on
            return self._lease_lost(claimed, error)

    def settle_refused(self, held: HeldCompletion, error: CancelPending | LeaseLostError) -> RunOutcome:
        """The outcome of a held completion the store refused, as if the task's own
        completion had been: a cancel requested while it was held wins (the task has
        nothing to undo, so it ends cancelled), a lost lease is the new owner's task."""
        claimed = held.claimed
        if isinstance(error, LeaseLostError):
            return self._lease_lost(claimed, error)
        return _settled(self._guarded(claimed, held.run, lambda: self._compensate(claimed, held.run, None)))

    def _run(self, claimed: ClaimedTask, definition: WorkflowDefinition, ctx: TaskRun) -> Cycle:
        """Finish an undo a crash interrupted, run the main function, or undo a task
        cancelled before this claim."""
        if claimed.claims_since_progress > definition.budget.max_attempts and not self._lost_claims_reported(
            claimed, definition.budget.max_attempts
        ):
            raise FailRequested(
                f"claimed {claimed.claims_since_progress} times without progress, over "
                f"max_attempts={definition.budget.max_attempts}: a step keeps crashing its worker",
                cause="crash_loop",
            )
        resumed = ctx.checkpoint.compensating_for
        if resumed is not None:  # a crash interrupted the undo; its reason is in the checkpoint
            failure = None if resumed == "cancel" else FailRequested("", cause="other")
            return self._compensate(claimed, ctx, failure)
        if claimed.lease.cancel_requested is None:
            try:
                return self._drive(claimed, definition, ctx)
            except CancelPending:
                pass  # the cancel reached the row before this cycle's transition: it wins
        # Cancelled before this claim (while queued, waiting, or under a worker that
        # died): no step of the main function runs again, only the compensations.
        return self._compensate(claimed, ctx, None)

    def _lost_claims_reported(self, claimed: ClaimedTask, max_attempts: int) -> bool:
        """Whether, for a task taken over from an expired lease with too many claims
        without progress by a worker that was itself cut off from the store within the
        last lease, the workers that lost those claims while alive report them within a
        lease (``store.forgive_lost_claim``), bringing the count back within
        ``max_attempts``. A pool cut off from the store takes its tasks over as the
        network heals, at the moment the worker that lost each lease reports it: the
        verdict waits for that report rather than racing it. (A worker that was not cut
        off decides at once, as before.)"""
        if claimed.from_state != "leased" or not self._keeper.cut_off_within(self._lease_s):
            return False
        deadline = time.monotonic() + self._lease_s
        while time.monotonic() < deadline:
            time.sleep(_REPORT_POLL_S)
            if self.store.task_records([claimed.lease.task_id])[0].claims_since_progress <= max_attempts:
                log.info(
                    "claims lost by a living worker were reported: not a crash loop",
                    extra=task_fields(claimed.lease),
                )
                return True
        return False

    def _fail_after_undo(self, claimed: ClaimedTask, ctx: TaskRun, failure: FailRequested) -> RunOutcome:
        """Undo completed steps once if the failure calls for it, then end the task failed;
        a compensation that raises ends the undo, and the task fails with its reason."""
        undo = failure.ambiguous_effect is None and ctx.checkpoint.compensating_for is None
        if undo and ctx.needs_compensation():
            try:
                return self._compensate(claimed, ctx, failure)
            except FailRequested as undo_failed:
                failure = undo_failed
        ctx.checkpoint.phase = "failed"
        try:
            write: CheckpointWrite | None = ctx.encode()
        except CheckpointError:
            write = None  # the head stays as last committed
        return self._fail(claimed, ctx.revision, write, failure)

    def _drive(self, claimed: ClaimedTask, definition: WorkflowDefinition, ctx: TaskRun) -> Cycle:
        """Run the main function and make the transition it ended in."""
        lease = claimed.lease
        workflow = definition.workflow
        assert workflow.main_fn is not None
        try:
            workflow_input = _structured_input(claimed, definition, ctx.checkpoint)
            try:
                value = workflow.main_fn(ctx.context, workflow_input)
            except StoreUnavailable:
                # A checkpoint commit, signal or clock read through ctx found the store
                # away: that ends this cycle, not the task, which is claimed again once
                # its lease expires. (Failing it would also record in-memory progress,
                # such as a consumed signal, that the store never committed.)
                raise
            except Exception as exc:
                if ctx.cancel_delivered:  # a finally: block that raised while the cancel unwound main
                    raise CancelRequested() from exc
                if isinstance(exc, StepFailed):  # a step's final failure nothing caught
                    ctx.forget_failure(exc.call_id)
                    raise uncaught(exc) from exc
                raise FailRequested(
                    f"workflow main raised {type(exc).__name__}: {exc}", cause="workflow_error", error=exc
                ) from exc
            try:
                result_json = to_json(value, max_depth=MAX_NESTING_DEPTH)
            except NotJsonable as exc:
                raise FailRequested(
                    f"workflow result cannot be stored as JSON: {exc}",
                    cause="not_serializable",
                    error=OutputNotSerializable("result", str(exc)),
                ) from exc
            self._check_result_size(lease.task_id, result_json)
            ctx.checkpoint.phase = "completed"
            write = self._encode_or_fail(ctx)
            completed = Completed(lease.task_id, from_json(result_json))
            if self._held.accepts(ctx):
                completion = Completion(
                    lease, ctx.revision, write.head_json, result_json, tuple(write.journal)
                )
                self._held.hold(claimed, ctx, completion, completed)
                return Held(lease.task_id)
            self._keeper.ending()
            with crashpoints.transition("complete"):
                then_claim = self._ahead.completion_claim()
                self._ahead.took(
                    then_claim,
                    self.store.complete(
                        lease,
                        ctx.revision,
                        write.head_json,
                        result_json,
                        then_claim=then_claim,
                        journal=write.journal,
                    ),
                )
            return completed
        except SuspendRequested as wait:
            ctx.checkpoint.phase = "waiting"
            write = self._encode_or_fail(ctx)
            self._keeper.ending()
            with crashpoints.transition("suspend"):
                self.store.suspend(
                    lease,
                    ctx.revision,
                    write.head_json,
                    wake_at=wait.wake_at,
                    reason=wait.reason,
                    signal=wait.signal,
                    approvers=wait.approvers,
                    child=wait.child,
                    journal=write.journal,
                )
            return Suspended(lease.task_id, wait.reason, wait.wake_at)
        except CancelRequested:
            return self._compensate(claimed, ctx, None)
        except RetryRequested as retry:
            write = self._encode_or_fail(ctx)
            delay = timedelta(seconds=retry.delay_s)
            self._keeper.ending()
            with crashpoints.transition("retry"):
                retry_at = self.store.retry(
                    lease,
                    ctx.revision,
                    write.head_json,
                    delay=delay,
                    reason=retry.reason,
                    journal=write.journal,
                )
            return Retried(lease.task_id, retry.reason, retry_at)
        except ContinueRequested as again:
            try:
                run, write = ctx.encode_next_run()
            except CheckpointError as exc:
                raise FailRequested(str(exc), cause="checkpoint", error=exc) from exc
            self._keeper.ending()
            with crashpoints.transition("continue"):
                self.store.continue_as_new(lease, ctx.revision, write.head_json, again.input_json, run=run)
            return ContinuedAsNew(lease.task_id, run)
        except YieldRequested as yielded:
            self._keeper.ending()
            with crashpoints.transition("yield"):
                self.store.release(lease, delay=timedelta(0), reason=yielded.reason)
            return Yielded(lease.task_id)
        except UnknownPatch as unknown:  # an older deploy met a newer one's path: not a failure
            self._keeper.ending()
            return self._hand_back(
                claimed,
                f"definition unavailable: {claimed.definition_name!r} version "
                f"{claimed.definition_version} on worker {self.worker_id}: {unknown.reason}",
            )

    def _compensate(self, claimed: ClaimedTask, ctx: TaskRun, failure: FailRequested | None) -> RunOutcome:
        """Undo completed steps (if any have compensations), then end the task cancelled
        (no ``failure``) or failed as ``failure`` says, with its original reason."""
        lease = claimed.lease
        if failure is not None:
            ctx.compensate("failure", failure.reason)
        else:
            ctx.compensate("cancel", "cancel requested")
            ctx.checkpoint.phase = "cancelled"
            write = self._encode_or_fail(ctx)
            self._keeper.ending()
            with crashpoints.transition("cancel"):
                self.store.acknowledge_cancel(lease, ctx.revision, write.head_json, journal=write.journal)
            return Cancelled(lease.task_id, self.store.task_records([lease.task_id])[0].reason or "cancelled")
        ctx.checkpoint.phase = "failed"
        undone = ", ".join(ctx.checkpoint.compensated) or "nothing"
        reason = f"{ctx.checkpoint.compensation_reason or failure.reason} (compensated: {undone})"
        return self._fail(claimed, ctx.revision, ctx.encode(), failure, reason)

    def _check_result_size(self, task_id: str, result_json: str) -> None:
        """Hold the result to the checkpoint's size limit: it is stored in the same row
        and read back by everyone who looks at the task."""
        size = len(result_json)  # canonical text is ASCII: its length is its size in bytes
        if size > self._max_entry_bytes:
            raise FailRequested(
                f"workflow result of task {task_id!r} is {size} bytes, over the limit of "
                f"{self._max_entry_bytes} bytes (max_entry_bytes); keep large "
                "artifacts outside and return their ids",
                cause="checkpoint",
            )

    def _encode_or_fail(self, ctx: TaskRun) -> CheckpointWrite:
        try:
            return ctx.encode()
        except CheckpointError as exc:
            raise FailRequested(str(exc), cause="checkpoint", error=exc) from exc

    def _fail(
        self,
        claimed: ClaimedTask,
        revision: int,
        write: CheckpointWrite | None,
        failure: FailRequested,
        reason: str | None = None,
    ) -> RunOutcome:
        """End the task failed as ``failure`` says (with ``reason`` in place of its own
        once compensations ran), recording what failed where in the ``failed`` event."""
        lease = claimed.lease
        reason = failure.reason if reason is None else reason
        error = failure.error
        detail = FailureDetail(
            error_class=None if error is None else _error_class(error),
            message=reason if error is None else _message(error),
            task_id=lease.task_id,
            step_id=failure.step_id,
            effect_key=failure.effect_key,
            traceback=None if error is None else _traceback(error),
        )
        ambiguous_effect = failure.ambiguous_effect
        # A step's or effect's traceback was logged with its failed attempt (calls.py);
        # any other error that was raised is logged here, once.
        logged = failure.cause == "step_error" or detail.traceback is None
        log.error("task failed: %s", reason, exc_info=None if logged else error, extra=task_fields(lease))
        try:
            self._keeper.ending()
            with crashpoints.transition("fail"):
                self.store.fail(
                    lease,
                    revision,
                    None if write is None else write.head_json,
                    reason=reason,
                    ambiguous_effect=ambiguous_effect,
                    error=detail,
                    journal=() if write is None else write.journal,
                )
        except LeaseLostError as error:
            return self._lease_lost(claimed, error)
        recoverable = ambiguous_effect is not None
        return Failed(lease.task_id, reason, recoverable=recoverable, cause=failure.cause, error=detail)

    def _lease_lost(self, claimed: ClaimedTask, error: LeaseLostError) -> RunOutcome:
        log.warning("%s", error, extra=task_fields(claimed.lease))
        self._keeper.forgive_if_cut_off(claimed.lease, claimed.revision)
        return LeaseLost(error.task_id, error.fencing_token, error.operation)


def _wanted(claimed: ClaimedTask) -> str:
    """How a hand-back names the definition a worker lacks."""
    return f"definition unavailable: {claimed.definition_name!r} version {claimed.definition_version}"


def _error_class(error: Exception) -> str:
    """The class a failure names: a StepFailed names the step's own error."""
    return error.error_class if isinstance(error, StepFailed) else type(error).__name__


def _message(error: Exception) -> str:
    return error.message if isinstance(error, StepFailed) else str(error)


def _traceback(error: Exception) -> str | None:
    return error.traceback if isinstance(error, StepFailed) else kept_traceback(error)


def _settled(cycle: Cycle) -> RunOutcome:
    """The outcome of a run that cannot hold its completion: a traced one (holding is off
    with a tracer) or the settling of a refused held completion."""
    assert not isinstance(cycle, Held), cycle
    return cycle


def _structured_input(claimed: ClaimedTask, definition: WorkflowDefinition, checkpoint: Checkpoint) -> object:
    """The task's input as its main function's type, or the task fails naming each field
    that does not fit (the same detail ``WorkflowRegistry.task`` gives at enqueue).

    A run that has already recorded calls keeps the input it started with, though: it may
    have started under a release that coerced inputs (``"7"`` into 7), and replay must
    give the main function what it gave it then. So such a run falls back to coercion,
    and says so in the log, rather than failing in the middle."""
    raw = from_json(claimed.input_json)
    try:
        return definition.structure_input(raw)
    except InputMismatch as exc:
        if definition.coerce_input or not checkpoint.journal:
            raise FailRequested(str(exc), cause="bad_input", error=exc) from exc
        try:
            value = attrs.evolve(definition, coerce_input=True).structure_input(raw)
        except InputMismatch:
            raise FailRequested(str(exc), cause="bad_input", error=exc) from exc
        log.warning(
            "%s; the run started with this input coerced, so it goes on coerced",
            exc,
            extra=task_fields(claimed.lease),
        )
        return value
