"""The kit's helpers and its clock on both stores: approvals refused as in production,
results that say why a task has none, journals, and clock moves that compose with the
skips of ``run_until_idle``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import WorkflowStore
from runifold_sync.errors import InvalidArgument, InvalidState, SignalNotAccepted
from runifold_sync.model.checkpoint import EntryKind, EntryStatus
from runifold_sync.store import TaskState
from runifold_sync.testing import StoreClock, approve, journal, result, run_until_idle, send_signal

from . import workflows
from .workflows import registry

approval = workflows.Workflow("approval", 1, signals=["ok"])


@approval.main
def ask(ctx: workflows.WorkflowContext, _: None) -> object:
    decision = ctx.request_approval("ok", approvers=["alice"])
    return decision.approved  # type: ignore[union-attr]  # no timeout: never ApprovalTimedOut


def enqueue(store: WorkflowStore, workflow: workflows.Workflow, value: object, task_id: str) -> str:
    task = registry(workflow).task(workflow.name, workflow.version, value, checkpoint_id=task_id)
    return store.enqueue(task).task_id


def test_an_approval_from_someone_not_listed_is_refused_and_alices_is_taken(store: WorkflowStore) -> None:
    task_id = enqueue(store, approval, None, "t-approve")
    run_until_idle(store, registry(approval))

    with pytest.raises(SignalNotAccepted, match="'mallory' is not an approver"):
        approve(store, task_id, "ok", approver="mallory")
    approve(store, task_id, "ok", approver="alice", approved=False, reason="not now")
    run_until_idle(store, registry(approval))

    assert result(store, task_id) is False


def test_approve_refuses_a_decision_that_is_not_a_bool(store: WorkflowStore) -> None:
    task_id = enqueue(store, approval, None, "t-approve-bad")
    with pytest.raises(InvalidArgument, match="'yes'"):
        approve(store, task_id, "ok", approver="alice", approved="yes")  # type: ignore[arg-type]


def test_each_signal_sent_is_a_new_delivery_in_the_tasks_tenant(store: WorkflowStore) -> None:
    task = registry(workflows.listener).task("listener", 1, None, tenant="acme")
    task_id = store.enqueue(task).task_id

    first = send_signal(store, task_id, "go", 1)
    second = send_signal(store, task_id, "go", 1)

    assert first.created and second.created and first.signal_id != second.signal_id


def test_result_says_where_an_unfinished_or_failed_task_stands(store: WorkflowStore) -> None:
    task_id = enqueue(store, workflows.listener, None, "t-result")
    with pytest.raises(InvalidState, match="'t-result' has not completed: it is queued"):
        result(store, task_id)
    run_until_idle(store, registry(workflows.listener))
    with pytest.raises(InvalidState, match="it is waiting \\(waiting for signal 'go'\\)"):
        result(store, task_id)
    store.cancel(task_id, "test", "enough")
    with pytest.raises(InvalidState, match="it is cancelled"):
        result(store, task_id)


def test_journal_lists_the_main_functions_entries(store: WorkflowStore) -> None:
    task_id = enqueue(store, workflows.sleeper, "ada", "t-journal")
    assert journal(store, task_id) == []

    run_until_idle(store, registry(workflows.sleeper))

    entries = journal(store, task_id)
    assert [(e.kind, e.status) for e in entries] == [
        (EntryKind.TIMER, EntryStatus.DONE),
        (EntryKind.STEP, EntryStatus.DONE),
    ]
    assert entries[-1].output == "good morning, ada"


def test_the_clock_moves_from_the_offset_the_store_holds(store: WorkflowStore) -> None:
    clock = StoreClock(store)
    start = clock.now()
    task_id = enqueue(store, workflows.sleeper, "ada", "t-clock")
    run_until_idle(store, registry(workflows.sleeper))  # skipped a day
    assert result(store, task_id) == "good morning, ada"

    clock.advance(timedelta(hours=1))  # on top of the day, not in place of it

    assert clock.now() - start >= timedelta(days=1, hours=1)
    assert store.clock_reading().offset > timedelta(days=1)  # the skip, less the time it took, and the hour
    assert clock.advance_to(start) >= start + timedelta(days=1)  # never backwards


@pytest.mark.parametrize("delta", [timedelta(0), timedelta(seconds=-1), 5])
def test_the_clock_refuses_a_step_that_is_not_forward(store: WorkflowStore, delta: object) -> None:
    with pytest.raises(
        InvalidArgument, match=r"^advance delta must be (positive|a datetime.timedelta), got "
    ):
        StoreClock(store).advance(delta)  # type: ignore[arg-type]


def test_clock_reading_skips_paused_and_leased_tasks(store: WorkflowStore) -> None:
    assert store.clock_reading().next_due is None
    paused = enqueue(store, workflows.sleeper, "a", "t-reading-paused")
    run_until_idle(store, registry(workflows.sleeper), skip_time=False)
    due = store.get_task(paused).ready_at
    assert store.clock_reading().next_due == due
    store.pause(paused, actor="test", reason="hold")
    assert store.get_task(paused).state is TaskState.WAITING
    assert store.clock_reading().next_due is None
