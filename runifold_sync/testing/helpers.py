"""What a test does to a task between two ``run_until_idle`` calls, and reads after them.

Each is a thin call of the store's own API, so a test exercises what production code
does: a signal or approval goes through ``store.send_signal`` with all its checks (a
misspelt name or a sender who is no approver is refused here exactly as in
production), and the journal is read as a claim loads it. What a test should not have to
write each time is filled in: a fresh signal id, the task's own tenant, the approval's
payload shape.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..errors import InvalidState
from ..model import validate
from ..model.checkpoint import JournalEntry
from ..model.values import TaskOutcome, TaskState
from ..store.base import WorkflowStore
from ..store.checkpoints import read_checkpoint
from ..store.records import SignalDelivery


def send_signal(
    store: WorkflowStore,
    task_id: str,
    name: str,
    payload: Any,
    *,
    sender: str = "test",
    reason: str | None = None,
) -> SignalDelivery:
    """Send signal ``name`` with ``payload`` (a JSON value) to ``task_id`` under a new
    signal id, in the task's own tenant; it wakes the task if it waits for ``name``, and
    the next ``run_until_idle`` takes it. Refusals are the store's
    (``SignalNotAccepted``, ``SignalRefused``, ``TaskNotFound``)."""
    tenant = store.get_task(task_id).tenant
    signal_id = f"test-{uuid.uuid4().hex}"
    return store.send_signal(
        task_id, name, payload, signal_id=signal_id, sender=sender, tenant=tenant, reason=reason
    )


def approve(
    store: WorkflowStore,
    task_id: str,
    name: str,
    *,
    approver: str,
    approved: bool = True,
    reason: str | None = None,
) -> SignalDelivery:
    """Decide the approval ``name`` of ``task_id`` as ``approver``: approve it, or reject
    it with ``approved=False``. The store refuses an approver the waiting approval does
    not list, as it would in production."""
    validate.flag("approved", approved)
    payload = {"approved": approved, "reason": reason}
    return send_signal(store, task_id, name, payload, sender=approver, reason=reason)


def journal(store: WorkflowStore, task_id: str) -> list[JournalEntry]:
    """The main function's journal of ``task_id`` (its current run's), oldest entry
    first: each step, effect, wait and child as recorded, ``call_id`` naming the call
    and its occurrence (``pay#1``).
    Empty before the first commit. Parallel branches keep their own journals:
    ``checkpoint.read_checkpoint(store, task_id).branch_journals``."""
    checkpoint = read_checkpoint(store, task_id)
    return [] if checkpoint is None else list(checkpoint.journal)


def result(store: WorkflowStore, task_id: str) -> Any:
    """The result of ``task_id``, which must have completed; a task that has not (still
    unfinished, failed, cancelled) is :class:`InvalidState` naming where it stands and
    why, which is the line a failing test should print."""
    record = store.get_task(task_id)
    if record.outcome is TaskOutcome.COMPLETED:
        return record.result
    if record.state is TaskState.TERMINAL:
        where = f"failed: {record.reason}"
    else:
        note = record.reason or record.status_note
        where = record.state.value + ("" if note is None else f" ({note})")
    raise InvalidState(f"task {task_id!r} has not completed: it is {where}")
