"""One root exception and the conditions a caller can act on.

Errors carry structured fields (task id, effect id, key) so an operator tool can act on
them without parsing the message. Invalid arguments are also ``ValueError`` so that
generic input handling keeps working.
"""

from __future__ import annotations

import shlex
from datetime import timedelta

import attrs

# An error with structured fields: attrs writes the constructor, repr and pickling (the
# fields are the exception's ``args``); each class writes only its message, as __str__.
_detailed = attrs.define(auto_exc=True, slots=False)


class RunifoldError(Exception):
    """Root of every error raised by runifold_sync."""


class InvalidArgument(RunifoldError, ValueError):
    """An argument was rejected at the call that received it."""


class AppNotLoaded(InvalidArgument):
    """The application's registry could not be had from its ``module:attribute``
    reference: the module is not on the import path, raised while it was imported (the
    original exception is this one's ``__cause__``), lacks the attribute, or the
    attribute is no registry. The message is one line naming the module and, for an
    exception on import, the file and line it was raised at."""


class DefinitionConflict(InvalidArgument):
    """The same name and version was registered with a different step graph."""


@_detailed
class UnknownDefinition(InvalidArgument):
    """A task was asked of a registry for a name or version it does not hold: nothing
    would ever run it. ``registered`` maps each name the registry holds to its versions."""

    name: str
    version: int
    registered: dict[str, list[int]]
    hint: str

    def __str__(self) -> str:
        return self.hint


@_detailed
class InputMismatch(InvalidArgument):
    """A workflow input does not fit its main function's annotation. ``problems`` has one
    line per wrong field, ``path: reason`` (``input.lines[0].qty: required field
    missing``), so the caller can fix every field at once."""

    what: str
    type_name: str
    problems: tuple[str, ...] = attrs.field(converter=tuple)

    def __str__(self) -> str:
        return f"{self.what} does not fit {self.type_name}: {'; '.join(self.problems)}"


@_detailed
class EnqueueConflict(RunifoldError):
    """A task with this checkpoint identity exists with different content."""

    task_id: str
    differences: list[str]

    def __str__(self) -> str:
        return (
            f"task {self.task_id!r} already exists with a different {', '.join(self.differences)}; "
            "enqueue is idempotent only for identical tasks"
        )


@_detailed
class SignalConflict(RunifoldError, ValueError):
    task_id: str
    signal_id: str

    def __str__(self) -> str:
        return (
            f"signal {self.signal_id!r} was already delivered to task {self.task_id!r} with a "
            "different name or payload; a signal id names one delivery"
        )


@_detailed
class SignalRefused(RunifoldError):
    task_id: str
    signal_id: str
    why: str

    def __str__(self) -> str:
        return f"signal {self.signal_id!r} to task {self.task_id!r} refused: {self.why}"


@_detailed
class SignalNotAccepted(SignalRefused, InvalidArgument):
    """The task's definition would never accept this signal: a name it does not declare,
    a sender who is not an approver of the approval it waits for, or a payload that is
    not a decision. ``field`` names what is wrong (``name``, ``sender`` or ``payload``).
    Refused where it is sent, and recorded in the task's history, instead of being kept
    until a wait refuses it."""

    field: str


@_detailed
class TaskNotFound(RunifoldError, LookupError):
    task_id: str

    def __str__(self) -> str:
        return f"no task with id {self.task_id!r}"


@_detailed
class UpdateRejected(RunifoldError):
    """``store.update``'s update was rejected by the workflow before it was recorded: its
    validator (``@workflow.validator(name)``) raised, or the payload did not fit the
    wait's type, or the sender policy refused it. ``reason`` says which; the journal
    holds no trace of it (the task's history does)."""

    task_id: str
    name: str
    update_id: str
    reason: str

    def __str__(self) -> str:
        return f"update {self.name!r} ({self.update_id}) of task {self.task_id!r} was rejected: {self.reason}"


@_detailed
class UpdateNotAnswered(RunifoldError):
    """The task of ``store.update``'s update finished without answering it (it never
    waited for it, or accepted it and did not ``ctx.reply``)."""

    task_id: str
    name: str
    update_id: str

    def __str__(self) -> str:
        return f"task {self.task_id!r} finished without answering update {self.name!r} ({self.update_id})"


@_detailed
class WaitTimedOut(RunifoldError, TimeoutError):
    """``store.wait_for_task`` or ``store.get_event`` waited ``timeout`` and the task did
    not finish (``key`` None) or did not publish event ``key``. A ``TimeoutError`` too, so
    code that already handles timeouts handles this one."""

    task_id: str
    timeout: timedelta
    key: str | None = None

    def __str__(self) -> str:
        waited = f"within {self.timeout.total_seconds():g} s"
        if self.key is None:
            return f"task {self.task_id!r} did not finish {waited}"
        return f"task {self.task_id!r} did not publish event {self.key!r} {waited}"


