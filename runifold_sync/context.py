"""The replay engine behind ``ctx`` in workflow code.

The main function runs from the top on every claim. Each step, effect or timer call
takes the next position in the checkpoint journal: a recorded call returns its recorded
output, the first unrecorded one runs and is committed (fenced, revision-checked) before
the function goes on. Control leaves the main function through ``Interrupt``
exceptions, which derive from ``BaseException`` so that ``except Exception`` in workflow
code cannot swallow a suspension or a lost lease.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import crashpoints
from .checkpoint import Checkpoint, JournalEntry
from .codec import NotJsonable, from_json, structure, to_jsonable
from .effects import EffectEvidence, EffectStatus
from .errors import (
    AmbiguousEffect,
    CheckpointError,
    InvalidArgument,
    LeaseLostError,
    NonDeterminism,
    OutputNotSerializable,
)
from .heartbeat import LeaseFlags
from .interrupts import (
    BranchStopped,
    CancelRequested,
    FailRequested,
    LeaseGone,
    RetryRequested,
    SuspendRequested,
    YieldRequested,
)
from .logs import task_fields
from .models import Budget, BudgetUsage
from .progress import BranchScope, Progress
from .step_context import StepContext
from .store.base import WorkflowStore
from .store.records import ClaimedTask, Committed, Lease, Signal
from .waits import ApprovalDecision, ApprovalTimedOut, SignalTimedOut, approval_payload_problem

if TYPE_CHECKING:
    from .definition import WorkflowDefinition
    from .workflow import StepSpec


log = logging.getLogger("runifold_sync.context")


class WorkflowContext:
    """``ctx`` in a workflow's main function. Only the calls made through it are
    durable; everything else in the main function must be deterministic."""

    def __init__(
        self,
        *,
        claimed: ClaimedTask,
        definition: WorkflowDefinition,
        checkpoint: Checkpoint,
        store: WorkflowStore,
        flags: LeaseFlags,
        max_steps_per_claim: int | None,
        max_checkpoint_bytes: int,
    ) -> None:
        self.task_id = claimed.lease.task_id
        self.tenant = claimed.lease.tenant
        self._claimed = claimed
        self._definition = definition
        self._progress = Progress(checkpoint, claimed.revision)
        self._store = store
        self._flags = flags  # set by the heartbeat thread
        self._max_steps_per_claim = max_steps_per_claim
        self._max_checkpoint_bytes = max_checkpoint_bytes
        self._journal = checkpoint.journal
        self._branch: BranchScope | None = None
        self._cursor = 0
        self._occurrences: Counter[str] = Counter()
        self._executed = 0

    def branch(
        self, key: str, reserve: Budget | None, stop: threading.Event, held: Mapping[str, Budget]
    ) -> WorkflowContext:
        """A context for one parallel branch: same lease and checkpoint, its own journal
        and call ids scoped by ``key``; ``held`` are the reservations of all branches."""
        child = copy.copy(self)
        child._branch = BranchScope(key, reserve, stop, held)
        with self._progress.lock:
            child._journal = self.checkpoint.branch_journals.setdefault(key, [])
        child._cursor = 0
        child._occurrences = Counter()
        child._executed = 0
        return child

    @property
    def checkpoint(self) -> Checkpoint:
        return self._progress.checkpoint

    @property
    def revision(self) -> int:
        return self._progress.revision

    @property
    def lease(self) -> Lease:
        return self._claimed.lease

    @property
    def fence(self) -> int:
        """The lease's fencing token: make the application's own writes conditional on it."""
        return self._claimed.lease.fencing_token

    # --- checkpoint plumbing -------------------------------------------------------

    def encode(self) -> str:
        """The checkpoint as text, its run time brought up to now."""
        with self._progress.lock:
            self._progress.tick()
            return self.checkpoint.encode(self.task_id, self._max_checkpoint_bytes)

    def commit(self, subject: str = "") -> None:
        """Commit the checkpoint; ``subject`` (the call id it records) names the commit
        for crash points."""
        self._write(lambda text: self._store.commit_checkpoint(self.lease, self.revision, text), subject)

    def _write(self, write: Callable[[str], Committed], subject: str = "") -> None:
        """Encode the checkpoint and make one fenced write of it; keeps the new revision.
        The write also answers whether a cancel is pending, so a task stops at its next
        step boundary (see ``_check_continue``) without waiting for a heartbeat."""
        with self._progress.lock:
            try:
                text = self.encode()
            except CheckpointError as exc:
                raise FailRequested(str(exc), cause="checkpoint") from exc
            if crashpoints.ARMED:
                crashpoints.reached("before_commit", subject)
            try:
                committed = write(text)
            except LeaseLostError as exc:
                raise LeaseGone(exc) from exc
            self._progress.revision = committed.revision
            if committed.cancel_requested is not None:
                self._flags.cancel = True
            self._progress.unsaved = None
            if crashpoints.ARMED:
                crashpoints.reached("after_commit", subject)

    def _next(self, base: str, kind: str) -> tuple[str, JournalEntry | None]:
        """The call id for this call and its recorded entry, if any."""
        self._occurrences[base] += 1
        prefix = "" if self._branch is None else f"{self._branch.key}/"
        call_id = f"{prefix}{base}#{self._occurrences[base]}"
        journal = self._journal
        position = self._cursor
        if position < len(journal):
            entry = journal[position]
            if entry.call_id != call_id or entry.kind != kind:
                raise FailRequested(
                    str(NonDeterminism(self.task_id, position, entry.call_id, call_id)),
                    cause="nondeterminism",
                )
            return call_id, entry
        return call_id, None

    def _check_lease(self) -> None:
        if self._flags.expired():
            raise LeaseGone(LeaseLostError(self.task_id, self.fence, "next step"))

    def _check_continue(self) -> None:
        """Before anything new starts: the lease still held and no cancel requested. A
        step that already ran is recorded first, so a cancel never hides what happened."""
        self._check_lease()
        if self._flags.cancel:
            raise CancelRequested()
        if self._branch is not None and self._branch.stop.is_set():
            raise BranchStopped()

    def _commit_unsaved(self) -> None:
        """Commit a step result still held back (see ``Progress.unsaved``), so nothing
        that ran is only in memory when the outside world is touched again. Checked
        under the lock: two branches reaching a boundary at once must not both commit it."""
        with self._progress.lock:
            unsaved = self._progress.unsaved
            if unsaved is not None:
                self.commit(unsaved)

    def _boundary(self) -> None:
        """Checks made before a step or effect body runs, after saving the previous
        step's result: lease, cancel, slice and budget."""
        self._commit_unsaved()
        self._check_continue()
        if self._max_steps_per_claim is not None and self._executed >= self._max_steps_per_claim:
            raise YieldRequested()
        self._check_budget(next_steps=1)

    def _check_budget(self, next_steps: int = 0) -> None:
        """Fail when usage (plus the steps about to run) is over the task's budget or the
        branch's reservation. Checked before each body and after each commit, so a body
        that overspends fails the task even when it was the last one."""
        branch = self._branch
        if not self._definition.budget.limits_usage() and (branch is None or branch.reserve is None):
            return  # nothing to check: skip building usage objects twice a step
        with self._progress.lock:
            self._progress.tick()
            usage = self.checkpoint.usage.add(steps=next_steps)
            over = self._definition.budget.exceeded(usage)
            if branch is not None and branch.reserve is not None and not over:
                used = self.checkpoint.branch_usage.get(branch.key, BudgetUsage())
                share = branch.reserve.exceeded(used.add(steps=next_steps))
                over = None if share is None else f"branch {branch.key!r} reserve: {share}"
            elif branch is not None and not over:
                steps, cost = branch.held_for_others(self.checkpoint.branch_usage)
                held = self._definition.budget.exceeded(usage.add(steps=steps, cost=cost))
                if held is not None:
                    over = (
                        f"branch {branch.key!r} is unreserved and may not spend what its siblings "
                        f"reserved ({steps} steps, cost {cost:g} still held): {held} counting the "
                        "reservations"
                    )
        if over:
            raise FailRequested(over, cause="budget")

    def _encode_output(self, call_id: str, value: Any) -> Any:
        try:
            return to_jsonable(value)
        except NotJsonable as exc:
            raise FailRequested(
                str(OutputNotSerializable(call_id, str(exc))), cause="not_serializable"
            ) from exc

    def _structure(self, spec: StepSpec, raw: Any) -> Any:
        try:
            return structure(raw, spec.output_type)
        except Exception as exc:
            raise FailRequested(
                f"recorded output of {spec.step_id!r} no longer fits its return type "
                f"{spec.output_type!r}: {exc}",
                cause="nondeterminism",
            ) from exc

    # --- steps and effects ---------------------------------------------------------

    def call(self, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call_id, entry = self._next(spec.step_id, spec.kind)
        if entry is not None and entry.status == "done":
            self._cursor += 1
            return self._structure(spec, entry.output)
        if spec.kind == "effect":
            return self._effect(spec, call_id, entry, args, kwargs)
        self._boundary()
        output = self._execute(spec, call_id, None, args, kwargs)
        with self._progress.lock:
            self._journal.append(JournalEntry(call_id, "step", "done", output))
            self._completed(spec, call_id)
            self._progress.unsaved = call_id
        self._cursor += 1
        self._check_budget()
        return self._structure(spec, output)

    def _effect(
        self,
        spec: StepSpec,
        call_id: str,
        entry: JournalEntry | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if entry is None:
            self._boundary()
            entry = JournalEntry(call_id, "effect", "intent", key=f"{self.task_id}/{call_id}")
            with self._progress.lock:
                self._journal.append(entry)
            self.commit(f"{call_id}:intent")  # durable before the outside world is touched
            self._continue_after_intent(entry)
        else:
            self._boundary()
            known = self._known_outcome(spec, entry, args, kwargs)
            if known is not None:
                evidence, output = known
                return self._finish_effect(spec, entry, output, evidence)
        output = self._execute(spec, call_id, entry.key, args, kwargs)
        return self._finish_effect(spec, entry, output, "ran")

    def _continue_after_intent(self, entry: JournalEntry) -> None:
        """The intent's commit may have answered with a cancel (or the branch was stopped
        meanwhile): checked again here, so the body is not called once the task is to stop.
        The intent is then taken back out of the journal, so the checkpoint the task ends
        with records the effect as never called rather than as interrupted mid-call (which
        a replay would have to reconcile or fail closed on). Only if this worker dies before
        that checkpoint is written does the intent stay; a cancelled task never replays its
        main function, so it is then only a conservative record."""
        try:
            self._check_continue()
        except (CancelRequested, BranchStopped):
            with self._progress.lock:
                self._journal.remove(entry)
            raise

    def _known_outcome(
        self, spec: StepSpec, entry: JournalEntry, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, Any] | None:
        """For an effect interrupted mid-call: (evidence, output) when it is known to have
        happened, None when it is safe to run again; fails closed when unknown."""
        assert entry.key is not None
        # A resolution answers for the interruption it was made about. Once the effect has
        # been re-run on it, a later interruption needs new evidence, not the same answer.
        used = entry.evidence is not None
        resolution = None if used else self._claimed.resolutions.get(entry.key)
        if resolution is not None:
            if not resolution.applied:
                entry.evidence = f"re-run as not applied, resolved by {resolution.actor}: {resolution.reason}"
                self.commit()  # durable before the outside world is touched again
                return None
            raw = None if resolution.result_json is None else from_json(resolution.result_json)
            return f"resolved by {resolution.actor}: {resolution.reason}", raw
        if spec.idempotent:
            return None
        if spec.reconcile is not None:
            context = StepContext(self.task_id, entry.call_id, 0, self.fence, entry.key)
            try:
                evidence = spec.reconcile(context, *args, **kwargs)
            except Exception as exc:  # no evidence is unknown: fail closed, never guess
                log.warning(
                    "reconcile of %s raised %s: %s",
                    entry.key,
                    type(exc).__name__,
                    exc,
                    extra=task_fields(self.lease),
                )
                evidence = EffectEvidence.unknown()
            if evidence.status is EffectStatus.APPLIED:
                return "reconciled", self._encode_output(entry.call_id, evidence.result)
            if evidence.status is EffectStatus.NOT_APPLIED:
                return None
        entry.evidence = None  # the next resolution of this key answers this interruption
        error = AmbiguousEffect(self.task_id, spec.step_id, entry.key)
        raise FailRequested(str(error), ambiguous_effect=entry.key, cause="ambiguous_effect")

    def _finish_effect(self, spec: StepSpec, entry: JournalEntry, output: Any, evidence: str) -> Any:
        with self._progress.lock:
            entry.status = "done"
            entry.output = output
            entry.evidence = evidence
            self._completed(spec, entry.call_id)
        self._cursor += 1
        self.commit(entry.call_id)
        self._check_budget()
        return self._structure(spec, output)

    def _execute(
        self,
        spec: StepSpec,
        call_id: str,
        key: str | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run a body for real, account for it, and turn its failure into a retry or a
        terminal failure according to its retry policy."""
        with self._progress.lock:
            failures = self.checkpoint.step_failures.get(call_id, 0)
        context = StepContext(self.task_id, call_id, failures + 1, self.fence, key)
        started = time.monotonic()
        if crashpoints.ARMED:
            crashpoints.reached(f"before_{spec.kind}", call_id)
        try:
            value = spec.fn(context, *args, **kwargs)
        except Exception as exc:
            self._check_lease()  # a lost lease outranks the failure: record nothing
            failures += 1
            with self._progress.lock:
                self._account(steps=0, cost=context.cost, started=started)
                self.checkpoint.step_failures[call_id] = failures
            description = f"{spec.kind} {spec.step_id!r} raised {type(exc).__name__}: {exc}"
            if failures < spec.retry.max_attempts:
                raise RetryRequested(
                    spec.retry.backoff_s(failures),
                    f"{description} (attempt {failures} of {spec.retry.max_attempts})",
                ) from exc
            raise FailRequested(
                f"{description}; gave up after {failures} attempts", cause="step_error"
            ) from exc
        if crashpoints.ARMED:
            crashpoints.reached(f"after_{spec.kind}", call_id)
        self._check_lease()
        output = self._encode_output(call_id, value)
        with self._progress.lock:
            self._account(steps=1, cost=context.cost, started=started)
            self.checkpoint.step_failures.pop(call_id, None)
        self._executed += 1
        return output

    def _completed(self, spec: StepSpec, call_id: str) -> None:
        """Note a completed call that has a compensation, in completion order across
        branches (caller holds the lock): the undo runs in exactly the reverse order."""
        if spec.step_id in self._definition.workflow.compensations:
            self.checkpoint.undo.append(call_id)

    def _account(self, *, steps: int, cost: float, started: float) -> None:
        """Add a body's usage to the task (its run time by a tick), and to its branch's
        share, whose time is the branch's own bodies (caller holds the lock)."""
        elapsed_s = time.monotonic() - started
        checkpoint = self.checkpoint
        self._progress.tick(steps=steps, cost=cost)
        if self._branch is not None:
            used = checkpoint.branch_usage.get(self._branch.key, BudgetUsage())
            checkpoint.branch_usage[self._branch.key] = used.add(steps=steps, cost=cost, elapsed_s=elapsed_s)

    # --- compensation ----------------------------------------------------------------

    def needs_compensation(self) -> bool:
        """True when a completed step has a declared compensation not yet run."""
        return any(True for _ in self._to_compensate())

    def compensate(self, cause: str, reason: str) -> None:
        """Undo completed steps newest first, committing after each, after the task
        failed or was cancelled. A compensation that raises fails the task as it is."""
        with self._progress.lock:
            starting = self.checkpoint.compensating_for is None
            if starting:
                self.checkpoint.compensating_for = cause
                self.checkpoint.compensation_reason = reason
        if starting:  # resuming commits only after an undo: a crashing one must not count as progress
            self.commit()
        workflow = self._definition.workflow
        for entry, step_id in list(self._to_compensate()):
            self._check_lease()
            spec = workflow.steps[step_id]
            call_id = f"compensate:{entry.call_id}"
            context = StepContext(self.task_id, call_id, 1, self.fence, f"{self.task_id}/{call_id}")
            started = time.monotonic()
            try:
                workflow.compensations[step_id](context, self._structure(spec, entry.output))
            except Exception as exc:
                with self._progress.lock:  # what it spent before raising was spent
                    self._account(steps=0, cost=context.cost, started=started)
                raise FailRequested(
                    f"{reason}; compensation of {entry.call_id} raised {type(exc).__name__}: {exc}",
                    cause="compensation_error",
                ) from exc
            with self._progress.lock:
                self._account(steps=0, cost=context.cost, started=started)
                self.checkpoint.compensated.append(entry.call_id)
            self.commit()

    def _to_compensate(self) -> Iterator[tuple[JournalEntry, str]]:
        """Completed calls still to undo with their step ids, newest completion first."""
        checkpoint = self.checkpoint
        if len(checkpoint.undo) == len(checkpoint.compensated):
            return
        entries = {entry.call_id: entry for entry in checkpoint.journal}
        for journal in checkpoint.branch_journals.values():
            entries.update((entry.call_id, entry) for entry in journal)
        for call_id in reversed(checkpoint.undo):
            if call_id not in checkpoint.compensated:
                yield entries[call_id], call_id.rsplit("/", 1)[-1].split("#")[0]

    # --- parallel branches and races ------------------------------------------------

    def parallel(
        self,
        branches: Mapping[str, Callable[[WorkflowContext], Any]],
        *,
        reserve: Mapping[str, Budget] | None = None,
        max_threads: int = 4,
    ) -> dict[str, Any]:
        """Run ``branches`` (name -> function of a branch ctx) on up to ``max_threads``
        threads and return each one's result. ``reserve`` gives branches a share of the
        task's budget (steps, cost, duration), refused up front if the remaining budget
        cannot cover all shares. A reserved branch may spend its share; an unreserved one
        only what no unfinished sibling holds. Waits (timers, signals) belong in the main
        function."""
        from .branches import run_parallel

        return run_parallel(self, branches, reserve, max_threads)

    def race(
        self,
        branches: Mapping[str, Callable[[WorkflowContext], Any]],
        *,
        cancel_safe: Iterable[str] = (),
        max_threads: int = 4,
    ) -> tuple[str, Any]:
        """First success wins: returns (branch name, result), recorded for replay. Losers
        named in ``cancel_safe`` stop at their next step boundary; the others are left
        to finish (an effect in flight is never abandoned) and recorded as superseded."""
        from .branches import run_race

        return run_race(self, branches, list(cancel_safe), max_threads)

    def _begin(self, call_id: str, kind: str) -> JournalEntry:
        entry = JournalEntry(call_id, kind, "pending", output={})
        with self._progress.lock:
            self._journal.append(entry)
        return entry

    def _record(self, entry: JournalEntry, output: Any) -> None:
        with self._progress.lock:
            entry.output = output
        self.commit()

    def _finish(self, entry: JournalEntry, output: Any) -> None:
        with self._progress.lock:
            entry.status = "done"
            entry.output = output
        self._cursor += 1
        self.commit()

    # --- timers ------------------------------------------------------------------

    def sleep(self, duration: timedelta) -> None:
        """Wait durably for ``duration`` of store time; the worker is freed meanwhile."""
        if not isinstance(duration, timedelta) or duration < timedelta(0):
            raise InvalidArgument(f"sleep duration must be a non-negative timedelta, got {duration!r}")
        self._timer(lambda now: now + duration)

    def sleep_until(self, deadline: datetime) -> None:
        """Wait durably until ``deadline`` in store time."""
        if not isinstance(deadline, datetime) or deadline.tzinfo is None:
            raise InvalidArgument(f"sleep_until needs a timezone-aware datetime, got {deadline!r}")
        self._timer(lambda _now: deadline)

    def _timer(self, deadline: Any) -> None:
        self._no_wait_in_branch("timer")
        call_id, entry = self._next("timer", "timer")
        if entry is not None and entry.status == "done":
            self._cursor += 1
            return
        now = self._store.now()
        if entry is None:
            self._check_continue()
            due = deadline(now)
            entry = JournalEntry(call_id, "timer", "pending", due=due.timestamp())
            self._journal.append(entry)
        assert entry.due is not None
        due_at = datetime.fromtimestamp(entry.due, UTC)
        if now >= due_at:
            entry.status = "done"  # persisted with the next commit; replay re-derives it
            self._cursor += 1
            return
        raise SuspendRequested(due_at, f"waiting for timer {call_id} until {due_at.isoformat()}")

    # --- signals and approvals -------------------------------------------------------

    def wait_for_signal(self, name: str, *, timeout: timedelta | None = None, payload_type: Any = Any) -> Any:
        """Wait durably for a signal named ``name`` (declared on the workflow). Returns its
        payload, structured as ``payload_type``, or :class:`SignalTimedOut`. A signal sent
        before the wait is kept for it; the definition's sender policy may refuse one."""

        def refusal(signal: Signal, payload: Any) -> str | None:
            try:  # a payload the workflow cannot read is refused, not allowed to fail it
                structure(payload, payload_type)
            except Exception as exc:
                return f"payload does not fit {payload_type!r}: {type(exc).__name__}: {exc}"
            return self._policy_refusal(signal, payload)

        output = self._await_signal(name, timeout, refusal)
        if output.get("timed_out"):
            return SignalTimedOut(name)
        return structure(output["payload"], payload_type)

    def request_approval(
        self,
        name: str,
        *,
        approvers: Iterable[str],
        timeout: timedelta | None = None,
        escalate_to: Iterable[str] = (),
        escalation_timeout: timedelta | None = None,
    ) -> ApprovalDecision | ApprovalTimedOut:
        """Wait for a person in ``approvers`` to send signal ``name`` with payload
        ``{"approved": bool, "reason": ...}``. Decisions from anyone else are refused and
        kept in the history. On timeout, ``escalate_to`` (if any) is asked next."""
        for names in (approvers, escalate_to):
            if isinstance(names, str):
                raise InvalidArgument(f"approvers must be a list of names, got the string {names!r}")
        stages = [(frozenset(approvers), timeout, False)]
        if escalate_to:
            stages.append((frozenset(escalate_to), escalation_timeout, True))
        for allowed, stage_timeout, escalated in stages:
            if not allowed:
                raise InvalidArgument(f"approval {name!r} needs at least one approver")

            def refusal(signal: Signal, payload: Any, allowed: frozenset[str] = allowed) -> str | None:
                if signal.sender not in allowed:
                    return f"{signal.sender!r} is not an approver of {name!r}"
                return approval_payload_problem(payload) or self._policy_refusal(signal, payload)

            output = self._await_signal(name, stage_timeout, refusal)
            if not output.get("timed_out"):
                payload = output["payload"]
                return ApprovalDecision(
                    name, output["sender"], payload["approved"], payload.get("reason"), escalated
                )
        return ApprovalTimedOut(name, escalated=len(stages) > 1)

    def _policy_refusal(self, signal: Signal, payload: Any) -> str | None:
        policy = self._definition.sender_policy
        if policy is None:
            return None
        try:
            accepted = policy(signal.sender, signal.name, payload)
        except Exception as exc:  # the policy's bug refuses this signal; it must not fail the task
            return (
                f"sender {signal.sender!r} refused: the definition's sender policy raised "
                f"{type(exc).__name__}: {exc}"
            )
        if accepted:
            return None
        return f"sender {signal.sender!r} refused by the definition's sender policy"

    def _await_signal(
        self, name: str, timeout: timedelta | None, refusal: Callable[[Signal, Any], str | None]
    ) -> dict[str, Any]:
        """The journal output of a signal wait: the accepted signal, or a timeout."""
        self._no_wait_in_branch(f"signal {name!r}")
        if name not in self._definition.workflow.signals:
            raise FailRequested(
                f"signal {name!r} is not declared by {self._definition.workflow!r}", cause="misuse"
            )
        if timeout is not None and (not isinstance(timeout, timedelta) or timeout <= timedelta(0)):
            raise InvalidArgument(f"signal timeout must be a positive timedelta or None, got {timeout!r}")
        call_id, entry = self._next(f"signal:{name}", "signal")
        if entry is not None and entry.status == "done":
            self._cursor += 1
            output: dict[str, Any] = entry.output
            return output
        self._check_continue()
        now = self._store.now()
        if entry is None:
            due = None if timeout is None else (now + timeout).timestamp()
            entry = JournalEntry(call_id, "signal", "pending", due=due)
            self._journal.append(entry)
        # The store keeps any name (it does not know the definition); the wait refuses the
        # names the definition does not declare, so they leave the pending count, and leaves
        # other declared names for their own wait.
        workflow = self._definition.workflow
        for signal in self._store.pending_signals(self.task_id):
            if signal.name not in workflow.signals:
                note = f"signal {signal.name!r} is not declared by {workflow!r}"
                self._consume(signal, call_id, accepted=False, note=note)
                continue
            if signal.name != name:
                continue
            payload = from_json(signal.payload_json)
            refused = refusal(signal, payload)
            if refused is None:
                entry.status = "done"
                entry.output = {"signal_id": signal.signal_id, "sender": signal.sender, "payload": payload}
                self._cursor += 1
            self._consume(signal, call_id, accepted=refused is None, note=refused or f"accepted by {call_id}")
            if refused is None:
                return dict(entry.output)
        due_at = None if entry.due is None else datetime.fromtimestamp(entry.due, UTC)
        if due_at is not None and now >= due_at:
            entry.status = "done"
            entry.output = {"timed_out": True}
            self._cursor += 1
            return dict(entry.output)
        until = "" if due_at is None else f" until {due_at.isoformat()}"
        raise SuspendRequested(due_at, f"waiting for signal {name!r}{until}", signal=name)

    def _no_wait_in_branch(self, what: str) -> None:
        if self._branch is not None:
            raise FailRequested(
                f"branch {self._branch.key!r} waits for a {what}; durable waits belong in the "
                "main function, not in parallel branches",
                cause="misuse",
            )

    def _consume(self, signal: Signal, call_id: str, *, accepted: bool, note: str) -> None:
        self._write(
            lambda text: self._store.consume_signal(
                self.lease, self.revision, text, signal.signal_id, accepted=accepted, note=note
            ),
            call_id,
        )
