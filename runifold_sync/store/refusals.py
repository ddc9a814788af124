"""Why the store refuses a write, decided once for every backend: the enqueue identity
check, a fenced transition that changed no row, a signal a task may not take, and the
operator actions a task's state does not allow."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from ..errors import (
    CancelPending,
    EnqueueConflict,
    InvalidState,
    LeaseLostError,
    RunifoldError,
    SignalNotAccepted,
    SignalRefused,
    TaskNotFound,
)
from ..model.codec import to_json
from ..model.values import WorkflowTask
from .dialect import Row
from .records import EnqueueResult, Lease, TaskRecord
from .signal_checks import Verdict

# Transitions that would end a run's cycle without honouring a cancel request: while one
# is pending the store refuses them (query ``pending_cancel`` tells why no row changed).
REFUSED_WHILE_CANCEL_PENDING = frozenset({"complete", "suspend", "retry", "continue_as_new"})

# The signals refused where they were sent that a task's history records, each with who
# sent it and why it was refused; past these a refusal is only counted
# (``TaskRecord.refused_signals``), so a flood of refused signals (the pending cap holds
# the kept ones) cannot grow the history, and the pages that show it, without bound.
RECORDED_SIGNAL_REFUSALS = 20


def already_enqueued(task: WorkflowTask, stored: Row) -> EnqueueResult:
    """The result of enqueueing ``task`` whose id is taken by the ``stored`` row: the same
    task, not created again, or :class:`EnqueueConflict`. Input is compared as canonical
    JSON text, so ``1`` and ``1.0`` differ on every backend."""
    differences = [
        label
        for label, column, given in (
            ("definition name", "definition_name", task.definition_name),
            ("definition version", "definition_version", task.definition_version),
            ("tenant", "tenant", task.tenant),
            ("input", "input", task.input_json),
            ("parent", "parent_id", task.parent_id),
            ("queue", "queue", task.queue),
            ("concurrency key", "concurrency_key", task.concurrency_key),
        )
        if stored[column] != given
    ]
    if differences:
        raise EnqueueConflict(task.task_id, differences)
    return EnqueueResult(task.task_id, created=False)


def refuse_transition(
    one: Callable[[str, Mapping[str, Any]], Row | None],
    name: str,
    lease: Lease,
    operation: str,
    params: Mapping[str, Any],
) -> NoReturn:
    """Raise :func:`transition_refusal`'s answer."""
    raise transition_refusal(one, name, lease, operation, params)


def transition_refusal(
    one: Callable[[str, Mapping[str, Any]], Row | None],
    name: str,
    lease: Lease,
    operation: str,
    params: Mapping[str, Any],
) -> CancelPending | LeaseLostError:
    """Why fenced transition ``name`` changed no row: a pending cancel request when the
    lease still holds (``one`` runs query ``pending_cancel`` where the caller runs its
    statements), otherwise a lost lease."""
    pending = one("pending_cancel", params) if name in REFUSED_WHILE_CANCEL_PENDING else None
    if pending is not None:
        return CancelPending(lease.task_id, pending["cancel_requested"], operation)
    return LeaseLostError(lease.task_id, lease.fencing_token, operation)


def same_signal(stored: Row, name: str, payload_text: str) -> bool:
    """Whether a stored delivery has this name and payload. The stored text is encoded
    again, so text kept before payloads were canonical compares by value too."""
    if stored["name"] != name:
        return False
    return bool(stored["payload"] == payload_text or to_json(json.loads(stored["payload"])) == payload_text)


def tenant_refusal(task: Row, tenant: str) -> str | None:
    """Checked before anything else about a delivery, so a sender of another tenant
    learns nothing about the task's signals (not even whether a signal id is taken). The
    text is for the task's history, which operators read; the sender gets
    :func:`refused_signal`'s answer."""
    if task["tenant"] != tenant:
        return f"sender's tenant {tenant!r} is not the task's tenant {task['tenant']!r}"
    return None


def signal_refusal(task: Row, pending: int, cap: int, verdict: Verdict) -> str | None:
    """Why a task may not take a new signal, or None. Checked before a delivery is kept:
    the task's state first, then what :mod:`.signal_checks` judged, then the cap."""
    if task["state"] in ("terminal", "cancelled"):
        return f"the task is {task['state']}"
    if task["cancel_requested"] is not None:  # no wait of it will run again to take it
        return "the task is being cancelled"
    if verdict.refusal is not None:
        return verdict.refusal
    if pending >= cap:
        return f"the task already has {pending} pending signals (limit {cap})"
    return None


def refused_signal(
    task_id: str, signal_id: str, refusal: str, *, foreign: bool, verdict: Verdict | None
) -> RunifoldError:
    """What a refused delivery raises, after its refusal is recorded. A sender of another
    tenant (``foreign``) gets exactly the answer for a task that does not exist, so it
    cannot even learn that the task exists; everyone else is told why, as
    :class:`SignalNotAccepted` (naming the wrong field) when the signal itself is wrong."""
    if foreign:
        return TaskNotFound(task_id)
    if verdict is not None and verdict.field is not None and verdict.refusal == refusal:
        return SignalNotAccepted(task_id, signal_id, refusal, verdict.field)
    return SignalRefused(task_id, signal_id, refusal)


def not_cancellable(record: TaskRecord) -> InvalidState:
    return InvalidState(
        f"task {record.task_id!r} is {record.state.value}; only an unfinished task can be cancelled"
    )


def not_pausable(record: TaskRecord) -> InvalidState:
    if record.paused is not None:
        return InvalidState(f"task {record.task_id!r} is already paused ({record.paused})")
    return InvalidState(
        f"task {record.task_id!r} is {record.state.value}; only an unfinished task can be paused"
    )


def not_resumable(record: TaskRecord) -> InvalidState:
    return InvalidState(f"task {record.task_id!r} is not paused (it is {record.state.value})")


def not_requeueable(record: TaskRecord) -> InvalidState:
    what = record.state.value if record.outcome is None else f"{record.state.value} ({record.outcome.value})"
    hint = "; resolve its ambiguous effect instead" if record.ambiguous_effect else ""
    return InvalidState(f"task {record.task_id!r} is {what}; only a failed task can be requeued{hint}")


def not_resolvable(record: TaskRecord, effect_key: str) -> InvalidState:
    return InvalidState(
        f"task {record.task_id!r} is {record.state.value} "
        f"(ambiguous effect: {record.ambiguous_effect!r}); only a task failed on "
        f"ambiguous effect {effect_key!r} can have it resolved"
    )