@_detailed
class EventNotFound(RunifoldError, KeyError):
    """Task ``task_id`` has not published event ``key`` (``ctx.set_event``). A ``KeyError``
    too, as a missing mapping key is; its message is written here because ``KeyError``
    would print only the quoted first argument."""

    task_id: str
    key: str

    def __str__(self) -> str:
        return f"task {self.task_id!r} has published no event {self.key!r}"


@_detailed
class ScheduleExists(RunifoldError):
    """``store.create_schedule`` was given a name already stored: declared by a registry,
    or created before. Delete the created one first (``store.delete_schedule``) to
    replace it."""

    name: str

    def __str__(self) -> str:
        return f"a schedule named {self.name!r} is already stored; delete it first to replace it"


@_detailed
class ScheduleNotFound(RunifoldError, LookupError):
    """No schedule of this name is stored: none was ever declared by a worker whose
    registry adds it (``registry.add_schedule``), which stores it when it starts."""

    name: str

    def __str__(self) -> str:
        return (
            f"no schedule named {self.name!r} is stored; a worker whose registry adds it "
            "(registry.add_schedule) stores it when it starts"
        )


@_detailed
class LeaseLostError(RunifoldError):
    """A fenced write changed no row: another worker owns the task or the lease expired."""

    task_id: str
    fencing_token: int
    operation: str

    def __str__(self) -> str:
        return (
            f"lease on task {self.task_id!r} with fencing token {self.fencing_token} is no "
            f"longer held; {self.operation} was refused"
        )


@_detailed
class CancelPending(RunifoldError):
    """A worker tried to complete, suspend or retry a task whose cancel was requested:
    the cancel wins, so the worker compensates and ends the task cancelled instead."""

    task_id: str
    request: str
    operation: str

    def __str__(self) -> str:
        return f"task {self.task_id!r} has a pending cancel ({self.request}); {self.operation} was refused"


class StoreUnavailable(RunifoldError):
    """The store could not be reached or answered with a driver error."""


class StoreNotWritable(StoreUnavailable):
    """The store's database refuses this process's writes: file or directory permissions,
    a read-only filesystem, a read-only (standby) server, missing privileges. An operator
    must act, so workers retry only a few times and then stop with this reason."""


class StoreMisconfigured(StoreNotWritable):
    """The store is reached in a way its URL does not say: a transaction-pooling PgBouncer
    without ``pgbouncer=true``, which runs the next transaction on another server
    connection, where the statements this connection prepared do not exist. Waiting does
    not cure it; the URL must change, so workers treat it as a store that refuses writes."""


class StoreClosed(StoreUnavailable):
    """The store was closed by its owner: unlike an unreachable one, it will not return."""


class StoreUsedAcrossFork(RunifoldError, RuntimeError):
    """A store opened in one process was used in a process forked from it. A programming
    error, not an outage: retrying would fail the same way, so it is not StoreUnavailable
    (which workers and the supervisor survive and retry)."""


class ForkUnsafe(RunifoldError, RuntimeError):
    """A pool was asked to fork from a process holding what must not cross a fork: a
    store still open here (its connections, its pool and listener threads) or a worker's
    threads. Every child would inherit them; a lock one of them held would hang it. Also
    a worker built in one process and used in a process forked from it."""


class MetricsUnavailable(RunifoldError):
    """The metrics endpoint could not be set up."""


class SchemaTooNew(RunifoldError):
    """The database was migrated by a newer runifold_sync than this one."""


class InvalidState(RunifoldError):
    """An operator action does not apply to the task in its current state."""


class CheckpointError(RunifoldError):
    """A checkpoint cannot be used to continue the task; the task fails closed."""


@_detailed
class CheckpointTooLarge(CheckpointError):
    """One journal entry (or the checkpoint's head) is over ``max_entry_bytes``: the
    limit is per entry, so a workflow's length is bounded by disk alone."""

    task_id: str
    part: str
    size_bytes: int
    limit_bytes: int

    def __str__(self) -> str:
        return (
            f"{self.part} of task {self.task_id!r} is {self.size_bytes} bytes, over the limit of "
            f"{self.limit_bytes} bytes (max_entry_bytes); keep large artifacts outside and store their ids"
        )


@_detailed
class NonDeterminism(CheckpointError):
    task_id: str
    position: int
    recorded: str
    requested: str

    def __str__(self) -> str:
        return (
            f"task {self.task_id!r} replay diverged at call {self.position}: the checkpoint "
            f"recorded {self.recorded!r} but the workflow asked for {self.requested!r}"
        )


