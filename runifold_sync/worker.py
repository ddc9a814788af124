"""``WorkflowWorker``: one claim-and-execute cycle at a time.

A cycle claims a task, rebuilds its exact definition version, replays the checkpoint and
ends with exactly one store transition (complete, suspend, retry, release or fail), all
fenced by the lease. Workflow failures become outcomes; only programming errors and an
unreachable store raise.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from datetime import timedelta
from typing import TYPE_CHECKING

import attrs

from . import crashpoints
from .checkpoint import DEFAULT_MAX_CHECKPOINT_BYTES, Checkpoint
from .codec import MAX_NESTING_DEPTH, NotJsonable, from_json, structure, to_json
from .definition import WorkflowDefinition, WorkflowRegistry
from .engine import TaskRun
from .errors import (
    CancelPending,
    CheckpointError,
    FingerprintMismatch,
    InvalidArgument,
    LeaseLostError,
    StoreUnavailable,
)
from .heartbeat import LeaseKeeper
from .interrupts import (
    CancelRequested,
    FailRequested,
    LeaseGone,
    RetryRequested,
    SuspendRequested,
    YieldRequested,
)
from .logs import task_fields
from .models import LeaseDuration, WorkerId
from .observer import CycleObserver
from .outcomes import (
    Cancelled,
    Completed,
    DefinitionUnavailable,
    Failed,
    FailureCause,
    Idle,
    LeaseLost,
    Retried,
    RunOutcome,
    Suspended,
    Yielded,
)
from .store.base import ClaimedTask, ClaimRequest, WorkflowStore

if TYPE_CHECKING:
    from .supervisor import CancellationToken

log = logging.getLogger("runifold_sync.worker")


class WorkflowWorker:
    def __init__(
        self,
        store: WorkflowStore,
        registry: WorkflowRegistry,
        worker_id: WorkerId,
        lease_duration: LeaseDuration,
        heartbeat_interval: timedelta,
        *,
        max_steps_per_claim: int | None = None,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        unavailable_delay: timedelta = timedelta(seconds=5),
        observer: CycleObserver | None = None,
        claim_batch: int = 1,
    ) -> None:
        if not isinstance(store, WorkflowStore):
            raise InvalidArgument(f"store must be a WorkflowStore, got {store!r}")
        if not isinstance(registry, WorkflowRegistry):
            raise InvalidArgument(f"registry must be a WorkflowRegistry, got {registry!r}")
        if not isinstance(worker_id, WorkerId):
            raise InvalidArgument(f"worker_id must be a WorkerId (use WorkerId.parse), got {worker_id!r}")
        if not isinstance(lease_duration, LeaseDuration):
            raise InvalidArgument(f"lease_duration must be a LeaseDuration, got {lease_duration!r}")
        self.validate_timing(lease_duration, heartbeat_interval)
        if max_steps_per_claim is not None and (
            isinstance(max_steps_per_claim, bool)
            or not isinstance(max_steps_per_claim, int)
            or max_steps_per_claim < 1
        ):
            raise InvalidArgument(f"max_steps_per_claim must be None or >= 1, got {max_steps_per_claim!r}")
        if (
            isinstance(max_checkpoint_bytes, bool)
            or not isinstance(max_checkpoint_bytes, int)
            or max_checkpoint_bytes < 1024
        ):
            raise InvalidArgument(
                f"max_checkpoint_bytes must be an integer >= 1024, got {max_checkpoint_bytes!r}"
            )
        if not isinstance(unavailable_delay, timedelta) or unavailable_delay < timedelta(0):
            raise InvalidArgument(
                f"unavailable_delay must be a non-negative timedelta, got {unavailable_delay!r}"
            )
        self.validate_claim_batch(claim_batch)
        if observer is not None and not isinstance(observer, CycleObserver):
            raise InvalidArgument(f"observer must be a CycleObserver or None, got {observer!r}")
        self.store = store
        self.registry = registry
        self.worker_id = worker_id
        self.lease_duration = lease_duration
        self._max_steps_per_claim = max_steps_per_claim
        self._max_checkpoint_bytes = max_checkpoint_bytes
        self._unavailable_delay = unavailable_delay
        self._observer = observer
        self._claim_batch = claim_batch
        self._ahead: deque[ClaimedTask] = deque()  # claimed in a batch, not run yet
        self._claim_next = False  # this cycle's run_once(claim_next=...)
        self._stopping: CancellationToken | None = None  # this cycle's run_once(stopping=...)
        self._registered = False
        self._keeper = LeaseKeeper(
            store, lease_duration, heartbeat_interval.total_seconds(), f"runifold-heartbeat-{worker_id}"
        )

    @staticmethod
    def validate_timing(lease_duration: LeaseDuration, heartbeat_interval: timedelta) -> None:
        """Refuse a heartbeat that is not clearly shorter than the lease."""
        if not isinstance(heartbeat_interval, timedelta) or heartbeat_interval <= timedelta(0):
            raise InvalidArgument(
                f"heartbeat interval must be a positive timedelta, got {heartbeat_interval!r}"
            )
        if heartbeat_interval * 2 > lease_duration.value:
            raise InvalidArgument(
                f"heartbeat interval {heartbeat_interval} must be at most half the lease "
                f"duration {lease_duration.value}, so one missed beat does not lose the lease"
            )

    @staticmethod
    def validate_claim_batch(value: object, name: str = "claim_batch") -> int:
        """Refuse a claim batch outside 1..100 (``name`` is how the caller spelled it)."""
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
            raise InvalidArgument(f"{name} must be an integer in 1..100, got {value!r}")
        return value

    def close(self) -> None:
        """Hand back tasks claimed ahead, stop the heartbeat thread and mark the worker
        stopped in the registry. The store belongs to the caller."""
        self._release_ahead()
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

    def run_once(self, *, claim_next: bool = False, stopping: CancellationToken | None = None) -> RunOutcome:
        """Claim one ready task and run it until it completes, waits, fails or yields.

        ``claim_next`` is for a loop that calls again at once (the supervisor's children):
        a completion then also claims the next task, in the completion's transaction,
        which saves a commit per task; the next call runs that task, and :meth:`close`
        hands it back unstarted. ``stopping`` is that loop's stop token: once it is
        cancelled (a SIGTERM during the cycle) the completion claims nothing, since a
        stopping worker takes no new work."""
        self._claim_next = claim_next
        self._stopping = stopping
        if not self._registered:  # in the process that runs, so after any fork
            definitions = sorted((d.workflow.name, d.workflow.version) for d in self.registry)
            self.store.register_worker(
                self.worker_id, host=socket.gethostname(), pid=os.getpid(), definitions=definitions
            )
            self._keeper.announce(self.worker_id)
            self._registered = True
        extended_at = None
        while self._ahead:
            task = self._ahead.popleft()
            held = self._keeper.take(task.lease.task_id)
            if held is not None:
                lease, extended_at = held
                task = attrs.evolve(task, lease=lease)
                break
            if not self._keeper.was_handed_back(task.lease.task_id):
                # its lease ran out while it waited: another worker has it
                return LeaseLost(task.lease.task_id, task.lease.fencing_token)
        else:
            if crashpoints.ARMED:
                crashpoints.reached("before_claim", str(self.worker_id))
            claimed = self.store.claim(self.worker_id, self.lease_duration, limit=self._claim_batch)
            if not claimed:
                return Idle()
            task = claimed[0]
            self._hold_ahead(claimed[1:])
        if crashpoints.ARMED:
            crashpoints.reached("after_claim", task.lease.task_id)
        observer = self._observer
        if observer is None:
            return self._run(task, extended_at)
        observer.claimed(task)
        started = time.monotonic()
        outcome = self._run(task, extended_at)
        observer.finished(task, outcome, time.monotonic() - started)
        return outcome

    def _hold_ahead(self, claimed: list[ClaimedTask]) -> None:
        """Keep tasks claimed for later calls, their leases extended by the heartbeat."""
        if claimed:
            self._ahead.extend(claimed)
            self._keeper.hold([c.lease for c in claimed])

    def _release_ahead(self) -> None:
        """Give tasks claimed ahead back to the queue (the claim not counted as an
        attempt), so other workers take them now rather than after their leases expire."""
        while self._ahead:
            task = self._ahead.popleft()
            held = self._keeper.take(task.lease.task_id)
            if held is None:
                continue
            if crashpoints.ARMED:
                crashpoints.reached("before_transition", "hand_back")
            try:
                self.store.release(
                    held[0], delay=timedelta(0), reason="handed back unstarted by a stopping worker"
                )
            except (LeaseLostError, StoreUnavailable) as exc:
                log.warning("could not hand back a task claimed ahead: %s", exc, extra=task_fields(held[0]))
                continue
            if crashpoints.ARMED:
                crashpoints.reached("after_transition", "hand_back")

    def _run(self, claimed: ClaimedTask, extended_at: float | None = None) -> RunOutcome:
        lease = claimed.lease
        definition = self.registry.get(claimed.definition_name, claimed.definition_version)
        if definition is None:
            reason = (
                f"definition unavailable: {claimed.definition_name!r} version "
                f"{claimed.definition_version} is not registered on worker {self.worker_id}"
            )
            log.warning(reason, extra=task_fields(lease))
            if crashpoints.ARMED:
                crashpoints.reached("before_transition", "unavailable")
            try:
                self.store.release(lease, delay=self._unavailable_delay, reason=reason)
            except LeaseLostError as error:
                return self._lease_lost(claimed, error)
            if crashpoints.ARMED:
                crashpoints.reached("after_transition", "unavailable")
            return DefinitionUnavailable(lease.task_id, claimed.definition_name, claimed.definition_version)
        try:
            checkpoint = self._load_checkpoint(claimed, definition)
        except CheckpointError as exc:
            return self._fail(claimed, claimed.revision, None, str(exc), "checkpoint")
        if checkpoint.phase == "failed":  # requeued by an operator: failing steps start afresh
            checkpoint.step_failures.clear()
        checkpoint.phase = "running"
        checkpoint.usage = checkpoint.usage.add(claims=1)
        flags = self._keeper.watch(lease, extended_at)
        try:
            ctx = TaskRun(
                claimed=claimed,
                definition=definition,
                checkpoint=checkpoint,
                store=self.store,
                flags=flags,
                max_steps_per_claim=self._max_steps_per_claim,
                max_checkpoint_bytes=self._max_checkpoint_bytes,
            )
            return self._execute(claimed, definition, ctx)
        finally:
            self._keeper.unwatch()

    def _load_checkpoint(self, claimed: ClaimedTask, definition: WorkflowDefinition) -> Checkpoint:
        identity = definition.identity
        if claimed.checkpoint_json is None:
            return Checkpoint(identity)
        checkpoint = Checkpoint.decode(claimed.lease.task_id, claimed.checkpoint_json)
        if checkpoint.definition != identity:
            raise FingerprintMismatch(
                claimed.lease.task_id, checkpoint.definition.fingerprint, identity.fingerprint
            )
        return checkpoint

    def _execute(self, claimed: ClaimedTask, definition: WorkflowDefinition, ctx: TaskRun) -> RunOutcome:
        try:
            try:
                if claimed.claims_since_progress > definition.budget.max_attempts:
                    raise FailRequested(
                        f"claimed {claimed.claims_since_progress} times without progress, over "
                        f"max_attempts={definition.budget.max_attempts}: a step keeps crashing its worker",
                        cause="crash_loop",
                    )
                if ctx.checkpoint.compensating_for is not None:  # a crash interrupted the undo
                    return self._compensate(claimed, ctx, ctx.checkpoint.compensating_for, "", "other")
                if claimed.lease.cancel_requested is None:
                    try:
                        return self._drive(claimed, definition, ctx)
                    except CancelPending:
                        pass  # the cancel reached the row before this cycle's transition: it wins
                # Cancelled before this claim (while queued, waiting, or under a worker that
                # died): no step of the main function runs again, only the compensations.
                return self._compensate(claimed, ctx, "cancel", "cancel requested", "other")
            except FailRequested as failure:
                return self._fail_after_undo(claimed, ctx, failure)
        except LeaseGone as gone:  # also while undoing: the new owner carries on
            return self._lease_lost(claimed, gone.error)
        except LeaseLostError as error:  # the final write was refused
            return self._lease_lost(claimed, error)

    def _fail_after_undo(self, claimed: ClaimedTask, ctx: TaskRun, failure: FailRequested) -> RunOutcome:
        """Undo completed steps once if the failure calls for it, then end the task failed;
        a compensation that raises ends the undo, and the task fails with its reason."""
        undo = failure.ambiguous_effect is None and ctx.checkpoint.compensating_for is None
        if undo and ctx.needs_compensation():
            try:
                return self._compensate(claimed, ctx, "failure", failure.reason, failure.cause)
            except FailRequested as undo_failed:
                failure = undo_failed
        ctx.checkpoint.phase = "failed"
        try:
            text: str | None = ctx.encode()
        except CheckpointError:
            text = None
        return self._fail(
            claimed, ctx.revision, text, failure.reason, failure.cause, failure.ambiguous_effect
        )

    def _drive(self, claimed: ClaimedTask, definition: WorkflowDefinition, ctx: TaskRun) -> RunOutcome:
        """Run the main function and make the transition it ended in."""
        lease = claimed.lease
        workflow = definition.workflow
        assert workflow.main_fn is not None
        try:
            try:
                workflow_input = structure(from_json(claimed.input_json), workflow.input_type())
            except Exception as exc:
                raise FailRequested(
                    f"input does not fit {workflow.input_type()!r}: {exc}", cause="bad_input"
                ) from exc
            try:
                value = workflow.main_fn(ctx.context, workflow_input)
            except StoreUnavailable:
                # A checkpoint commit, signal or clock read through ctx found the store
                # away: that ends this cycle, not the task, which is claimed again once
                # its lease expires. (Failing it would also record in-memory progress,
                # such as a consumed signal, that the store never committed.)
                raise
            except Exception as exc:
                raise FailRequested(
                    f"workflow main raised {type(exc).__name__}: {exc}", cause="workflow_error"
                ) from exc
            try:
                result_json = to_json(value, max_depth=MAX_NESTING_DEPTH)
            except NotJsonable as exc:
                raise FailRequested(
                    f"workflow result cannot be stored as JSON: {exc}", cause="not_serializable"
                ) from exc
            self._check_result_size(lease.task_id, result_json)
            ctx.checkpoint.phase = "completed"
            if crashpoints.ARMED:
                crashpoints.reached("before_transition", "complete")
            then_claim = None
            stopping = self._stopping is not None and self._stopping.cancelled
            if self._claim_next and not self._ahead and not stopping:
                then_claim = ClaimRequest(self.worker_id, self.lease_duration, self._claim_batch)
            self._hold_ahead(
                self.store.complete(
                    lease, ctx.revision, self._encode_or_fail(ctx), result_json, then_claim=then_claim
                )
            )
            if crashpoints.ARMED:
                crashpoints.reached("after_transition", "complete")
            return Completed(lease.task_id, from_json(result_json))
        except SuspendRequested as wait:
            ctx.checkpoint.phase = "waiting"
            text = self._encode_or_fail(ctx)
            if crashpoints.ARMED:
                crashpoints.reached("before_transition", "suspend")
            self.store.suspend(
                lease, ctx.revision, text, wake_at=wait.wake_at, reason=wait.reason, signal=wait.signal
            )
            if crashpoints.ARMED:
                crashpoints.reached("after_transition", "suspend")
            return Suspended(lease.task_id, wait.reason, wait.wake_at)
        except CancelRequested:
            return self._compensate(claimed, ctx, "cancel", "cancel requested", "other")
        except RetryRequested as retry:
            text = self._encode_or_fail(ctx)
            delay = timedelta(seconds=retry.delay_s)
            if crashpoints.ARMED:
                crashpoints.reached("before_transition", "retry")
            retry_at = self.store.retry(lease, ctx.revision, text, delay=delay, reason=retry.reason)
            if crashpoints.ARMED:
                crashpoints.reached("after_transition", "retry")
            return Retried(lease.task_id, retry.reason, retry_at)
        except YieldRequested:
            if crashpoints.ARMED:
                crashpoints.reached("before_transition", "yield")
            self.store.release(lease, delay=timedelta(0), reason="step slice used up; requeued")
            if crashpoints.ARMED:
                crashpoints.reached("after_transition", "yield")
            return Yielded(lease.task_id)

    def _compensate(
        self,
        claimed: ClaimedTask,
        ctx: TaskRun,
        cause: str,
        reason: str,
        failure_cause: FailureCause,
    ) -> RunOutcome:
        """Undo completed steps (if any have compensations), then end the task as the
        cause says: cancelled, or failed with the original reason and ``failure_cause``."""
        lease = claimed.lease
        ctx.compensate(cause, reason)
        reason = ctx.checkpoint.compensation_reason or reason
        if cause == "cancel":
            ctx.checkpoint.phase = "cancelled"
            text = self._encode_or_fail(ctx)
            if crashpoints.ARMED:
                crashpoints.reached("before_transition", "cancel")
            self.store.acknowledge_cancel(lease, ctx.revision, text)
            if crashpoints.ARMED:
                crashpoints.reached("after_transition", "cancel")
            return Cancelled(lease.task_id, self.store.get_task(lease.task_id).reason or "cancelled")
        ctx.checkpoint.phase = "failed"
        undone = ", ".join(ctx.checkpoint.compensated) or "nothing"
        reason = f"{reason} (compensated: {undone})"
        return self._fail(claimed, ctx.revision, ctx.encode(), reason, failure_cause)

    def _check_result_size(self, task_id: str, result_json: str) -> None:
        """Hold the result to the checkpoint's size limit: it is stored in the same row
        and read back by everyone who looks at the task."""
        size = len(result_json.encode())
        if size > self._max_checkpoint_bytes:
            raise FailRequested(
                f"workflow result of task {task_id!r} is {size} bytes, over the limit of "
                f"{self._max_checkpoint_bytes} bytes (max_checkpoint_bytes); keep large "
                "artifacts outside and return their ids",
                cause="checkpoint",
            )

    def _encode_or_fail(self, ctx: TaskRun) -> str:
        try:
            return ctx.encode()
        except CheckpointError as exc:
            raise FailRequested(str(exc), cause="checkpoint") from exc

    def _fail(
        self,
        claimed: ClaimedTask,
        revision: int,
        checkpoint_json: str | None,
        reason: str,
        cause: FailureCause,
        ambiguous_effect: str | None = None,
    ) -> RunOutcome:
        lease = claimed.lease
        log.error("task failed: %s", reason, extra=task_fields(lease))
        if crashpoints.ARMED:
            crashpoints.reached("before_transition", "fail")
        try:
            self.store.fail(
                lease, revision, checkpoint_json, reason=reason, ambiguous_effect=ambiguous_effect
            )
        except LeaseLostError as error:
            return self._lease_lost(claimed, error)
        if crashpoints.ARMED:
            crashpoints.reached("after_transition", "fail")
        return Failed(lease.task_id, reason, recoverable=ambiguous_effect is not None, cause=cause)

    def _lease_lost(self, claimed: ClaimedTask, error: LeaseLostError) -> RunOutcome:
        log.warning("%s", error, extra=task_fields(claimed.lease))
        return LeaseLost(claimed.lease.task_id, claimed.lease.fencing_token)
