"""Compensation steps: run newest first when a task fails or is cancelled, each one
checkpointed, never for an ambiguous effect."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import (
    Cancelled,
    Failed,
    InvalidArgument,
    LeaseDuration,
    RetryPolicy,
    StepContext,
    TaskState,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.checkpoint import Checkpoint
from runifold_sync.sqlite import SqliteWorkflowStore

ONCE = RetryPolicy(max_attempts=1)


class Crash(BaseException):
    """Stands for the process dying inside a compensation."""


def _workflow(
    log: list[str], *, fail_last: bool, crash_undo_once: list[bool] | None = None, refund_error: bool = False
) -> Workflow:
    workflow = Workflow("undoable", 1)

    @workflow.step()
    def reserve(ctx: StepContext, sku: str) -> str:
        log.append("reserve")
        return f"res-{sku}"

    @workflow.effect(idempotent=True)
    def charge(ctx: StepContext, amount: int) -> str:
        log.append("charge")
        return f"ch-{amount}"

    @workflow.step(retry=ONCE)
    def ship(ctx: StepContext) -> None:
        log.append("ship")
        if fail_last:
            raise RuntimeError("carrier down")

    @workflow.compensate_for("reserve")
    def release(ctx: StepContext, reservation: str) -> None:
        log.append(f"release {reservation}")

    @workflow.compensate_for("charge")
    def refund(ctx: StepContext, charge_id: str) -> None:
        if crash_undo_once and crash_undo_once.pop():
            raise Crash()
        if refund_error:
            raise ConnectionError("payment provider down")
        log.append(f"refund {charge_id}")

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        reserve(ctx, "sku1")
        charge(ctx, 42)
        ship(ctx)

    return workflow


def _worker(store: SqliteWorkflowStore, workflow: Workflow) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    return WorkflowWorker(
        store, registry, WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)), timedelta(seconds=5)
    )


def test_a_failed_task_undoes_its_completed_steps_newest_first(sqlite_store: SqliteWorkflowStore) -> None:
    log: list[str] = []
    sqlite_store.enqueue(WorkflowTask.new("undoable", 1, None, checkpoint_id="c1"))
    outcome = _worker(sqlite_store, _workflow(log, fail_last=True)).run_once()
    assert isinstance(outcome, Failed)
    assert "carrier down" in outcome.reason and "compensated: charge#1, reserve#1" in outcome.reason
    assert log == ["reserve", "charge", "ship", "refund ch-42", "release res-sku1"]
    checkpoint = Checkpoint.decode("c1", sqlite_store.get_task("c1").checkpoint_json or "")
    assert checkpoint.compensated == ["charge#1", "reserve#1"]


def test_a_crash_inside_a_compensation_resumes_without_repeating_finished_ones(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    log: list[str] = []
    crash_first_refund = [False, True]  # popped from the end: crash once, then succeed
    workflow = _workflow(log, fail_last=True, crash_undo_once=crash_first_refund)
    sqlite_store.enqueue(WorkflowTask.new("undoable", 1, None, checkpoint_id="c2"))
    worker = _worker(sqlite_store, workflow)
    with pytest.raises(Crash):
        worker.run_once()
    worker.close()
    assert sqlite_store.get_task("c2").state is TaskState.LEASED
    sqlite_store.set_clock_offset(timedelta(seconds=31))  # the dead worker's lease expires
    outcome = _worker(sqlite_store, workflow).run_once()
    assert isinstance(outcome, Failed) and "carrier down" in outcome.reason
    assert log == ["reserve", "charge", "ship", "refund ch-42", "release res-sku1"]


def test_a_compensation_that_raises_after_a_failure_fails_the_task_naming_both(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    log: list[str] = []
    sqlite_store.enqueue(WorkflowTask.new("undoable", 1, None, checkpoint_id="c4"))
    outcome = _worker(sqlite_store, _workflow(log, fail_last=True, refund_error=True)).run_once()
    assert isinstance(outcome, Failed) and outcome.cause == "compensation_error"
    assert "carrier down" in outcome.reason
    assert "compensation of charge#1 raised ConnectionError: payment provider down" in outcome.reason
    record = sqlite_store.get_task("c4")
    assert (record.state, record.reason) == (TaskState.TERMINAL, outcome.reason)
    assert log == ["reserve", "charge", "ship"]  # the undo stopped at the refund that raised


def test_a_cancelled_task_is_compensated_before_it_ends_cancelled(sqlite_store: SqliteWorkflowStore) -> None:
    log: list[str] = []
    workflow = Workflow("undo-on-cancel", 1)

    @workflow.step()
    def book(ctx: StepContext, n: int) -> int:
        log.append(f"book {n}")
        return n

    @workflow.compensate_for("book")
    def unbook(ctx: StepContext, n: int) -> None:
        log.append(f"unbook {n}")

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        book(ctx, 1)
        ctx.sleep(timedelta(seconds=10))
        book(ctx, 2)

    sqlite_store.enqueue(WorkflowTask.new("undo-on-cancel", 1, None, checkpoint_id="c3"))
    worker = _worker(sqlite_store, workflow)
    assert worker.run_once().kind == "suspended"
    sqlite_store.set_clock_offset(timedelta(seconds=11))  # the timer is due
    (claimed,) = sqlite_store.claim(WorkerId.parse("w0"), LeaseDuration(timedelta(seconds=1)))
    assert sqlite_store.cancel("c3", actor="ops", reason="customer left") is TaskState.LEASED
    sqlite_store.set_clock_offset(timedelta(seconds=20))  # w0 died with the cancel unseen
    outcome = worker.run_once()
    assert outcome == Cancelled("c3", "cancelled by ops: customer left")
    assert log == ["book 1", "unbook 1"]


def test_a_compensation_for_an_undeclared_step_is_refused() -> None:
    workflow = Workflow("bad-undo", 1)

    @workflow.compensate_for("nothing")
    def undo(ctx: StepContext, value: object) -> None: ...

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None: ...

    with pytest.raises(InvalidArgument, match="compensation for 'nothing'"):
        WorkflowDefinition(workflow)
