"""Steps and effects: running a body for real, under its retry policy, and the intent an
effect commits before it touches the outside world.

A step follows the replay rule as it is: replayed when its entry is finished, else run,
recorded and committed before the next body runs. An effect first
commits an intent with a stable idempotency key; found unfinished on replay, it is run
again only when that is known to be safe (idempotent, resolved as not applied, or
reconciled as not applied), returns the known result when it is known to have happened,
and otherwise fails the task closed as ambiguous: never decided from a guess.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import (
    AmbiguousEffect,
    InvalidArgument,
    OutputMismatch,
    OutputNotSerializable,
    StepFailed,
    gave_up_after,
)
from ..model import crashpoints, validate
from ..model.checkpoint import EntryKind, EntryStatus, JournalEntry
from ..model.codec import MAX_NESTING_DEPTH, NotJsonable, from_json, structure, to_json
from ..model.effects import (
    RAN,
    RECONCILED,
    RERUN_RECONCILED,
    EffectEvidence,
    EffectStatus,
    came_from,
    resolved,
)
from ..model.inputs import fit_output, problems, type_name
from ..model.tracebacks import kept_traceback, storable
from ..store import checks
from ..store.checks import MAX_EVENT_BYTES
from ..workflow.specs import StepSpec
from ..workflow.step_context import StepContext
from .boundary import Boundary
from .interrupts import BranchStopped, CancelRequested, FailRequested, RetryRequested
from .logs import task_fields
from .replay import Cursor, finished
from .spans import NO_SPANS
from .timeouts import Timeouts, Unfinished

if TYPE_CHECKING:
    from ..workflow.declaration import Workflow

log = logging.getLogger("runifold_sync.workflow.context")  # the engine's logger kept its name

# Bound once, for the replay of every step (see replay._DONE).
_STEP, _EFFECT, _DONE = EntryKind.STEP, EntryKind.EFFECT, EntryStatus.DONE
_FAILED = EntryStatus.FAILED
# The failures a main function can catch as StepFailed: a body's own, after its retries.
_CATCHABLE = ("step_error", "step_timeout")


def replayed_failure(entry: JournalEntry) -> StepFailed:
    """The StepFailed a recorded final failure raises again on replay."""
    out = entry.output
    return StepFailed(
        out["step_id"],
        entry.call_id,
        out["attempts"],
        out["error_class"],
        out["message"],
        out["reason"],
        out["cause"],
        entry.key,
        out.get("traceback"),
    )


def structured(spec: StepSpec, raw: Any, text: str | None = None) -> Any:
    """A recorded output (``text``: its canonical text, when the caller has it) as the
    step's return type; one that no longer fits it means the code changed under the
    checkpoint."""
    try:
        return structure(raw, spec.output_type, text)
    except Exception as exc:
        raise FailRequested(
            f"recorded output of {spec.step_id!r} no longer fits its return type {spec.output_type!r}: {exc}",
            cause="nondeterminism",
            error=exc,
            step_id=spec.step_id,
        ) from exc


def checked(spec: StepSpec, raw: Any, text: str | None, came: str = "returned") -> Any:
    """A new output (``raw``, decoded from ``text``) as the step's return type, held to
    it as strictly as a task's input: a step annotated ``-> str`` that returns 42 fails
    the task, not retried (the same body returns the same), rather than give the main
    function ``"42"``. ``came`` says where the value came from. A recorded output is
    replayed by :func:`structured`, as it always was."""
    try:
        return fit_output(raw, spec.output_type, text)
    except Exception as exc:
        shown, type_ = validate.shown(raw), type_name(spec.output_type)
        error = OutputMismatch(str(spec.kind), spec.step_id, came, shown, type_, problems(exc, "output"))
        raise FailRequested(str(error), cause="bad_output", error=error, step_id=spec.step_id) from exc


def encode_output(spec: StepSpec, call_id: str, value: Any) -> str:
    """A body's result as the journal keeps it: its canonical text, checked to be strict
    JSON nested at most :data:`MAX_NESTING_DEPTH` deep. Encoded once: the journal's form,
    the entry's text and the copy the main function gets are all read from it."""
    try:
        return to_json(value, max_depth=MAX_NESTING_DEPTH)
    except NotJsonable as exc:
        error = OutputNotSerializable(call_id, str(exc))
        raise FailRequested(str(error), cause="not_serializable", error=error, step_id=spec.step_id) from exc


