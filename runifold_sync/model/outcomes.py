"""What one claim-and-execute cycle (``WorkflowWorker.run_once``) ended with."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

import attrs

# Why a task failed, as a small fixed set: metrics label failures with it (the reason
# text names inputs and exceptions, far too many values for a label).
FailureCause = Literal[
    "step_error",  # a step or effect raised on its last allowed attempt
    "step_timeout",  # a step or effect overran its timeout on its last allowed attempt
    "workflow_error",  # the main function or a parallel branch raised
    "compensation_error",  # a compensation step raised
    "ambiguous_effect",  # an interrupted effect may or may not have happened
    "budget",  # a step, cost or branch reservation limit was exceeded
    "nondeterminism",  # replay no longer matches the journal
    "checkpoint",  # a checkpoint that cannot be read, written or continued (or a result over its size limit)
    "not_serializable",  # an output or result that cannot be stored as JSON
    "bad_input",  # the task's input does not fit the workflow's input type
    "bad_output",  # a step's or effect's new output does not fit its return annotation
    "crash_loop",  # claimed too often without progress (or a step with a timeout was
    # interrupted on its last allowed attempt): a step keeps killing its worker
    "misuse",  # a workflow API used where it is not allowed
    "other",  # not recorded: a failure's compensation resumed after a crash
]


@attrs.frozen
class RunOutcome:
    kind: ClassVar[str] = "outcome"


@attrs.frozen
class Idle(RunOutcome):
    """No task was ready to claim."""

    kind: ClassVar[str] = "idle"


@attrs.frozen
class Completed(RunOutcome):
    kind: ClassVar[str] = "completed"
    task_id: str
    result: Any


@attrs.frozen
class Retried(RunOutcome):
    """A step failed and the task was requeued with backoff at store time."""

    kind: ClassVar[str] = "retried"
    task_id: str
    reason: str
    retry_at: datetime


@attrs.frozen
class Suspended(RunOutcome):
    """The task waits durably (timer, signal) and its worker is free."""

    kind: ClassVar[str] = "suspended"
    task_id: str
    reason: str
    wake_at: datetime | None


@attrs.frozen
class ContinuedAsNew(RunOutcome):
    """The main function called ``ctx.continue_as_new``: the task is queued again as run
    number ``run``, with a new input and an empty journal."""

    kind: ClassVar[str] = "continued_as_new"
    task_id: str
    run: int


@attrs.frozen
class Yielded(RunOutcome):
    """The per-claim step limit was reached; progress is committed and the task requeued."""

    kind: ClassVar[str] = "yielded"
    task_id: str


@attrs.frozen
class FailureDetail:
    """What failed, as fields a caller or an operator tool can match without parsing the
    reason; also written into the ``failed`` history event."""

    # The class name of the error: a RunifoldError naming the condition (NonDeterminism,
    # AmbiguousEffect, OutputNotSerializable, CheckpointError...) or the exception a step,
    # effect, compensation or main function raised; None when a limit was reached (a
    # budget, a crash loop, a misuse) and nothing raised.
    error_class: str | None
    message: str  # the error's own message (the reason when nothing raised)
    task_id: str
    step_id: str | None = None  # the step, effect or compensated step it failed in
    effect_key: str | None = None  # the idempotency key of the effect it failed in
    # Where the error was raised: its traceback, the newest 4 KiB of it
    # (``tracebacks.kept_traceback``); None for an error the engine built without raising
    # it, or when nothing raised. Diagnostics, not identity: it names files and line
    # numbers that differ between deployments, so failures compare equal without it, and
    # it is left out of the one-line repr (the logs and ``show`` print it whole).
    traceback: str | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class Failed(RunOutcome):
    """Terminal failure. ``recoverable`` tasks (ambiguous effects) wait for resolve_effect;
    ``cause`` classifies ``reason``, and ``error`` says what failed where."""

    kind: ClassVar[str] = "failed"
    task_id: str
    reason: str
    recoverable: bool = False
    cause: FailureCause = "other"
    error: FailureDetail | None = None


@attrs.frozen
class Cancelled(RunOutcome):
    """``store.cancel()`` stopped the task at a step boundary (or before it resumed) and
    its declared compensations ran; other completed external writes were not undone."""

    kind: ClassVar[str] = "cancelled"
    task_id: str
    reason: str


@attrs.frozen
class DefinitionUnavailable(RunOutcome):
    """This worker lacks the exact definition version; the task went back to the queue."""

    kind: ClassVar[str] = "definition_unavailable"
    task_id: str
    name: str
    version: int


@attrs.frozen
class LeaseLost(RunOutcome):
    """Another worker owns the task now; nothing more was written for it. ``operation``
    is the write or check that found the lease gone (``LeaseLostError.operation``), None
    for a task claimed ahead whose lease ran out before it started."""

    kind: ClassVar[str] = "lease_lost"
    task_id: str
    fencing_token: int
    operation: str | None = None
