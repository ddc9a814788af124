"""Compensation steps: run newest first (in the order steps completed, parallel branches
included) when a task fails, is cancelled or keeps crashing its worker, each one
checkpointed and its cost charged, never for an ambiguous effect."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import (
    Budget,
    LeaseDuration,
    RetryPolicy,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.model.checkpoint import Checkpoint
from runifold_sync.outcomes import Cancelled, Failed
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState

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


def test_compensations_undo_in_reverse_completion_order_across_a_parallel_block(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    log: list[str] = []
    workflow = Workflow("trip-parallel", 1)

    @workflow.step()
    def reserve(ctx: StepContext) -> str:
        log.append("reserve")
        return "seat"

    @workflow.step()
    def book(ctx: StepContext) -> str:
        log.append("book")
        return "hotel"

    @workflow.step()
    def charge(ctx: StepContext) -> str:
        log.append("charge")
        return "card"

    @workflow.step(retry=ONCE)
    def confirm(ctx: StepContext) -> None:
        raise RuntimeError("confirmation refused")

    for step in ("reserve", "book", "charge"):

        @workflow.compensate_for(step)
        def undo(ctx: StepContext, what: str) -> None:
            log.append(f"undo {what}")

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        reserve(ctx)
        ctx.parallel({"hotel": lambda branch: book(branch)})
        charge(ctx)
        confirm(ctx)

    sqlite_store.enqueue(WorkflowTask.new("trip-parallel", 1, None, checkpoint_id="tp"))
    outcome = _worker(sqlite_store, workflow).run_once()

    assert isinstance(outcome, Failed) and "confirmation refused" in outcome.reason
    assert log == ["reserve", "book", "charge", "undo card", "undo hotel", "undo seat"]
    checkpoint = Checkpoint.decode("tp", sqlite_store.get_task("tp").checkpoint_json or "")
    assert checkpoint.undo == ["reserve#1", "parallel#1/hotel/book#1", "charge#1"]
    assert checkpoint.compensated == ["charge#1", "parallel#1/hotel/book#1", "reserve#1"]


def test_a_task_that_keeps_crashing_its_worker_is_compensated_when_it_fails(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    log: list[str] = []
    workflow = Workflow("crashes", 1)

    @workflow.step()
    def reserve(ctx: StepContext) -> str:
        log.append("reserve")
        return "seat"

    @workflow.step()
    def crash(ctx: StepContext) -> None:
        log.append("crash")
        raise Crash()

    @workflow.compensate_for("reserve")
    def release(ctx: StepContext, what: str) -> None:
        log.append(f"release {what}")

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        reserve(ctx)
        crash(ctx)

    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow, Budget(max_attempts=1)))
    sqlite_store.enqueue(WorkflowTask.new("crashes", 1, None, checkpoint_id="cr"))
    for dead in range(2):  # the first claim commits reserve; then two claims die without progress
        worker = WorkflowWorker(
            sqlite_store,
            registry,
            WorkerId.parse(f"w{dead}"),
            LeaseDuration(timedelta(seconds=30)),
            timedelta(seconds=5),
        )
        with pytest.raises(Crash):
            worker.run_once()
        worker.close()
        sqlite_store.set_clock_offset(timedelta(seconds=31 * (dead + 1)))  # its lease expires

    outcome = WorkflowWorker(
        sqlite_store,
        registry,
        WorkerId.parse("w2"),
        LeaseDuration(timedelta(seconds=30)),
        timedelta(seconds=5),
    ).run_once()

    assert isinstance(outcome, Failed) and outcome.cause == "crash_loop"
    assert "claimed 2 times without progress" in outcome.reason
    assert outcome.reason.endswith("(compensated: reserve#1)")
    assert log == ["reserve", "crash", "crash", "release seat"]


def test_cost_charged_inside_a_compensation_is_added_to_the_tasks_usage(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    workflow = Workflow("costly-undo", 1)

    @workflow.step()
    def call_model(ctx: StepContext) -> str:
        ctx.charge(10)
        return "answer"

    @workflow.step(retry=ONCE)
    def fail(ctx: StepContext) -> None:
        raise RuntimeError("bad answer")

    @workflow.compensate_for("call_model")
    def retract(ctx: StepContext, answer: str) -> None:
        ctx.charge(3)

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        call_model(ctx)
        fail(ctx)

    sqlite_store.enqueue(WorkflowTask.new("costly-undo", 1, None, checkpoint_id="cu"))
    assert isinstance(_worker(sqlite_store, workflow).run_once(), Failed)

    checkpoint = Checkpoint.decode("cu", sqlite_store.get_task("cu").checkpoint_json or "")
    assert (checkpoint.usage.cost, checkpoint.compensated) == (13, ["call_model#1"])