@_detailed
class FingerprintMismatch(CheckpointError):
    task_id: str
    recorded: str
    registered: str

    def __str__(self) -> str:
        return (
            f"task {self.task_id!r} was checkpointed by a definition with fingerprint "
            f"{self.recorded} but the registered one has {self.registered}; register the "
            "original steps under this version or give the changed workflow a new version"
        )


@_detailed
class ChildFailed(RunifoldError):
    """A child task the workflow waited for (``ctx.wait_child``) failed or was
    cancelled; the parent may catch it. ``outcome`` is ``failed`` or ``cancelled``."""

    child_id: str
    outcome: str
    reason: str | None

    def __str__(self) -> str:
        return f"child task {self.child_id!r} {self.outcome}: {self.reason or 'no reason recorded'}"


@_detailed
class TaskFailed(RunifoldError):
    """A task whose result was asked for (``TaskHandle.result``) failed or was cancelled:
    ``outcome`` is ``failed`` or ``cancelled``, ``reason`` what the store recorded."""

    task_id: str
    outcome: str
    reason: str | None

    def __str__(self) -> str:
        return f"task {self.task_id!r} {self.outcome}: {self.reason or 'no reason recorded'}"


@_detailed
class StepFailed(RunifoldError):
    """A step or effect failed for good (its retries used up, a non-retryable error, or
    its timeout on the last attempt), raised at its call in the main function, which may
    catch it: a fallback step, a compensation path. Uncaught, the task fails as it would
    have without the catch (``reason``, with the step's error class and message).

    Recorded in the journal before it is raised, so a replay raises it again with the
    same fields; only the first raise has the original exception as ``__cause__``."""

    step_id: str
    call_id: str
    attempts: int
    error_class: str
    message: str
    reason: str  # the task's failure reason when nothing catches it
    cause: str = "step_error"  # or "step_timeout"
    effect_key: str | None = None
    traceback: str | None = None  # the step's error's, as the task's failure keeps it

    def __str__(self) -> str:
        return self.reason


def gave_up_after(attempts: int) -> str:
    """How a failure reason ends when a step's retries are used up: ``gave up after
    1 attempt`` or ``... 3 attempts`` (``RetryPolicy(max_attempts=1)`` is common)."""
    return f"gave up after {attempts} attempt{'' if attempts == 1 else 's'}"


@_detailed
class AmbiguousEffect(RunifoldError):
    """A non-idempotent effect may or may not have happened; nothing is guessed."""

    task_id: str
    effect_id: str
    key: str

    def __str__(self) -> str:
        # Both ways to resolve it are named, the command with this task's arguments, so
        # the operator who reads the reason (``show``, the dashboard) can act on it.
        command = f"python -m runifold_sync resolve {shlex.quote(self.task_id)} {shlex.quote(self.key)}"
        return (
            f"ambiguous effect: {self.effect_id!r} of task {self.task_id!r} (idempotency key "
            f"{self.key}) was interrupted and its outcome is unknown; resolve it with resolve_effect "
            f"or on the command line: {command} (--applied [--result JSON] | --not-applied) "
            "--actor WHO --reason WHY"
        )


@_detailed
class StepTimedOut(RunifoldError, TimeoutError):
    """A step or effect overran its ``timeout`` on its last allowed attempt (the
    ``error_class`` of the failure; the engine names it, nothing raises it in user code)."""

    task_id: str
    kind: str  # "step" or "effect"
    step_id: str
    timeout: str  # as reasons write it: "1s"
    attempts: int

    def __str__(self) -> str:
        return (
            f"{self.kind} {self.step_id!r} of task {self.task_id!r} timed out after {self.timeout}; "
            f"{gave_up_after(self.attempts)}"
        )


@_detailed
class OutputNotSerializable(RunifoldError, TypeError):
    call_id: str
    detail: str

    def __str__(self) -> str:
        return f"output of {self.call_id!r} cannot be stored as JSON: {self.detail}"


@_detailed
class OutputMismatch(RunifoldError, TypeError):
    """A step's or effect's new output does not fit its return annotation (the
    ``error_class`` of the failure; the engine names it, nothing raises it in user
    code). ``problems`` has one line per wrong field, ``path: reason``. Checked as
    strictly as a task's input, and never retried: the same body returns the same."""

    kind: str  # "step" or "effect"
    step_id: str
    came: str  # where the value came from: "returned", "was reconciled as applied with the result"...
    value: str  # bounded, as messages show values
    type_name: str
    problems: tuple[str, ...] = attrs.field(converter=tuple)

    def __str__(self) -> str:
        return (
            f"{self.kind} {self.step_id!r} {self.came} {self.value}, which does not fit its return "
            f"annotation {self.type_name}: {'; '.join(self.problems)}; not retried: a programming error"
        )


class WorkerIdInUse(InvalidArgument):
    """A worker id a new pool would use is live in another process or on another host."""
