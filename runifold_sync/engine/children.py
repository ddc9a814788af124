"""Child workflows: a task that starts other tasks and waits for how they end.

Starting a child is a journal entry (``EntryKind.CHILD``) holding the child's task id, so
a replay gets the same handle back and enqueues nothing. The id is the one the caller
gives, or one derived from the parent's id and the call's id, so the enqueue itself is
idempotent: after a crash between the enqueue and the parent's commit, the replay's
enqueue finds the task it made and the same handle comes back, and no second child runs.
The enqueue does not wait for the disk (``store.enqueue_child``): the parent's commit
that records the handle does, and makes the enqueue durable with it.

Waiting (``EntryKind.CHILDREN``) is durable, like a signal wait: the parent suspends on
the first child that has not ended and its worker is freed; that child's end (completed,
failed or cancelled) wakes the parent in the same transaction (store query
``wake_parent``), and the replay reads the children again. The outcomes are recorded in
the parent's journal when all have ended, so later replays return them without asking
the store.

A child is a task like any other: its own definition, budget (the parent's usage is not
charged for it), retries and tenant admission; it inherits the parent's tenant unless
told otherwise. Cancelling the parent cancels its unfinished children
(``store.cancel``), except those started ``detached``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import attrs

from ..errors import ChildFailed, EnqueueConflict, InvalidArgument
from ..model import validate
from ..model.checkpoint import EntryKind, EntryStatus, JournalEntry
from ..model.codec import structure
from ..model.values import TaskOutcome, TaskState, WorkflowTask
from ..store.records import TaskRecord
from ..workflow.waiting import ChildHandle, ChildTimedOut
from .boundary import Boundary
from .interrupts import FailRequested, SuspendRequested
from .replay import Cursor, finished
from .waits import OpenWait, open_wait

_MAX_DERIVED_ID = 200  # validate.name's bound on a checkpoint id


class Children:
    """The child tasks of one journal: starting them, and waiting for them (the main
    function only: waits belong there, as for timers and signals)."""

    def __init__(self, cursor: Cursor, boundary: Boundary) -> None:
        self._cursor = cursor
        self._boundary = boundary
        self._store = boundary.commits.store
        self._spans = boundary.claim.spans
        self._tenant = boundary.claim.lease.tenant  # a child's tenant unless the call names one
        self._branch = None if boundary.branch is None else boundary.branch.key

    def start(
        self,
        name: str,
        version: int,
        input: Any,
        checkpoint_id: str | None,
        tenant: str | None,
        queue: str = "default",
        detached: bool = False,
    ) -> ChildHandle:
        """Enqueue the child once; the recorded handle on replay. A bad ``queue`` is an
        :class:`InvalidArgument` raised to the caller before anything is recorded."""
        validate.name("queue", queue)
        call_id, entry = self._cursor.take(f"child:{name}", EntryKind.CHILD)
        if entry is not None and finished(entry):
            return ChildHandle(**entry.output)
        # A step result held back is committed first: the child's input may come from it.
        self._boundary.before_body()
        parent_id = self._cursor.task_id
        task_id = checkpoint_id if checkpoint_id is not None else _derived_id(parent_id, call_id)
        task = WorkflowTask.new(
            name,
            version,
            input,
            tenant=self._tenant if tenant is None else tenant,
            checkpoint_id=task_id,
            queue=queue,
        )
        try:
            self._store.enqueue_child(task.evolve(parent_id=parent_id, detached=detached))
        except EnqueueConflict as exc:
            raise FailRequested(
                f"child {call_id} of task {parent_id!r}: {exc}", cause="misuse", error=exc, step_id=call_id
            ) from exc
        handle = ChildHandle(task.task_id, name, version)
        # Committed with the next commit, not one of its own: until then a replay makes the
        # same idempotent enqueue, so ten children cost ten enqueues and one commit.
        self._cursor.record(JournalEntry(call_id, EntryKind.CHILD, EntryStatus.DONE, attrs.asdict(handle)))
        return handle

    def wait(
        self, handles: Sequence[ChildHandle], timeout: timedelta | None, result_type: Any
    ) -> list[Any] | ChildTimedOut:
        """Each child's result structured as ``result_type``, in the order of
        ``handles``; :class:`ChildFailed` for the first that failed or was cancelled."""
        _check_wait(handles)
        if self._branch is not None:
            raise FailRequested(
                f"branch {self._branch!r} waits for child tasks; durable waits belong in the "
                "main function, not in parallel branches",
                cause="misuse",
            )
        output = self._ended(handles, timeout)
        if "timed_out" in output:
            return ChildTimedOut(tuple(output["timed_out"]))
        results = []
        for ended in output["children"]:
            if ended["outcome"] != TaskOutcome.COMPLETED.value:
                raise ChildFailed(ended["task_id"], ended["outcome"], ended["reason"])
            results.append(structure(ended["result"], result_type))
        return results

    def _ended(self, handles: Sequence[ChildHandle], timeout: timedelta | None) -> dict[str, Any]:
        """The journal output of the wait: how each child ended, or which had not when
        the timeout passed. Suspends while a child is unfinished."""
        wait = open_wait(self._cursor, self._boundary, self._store, "children", EntryKind.CHILDREN, timeout)
        if not isinstance(wait, OpenWait):
            return wait
        entry, due_at = wait.entry, wait.due_at
        with self._spans.wait("children", wait.call_id) as span:
            records = self._store.task_records([handle.task_id for handle in handles])
            ended = (TaskState.TERMINAL, TaskState.CANCELLED)
            unfinished = [r.task_id for r in records if r.state not in ended]
            if not unfinished:
                self._cursor.finish(entry, {"children": [_ending(r) for r in records]})
                span.ended("ended")
            elif due_at is not None and wait.now >= due_at:
                self._cursor.finish(entry, {"timed_out": unfinished})
                span.ended("timed_out")
            else:
                until = "" if due_at is None else f" until {due_at.isoformat()}"
                waited = unfinished[0]
                others = f" (and {len(unfinished) - 1} more)" if len(unfinished) > 1 else ""
                reason = f"waiting for child task {waited!r}{others}{until}"
                raise SuspendRequested(due_at, reason, child=waited)
        return dict(entry.output)


def _ending(record: TaskRecord) -> dict[str, Any]:
    """How a child ended, as the parent's journal keeps it."""
    if record.state is TaskState.CANCELLED:
        outcome = "cancelled"
    else:
        assert record.outcome is not None
        outcome = record.outcome.value
    result = record.result if outcome == TaskOutcome.COMPLETED.value else None
    return {"task_id": record.task_id, "outcome": outcome, "reason": record.reason, "result": result}


def _derived_id(parent_id: str, call_id: str) -> str:
    """The child's task id when the caller gives none: the parent's id and the call's,
    so the same call of the same parent always names the same child (``order-7`` ->
    ``order-7:child:quote-1``), with no ``/`` or ``#``, which paths and URLs made of task
    ids would misread. Past the bound on task ids, a digest of the two instead."""
    derived = f"{parent_id}:{call_id.replace('/', ':').replace('#', '-')}"
    if len(derived) <= _MAX_DERIVED_ID:
        return derived
    return "child-" + hashlib.sha256(f"{parent_id}\0{call_id}".encode()).hexdigest()


def _check_wait(handles: Sequence[ChildHandle]) -> None:
    if isinstance(handles, ChildHandle) or not handles:
        raise InvalidArgument(
            f"wait_children needs a non-empty list of ChildHandle, got {validate.shown(handles)}"
        )
    for handle in handles:
        if not isinstance(handle, ChildHandle):
            validate.refuse("children to wait for", "ChildHandle (ctx.start_child)", handle)
        validate.name("child task id", handle.task_id)