class BodyRuntime:
    """What a running body's ``ctx`` reaches of its run (``StepRuntime``): heartbeats
    with details, the stop flags, events and stream writes. ``transactional``: the body
    runs inside the store's transaction, where a commit of its own cannot be made."""

    def __init__(self, boundary: Boundary, transactional: bool) -> None:
        self._commits = boundary.commits
        self._boundary = boundary
        self._transactional = transactional

    def heartbeat(self, call_id: str, details: Any) -> None:
        self._boundary.claim.check_lease()
        if details is None:
            return
        if self._transactional:
            raise InvalidArgument(
                f"heartbeat details of {call_id!r}: a transaction step cannot commit them (its body "
                "runs inside the store's transaction); call heartbeat() without details"
            )
        text = validate.json_text(
            f"heartbeat details of {call_id!r}",
            details,
            limit=MAX_EVENT_BYTES,
            instead="keep a position or an id there, not the data",
        )
        with self._commits.lock:
            self._commits.checkpoint.heartbeats[call_id] = from_json(text)
        self._commits.commit(f"{call_id}:heartbeat")

    def cancelled(self) -> bool:
        return self._boundary.stop_requested()

    def set_event(self, call_id: str, key: str, value: Any) -> None:
        value_json = checks.event(key, value)
        if self._transactional:
            raise InvalidArgument(
                f"set_event from {call_id!r}: a transaction step cannot commit an event of its own "
                "(its body runs inside the store's transaction); set it from the main function"
            )
        self._commits.commit_event(key, value_json)

    def write_stream(self, call_id: str, key: str, value: Any, seq: int) -> None:
        self._commits.append_stream(call_id, key, value, seq)


