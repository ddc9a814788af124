"""One root exception and the conditions a caller can act on.

Errors carry structured fields (task id, effect id, key) so an operator tool can act on
them without parsing the message. Invalid arguments are also ``ValueError`` so that
generic input handling keeps working.
"""

from __future__ import annotations


class RunifoldError(Exception):
    """Root of every error raised by runifold_sync."""


class InvalidArgument(RunifoldError, ValueError):
    """An argument was rejected at the call that received it."""


class DefinitionConflict(InvalidArgument):
    """The same name and version was registered with a different step graph."""


class UnknownDefinition(InvalidArgument):
    """A task was asked of a registry for a name or version it does not hold: nothing
    would ever run it. ``registered`` maps each name the registry holds to its versions."""

    def __init__(self, name: str, version: int, registered: dict[str, list[int]], hint: str) -> None:
        self.name = name
        self.version = version
        self.registered = registered
        super().__init__(hint)


class InputMismatch(InvalidArgument):
    """A workflow input does not fit its main function's annotation. ``problems`` has one
    line per wrong field, ``path: reason`` (``input.lines[0].qty: required field
    missing``), so the caller can fix every field at once."""

    def __init__(self, what: str, type_name: str, problems: list[str]) -> None:
        self.type_name = type_name
        self.problems = tuple(problems)
        super().__init__(f"{what} does not fit {type_name}: {'; '.join(problems)}")


class EnqueueConflict(RunifoldError):
    """A task with this checkpoint identity exists with different content."""

    def __init__(self, task_id: str, differences: list[str]) -> None:
        self.task_id = task_id
        self.differences = differences
        super().__init__(
            f"task {task_id!r} already exists with a different {', '.join(differences)}; "
            "enqueue is idempotent only for identical tasks"
        )


class SignalConflict(RunifoldError, ValueError):
    def __init__(self, task_id: str, signal_id: str) -> None:
        self.task_id = task_id
        self.signal_id = signal_id
        super().__init__(
            f"signal {signal_id!r} was already delivered to task {task_id!r} with a different "
            "name or payload; a signal id names one delivery"
        )


class SignalRefused(RunifoldError):
    def __init__(self, task_id: str, signal_id: str, why: str) -> None:
        self.task_id = task_id
        self.signal_id = signal_id
        self.why = why
        super().__init__(f"signal {signal_id!r} to task {task_id!r} refused: {why}")


class SignalNotAccepted(SignalRefused, InvalidArgument):
    """The task's definition would never accept this signal: a name it does not declare,
    a sender who is not an approver of the approval it waits for, or a payload that is
    not a decision. ``field`` names what is wrong (``name``, ``sender`` or ``payload``).
    Refused where it is sent, and recorded in the task's history, instead of being kept
    until a wait refuses it."""

    def __init__(self, task_id: str, signal_id: str, why: str, field: str) -> None:
        self.field = field
        super().__init__(task_id, signal_id, why)


class TaskNotFound(RunifoldError, LookupError):
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"no task with id {task_id!r}")


class LeaseLostError(RunifoldError):
    """A fenced write changed no row: another worker owns the task or the lease expired."""

    def __init__(self, task_id: str, fencing_token: int, operation: str) -> None:
        self.task_id = task_id
        self.fencing_token = fencing_token
        self.operation = operation
        super().__init__(
            f"lease on task {task_id!r} with fencing token {fencing_token} is no longer "
            f"held; {operation} was refused"
        )


class CancelPending(RunifoldError):
    """A worker tried to complete, suspend or retry a task whose cancel was requested:
    the cancel wins, so the worker compensates and ends the task cancelled instead."""

    def __init__(self, task_id: str, request: str, operation: str) -> None:
        self.task_id = task_id
        self.request = request
        self.operation = operation
        super().__init__(f"task {task_id!r} has a pending cancel ({request}); {operation} was refused")


class StoreUnavailable(RunifoldError):
    """The store could not be reached or answered with a driver error."""


class StoreNotWritable(StoreUnavailable):
    """The store's database refuses this process's writes: file or directory permissions,
    a read-only filesystem, a read-only (standby) server, missing privileges. An operator
    must act, so workers retry only a few times and then stop with this reason."""


class StoreClosed(StoreUnavailable):
    """The store was closed by its owner: unlike an unreachable one, it will not return."""


class StoreUsedAcrossFork(RunifoldError, RuntimeError):
    """A store opened in one process was used in a process forked from it. A programming
    error, not an outage: retrying would fail the same way, so it is not StoreUnavailable
    (which workers and the supervisor survive and retry)."""


class SchemaTooNew(RunifoldError):
    """The database was migrated by a newer runifold_sync than this one."""


class InvalidState(RunifoldError):
    """An operator action does not apply to the task in its current state."""


class CheckpointError(RunifoldError):
    """A checkpoint cannot be used to continue the task; the task fails closed."""


class CheckpointTooLarge(CheckpointError):
    """One journal entry (or the checkpoint's head) is over ``max_entry_bytes``: the
    limit is per entry, so a workflow's length is bounded by disk alone."""

    def __init__(self, task_id: str, part: str, size_bytes: int, limit_bytes: int) -> None:
        self.task_id = task_id
        self.part = part
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes
        super().__init__(
            f"{part} of task {task_id!r} is {size_bytes} bytes, over the limit of "
            f"{limit_bytes} bytes (max_entry_bytes); keep large artifacts outside and store their ids"
        )


class NonDeterminism(CheckpointError):
    def __init__(self, task_id: str, position: int, recorded: str, requested: str) -> None:
        self.task_id = task_id
        self.position = position
        self.recorded = recorded
        self.requested = requested
        super().__init__(
            f"task {task_id!r} replay diverged at call {position}: the checkpoint recorded "
            f"{recorded!r} but the workflow asked for {requested!r}"
        )


class FingerprintMismatch(CheckpointError):
    def __init__(self, task_id: str, recorded: str, registered: str) -> None:
        self.task_id = task_id
        self.recorded = recorded
        self.registered = registered
        super().__init__(
            f"task {task_id!r} was checkpointed by a definition with fingerprint "
            f"{recorded} but the registered one has {registered}; register the original "
            "steps under this version or give the changed workflow a new version"
        )


class AmbiguousEffect(RunifoldError):
    """A non-idempotent effect may or may not have happened; nothing is guessed."""

    def __init__(self, task_id: str, effect_id: str, key: str) -> None:
        self.task_id = task_id
        self.effect_id = effect_id
        self.key = key
        super().__init__(
            f"ambiguous effect: {effect_id!r} of task {task_id!r} (idempotency key {key}) "
            "was interrupted and its outcome is unknown; resolve it with resolve_effect"
        )


class OutputNotSerializable(RunifoldError, TypeError):
    def __init__(self, call_id: str, detail: str) -> None:
        self.call_id = call_id
        super().__init__(f"output of {call_id!r} cannot be stored as JSON: {detail}")


class WorkerIdInUse(InvalidArgument):
    """A worker id a new pool would use is live in another process or on another host."""