class Calls:
    """The steps and effects of one journal (the main function's or a branch's)."""

    def __init__(self, cursor: Cursor, boundary: Boundary, workflow: Workflow) -> None:
        self._cursor = cursor
        self._boundary = boundary
        self._commits = boundary.commits
        self._claim = claim = boundary.claim
        self._timeouts = Timeouts(boundary)
        self._undoable = workflow.compensations  # step ids that declare a compensation
        self._undo_with_args = workflow.compensation_args  # those whose compensation takes their arguments
        self._arguments: dict[str, Any] = {}  # call id -> [args, kwargs] of a call in flight that needs them
        self._resolutions = claim.claimed.resolutions  # the claim's answers about ambiguous effects
        # Read at every step: the claim's one checkpoint, its lock and progress.
        self._checkpoint = boundary.commits.checkpoint
        self._lock = boundary.commits.lock
        self._progress = boundary.commits.progress

    def call(self, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """What calling a declared step or effect with ``ctx`` does."""
        if spec.kind is _EFFECT:
            return self._effect(spec, args, kwargs)
        call_id, entry = self._cursor.take(spec.step_id, _STEP)
        if entry is not None and entry.status == _DONE:
            return structured(spec, entry.output)
        if entry is not None and entry.status == _FAILED:
            raise replayed_failure(entry)
        if spec.step_id in self._undo_with_args:
            self._keep_arguments(spec, call_id, args, kwargs)
        if self._checkpoint.deadlines:  # an attempt an earlier claim began may be unfinished
            prior = self._timeouts.unfinished(call_id)
            if prior is not None:
                self._next_attempt(spec, call_id, prior, None)
        if spec.timeout is None:
            self._boundary.before_body()
        else:
            try:
                self._boundary.before_body(lambda: self._timeouts.mark(spec, call_id))
            except BaseException:
                self._timeouts.unmark(call_id)  # refused before its body began
                raise
        if spec.transactional:
            value = self._transaction(spec, call_id, args, kwargs)
            self._boundary.check_budget()
            return value
        text = self._execute(spec, call_id, None, args, kwargs)
        output = from_json(text)
        value = checked(spec, output, text)  # not recorded when it does not fit
        with self._lock:
            self._cursor.record(JournalEntry(call_id, _STEP, _DONE, output), text)
            if spec.step_id in self._undoable:
                self._completed(spec, call_id)
            self._progress.unsaved = call_id  # Commits.defer: committed at the next boundary
        self._boundary.check_budget()
        return value

    def _effect(self, spec: StepSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call_id, entry = self._cursor.take(spec.step_id, _EFFECT)
        if entry is not None and finished(entry):
            return structured(spec, entry.output)
        if entry is not None and entry.status == _FAILED:
            raise replayed_failure(entry)
        if spec.step_id in self._undo_with_args:
            self._keep_arguments(spec, call_id, args, kwargs)
        timed = spec.timeout is not None
        prior = None if entry is None else self._timeouts.unfinished(call_id)
        ran = RAN  # the evidence if its body runs now
        self._boundary.before_body()
        if entry is None:
            key = self._commits.checkpoint.idempotency_key(self._claim.lease.task_id, call_id)
            entry = JournalEntry(call_id, _EFFECT, EntryStatus.INTENT, key=key)
            self._cursor.begin(entry)
            if timed:  # its deadline is durable with the intent
                self._timeouts.mark(spec, call_id)
            self._commits.commit(f"{call_id}:intent")  # durable before the outside world is touched
            self._continue_after_intent(entry)
        else:
            known = self._known_outcome(spec, entry, args, kwargs, prior)
            if isinstance(known, tuple):
                evidence, output = known
                return self._finish_effect(spec, entry, output, evidence)
            ran = known
            if prior is not None:
                self._next_attempt(spec, call_id, prior, entry.key)
            if timed:  # running it again: its new deadline is durable first
                self._commits.commit(self._timeouts.mark(spec, call_id))
        text = self._execute(spec, call_id, entry.key, args, kwargs)
        return self._finish_effect(spec, entry, from_json(text), ran, text)

    def _next_attempt(self, spec: StepSpec, call_id: str, prior: Unfinished, key: str | None) -> None:
        """Count an attempt an earlier claim began and never ended; when that was the last
        one and it timed out, the main function gets a StepFailed, as if the attempt had
        timed out under this claim."""
        try:
            self._timeouts.next_attempt(spec, call_id, prior, key)
        except FailRequested as failure:
            if failure.cause not in _CATCHABLE:
                raise
            with self._commits.lock:
                attempts = self._commits.checkpoint.step_failures.get(call_id, 0)
            log.warning("%s", failure.reason, extra=task_fields(self._claim.lease))
            raise self._record_failure(spec, call_id, key, attempts, failure) from None

    def _continue_after_intent(self, entry: JournalEntry) -> None:
        """The intent's commit may have answered with a cancel (or the branch was stopped
        meanwhile): checked again here, so the body is not called once the task is to stop.
        The intent is then taken back out of the journal, so the checkpoint the task ends
        with records the effect as never called rather than as interrupted mid-call (which
        a replay would have to reconcile or fail closed on). Only if this worker dies before
        that checkpoint is written does the intent stay; a cancelled task never replays its
        main function, so it is then only a conservative record."""
        try:
            self._boundary.check_continue()
        except (CancelRequested, BranchStopped):
            self._cursor.drop(entry)
            self._timeouts.unmark(entry.call_id)
            raise

    def _known_outcome(
        self,
        spec: StepSpec,
        entry: JournalEntry,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        prior: Unfinished | None,
    ) -> tuple[str, Any] | str:
        """For an effect interrupted mid-call (``prior``: by its timeout, or its worker
        stopping, when it has a timeout): (evidence, output) when it is known to have
        happened; when it is safe to run again, the evidence its new run will have (what
        found it not applied); fails closed when unknown."""
        assert entry.key is not None
        # A resolution answers for the interruption it was made about. Once the effect has
        # been re-run on it, a later interruption needs new evidence, not the same answer.
        used = entry.evidence is not None
        resolution = None if used else self._resolutions.get(entry.key)
        if resolution is not None:
            decided = resolved(resolution.actor, resolution.reason, applied=resolution.applied)
            if not resolution.applied:
                entry.evidence = decided
                self._commits.commit()  # durable before the outside world is touched again
                return decided
            raw = None if resolution.result_json is None else from_json(resolution.result_json)
            return decided, raw
        if spec.idempotent:
            return RAN
        if spec.reconcile is not None:
            lease = self._claim.lease
            context = StepContext(lease.task_id, entry.call_id, 0, lease.fencing_token, entry.key)
            try:
                evidence = spec.reconcile(context, *args, **kwargs)
            except Exception as exc:  # no evidence is unknown: fail closed, never guess
                log.warning(
                    "reconcile of %s raised %s: %s",
                    entry.key,
                    type(exc).__name__,
                    exc,
                    extra=task_fields(lease),
                )
                evidence = EffectEvidence.unknown()
            if evidence.status is EffectStatus.APPLIED:
                return RECONCILED, from_json(encode_output(spec, entry.call_id, evidence.result))
            if evidence.status is EffectStatus.NOT_APPLIED:
                return RERUN_RECONCILED
        entry.evidence = None  # the next resolution of this key answers this interruption
        error = AmbiguousEffect(self._claim.lease.task_id, spec.step_id, entry.key)
        reason = str(error) if prior is None else f"{prior.describe(spec)}; {error}"
        raise FailRequested(
            reason, cause="ambiguous_effect", error=error, step_id=spec.step_id, effect_key=entry.key
        )

    def _finish_effect(
        self, spec: StepSpec, entry: JournalEntry, output: Any, evidence: str, text: str | None = None
    ) -> Any:
        """Record the effect's result and how it became known. It happened, so it is
        recorded even when its result does not fit the return annotation, before that
        fails the task."""
        with self._commits.lock:
            self._cursor.finish(entry, output, evidence)
            self._completed(spec, entry.call_id)
        self._commits.commit(entry.call_id)
        value = checked(spec, output, text, came_from(evidence))
        self._boundary.check_budget()
        return value

    def _execute(
        self,
        spec: StepSpec,
        call_id: str,
        key: str | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> str:
        """Run a body for real, in its span, account for it, and turn its failure into a
        retry or a terminal failure according to its retry policy; its result's text."""
        with self._commits.lock:
            failures = self._commits.checkpoint.step_failures.get(call_id, 0)
            last = self._commits.checkpoint.heartbeats.get(call_id)
        lease = self._claim.lease
        context = StepContext(lease.task_id, call_id, failures + 1, lease.fencing_token, key)
        context.last_heartbeat = last
        context.runtime = BodyRuntime(self._boundary, transactional=False)
        spans = self._claim.spans
        if spans is NO_SPANS:  # tracing off: no span to enter and leave
            return self._attempt(spec, context, args, kwargs)
        with spans.call(spec, context):
            return self._attempt(spec, context, args, kwargs)

    def _attempt(
        self, spec: StepSpec, context: StepContext, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> str:
        checkpoint = self._commits.checkpoint
        call_id, key = context.call_id, context.idempotency_key
        started = time.monotonic()
        if crashpoints.ARMED:
            crashpoints.reached(f"before_{spec.kind}", call_id)
        error: Exception | None = None
        late = False
        if spec.timeout is None:
            try:
                value = spec.fn(context, *args, **kwargs)
            except Exception as exc:
                error = exc
        else:
            value, error, late = self._timeouts.run(spec, context, args, kwargs)
        if context.refused is not None:  # a refused charge fails the attempt, caught or not
            error = context.refused
        if error is not None and spec.kind is _STEP and self._boundary.stop_requested():
            self._stopped(spec, context, started)  # told to stop: not a failed attempt
        # A step that ended past its deadline timed out, whatever it returned. An effect's
        # late result is kept: the outside world changed, and now it is known how.
        timed_out = late and spec.kind is _STEP
        if error is not None or timed_out:
            self._failed(spec, key, context, started, error, timed_out)
        if crashpoints.ARMED:
            crashpoints.reached(f"after_{spec.kind}", call_id)
        self._claim.check_lease()
        text = encode_output(spec, call_id, value)
        with self._commits.lock:
            self._boundary.account(steps=1, cost=context.cost, started=started)
            checkpoint.step_failures.pop(call_id, None)
            checkpoint.heartbeats.pop(call_id, None)
            if spec.timeout is not None:
                self._timeouts.unmark(call_id)
        return text

    def _stopped(self, spec: StepSpec, context: StepContext, started: float) -> None:
        """A step body that raised once its run was told to stop (``ctx.cancelled``):
        account for what it spent and stop as the boundary does (cancel, pause, or a
        stopped branch), its last heartbeat kept for the attempt that runs after a pause."""
        with self._commits.lock:
            self._boundary.account(steps=0, cost=context.cost, started=started)
            if spec.timeout is not None:
                self._timeouts.unmark(context.call_id)
        self._boundary.check_continue()

    def _failed(
        self,
        spec: StepSpec,
        key: str | None,
        context: StepContext,
        started: float,
        error: Exception | None,
        timed_out: bool = False,
    ) -> NoReturn:
        """Account for a failed attempt of a body and raise what it leads to: a retry, or
        the task's failure."""
        self._claim.check_lease()  # a lost lease outranks the failure: record nothing
        call_id, failures = context.call_id, context.attempt
        with self._commits.lock:
            self._boundary.account(steps=0, cost=context.cost, started=started)
            self._commits.checkpoint.step_failures[call_id] = failures
            self._timeouts.unmark(call_id)
        if timed_out:
            interrupt = self._timeouts.ended_late(spec, key, failures)
        elif context.refused is not None:
            interrupt = FailRequested(
                f"{spec.kind} {spec.step_id!r} was refused a charge: {context.refused}; not retried: "
                "every attempt would charge it again",
                cause="misuse",
                error=context.refused,
                step_id=spec.step_id,
                effect_key=key,
            )
        else:
            assert error is not None
            interrupt = self._after_failure(spec, key, error, failures)
        log.warning("%s", interrupt.reason, exc_info=error, extra=task_fields(self._claim.lease))
        if isinstance(interrupt, FailRequested) and interrupt.cause in _CATCHABLE:
            raise self._record_failure(spec, call_id, key, failures, interrupt) from error
        raise interrupt from error

    def _record_failure(
        self, spec: StepSpec, call_id: str, key: str | None, attempts: int, failure: FailRequested
    ) -> StepFailed:
        """Record the final failure of a body in the journal (in place of an effect's
        intent) and commit it, then hand the main function a StepFailed to catch. The
        commit comes first: a crash after it replays the same StepFailed rather than run
        the body past its attempts, one before it runs the last attempt again."""
        error = failure.error
        error_class = "Exception" if error is None else type(error).__name__
        message = "" if error is None else str(error)
        with self._commits.lock:
            journal, position = self._cursor.journal, self._cursor.position
            under = journal[position] if position < len(journal) else None  # an effect's intent
            output = {
                "step_id": spec.step_id,
                "attempts": attempts,
                "error_class": error_class,
                "message": storable(message),  # a message may hold what JSON columns refuse
                "reason": storable(failure.reason),
                "cause": failure.cause,
                "traceback": None if error is None else kept_traceback(error),
            }
            entry = JournalEntry(call_id, spec.kind, _FAILED, output, key=key)
            self._cursor.fail(under, entry)
            self._commits.checkpoint.step_failures.pop(call_id, None)
            self._commits.checkpoint.heartbeats.pop(call_id, None)
        self._commits.commit(f"{call_id}:failed")
        return replayed_failure(entry)

    def _transaction(
        self, spec: StepSpec, call_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run a ``@workflow.transaction()`` body on the store's connection and record it,
        committed in that one transaction: a body that raises rolls its writes back and
        fails as any step's body does. Its output, for the main function."""
        with self._commits.lock:
            failures = self._commits.checkpoint.step_failures.get(call_id, 0)
        lease = self._claim.lease
        context = StepContext(lease.task_id, call_id, failures + 1, lease.fencing_token, None)
        context.runtime = BodyRuntime(self._boundary, transactional=True)
        started = time.monotonic()
        outputs: list[Any] = []

        def run(connection: Any) -> None:
            context.connection = connection
            if crashpoints.ARMED:
                crashpoints.reached("before_step", call_id)
            try:
                with self._claim.spans.call(spec, context):
                    value = spec.fn(context, *args, **kwargs)
            except Exception as exc:
                raise _BodyFailed() from exc  # out of the transaction, which rolls back
            if context.refused is not None:  # a refused charge the body caught fails it all the same
                raise _BodyFailed() from context.refused
            if crashpoints.ARMED:
                crashpoints.reached("after_step", call_id)
            self._claim.check_lease()
            text = encode_output(spec, call_id, value)
            output = from_json(text)
            self._boundary.account(steps=1, cost=context.cost, started=started)
            self._commits.checkpoint.step_failures.pop(call_id, None)
            self._commits.checkpoint.heartbeats.pop(call_id, None)
            outputs.append(checked(spec, output, text))  # one that does not fit rolls it all back
            self._cursor.record(JournalEntry(call_id, _STEP, _DONE, output), text)
            self._completed(spec, call_id)

        try:
            self._commits.commit_transaction(call_id, run)
        except _BodyFailed as failed:
            assert isinstance(failed.__cause__, Exception)
            self._failed(spec, None, context, started, failed.__cause__)
        return outputs[0]

    def _after_failure(
        self, spec: StepSpec, key: str | None, exc: Exception, failures: int
    ) -> RetryRequested | FailRequested:
        """What the ``failures``-th failure of a body leads to under its retry policy: a
        retry with backoff, or the task's failure once attempts are used up or ``exc`` is
        of a class the policy does not retry."""
        retry = spec.retry
        description = f"{spec.kind} {spec.step_id!r} raised {type(exc).__name__}: {exc}"
        if isinstance(exc, retry.non_retryable):
            reason = (
                f"{description}; not retried: {type(exc).__name__} is non-retryable "
                "(RetryPolicy.non_retryable)"
            )
        elif failures < retry.max_attempts:
            return RetryRequested(
                retry.backoff_s(failures), f"{description} (attempt {failures} of {retry.max_attempts})"
            )
        else:
            reason = f"{description}; {gave_up_after(failures)}"
        return FailRequested(reason, cause="step_error", error=exc, step_id=spec.step_id, effect_key=key)

    def _completed(self, spec: StepSpec, call_id: str) -> None:
        """Note a completed call that has a compensation, in completion order across
        branches (caller holds the lock): the undo runs in exactly the reverse order.
        (A step's completion asks ``spec.step_id in self._undoable`` before calling.)"""
        if spec.step_id in self._undoable:
            self._commits.checkpoint.undo.append(call_id)
            arguments = self._arguments.pop(call_id, None)
            if arguments is not None:
                self._commits.checkpoint.compensation_args[call_id] = arguments

    def _keep_arguments(
        self, spec: StepSpec, call_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Hold a call's arguments in their JSON form, before its body runs, when its
        compensation takes them: recorded when it completes. Ones that are not JSON fail
        the task here, before anything ran, naming the step. (Its callers ask
        ``spec.step_id in self._undo_with_args`` before calling.)"""
        if spec.step_id not in self._undo_with_args:
            return
        try:
            text = to_json([list(args), kwargs], max_depth=MAX_NESTING_DEPTH)
        except NotJsonable as exc:
            error = OutputNotSerializable(f"{call_id} arguments", str(exc))
            raise FailRequested(
                f"the compensation of {spec.kind} {spec.step_id!r} takes its arguments, which must be "
                f"JSON values: {exc}",
                cause="not_serializable",
                error=error,
                step_id=spec.step_id,
            ) from exc
        self._arguments[call_id] = from_json(text)


class _BodyFailed(Exception):
    """Carries a transaction step's failure (its ``__cause__``) out of the store
    transaction, which rolls back on the way."""
